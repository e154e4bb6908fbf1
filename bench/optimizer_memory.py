"""Peak memory of serializing a step's optimizer state and of the replay's comparison
(:func:`vrl.rl.step.optimizer_bytes`, :func:`vrl.rl.step.compare`), each in a process of its
own so that its peak RSS is its own, against the state's size.

    python bench/optimizer_memory.py                                # the 2-layer 0.5B shape
    python bench/optimizer_memory.py --model qwen2.5-0.5b           # the full one (about 12 GiB)

The state is AdamW's after one step on random gradients: its size, not its values, is what
the copies cost. Writes bench/results/optimizer-memory.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from process_memory import peak_bytes, reset_peak, rss_bytes  # noqa: E402

GiB = 1 << 30
RESULTS = Path(__file__).resolve().parent / "results" / "optimizer-memory.json"


def measure(model_name: str, what: str) -> dict:
    import torch

    import vrl
    from vrl.rl import step

    model = vrl.load_model(model_name)
    network = model.network
    optimizer = torch.optim.AdamW(network.parameters(), lr=1e-6, fused=True)
    generator = torch.Generator().manual_seed(0)
    for p in network.parameters():
        p.grad = torch.randn(p.shape, generator=generator) * 1e-3
    optimizer.step()
    for p in network.parameters():
        p.grad = None
    state_bytes = sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values())
    if what == "compare:now":  # what a replay is handed: the parent's file, the claimed file and weights
        parent_file = step.optimizer_bytes(network, optimizer)
        claimed_file = bytes(parent_file)  # (here the same state)
        claimed = {k: v.detach().clone() for k, v in network.state_dict().items()}
    reset_peak()
    before = rss_bytes()
    if what == "bytes:now":
        data = step.optimizer_bytes(network, optimizer)
    elif what == "compare:now":
        data = step.compare(network, parent_file, network, optimizer, claimed, claimed_file, {}).optimizer_hash
    else:
        raise SystemExit(f"unknown measurement {what!r}")
    del data
    peak = peak_bytes()
    return {"what": what, "optimizer_state_bytes": state_bytes, "rss_before_bytes": before, "peak_rss_bytes": peak,
            "peak_over_state": (peak - before) / state_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-0.5b-2layer")
    parser.add_argument("--part", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        print(json.dumps(measure(args.model, args.part)))
        return
    results = {}
    for part in ("bytes:now", "compare:now"):
        done = subprocess.run([sys.executable, __file__, "--model", args.model, "--part", part], capture_output=True,
                              text=True, check=True)
        results[part] = json.loads(done.stdout.strip().splitlines()[-1])
        print(part, f"peak {results[part]['peak_rss_bytes'] / GiB:.2f} GiB, "
              f"{results[part]['peak_over_state']:.2f} x the state above the baseline", flush=True)
    out = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    out[args.model] = {"command": " ".join(["python bench/optimizer_memory.py", *sys.argv[1:]]), "results": results,
                       "machine": "2 cores and 24 GiB shared with other jobs; memory, not time, is measured"}
    RESULTS.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
