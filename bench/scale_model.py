"""What a 0.5B model costs on a CPU: Qwen2.5-0.5B's shape (the ``qwen2.5-0.5b`` preset: hidden
896, 24 layers, 14 heads over 2 KV heads, vocabulary 151,936, tied embeddings; seeded random
weights), float32, end to end.

    python bench/scale_model.py                   # everything -> bench/results/qwen0.5b.json
    python bench/scale_model.py --model qwen2.5-0.5b-2layer --new-tokens 16 --out /tmp/q.json  # a dry run
    python bench/scale_model.py --only grpo:adamw8bit   # one measurement, merged into --out
    python bench/scale_model.py --device cuda --dtype bfloat16 --out bench/results/qwen0.5b-cuda.json  # a GPU

On a GPU (``--device cuda``; bench/gpu.sh runs it on a lent one) generation and verification
run in ``--dtype`` (bfloat16 there) with ``--attention`` (sdpa), every timing is taken between
``torch.cuda.synchronize()`` calls, and each measurement also records its peak GPU memory
(``torch.cuda.max_memory_allocated``); the step stays the protocol's float32 AdamW step
(``grpo:adamw``), beside ``grpo:bf16-master``, and its replay is compared bit for bit.

Measures, each in a process of its own so that its peak RSS (``getrusage`` ``ru_maxrss``) is
its own and not the previous measurement's:

* ``load``: building the preset and hashing it;
* ``generate:B`` and ``verify:B``: one GRPO group of B completions of ``--new-tokens`` tokens
  (KV-cache decode with the canonical sampler, commitments built), then ``vrl.verify`` of it at
  batch B: ms per token, verify / generate, commitment bytes per token;
* ``grpo:OPT``: one GRPO step (:func:`vrl.rl.step.grpo_step`) on that group of 8, time and
  peak RSS, with ``OPT`` the optimizer: ``adamw`` (the protocol's: float32 weights, fused
  float32 AdamW), ``adamw-checkpointing`` (the same with activation checkpointing),
  ``bf16-master`` (bfloat16 weights and gradients, float32 master weights and AdamW) or
  ``adamw8bit`` (float32 weights, bitsandbytes' 8-bit AdamW; ``pip install bitsandbytes``);
* ``replay``: a verifier's replay of the ``adamw`` step (:func:`vrl.rl.step.replay`), against
  the step itself, and whether it is bit-exact;
* ``replay-memory``: the race replay (``proofs.sampler.replay_sequences``) over logits of the
  group's shape, at once and in blocks: its float64 copies of full-vocabulary logits are what a
  151,936-entry vocabulary makes large.

A measurement that needs more memory than ``/proc/meminfo``'s MemAvailable is not started; the
JSON says so. The machine is shared (2 cores, 24 GiB, other jobs running): wall times are
noisy, so each measurement also records its process's CPU time (``time.process_time``, all its
threads), which another job's load changes far less; ratios are given on both.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from process_memory import available_bytes, peak_bytes, rss_bytes

GiB = 1 << 30
#: What each 0.5B measurement needs free before it starts (MemAvailable): load, generate and
#: verify peaked at 2.8 GiB, replay-memory at 1.9 GiB (bench/results/qwen0.5b.json), plus
#: headroom. The step and its replay were measured at 32 new tokens only (8.1 GiB); at 256
#: tokens their need is unmeasured, so they ask for the 20 GiB this shared machine's rule names
#: for them (--force runs a shorter one on less, as the results did).
NEEDS_GIB = {"load": 4, "generate": 5, "verify": 5, "grpo": 20, "replay": 20, "replay-memory": 4}
OPTIMIZERS = ("adamw", "adamw-checkpointing", "bf16-master", "adamw8bit")
REWARDS = [1.0, 0.0] * 4  # the group's rewards for the step: random weights answer nothing, so all would be 0


# -- the measurements (each runs in a child process) -------------------------------------------


def sync(args) -> None:
    """Wait for the GPU's queued work, so that a timing ends when the work does."""
    if args.device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _load(args, dtype: str | None = None, *, build: bool = False):
    """The model on ``args.device``; from ``--weights-cache`` (the preset's float32 weights,
    saved there by the load part) unless ``build``: a 0.5B preset's seeded init takes about a
    minute of CPU, paid once instead of in every measurement's process."""
    import vrl

    spec = args.model if build or not args.weights_cache else args.weights_cache
    started = time.perf_counter()
    model = vrl.load_model(spec, dtype=dtype or args.dtype, attention=args.attention, device=args.device)
    model.model_hash  # noqa: B018 (part of loading: every node hashes what it loads)
    sync(args)
    return model, time.perf_counter() - started


def _tasks(batch: int):
    import vrl
    from vrl.tasks import Task

    # One prompt per group, as cost.py's: 40 bytes, 40 tokens of the byte tokenizer.
    return vrl.TaskList("scale", (Task(f"g{batch}", "Prompt number 0 with some words in it. ", "x"),))


def part_load(args) -> dict:
    import vrl

    model, seconds = _load(args, build=True)
    cache = Path(args.weights_cache) if args.weights_cache else None
    if cache and not cache.is_dir():  # the float32 weights, for the later measurements (untimed)
        partial = cache.with_name(cache.name + ".partial")
        vrl.load_model(args.model).save(partial)
        partial.rename(cache)
    return {"seconds": seconds, "parameters": sum(p.numel() for p in model.network.parameters()),
            "model_hash": model.model_hash.hex()}


def part_generate(args, batch: int) -> dict:
    import vrl
    from vrl.rollouts.files import write_rollouts
    from vrl.rollouts.generate import GenerationStats

    model, _ = _load(args)
    key = vrl.NodeKey.from_seed(b"scale".ljust(32, b"\0"))
    sampling = vrl.sampling_for(model, max_new_tokens=args.new_tokens)
    vrl.generate(model, _tasks(batch), key, round_seed=bytes(32), sampling=vrl.sampling_for(model, max_new_tokens=2),
                 groups=1, group_size=1)  # warm-up: first-call allocations and kernel choice
    stats = GenerationStats()
    sync(args)
    started, cpu_started = time.perf_counter(), time.process_time()
    rollouts = vrl.generate(model, _tasks(batch), key, round_seed=bytes(32), sampling=sampling, groups=1,
                            group_size=batch, batch_size=batch, stats=stats)
    sync(args)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    write_rollouts(Path(args.work) / f"group-{batch}.vrl", rollouts)
    return {"batch": batch, "tokens": stats.tokens, "seconds": seconds, "cpu_seconds": cpu_seconds,
            "ms_per_token": 1000 * seconds / stats.tokens,
            "decode_seconds": stats.decode_seconds, "commit_seconds": stats.commit_seconds,
            "commit_share": stats.commit_seconds / seconds,
            "commitment_bytes_per_token": stats.commitment_bytes / stats.tokens,
            "prompt_tokens": len(rollouts[0].prompt_tokens)}


def _group(args, batch: int = 8) -> list:
    """The generated group of ``batch``; for a step (``--step-tokens N``), each completion cut
    to its first N tokens, as if sampled with max_new_tokens N: what a step on shorter
    completions costs, without generating them again."""
    import dataclasses

    from vrl.rollouts.files import read_rollouts

    rollouts = list(read_rollouts(Path(args.work) / f"group-{batch}.vrl"))
    if args.step_tokens:
        n = args.step_tokens
        # Longer than generated: each completion's tokens (and their recorded logprobs) repeated
        # to N. A step's time and memory follow the batch's shape, not its token values, so this
        # measures a step on N-token completions without generating them (about 40 minutes of
        # decoding at 0.5B on this shared machine); its loss and update are not a real run's.
        reps = -(-n // min(len(r.completion_tokens) for r in rollouts))
        rollouts = [dataclasses.replace(r, completion_tokens=(r.completion_tokens * reps)[:n],
                                        behaviour_logprobs=(r.behaviour_logprobs * reps)[:n],
                                        sampling=dataclasses.replace(r.sampling, max_new_tokens=n)) for r in rollouts]
    return rollouts


def part_verify(args, batch: int) -> dict:
    import vrl

    model, _ = _load(args)
    rollouts = _group(args, batch)
    vrl.verify(rollouts[:1], model, batch_size=1)  # warm-up, as generate's
    sync(args)
    started, cpu_started = time.perf_counter(), time.process_time()
    verdicts = vrl.verify(rollouts, model, batch_size=batch)
    sync(args)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    tokens = sum(len(r.completion_tokens) for r in rollouts)
    return {"batch": batch, "tokens": tokens, "seconds": seconds, "cpu_seconds": cpu_seconds,
            "ms_per_token": 1000 * seconds / tokens, "model_hash": model.model_hash.hex(),
            "accepted": sum(v.accepted for v in verdicts), "records": len(verdicts)}


def _step_config(rollouts):
    from vrl.rl.step import StepConfig

    return StepConfig(learning_rate=1e-6, warmup_steps=1, grad_clip=1.0, temperature=rollouts[0].sampling.temperature,
                      max_new_tokens=rollouts[0].sampling.max_new_tokens)


class MasterWeights:
    """bfloat16 weights and gradients for the forward and backward pass, float32 master
    weights and AdamW moments for the update (mixed precision as GPU trainers run it), behind
    the three things grpo_step asks of an optimizer (param_groups, zero_grad, step)."""

    def __init__(self, network, config) -> None:
        import torch

        self.work = list(network.parameters())
        self.master = [p.detach().float().clone().requires_grad_(True) for p in self.work]
        self.inner = torch.optim.AdamW(self.master, lr=config.learning_rate, betas=config.betas, eps=config.eps,
                                       weight_decay=config.weight_decay, fused=True)
        self.param_groups = self.inner.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.work:
            p.grad = None

    def step(self) -> None:
        for master, work in zip(self.master, self.work):
            master.grad = work.grad.float()
            work.grad = None
        self.inner.step()
        for master, work in zip(self.master, self.work):
            work.data.copy_(master.data)
            master.grad = None


def optimizer_digest(network, optimizer) -> str:
    """sha256 over the optimizer's state tensors in parameter-name order, read in place: it
    changes when any bit of the state does, without ``optimizer_bytes``'s two optimizer-sized
    copies (7.9 GB at 0.5B parameters: what got this bench's first 0.5B step killed for memory,
    after the step)."""
    import numpy as np

    digest = hashlib.sha256()
    for name, parameter in sorted(network.named_parameters()):
        for slot, value in sorted(optimizer.state.get(parameter, {}).items()):
            digest.update(f"{name}.{slot}".encode())
            digest.update(np.ascontiguousarray(value.detach().float().cpu().reshape(-1).numpy()).view(np.uint8).data)
    return digest.hexdigest()


def part_grpo(args, optimizer_name: str) -> dict:
    import torch

    import vrl
    from vrl.rl.step import grpo_step, optimizer_bytes, optimizer_for

    rollouts = _group(args)
    config = _step_config(rollouts)
    # The protocol's step trains float32 weights whatever the rollouts' dtype (specs/training.md).
    model, _ = _load(args, "bfloat16" if optimizer_name == "bf16-master" else "float32")
    network = model.network.requires_grad_(True)
    if optimizer_name == "adamw-checkpointing":
        # transformers checkpoints only in training mode; Qwen2 has no dropout (attention_dropout
        # 0.0), so train() computes what eval() does.
        network.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        network.train()
    if optimizer_name == "bf16-master":
        optimizer = MasterWeights(network, config)
    elif optimizer_name == "adamw8bit":
        import bitsandbytes

        optimizer = bitsandbytes.optim.AdamW8bit(network.parameters(), lr=config.learning_rate, betas=config.betas,
                                                 eps=config.eps, weight_decay=config.weight_decay)
    else:
        optimizer = optimizer_for(network, config)
    before = optimizer_bytes(network, optimizer) if optimizer_name == "adamw" else b""
    rss_before = rss_bytes()
    sync(args)
    started, cpu_started = time.perf_counter(), time.process_time()
    stats = grpo_step(network, optimizer, [rollouts], [1.0], config, 0, model.pad_token_id, rewards=[REWARDS])
    sync(args)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    result = {"optimizer": optimizer_name, "seconds": seconds, "cpu_seconds": cpu_seconds,
              "peak_rss_bytes": peak_bytes(), "rss_before_step_bytes": rss_before,
              "groups_used": stats["groups_used"],
              "completion_tokens": sum(len(r.completion_tokens) for r in rollouts)}
    # What the optimizer keeps between steps (moments, 8-bit blocks' scales, master weights) and
    # what the weights take, counted from the tensors themselves.
    inner = optimizer.inner if isinstance(optimizer, MasterWeights) else optimizer
    result["optimizer_state_bytes"] = sum(v.numel() * v.element_size() for state in inner.state.values()
                                          for v in state.values() if isinstance(v, torch.Tensor))
    if isinstance(optimizer, MasterWeights):
        result["optimizer_state_bytes"] += sum(m.numel() * m.element_size() for m in optimizer.master)
    result["weights_bytes"] = sum(p.numel() * p.element_size() for p in network.parameters())
    if optimizer_name == "adamw":  # the protocol's step: what the replay is compared against
        network.zero_grad(set_to_none=True)
        claimed = vrl.Model("step", network.eval(), model.tokenizer, "float32")
        result["model_hash"] = claimed.model_hash.hex()
        result["optimizer_hash"] = optimizer_digest(network, optimizer)
        (Path(args.work) / "optimizer-before.safetensors").write_bytes(before)
    del optimizer
    torch.set_grad_enabled(True)
    return result


def part_replay(args) -> dict:
    import vrl
    from vrl.rl.step import replay

    rollouts = _group(args)
    config = _step_config(rollouts)
    model, _ = _load(args, "float32")
    parent = model.network
    before = (Path(args.work) / "optimizer-before.safetensors").read_bytes()
    sync(args)
    started, cpu_started = time.perf_counter(), time.process_time()
    network, optimizer, stats = replay(parent, before, [rollouts], [1.0], config, 0, model.pad_token_id,
                                       rewards=[REWARDS])
    sync(args)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    peak = peak_bytes()
    network.zero_grad(set_to_none=True)
    del parent, model
    replayed_hash = vrl.Model("replay", network, None, "float32").model_hash.hex()  # type: ignore[arg-type]
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "peak_rss_bytes": peak, "model_hash": replayed_hash,
            "optimizer_hash": optimizer_digest(network, optimizer),
            "groups_used": stats["groups_used"]}


def part_replay_memory(args) -> dict:
    """The race replay alone (``proofs.sampler.replay_sequences``) over logits of the group's
    shape (8 completions of the vocabulary's width), at once (one block, as before blocks) or in
    blocks. The logits are seeded random numbers, not the model's: the memory and time of the
    replay depend on their shape, not their values, and no prefill is paid for."""
    import torch

    from proofs import sampler
    from vrl.rollouts.presets import PRESETS

    rollouts = _group(args)
    vocab = PRESETS[args.model].vocab
    generator = torch.Generator().manual_seed(0)
    sequences = [(torch.randn((len(r.completion_tokens), vocab), generator=generator) * 3,
                  torch.tensor(r.completion_tokens), r.sample_seed, r.sampling) for r in rollouts]
    if args.replay_at_once:
        sampler._REPLAY_BLOCK_ENTRIES = 1 << 62  # noqa: SLF001 (every row in one block: the replay before blocks)
    rss_before = rss_bytes()
    started, cpu_started = time.perf_counter(), time.process_time()
    sampler.replay_sequences(sequences, 0.0)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    return {"at_once": args.replay_at_once, "seconds": seconds, "cpu_seconds": cpu_seconds,
            "peak_rss_bytes": peak_bytes(), "rss_before_replay_bytes": rss_before,
            "logits_bytes": sum(z.numel() * 4 for z, _, _, _ in sequences)}


def run_part(args) -> dict:
    name, _, variant = args.part.partition(":")
    if name == "load":
        result = part_load(args)
    elif name == "generate":
        result = part_generate(args, int(variant))
    elif name == "verify":
        result = part_verify(args, int(variant))
    elif name == "grpo":
        result = part_grpo(args, variant)
    elif name == "replay":
        result = part_replay(args)
    elif name == "replay-memory":
        result = part_replay_memory(args)
    else:
        raise SystemExit(f"unknown part {args.part!r}")
    result.setdefault("peak_rss_bytes", peak_bytes())
    if args.device.startswith("cuda"):
        import torch

        result["peak_gpu_bytes"] = torch.cuda.max_memory_allocated()
        result["peak_gpu_reserved_bytes"] = torch.cuda.max_memory_reserved()
    return result


# -- the parent: one child per measurement ------------------------------------------------------


def child(args, part: str, *extra: str) -> dict:
    """Run one measurement in a process of its own; ``part@T`` runs it on T threads."""
    part, _, threads = part.partition("@")
    need = NEEDS_GIB[part.partition(":")[0]] if args.model == "qwen2.5-0.5b" else 2
    free = available_bytes()
    if free < need * GiB and not args.force:
        return {"skipped": f"needs {need} GiB available, MemAvailable was {free / GiB:.1f} GiB"}
    command = [sys.executable, __file__, "--part", part, "--model", args.model, "--new-tokens", str(args.new_tokens),
               "--work", args.work, "--threads", threads or str(args.threads),
               "--step-tokens", str(args.step_tokens), "--device", args.device, "--dtype", args.dtype,
               "--attention", args.attention, "--weights-cache", args.weights_cache, *extra]
    print("running", part, *extra, f"(MemAvailable {free / GiB:.1f} GiB)", flush=True)
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if done.returncode != 0:
        failed = {"failed": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}",
                  "exit_code": done.returncode}
        print("  ", json.dumps(failed), flush=True)
        return failed
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print("  ", json.dumps(result), flush=True)
    return result


#: Every measurement, in order. The step and its replay are compared at one thread, the
#: platform on which a replay must be bit-exact (vrl.rollouts.model.bit_exact_platform).
PARTS = ("load", "generate:1", "verify:1", "generate:8", "verify:8", "replay-memory", "replay-memory:at-once",
         *(f"grpo:{name}" for name in OPTIMIZERS), "grpo:adamw@1", "replay@1")
# (A replay is named replay@T, the step it replays grpo:adamw@T; with --step-tokens N both get /N.)
#: On a GPU: the thread count splits no GPU reduction, and the race replay's memory is the CPU's
#: (measured above), so the step and its replay run once, at the default thread count.
CUDA_PARTS = ("load", "generate:1", "verify:1", "generate:8", "verify:8", "grpo:adamw@2", "grpo:bf16-master",
              "replay@2")


def summary(results: dict) -> dict:
    """The ratios: verify / generate per batch, the replay against the step, the GRPO step's
    peaks in GiB."""
    out: dict = {}
    for batch in (1, 8):
        g, v = results.get(f"generate:{batch}", {}), results.get(f"verify:{batch}", {})
        if "seconds" in g and "seconds" in v:
            out[f"verify_over_generate_batch_{batch}"] = v["seconds"] / g["seconds"]
        if "cpu_seconds" in g and "cpu_seconds" in v:
            out[f"verify_over_generate_batch_{batch}_cpu"] = v["cpu_seconds"] / g["cpu_seconds"]
    for name, again in results.items():  # replay@T/N against grpo:adamw@T/N, the step it replays
        step = results.get("grpo:adamw" + name.removeprefix("replay"), {})
        if not name.startswith("replay@") or "seconds" not in step or "seconds" not in again:
            continue
        suffix = name.removeprefix("replay")
        out[f"replay_over_step{suffix}"] = again["seconds"] / step["seconds"]
        if "cpu_seconds" in step and "cpu_seconds" in again:
            out[f"replay_over_step_cpu{suffix}"] = again["cpu_seconds"] / step["cpu_seconds"]
        out[f"replay_bit_exact{suffix}"] = (step["model_hash"], step["optimizer_hash"]) == (
            again["model_hash"], again["optimizer_hash"])
    for name, result in results.items():
        if "peak_rss_bytes" in result:
            out[f"peak_rss_gib[{name}]"] = round(result["peak_rss_bytes"] / GiB, 2)
        if "peak_gpu_bytes" in result:
            out[f"peak_gpu_gib[{name}]"] = round(result["peak_gpu_bytes"] / GiB, 2)
    return out


def machine_of(args) -> str | dict:
    import torch

    if not args.device.startswith("cuda"):
        return (f"{os.cpu_count()} CPUs, {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}; "
                "shared with other jobs while measured")
    import transformers

    properties = torch.cuda.get_device_properties(0)
    return {"device": torch.cuda.get_device_name(0), "gpu_memory_bytes": properties.total_memory,
            "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
            "cpus": os.cpu_count(), "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated parts (default: all of them)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/qwen0.5b.json"))
    parser.add_argument("--work", default="", help="where the rollouts between parts are kept (default: beside --out)")
    parser.add_argument("--force", action="store_true", help="run parts even when MemAvailable is below their need")
    parser.add_argument("--step-tokens", type=int, default=0,
                        help="cut the group's completions to this many tokens for grpo and replay, or repeat "
                             "them to it (default: all)")
    parser.add_argument("--device", default="cpu", help="where the network runs: cpu, cuda (sampler: the CPU)")
    parser.add_argument("--dtype", default="float32", help="generation and verification dtype (the step: float32)")
    parser.add_argument("--attention", default="sdpa", choices=("sdpa", "eager"))
    parser.add_argument("--weights-cache", default="",
                        help="a folder for the preset's float32 weights, built once by the load part (default: none)")
    parser.add_argument("--part", default="", help=argparse.SUPPRESS)  # a child's one measurement
    parser.add_argument("--replay-at-once", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.part:
        print(json.dumps(run_part(args)))
        return
    suffix = "" if args.device == "cpu" else f"-{args.device}-{args.dtype}"
    args.work = args.work or str(Path(tempfile.gettempdir()) / f"vrl-scale-{args.model}-{args.new_tokens}{suffix}")
    Path(args.work).mkdir(parents=True, exist_ok=True)
    previous = json.loads(args.out.read_text()) if args.out.exists() else {}
    before = {"dtype": "float32", "device": "cpu", **previous.get("args", {})}  # files from before --device
    same = all(before.get(k) == getattr(args, k) for k in ("model", "new_tokens", "dtype", "device"))
    results = dict(previous.get("results", {})) if same else {}
    machine = machine_of(args)
    default_parts = CUDA_PARTS if args.device.startswith("cuda") else PARTS
    for part in args.only.split(",") if args.only else default_parts:
        stepped = args.step_tokens and part.startswith(("grpo", "replay@"))
        key = f"{part}/{args.step_tokens}" if stepped else part
        if part == "replay-memory:at-once":
            results[key] = child(args, "replay-memory", "--replay-at-once")
        else:
            results[key] = child(args, part)
        # Written after every part: a long run stopped midway keeps what it measured.
        # Other top-level keys a person added (notes, an earlier run's copied results) are kept.
        report = {**(previous if same else {}),
                  "args": {"model": args.model, "new_tokens": args.new_tokens, "threads": args.threads,
                           "dtype": args.dtype, "device": args.device, "attention": args.attention},
                  "machine": machine, "results": results, "summary": summary(results)}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(json.dumps(report["summary"], indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
