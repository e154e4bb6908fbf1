"""The detection table: our checks and the ``toploc`` package on the same hidden states, with
each statistic's honest drift beside the profile's tolerance (bench/calibrate.py sets them).

    python bench/detection.py --model small --dtype float32 --new-tokens 256
    python bench/detection.py --model tiny --dtype bfloat16

Honest rollouts are verified under every benign variation (prefill batch 1 vs padded 4, sdpa
vs eager attention, 1 vs 2 threads; the prover always decodes with a KV cache, the verifier
prefills). The worst honest value of every statistic is printed next to the tolerance of the
dtype's profile (specs/tolerances.json); then each attack is scored by both systems, with
the smallest value of each statistic over the attack's rollouts (its weakest rollout).
TOPLOC's verdict uses the paper's thresholds (<= 38 exponent mismatches, mean <= 10, median
<= 8 per 32-token chunk); its proofs are built with toploc's own code from the prover's rows.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

import vrl
from proofs import commitment
from vrl.harness.adversary import degraded
from vrl.rollouts.forward import decode, prefill
from vrl.rollouts.profiles import MEASURE_ONLY
from vrl.tasks import Task

console = Console(width=160)
STATS = ["commitment_miss_rate", "commitment_mantissa_error", "commitment_rows_fully_missed",
         "commitment_closing_misses", "race_margin_max", "logprob_error_max"]
LIMITS = {"commitment_miss_rate": "commitment_miss_rate", "commitment_mantissa_error": "commitment_mantissa_error",
          "commitment_rows_fully_missed": "commitment_rows_fully_missed",
          "commitment_closing_misses": "commitment_closing_misses", "race_margin_max": "race_margin",
          "logprob_error_max": "logprob_error"}


def honest_drift(model, rollouts) -> dict[str, dict[str, float]]:
    variations = {}
    before = torch.get_num_threads()
    eager = vrl.load_model(model.name, dtype=model.dtype_name,
                           attention="eager")
    for name, verifier, batch, threads in [("batch 1", model, 1, before), ("padded batch 4", model, 4, before),
                                           ("eager attention", eager, 4, before), ("1 thread", model, 4, 1),
                                           ("2 threads", model, 4, 2)]:
        torch.set_num_threads(threads)
        verdicts = vrl.verify(rollouts, verifier, batch_size=batch, tolerances=MEASURE_ONLY)
        variations[name] = {s: max(v.scores.get(s, 0.0) for v in verdicts) for s in STATS}
    torch.set_num_threads(before)
    return variations


def toploc_verdict(prover_rows: torch.Tensor, verifier_rows: torch.Tensor) -> bool | None:
    try:
        import toploc
    except ImportError:
        return None
    proofs = toploc.build_proofs_bytes(prover_rows.to(torch.bfloat16), 32, 128, skip_prefill=True)
    results = toploc.verify_proofs_bytes(verifier_rows.to(torch.bfloat16), proofs, 32, 128, skip_prefill=True)
    return all(r.exp_mismatches <= 38 and r.mant_err_mean <= 10 and r.mant_err_median <= 8 for r in results)


def detection(model, key, task_set, tasks, sampling, round_seed) -> list[dict]:
    """Each attack's rollouts, verified by us; TOPLOC judged on the very same prover rows."""
    rows = []

    def judge(name, claimed_rollouts, prover_hidden):
        verdicts = vrl.verify(claimed_rollouts, model)
        # Every statistic of every rollout (no stage stops early), for placing the thresholds:
        # an attack's weakest rollout is the one with the smallest value.
        measured = vrl.verify(claimed_rollouts, model, tolerances=MEASURE_ONLY)
        recomputed = prefill(model, [(list(r.prompt_tokens), list(r.completion_tokens)) for r in claimed_rollouts])
        toploc_ok = [toploc_verdict(h[:-1], p.hidden[:-1]) for h, p in zip(prover_hidden, recomputed)]
        rows.append({
            "condition": name,
            "ours_rejected": sum(not v.accepted for v in verdicts) / len(verdicts),
            "ours_stage": sorted({v.stage.name.lower() for v in verdicts if not v.accepted}),
            "toploc_rejected": None if None in toploc_ok else sum(not ok for ok in toploc_ok) / len(toploc_ok),
            "weakest": {stat: min(v.scores.get(stat, 0.0) for v in measured) for stat in STATS},
        })

    def run(prover):
        seeds = [vrl.sample_seed(round_seed, key.node_id, t.id, i) for t in tasks for i in range(4)]
        prompts = [prover.encode(t.prompt) for t in tasks for _ in range(4)]
        return decode(prover, prompts, seeds, sampling), prompts

    honest = vrl.generate(model, task_set, key, groups=len(tasks), round_seed=round_seed, sampling=sampling,
                          group_size=4)
    decoded, _ = run(model)
    judge("honest", honest, [d.hidden for d in decoded])
    for kind in ("other-model", "perturb-1pct", "int8", "int4"):
        cheap = degraded(model, kind)
        forged = [r.signed(key, model_hash=model.model_hash)
                  for r in vrl.generate(cheap, task_set, key, groups=len(tasks), round_seed=round_seed,
                                        sampling=sampling, group_size=4)]
        cheap_decoded, _ = run(cheap)
        judge(f"generated by {kind}", forged, [d.hidden for d in cheap_decoded])
        # The TOPLOC gap: the cheap model's tokens, committed by one honest prefill of ours.
        recommitted = [r.signed(key, commitment=vrl.commit(model, list(r.prompt_tokens), list(r.completion_tokens)))
                       for r in forged]
        pairs = [(list(r.prompt_tokens), list(r.completion_tokens)) for r in forged]
        honest_rows = [p.hidden for p in prefill(model, pairs)]
        judge(f"{kind} tokens + honest prefill commitment", recommitted, honest_rows)
    # The last token edited: the claimed model's honest rows, one token changed.
    edited, edited_rows = [], []
    for r, d in zip(honest, decoded):
        tokens = list(r.completion_tokens)
        tokens[-1] = (tokens[-1] + 7) % 256
        edited.append(r.signed(key, completion_tokens=tuple(tokens), finish_reason="length"
                               if tokens[-1] not in model.stop_token_ids else "stop"))
        edited_rows.append(d.hidden)
    judge("last completion token edited", edited, edited_rows)
    # Sign-flipped hidden states: TOPLOC ignores the sign bit.
    flipped = [r.signed(key, commitment=commitment.build(-d.hidden)) for r, d in zip(honest, decoded)]
    judge("sign-flipped hidden states", flipped, [-d.hidden for d in decoded])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args = parser.parse_args()
    model = vrl.load_model(args.model, dtype=args.dtype)
    key = vrl.NodeKey.from_seed(b"calibration".ljust(32, b"\0"))
    task_set = vrl.TaskList("calibrate", tuple(
        Task(f"c{i}", f"Question {i}: what is {i} times {i + 2}? ", str(i * (i + 2))) for i in range(args.tasks)))
    sampling = vrl.SamplingParams(1.0, 0, 1.0, args.new_tokens, model.stop_token_ids)
    round_seed = bytes(32)
    # The tasks the node is assigned, group by group, in the order generate() produces them.
    tasks = [vrl.assign(task_set, round_seed, key.node_id, g) for g in range(args.tasks)]
    rollouts = vrl.generate(model, task_set, key, groups=len(tasks), round_seed=round_seed, sampling=sampling,
                            group_size=4)
    profile = vrl.Tolerances.for_dtype(args.dtype)

    drift = honest_drift(model, rollouts)
    table = Table(title=f"honest drift: {args.model} {args.dtype}, {len(rollouts)} rollouts x {args.new_tokens} tokens")
    table.add_column("variation")
    for stat in STATS:
        table.add_column(stat.replace("commitment_", "c."), justify="right")
    for name, values in drift.items():
        table.add_row(name, *(f"{values[s]:.4g}" for s in STATS))
    worst = {s: max(v[s] for v in drift.values()) for s in STATS}
    table.add_row("[bold]worst honest", *(f"[bold]{worst[s]:.4g}" for s in STATS))
    table.add_row("[bold]tolerance", *(f"[bold]{getattr(profile, LIMITS[s]):.4g}" for s in STATS))
    console.print(table)
    headroom_ok = all(worst[s] <= getattr(profile, LIMITS[s]) for s in STATS)
    console.print(f"every honest value within tolerance: {'[green]yes' if headroom_ok else '[red]NO'}")

    rows = detection(model, key, task_set, tasks, sampling, round_seed)
    table = Table(title="detection: share of rollouts rejected (TOPLOC: paper thresholds, same prover rows)")
    weakest = ("commitment_miss_rate", "commitment_mantissa_error", "race_margin_max", "logprob_error_max")
    for column in ("condition", "vrl", "vrl stage", "toploc", *(f"weakest {s.replace('commitment_', 'c.')}"
                                                                 for s in weakest)):
        table.add_column(column)
    for row in rows:
        toploc = "n/a (toploc not installed)" if row["toploc_rejected"] is None else f"{row['toploc_rejected']:.2f}"
        table.add_row(row["condition"], f"{row['ours_rejected']:.2f}", ",".join(row["ours_stage"]), toploc,
                      *(f"{row['weakest'][s]:.3g}" for s in weakest))
    console.print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"detection-{args.model}-{args.dtype}.json"
    path.write_text(json.dumps({"drift": drift, "worst": worst, "tolerances": asdict(profile), "detection": rows},
                               indent=2))
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
