"""Weight deltas between consecutive policy versions (specs/network.md §6.1, vrl/node/deltas.py):
bytes per version against the full weights file, and the time to make and rebuild one, for
several candidate formats, on real GRPO steps.

    python bench/delta.py                          # the base model, 2 steps
    python bench/delta.py --model qwen2.5-0.5b --steps 1 --groups 2 --max-new-tokens 16

Each step is ``vrl.rl.train.Trainer.step`` (generate a batch from the current policy, verify it,
one GRPO step by ``vrl.rl.step.grpo_step``) with ``vrl train``'s defaults (learning rate 2e-5,
AdamW, clip 1, group size and batch as ``TrainConfig``), started past the warmup
(``--start-step``, default ``warmup_steps``) so the step moves the weights by the full learning
rate, as every step of a run but the first few does. Training runs in float32 (as the trainer
does); the bfloat16 figures are the bf16 cast of the parent's and the child's float32 weights,
i.e. the weights as a network publishing bf16 would ship them (not bf16 training).

A model with random weights (a preset such as the 0.5B-shaped one) answers nothing right, so
every group's rewards are equal, GRPO has no gradient and the weights do not move: with
``--synthetic-rewards`` the step trains on seeded random 0/1 rewards instead of the records'
own (generation as above, no verification, the same ``grpo_step`` through ``Trainer.update``).
Adam moves each weight by about the learning rate whatever the gradient's size, so the delta's
size depends little on where the rewards came from. The optimizer starts fresh at the first
measured step: Adam's first, bias-corrected step moves every weight by about the full learning
rate, more than a step of a long run does (its m / sqrt(v) is mostly under 1), so the first
step's delta is the pessimistic case; later steps show the trend.

Candidates, all lossless and checked to rebuild the child's file bit for bit:

* ``xor-planes-zstd-L``: XOR of the two files, split in byte planes per tensor, zstd level L
  (the format of vrl/node/deltas.py at its ZSTD_LEVEL);
* ``xor-zstd-3``: the XOR without the byte planes;
* ``xor-planes-lz4``: the byte planes, lz4 (frame, default level);
* ``sparse-zstd-3``: the changed elements only: the gaps between their indices (uint32) and
  their new values, zstd level 3.

Memory: one model, its optimizer for the step(s), the parent's and the child's files in each
dtype, and one candidate's buffers at a time (the optimizer's state is dropped after the last
step). The machine is shared by other jobs: times are medians of ``--repeats`` and noisy; the
byte counts are exact. Writes bench/results/delta.json (or ``--out``).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import platform
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import lz4.frame  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import zstandard  # noqa: E402
from safetensors.torch import save as save_tensors  # noqa: E402

from vrl.node import deltas  # noqa: E402
from vrl.rl.config import TrainConfig  # noqa: E402
from vrl.rl.train import Trainer  # noqa: E402
from vrl.rollouts.generate import iter_generate  # noqa: E402
from vrl.rollouts.record import round_seed  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def blob_in(network: torch.nn.Module, dtype: torch.dtype) -> bytes:
    """The weights file (vrl.node.weights.to_blob) of ``network`` cast to ``dtype``."""
    return save_tensors({k: v.detach().to(dtype).contiguous().clone() for k, v in network.state_dict().items()})


def _xor(parent: bytes, child: bytes) -> np.ndarray:
    return np.bitwise_xor(np.frombuffer(parent, np.uint8), np.frombuffer(child, np.uint8))


def _planes_candidate(compress: Callable[[bytes], bytes], decompress: Callable[[bytes], bytes]):
    def encode(parent: bytes, child: bytes) -> bytes:
        return compress(deltas._planes(_xor(parent, child), deltas.layout(parent)).tobytes())

    def decode(parent: bytes, delta: bytes) -> bytes:
        planes = np.frombuffer(decompress(delta), np.uint8)
        return np.bitwise_xor(deltas._unplanes(planes, deltas.layout(parent)), np.frombuffer(parent, np.uint8)
                              ).tobytes()
    return encode, decode


def _zstd(level: int) -> tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]:
    return (zstandard.ZstdCompressor(level=level).compress, zstandard.ZstdDecompressor().decompress)


def _xor_zstd():
    compress, decompress = _zstd(3)
    return (lambda p, c: compress(_xor(p, c).tobytes()),
            lambda p, d: np.bitwise_xor(np.frombuffer(decompress(d), np.uint8), np.frombuffer(p, np.uint8)).tobytes())


def _sparse(width: int):
    """Changed elements of the data section (every tensor has the dtype's ``width``)."""
    view = {4: np.uint32, 2: np.uint16}[width]
    compress, decompress = _zstd(3)

    def split(blob: bytes) -> tuple[int, np.ndarray]:
        start = deltas.layout(blob)[0][0]
        return start, np.frombuffer(blob, np.uint8)[start:].view(view)

    def encode(parent: bytes, child: bytes) -> bytes:
        start, old = split(parent)
        _, new = split(child)
        changed = np.flatnonzero(old != new)
        gaps = np.diff(changed, prepend=0).astype(np.uint32)
        head = bytes(a ^ b for a, b in zip(parent[:start], child[:start]))
        return compress(len(changed).to_bytes(8, "big") + head + gaps.tobytes() + new[changed].tobytes())

    def decode(parent: bytes, delta: bytes) -> bytes:
        raw = decompress(delta)
        count = int.from_bytes(raw[:8], "big")
        start, old = split(parent)
        head = bytes(a ^ b for a, b in zip(parent[:start], raw[8:8 + start]))
        at = 8 + start
        index = np.cumsum(np.frombuffer(raw, np.uint32, count, at), dtype=np.int64)
        values = np.frombuffer(raw, view, count, at + 4 * count)
        out = old.copy()
        out[index] = values
        return head + out.tobytes()
    return encode, decode


def candidates(width: int) -> dict[str, tuple[Callable, Callable]]:
    return {
        f"xor-planes-zstd-{deltas.ZSTD_LEVEL} (vrl.node.deltas)": (deltas.encode, deltas.rebuild),
        "xor-planes-zstd-1": _planes_candidate(*_zstd(1)),
        "xor-planes-zstd-9": _planes_candidate(*_zstd(9)),
        "xor-zstd-3": _xor_zstd(),
        "xor-planes-lz4": _planes_candidate(lz4.frame.compress, lz4.frame.decompress),
        "sparse-zstd-3": _sparse(width),
    }


def timed(call: Callable[[], bytes], repeats: int) -> tuple[bytes, float]:
    times, result = [], b""
    for _ in range(repeats):
        started = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - started)
    return result, statistics.median(times)


def measure(parent: bytes, child: bytes, repeats: int, only: str | None = None) -> dict:
    width = deltas.layout(parent)[-1][1]
    old = np.frombuffer(parent, np.uint8)[deltas.layout(parent)[0][0]:].view({4: np.uint32, 2: np.uint16}[width])
    new = np.frombuffer(child, np.uint8)[deltas.layout(child)[0][0]:].view(old.dtype)
    changed = float(np.count_nonzero(old != new)) / old.size
    del old, new
    _, hash_seconds = timed(lambda: hashlib.sha256(child).digest(), repeats)
    out = {"full_bytes": len(child), "elements_changed": changed, "sha256_full_seconds": hash_seconds,
           "candidates": {}}
    for name, (encode, decode) in candidates(width).items():
        if only is not None and not name.startswith(only):
            continue
        delta, encode_seconds = timed(lambda e=encode: e(parent, child), repeats)
        rebuilt, rebuild_seconds = timed(lambda d=decode, x=delta: d(parent, x), repeats)
        if rebuilt != child:
            raise SystemExit(f"{name}: did not rebuild the child's file bit for bit")
        out["candidates"][name] = {"bytes": len(delta), "ratio": len(delta) / len(child),
                                   "encode_seconds": encode_seconds, "rebuild_seconds": rebuild_seconds}
        del delta, rebuilt
        gc.collect()
    return out


def synthetic_step(trainer: Trainer, seed: int) -> dict:
    """One GRPO step (Trainer.update) on a freshly generated batch, trained on seeded random
    0/1 rewards in place of the records' own; then the next version (Trainer.advance)."""
    config, model = trainer.config, trainer.policy()
    groups = list(iter_generate(
        model, trainer.tasks, trainer.key, round_seed=round_seed(model.model_hash, trainer.step_index),
        sampling=trainer.sampling, groups=config.groups_per_step, reward_spec=config.reward_spec,
        group_size=config.group_size, policy_version=trainer.step_index, batch_size=config.generation_batch))
    generator = torch.Generator().manual_seed(seed)
    rewards = [[float(r) for r in torch.randint(0, 2, (len(g),), generator=generator).tolist()] for g in groups]
    stats = trainer.update(groups, rewards=rewards)
    trainer.advance()
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="base", help="a preset or a built model (base)")
    parser.add_argument("--steps", type=int, default=2, help="consecutive GRPO steps, each measured")
    parser.add_argument("--start-step", type=int, default=None, help="the first step's index (default: past warmup)")
    parser.add_argument("--groups", type=int, default=None, help="groups per step (default: TrainConfig's)")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3, help="timings are the median of this many")
    parser.add_argument("--synthetic-rewards", action="store_true",
                        help="train on seeded random rewards (a model with random weights has no gradient otherwise)")
    # A 0.5B model's float32 file is 2.5 GB: the sparse candidate's index list alone is 8 bytes an
    # element when every element changes, which took the first 0.5B run past 24 GiB (OOM-killed).
    parser.add_argument("--only", default=None, help="measure only the candidates whose name starts so "
                        "(e.g. xor-planes-zstd-3, the format vrl.node.deltas uses), to bound memory on large models")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "delta.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    options = {"model": args.model, "steps": 10**9, "eval_every": 10**9, "checkpoint_every": 10**9,
               "track_kl": False, "held_out": 1}
    if args.groups is not None:
        options["groups_per_step"] = args.groups
    if args.max_new_tokens is not None:
        options["max_new_tokens"] = args.max_new_tokens
    config = TrainConfig(**options)
    steps = []
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(config, Path(tmp) / "run")
        trainer.step_index = config.warmup_steps if args.start_step is None else args.start_step
        for number in range(args.steps):
            parents = {name: blob_in(trainer.network, dtype) for name, dtype in DTYPES.items()}
            index = trainer.step_index
            started = time.perf_counter()
            record = synthetic_step(trainer, index) if args.synthetic_rewards else trainer.step()
            step_seconds = time.perf_counter() - started
            if number == args.steps - 1:  # the optimizer is not needed to measure: free its memory
                trainer.optimizer.state.clear()
                trainer.optimizer.zero_grad(set_to_none=True)
                gc.collect()
            result = {"step_index": index, "learning_rate": trainer.step_config.learning_rate_at(index),
                      "groups_used": record.get("groups_used"), "loss": record.get("loss"),
                      "step_seconds": step_seconds, "rewards": "synthetic" if args.synthetic_rewards else "records",
                      "dtypes": {}}
            for name, dtype in DTYPES.items():
                child = blob_in(trainer.network, dtype)
                result["dtypes"][name] = measure(parents.pop(name), child, args.repeats, args.only)
                del child
                gc.collect()
            steps.append(result)
            if not record.get("groups_used"):
                print(f"step {index}: no group had a gradient, so the weights did not move and its delta is "
                      "trivial; a model with random weights needs --synthetic-rewards", flush=True)
            print(json.dumps({"step": index, **{d: {k: round(v["ratio"], 4) for k, v in r["candidates"].items()}
                                                for d, r in result["dtypes"].items()}}), flush=True)
    summary = {
        "model": args.model, "train_dtype": "float32",
        "bfloat16_is": "the bf16 cast of the parent's and the child's float32 weights (not bf16 training)",
        "train_config": {"learning_rate": config.learning_rate, "warmup_steps": config.warmup_steps,
                         "groups_per_step": config.groups_per_step, "group_size": config.group_size,
                         "max_new_tokens": trainer.config.max_new_tokens, "grad_clip": config.grad_clip},
        "steps": steps,
        "goal": "a GRPO step's delta at most 25% of the full file in bfloat16 (issue 31)",
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, shared with other jobs: times noisy",
        "command": "python " + " ".join(sys.argv),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
