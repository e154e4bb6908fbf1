"""What checking costs, as ratios measured side by side in one run.

    python bench/cost.py                      # small preset, 256 new tokens, float32
    python bench/cost.py --model tiny --new-tokens 64

Prints, per generation batch size:
* generation time per token (KV-cache decode with the canonical sampler);
* commitment building as a share of generation time;
* verification time per token (``vrl.verify``: one batched prefill plus every check);
* generation / verification, the cheapness of checking;
* commitment bytes per token, ours against TOPLOC's 258 bytes per 32 tokens.
Absolute times on a shared 2-core machine are noisy; the ratios are the result.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

import vrl
from vrl.rollouts.generate import GenerationStats
from vrl.tasks import Task

TOPLOC_BYTES_PER_TOKEN = 258 / 32


def measure(model, key, batch: int, new_tokens: int) -> dict:
    # Stop tokens present but the random-init presets rarely sample them: full-length rollouts.
    sampling = vrl.SamplingParams(1.0, 0, 1.0, new_tokens, model.stop_token_ids)
    tasks = vrl.TaskList("cost", tuple(Task(f"b{batch}-{i}", f"Prompt number {i} with some words in it. ", "x")
                                       for i in range(batch)))
    stats = GenerationStats()
    started = time.perf_counter()
    rollouts = vrl.generate(model, tasks, key, round_seed=bytes(32), sampling=sampling, groups=batch, group_size=1,
                            batch_size=batch, stats=stats)
    generation = time.perf_counter() - started
    started = time.perf_counter()
    verdicts = vrl.verify(rollouts, model, batch_size=4)
    verification = time.perf_counter() - started
    assert all(v.accepted for v in verdicts), [v.message for v in verdicts if not v.accepted]
    return {
        "batch": batch, "tokens": stats.tokens,
        "generation_ms_per_token": 1000 * generation / stats.tokens,
        "commit_share_of_generation": stats.commit_seconds / generation,
        "verification_ms_per_token": 1000 * verification / stats.tokens,
        "generation_over_verification": generation / verification,
        "commitment_bytes_per_token": stats.commitment_bytes / stats.tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="small")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--batches", default="1,8", help="generation batch sizes to measure")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = vrl.load_model(args.model, dtype=args.dtype)
    key = vrl.NodeKey.from_seed(b"cost".ljust(32, b"\0"))
    model.model_hash  # noqa: B018 (hashed once, outside the timings)
    measure(model, key, 1, 8)  # warm-up: first-call allocations and kernel selection
    rows = [measure(model, key, int(b), args.new_tokens) for b in args.batches.split(",")]

    console = Console(width=150)
    table = Table(title=f"cost: {args.model} {args.dtype}, {args.new_tokens} new tokens, {args.threads} threads")
    for column in ("gen batch", "tokens", "gen ms/token", "verify ms/token", "gen / verify",
                   "commit share of gen", "commit B/token", "TOPLOC B/token"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(str(r["batch"]), str(r["tokens"]), f"{r['generation_ms_per_token']:.2f}",
                      f"{r['verification_ms_per_token']:.2f}", f"{r['generation_over_verification']:.1f}x",
                      f"{100 * r['commit_share_of_generation']:.2f}%", f"{r['commitment_bytes_per_token']:.2f}",
                      f"{TOPLOC_BYTES_PER_TOKEN:.2f}")
    console.print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"cost-{args.model}-{args.dtype}.json"
    path.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2))
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
