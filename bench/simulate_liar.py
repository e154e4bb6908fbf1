"""The trainer's loss-confirmation budget against liars, simulated (specs/committee.md §8 "Lost
races"; vrl/node/claims.py): members that check honestly but state every race lost on each
committee seat they pass (the simulator's ``liar`` adversary), run side by side with the budget
(``loss_claim_budget``, the default) and without it (0), the same seed and settings otherwise.

    python bench/simulate_liar.py --nodes 100 --rounds 6 --shares 0,0.1,0.3 \\
        --out bench/results/simulate-liar-budget.json

Per run: the trainer's checks per round (mean over the measured rounds, and each round's), its
rounds' lengths, how many liars the trainer quarantined, honest false quarantines, and the
checks the liars' claims asked for (``liar_charges``: the trainer's checks of groups on which a
liar, and no one else, stated lost races, counted as the protocol asks for them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from simulate import batch_groups_arg, batch_size, protocol_arg  # noqa: E402

from vrl.config import ConfigError  # noqa: E402
from vrl.harness.simulator import SimConfig, Simulation, SpecError, parse_adversaries  # noqa: E402
from vrl.node.params import ProtocolParams  # noqa: E402

console = Console(stderr=True)


def run_one(config: SimConfig) -> dict:
    """One run, counting the trainer's checks that liars' claims alone asked for: the protocol's
    own pick of whom a confirmation is charged to (vrl.node.claims.LossClaims.charge) is wrapped
    to count, not changed."""
    started = time.process_time()
    sim = Simulation(config)
    liars = {n.key.node_id for n in sim.nodes if n.kind == "liar"}
    trainer = sim.nodes[0].protocol
    charges = {"liar": 0, "other": 0}
    claims = trainer.rounds.claims
    charge = claims.charge

    def counted(round_, claim, budget):
        charges["liar" if claim.verifier in liars else "other"] += 1
        charge(round_, claim, budget)

    claims.charge = counted
    summary = sim.run().summary
    quarantined = sorted(sim.metrics.version_at(t) for (observer, subject), t in sim.metrics.quarantined_at.items()
                         if observer == 0 and subject in liars)
    return {
        "loss_claim_budget": trainer.config.loss_claim_budget,
        "trainer_checks_per_round": summary["per_node_trainer"].get("checks_per_round"),
        "trainer_verify_seconds_per_round": summary["per_node_trainer"].get("verify_seconds_per_round"),
        "member_checks_per_round": summary["per_node_others"].get("checks_per_round"),
        "per_round": [{"version": r["version"], "seconds": round(r["seconds"], 2)} for r in summary["per_round"]],
        "trainer_checks_by_round": _trainer_checks_by_round(sim),
        "loss_confirmations_charged": charges,
        "liars": len(liars),
        "liars_quarantined_by_trainer": len(liars & trainer.quarantined),
        "liar_quarantine_versions": quarantined,
        "honest_false_quarantines": summary["honest_false_quarantines"],
        "bad_groups_trained": summary["bad_groups_trained"],
        "groups_lost": summary["groups_lost"],
        "rounds_measured": summary["rounds_measured"],
        "stopped": summary["stopped"],
        "cpu_seconds": time.process_time() - started,
    }


def _trainer_checks_by_round(sim) -> list[float]:
    """The trainer's checks in each round (between two of its policy announcements)."""
    snapshots = sim.metrics.snapshots
    versions = sorted(snapshots)
    return [snapshots[b][1]["checks"][0] - snapshots[a][1]["checks"][0] for a, b in zip(versions, versions[1:])]


def shares_arg(text: str) -> list[float]:
    """``--shares``: comma-separated shares of the nodes in [0, 1) (0: a run with no liar)."""
    try:
        shares = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated numbers in [0, 1), got {text!r}") from None
    if not all(0 <= share < 1 for share in shares):  # NaN fails this too
        raise argparse.ArgumentTypeError(f"each share must be in [0, 1), got {text!r}")
    return shares


def budgets_arg(text: str) -> list[int]:
    """``--budgets``: comma-separated loss_claim_budget values (0: no budget)."""
    try:
        budgets = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated whole numbers, got {text!r}") from None
    if not all(0 <= budget <= 2**16 for budget in budgets):
        raise argparse.ArgumentTypeError(f"each budget must be in [0, 65536] (ProtocolParams), got {text!r}")
    return budgets


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--shares", default="0,0.1", type=shares_arg,
                        help="liars' shares of the nodes, comma-separated (0: none)")
    parser.add_argument("--budgets", default=f"{ProtocolParams.loss_claim_budget},0", type=budgets_arg,
                        help="loss_claim_budget values to run side by side (0: no budget)")
    parser.add_argument("--batch-groups", default="round", type=batch_groups_arg,
                        help="groups a step trains on: a number, or 'round' (every worker's round)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--protocol", type=protocol_arg, action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    batch = batch_size(args.batch_groups, args.nodes)
    out = {"what": __doc__.split("\n\n")[0].replace("\n", " "),
           "command": "python bench/simulate_liar.py " + " ".join(sys.argv[1:]),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores, shared with other jobs; one run at a time",
           "seats_per_member_per_round": "~k x groups_per_round x N_w / N_v (specs/committee.md §6)",
           "settings": {"nodes": args.nodes, "rounds": args.rounds, "warmup": args.warmup, "batch_groups": batch,
                        "seed": args.seed, "design": "committee", "protocol": dict(args.protocol)},
           "runs": {}}
    table = Table(title=f"N = {args.nodes}, committee design: liars against the trainer's loss confirmations")
    for column in ("liars", "budget", "trainer checks/round", "charged to liars", "liars quarantined",
                   "false quarantines", "CPU s"):
        table.add_column(column, justify="right")
    for share in args.shares:
        for budget in args.budgets:
            config = SimConfig(nodes=args.nodes, rounds=args.rounds, warmup=args.warmup, design="committee",
                               seed=args.seed, adversaries=parse_adversaries(f"liar:{share}" if share else ""),
                               admission={} if batch is None else {"batch_groups": batch},
                               protocol={**dict(args.protocol), "loss_claim_budget": budget})
            run = run_one(config)
            out["runs"][f"liar:{share}/budget:{budget}"] = run
            table.add_row(f"{share:.0%}", str(budget) if budget else "none",
                          f"{run['trainer_checks_per_round']:.1f}", str(run["loss_confirmations_charged"]["liar"]),
                          f"{run['liars_quarantined_by_trainer']} of {run['liars']}",
                          str(run["honest_false_quarantines"]), f"{run['cpu_seconds']:.0f}")
            args.out.write_text(json.dumps(out, indent=1, sort_keys=True, default=str) + "\n")
    console.print(table)
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (SpecError, ConfigError) as error:
        console.print(f"[red]{error}[/]")
        sys.exit(2)
