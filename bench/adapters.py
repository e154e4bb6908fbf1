"""Adapter bytes per policy version (vrl/rl/adapters.py, specs/adapters.md) against the full
weights file and against a zstd weights delta (vrl/node/deltas.py), on the project's base model
and on the 0.5B shape, at LoRA ranks 8, 16 and 32 (issue 48, item 3: "so a verifier fetches
megabytes, not the model").

    python bench/adapters.py                         # base and qwen2.5-0.5b, ranks 8/16/32, a table
    python bench/adapters.py --json                  # one JSON object instead
    python bench/adapters.py --build-large           # build the 0.5B shape for real (about 2 GB)
    python bench/adapters.py --out bench/results/adapters.json   # the table, and the JSON written there

What is measured, per model:

* ``full_bytes``: the float32 weights file (``vrl.node.weights.to_blob``), and its bfloat16 cast.
* ``delta_bytes``: a weights delta (``vrl.node.deltas.encode``) of one optimizer step, float32 and
  the bfloat16 cast of parent and child. On the base model it is measured here: a seeded
  language-model loss on random tokens, AdamW at ``vrl train``'s learning rate (2e-5), the second
  of two steps (Adam moves each weight by about the learning rate whatever the loss, so the
  delta's size depends little on where the gradient came from; bench/delta.py). On the 0.5B shape
  a full-weights step is 44 s and 15 GiB here, so the delta is the one bench/delta.py recorded
  for a real GRPO step of it (bench/results/delta-qwen2.5-0.5b.json, read, and named as such).
* ``adapter_bytes``: the adapter blob of each rank (the default spec: every linear layer of the
  block, alpha 32). Its size is a function of the shapes alone (vrl.rl.adapters.blob_size); where
  the model is built the blob is made and its length checked against that. On the base model the
  adapter is also stepped twice (AdamW at 2e-4, ten times the full learning rate, as LoRA Without
  Regret prescribes), and ``adapter_delta_bytes`` is the weights delta between its last two
  versions, since an adapter blob is a safetensors file too.

Without ``--build-large`` the 0.5B shape is built on the meta device (shapes, no memory), and
its ``full_bytes`` is the data section from the shapes plus the safetensors header as its JSON
is long (offsets written in another order may change it by a few bytes; checked on the base
model against the real file). Sizes are exact; nothing here is timed but the build.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from vrl.node import deltas, weights  # noqa: E402
from vrl.rl.adapters import AdapterSpec, attach, blob_size, snapshot  # noqa: E402
from vrl.rollouts.model import ModelError, load_model  # noqa: E402
from vrl.rollouts.presets import build_preset  # noqa: E402

RECORDED_DELTA = ROOT / "bench" / "results" / "delta-qwen2.5-0.5b.json"
FULL_LR = 2e-5  # vrl train's learning rate (TrainConfig), which bench/delta.py's steps used
ADAPTER_LR = 2e-4  # ten times it: LoRA Without Regret's rule for LoRA's learning rate


def header_bytes(state: dict[str, torch.Tensor], dtype: str) -> int:
    """The length of a safetensors header for these names and shapes (compact JSON, space-padded
    to 8), as safetensors writes one; offsets in name order."""
    width = {"F32": 4, "BF16": 2}[dtype]
    entries, at = {}, 0
    for name, tensor in sorted(state.items()):
        end = at + width * tensor.numel()
        entries[name] = {"dtype": dtype, "shape": list(tensor.shape), "data_offsets": [at, end]}
        at = end
    text = len(json.dumps(entries, separators=(",", ":")))
    return 8 + text + (-(8 + text) % 8)


def shape_bytes(network: torch.nn.Module, dtype: str) -> int:
    state = network.state_dict()
    width = {"F32": 4, "BF16": 2}[dtype]
    return header_bytes(state, dtype) + width * sum(t.numel() for t in state.values())


def lm_step(parameters: list[torch.nn.Parameter], forward, optimizer: torch.optim.Optimizer, seed: int,
            vocab: int) -> None:
    """One AdamW step on the language-model loss of a seeded batch of random tokens."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (4, 32), generator=generator)
    loss = forward(input_ids=ids, labels=ids).loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(parameters, 1.0)
    optimizer.step()


def cast(blob_network: torch.nn.Module, dtype: torch.dtype) -> bytes:
    from safetensors.torch import save

    return save({k: v.detach().to(dtype).contiguous().clone() for k, v in blob_network.state_dict().items()})


def measure_built(name: str, ranks: list[int]) -> dict:
    """Everything measured on a built model: the full file, a full step's delta, each rank's adapter."""
    try:
        base = load_model(name)
    except ModelError as error:
        raise SystemExit(f"{error}") from None
    vocab = base.vocab_size
    full = weights.to_blob(base)
    assert len(full) == shape_bytes(base.network, "F32"), "the header estimate is not the real file's length"
    result: dict = {"model": name, "model_hash": base.model_hash.hex(), "built": True,
                    "parameters": sum(p.numel() for p in base.network.parameters()),
                    "full_bytes": {"float32": len(full), "bfloat16": len(cast(base.network, torch.bfloat16))}}
    # A full-weights step of the base: the parent is the weights after one step, the child after two.
    model = load_model(name)
    network = model.network.train().requires_grad_(True)
    parameters = list(network.parameters())
    optimizer = torch.optim.AdamW(parameters, lr=FULL_LR, weight_decay=0.0)
    lm_step(parameters, network, optimizer, 1, vocab)
    parents = {"float32": cast(network, torch.float32), "bfloat16": cast(network, torch.bfloat16)}
    lm_step(parameters, network, optimizer, 2, vocab)
    children = {"float32": cast(network, torch.float32), "bfloat16": cast(network, torch.bfloat16)}
    result["delta_bytes"] = {d: len(deltas.encode(parents[d], children[d])) for d in parents}
    result["delta_source"] = f"measured: AdamW lr {FULL_LR}, the second of two steps on a seeded LM loss"
    del model, network, optimizer, parents, children
    result["adapters"] = {}
    for rank in ranks:
        spec = AdapterSpec(rank=rank)
        peft_model = attach(base, spec, seed=0)
        live = [p for p in peft_model.parameters() if p.requires_grad]
        peft_model.train()
        optimizer = torch.optim.AdamW(live, lr=ADAPTER_LR, weight_decay=0.0)
        lm_step(live, peft_model, optimizer, 1, vocab)
        parent = snapshot(peft_model, spec, base).blob
        lm_step(live, peft_model, optimizer, 2, vocab)
        child = snapshot(peft_model, spec, base)
        assert len(child.blob) == blob_size(base.network, spec), "an adapter's length is not its shapes'"
        result["adapters"][rank] = {"adapter_bytes": len(child.blob),
                                    "parameters": sum(t.numel() for t in child.tensors.values()),
                                    "adapter_delta_bytes": len(deltas.encode(parent, child.blob))}
        del peft_model, optimizer, live
    return result


def measure_large(name: str, ranks: list[int], build: bool) -> dict:
    """The 0.5B shape: sizes from its shapes (or, with ``build``, from the real files), and the
    full-weights delta bench/delta.py recorded for it."""
    started = time.perf_counter()
    if build:
        base = load_model(name)
        network = base.network
        full_f32 = len(weights.to_blob(base))
    else:
        with torch.device("meta"):
            network, _ = build_preset(name)
        full_f32 = shape_bytes(network, "F32")
    result: dict = {"model": name, "built": build, "build_seconds": round(time.perf_counter() - started, 1),
                    "parameters": sum(p.numel() for p in network.parameters()),
                    "full_bytes": {"float32": full_f32, "bfloat16": shape_bytes(network, "BF16")}}
    recorded = json.loads(RECORDED_DELTA.read_text()) if RECORDED_DELTA.exists() else None
    if recorded is not None and recorded.get("model") == name:
        step = recorded["steps"][-1]["dtypes"]
        result["delta_bytes"] = {d: step[d]["candidates"]["xor-planes-zstd-3 (vrl.node.deltas)"]["bytes"]
                                 for d in ("float32", "bfloat16")}
        result["recorded_full_bytes"] = {d: step[d]["full_bytes"] for d in ("float32", "bfloat16")}
        result["delta_source"] = f"recorded: {RECORDED_DELTA.relative_to(ROOT)} ({recorded['command']})"
    result["adapters"] = {}
    for rank in ranks:
        spec = AdapterSpec(rank=rank)
        size = blob_size(network, spec)
        entry = {"adapter_bytes": size, "parameters": rank * sum(
            m.in_features + m.out_features for path, m in network.named_modules()
            if isinstance(m, torch.nn.Linear) and path.rsplit(".", 1)[-1] in spec.target_modules)}
        if build:
            blob = snapshot(attach(base, spec, seed=0), spec, base).blob
            assert len(blob) == size, "an adapter's length is not its shapes'"
        result["adapters"][rank] = entry
    return result


def ratios(result: dict) -> None:
    for entry in result["adapters"].values():
        size = entry["adapter_bytes"]
        entry["of_full"] = {d: size / b for d, b in result["full_bytes"].items()}
        if "delta_bytes" in result:
            entry["of_delta"] = {d: size / b for d, b in result["delta_bytes"].items()}


def table(results: list[dict]) -> str:
    def mb(n: float) -> str:
        return f"{n / 1e6:,.2f} MB" if n < 1e9 else f"{n / 1e9:,.3f} GB"

    lines = ["| model | rank | adapter | / full f32 | / full bf16 | / delta f32 | / delta bf16 | adapter delta |",
             "|---|---|---|---|---|---|---|---|"]
    for result in results:
        full, delta = result["full_bytes"], result.get("delta_bytes", {})
        lines.append(f"| {result['model']} (full f32 {mb(full['float32'])}, bf16 {mb(full['bfloat16'])}; "
                     f"delta f32 {mb(delta.get('float32', math.nan))}, bf16 {mb(delta.get('bfloat16', math.nan))}) "
                     "| | | | | | | |")
        for rank, entry in result["adapters"].items():
            of_delta = entry.get("of_delta", {})
            adapter_delta = entry.get("adapter_delta_bytes")
            stepped = f"{mb(adapter_delta)} ({adapter_delta / entry['adapter_bytes']:.2f})" if adapter_delta else "n/a"
            lines.append(
                f"| | {rank} | {mb(entry['adapter_bytes'])} | {entry['of_full']['float32']:.4f} | "
                f"{entry['of_full']['bfloat16']:.4f} | {of_delta.get('float32', math.nan):.4f} | "
                f"{of_delta.get('bfloat16', math.nan):.4f} | {stepped} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="base", help="the built model measured in full (base, or a preset)")
    parser.add_argument("--large", default="qwen2.5-0.5b", help="the large shape measured from its shapes")
    parser.add_argument("--ranks", default="8,16,32", help="comma-separated LoRA ranks")
    parser.add_argument("--build-large", action="store_true", help="build the large shape for real (2 GB a copy)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON object there "
                        "(bench/results/adapters.json holds the committed run)")
    args = parser.parse_args()
    ranks = [int(r) for r in args.ranks.split(",")]
    torch.manual_seed(0)
    results = [measure_built(args.model, ranks), measure_large(args.large, ranks, args.build_large)]
    for result in results:
        ratios(result)
    summary = {"results": results, "spec": "AdapterSpec(rank=r): alpha 32, every linear layer of the block, float32",
               "command": "python " + " ".join(sys.argv)}
    print(json.dumps(summary, indent=2) if args.json else table(results))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
