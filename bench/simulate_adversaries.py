"""Every adversary at 10%, 30% and 45% of the nodes, simulated (issue 30's "rounds to
quarantine for every adversary"): the real NodeProtocol state machines of vrl.harness.simulator,
one run per adversary family and share, each with the same seed and settings.

Families (each run holds one; the devnet's content cheats share their family's nodes equally):

* ``content``: the devnet's cheats on a group's content (quantized-model, other-model,
  tampered-tokens, replay, spoof-int8), each a fifth of the share;
* ``fabricated-reward``, ``collude`` (workers that fabricate rewards and, as verifiers, pass each
  other's bad groups), ``lazy`` (verifiers that pass without checking), ``withhold`` (workers
  that submit half their assigned groups), ``sybil`` (a flood of fresh keys each round);
* ``spoof``: spoof-int8 at the whole share, the cheat only the sequential tests see; how fast
  they see it is the spoofer's token count (``--completion-tokens``, specs/verification.md §7.1).

For each run: rounds from a cheater's first bad group to its quarantine by the trainer (median
over the cheaters it quarantined, and how many), honest false quarantines (must be 0), bad
groups trained (must be 0 below the bound f* of specs/committee.md §5), groups lost.

    python bench/simulate_adversaries.py --nodes 100 --rounds 12 --batch-groups round \\
        --out bench/results/simulate-adversaries-committee.json
    python bench/simulate_adversaries.py --nodes 100 --rounds 30 --families spoof --jobs 2 \\
        --out bench/results/simulate-adversaries-spoof.json

Runs are independent: ``--jobs J`` runs J at once, one process each.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from simulate import batch_groups_arg, batch_size, jobs_arg, protocol_arg, tokens_arg, tokens_from  # noqa: E402

from vrl.config import ConfigError  # noqa: E402
from vrl.harness.simulator import SimConfig, Simulation, SpecError, parse_adversaries  # noqa: E402
from vrl.node.committee import EPSILON, F_STAR  # noqa: E402

console = Console(stderr=True)
CONTENT = ("quantized-model", "other-model", "tampered-tokens", "replay", "spoof-int8")
FAMILIES = ("content", "fabricated-reward", "collude", "lazy", "withhold", "sybil", "spoof", "accuse")
KEPT = ("adversaries", "rounds_measured", "stopped", "cpu_seconds", "wall_seconds", "simulated_seconds",
        "rounds_to_quarantine", "honest_false_quarantines", "bad_groups_trained", "bad_groups_trained_by_kind",
        "trained_by_kind",
        "groups_lost", "groups_pending", "rounds_never_closed", "honest_groups_published", "withheld_groups",
        "withholding", "sybil", "per_node_others")


def spec(family: str, share: float) -> str:
    if family == "content":
        return ",".join(f"{kind}:{share / len(CONTENT):.4f}" for kind in CONTENT)
    if family == "spoof":
        return f"spoof-int8:{share}"
    return f"{family}:{share}"


def simulate(config: SimConfig, cpu_limit: float | None) -> tuple[dict, float]:
    """One run (in a worker process under --jobs): its kept summary and its wall seconds."""
    started = time.perf_counter()
    summary = Simulation(config).run(cpu_limit_s=cpu_limit).summary
    return {key: summary.get(key) for key in KEPT}, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--design", default="committee")
    parser.add_argument("--shares", default="0.1,0.3,0.45")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--batch-groups", default="round", type=batch_groups_arg,
                        help="groups a step trains on: a number, or 'round' (every worker's round)")
    parser.add_argument("--cpu-limit", type=float, default=None, help="per run, CPU seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--completion-tokens", type=tokens_arg, default=None,
                        help="mean completion tokens a record (default: the devnet's base model's, 4)")
    parser.add_argument("--jobs", type=jobs_arg, default=1, help="runs at once, one process each")
    parser.add_argument("--protocol", type=protocol_arg, action="append", default=[], metavar="KEY=VALUE",
                        help="a protocol parameter (vrl.node.params.ProtocolParams), e.g. submission_window=120")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    batch = batch_size(args.batch_groups, args.nodes)
    out = {"what": __doc__.split("\n\n")[0].replace("\n", " "),
           "command": "python bench/simulate_adversaries.py " + " ".join(sys.argv[1:]),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores, {args.jobs} runs at once; cpu_seconds is each "
                      "run's own",
           "f_bound": f"specs/committee.md §5: f* = {F_STAR} of verifier weight, eps = {EPSILON}",
           "settings": {"nodes": args.nodes, "rounds": args.rounds, "warmup": args.warmup, "design": args.design,
                        "batch_groups": batch, "seed": args.seed, "completion_tokens": args.completion_tokens
                        or SimConfig.completion_tokens, "protocol": dict(args.protocol)},
           "runs": {}}
    table = Table(title=f"N = {args.nodes}, {args.design}: rounds from first bad group to the trainer's quarantine")
    for column in ("adversary", "share", "cheaters", "quarantined", "median rounds", "weight at the end",
                   "false quarantines", "bad trained", "groups lost", "CPU s"):
        table.add_column(column, justify="right")
    runs = [(family, share, SimConfig(nodes=args.nodes, rounds=args.rounds, warmup=args.warmup, design=args.design,
                                      seed=args.seed, adversaries=parse_adversaries(spec(family, share)),
                                      admission={} if batch is None else {"batch_groups": batch},
                                      protocol=dict(args.protocol),
                                      **tokens_from(args.completion_tokens)))
            for family in args.families.split(",") for share in (float(s) for s in args.shares.split(","))]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(simulate, config, args.cpu_limit) for _, _, config in runs]
        for (family, share, _), future in zip(runs, futures):
            run, wall = future.result()
            run["spec"] = spec(family, share)
            out["runs"][f"{family}:{share}"] = run
            quarantine = run["rounds_to_quarantine"] or {}
            cheaters = sum(r["nodes"] for r in quarantine.values())
            caught = sum(r["quarantined_by_trainer"] for r in quarantine.values())
            medians = ", ".join(f"{k} {r['median_rounds_trainer']}" for k, r in quarantine.items())
            # Their share of the last manifest's draw weight: the f of specs/committee.md §5.
            weight = sum(r.get("weight_share", 0.0) for r in quarantine.values())
            table.add_row(family, f"{share:.0%}", str(cheaters), str(caught), medians or "-", f"{weight:.2f}",
                          str(run["honest_false_quarantines"]), str(run["bad_groups_trained"]),
                          str(run["groups_lost"]), f"{run['cpu_seconds']:.0f}")
            console.print(f"[dim]{family} {share:.0%}: {run['rounds_measured']} rounds, {run['stopped']}, "
                          f"{wall:.0f} s wall[/]")
            args.out.write_text(json.dumps(out, indent=1, sort_keys=True, default=str) + "\n")
    console.print(table)
    console.print(f"wrote {args.out}")
    return 0


def run() -> int:
    try:
        return main()
    except (SpecError, ConfigError) as error:  # a setting out of its range names itself
        console.print(f"[red]{error}[/]")
        return 2


if __name__ == "__main__":
    sys.exit(run())
