"""Combine bench/simulate.py --json runs into one results file: the per-node table by design and
N, each run's command, and the ratio of each per-node cost to the same design's smallest N
(issue 30: the committee design at N = 1,000 within 1.5x of N = 10).

    python bench/simulate_table.py --out bench/results/simulate-scale.json \\
        "python bench/simulate.py --nodes 10 --rounds 20 --design committee --json=/tmp/c10.json" ...

Each argument is COMMAND=PATH: the command that wrote the run, and the JSON it wrote (--out).
``--tickets-floor 100,1000`` adds, for N where the ticket design cannot be simulated here, the
least it costs a node a round by its own rules (:func:`tickets_floor`), labelled as arithmetic.
``--into`` adds runs to the file ``--out`` names instead of writing a new one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from vrl.harness.simulator.payloads import Records  # noqa: E402
from vrl.harness.simulator.spec import SimConfig  # noqa: E402
from vrl.node.messages import Outcome, SignedVerdict, audit_ticket  # noqa: E402
from vrl.node.params import ProtocolParams  # noqa: E402
from vrl.node.reputation import ReputationConfig  # noqa: E402
from vrl.rollouts.keys import NodeKey  # noqa: E402

COLUMNS = ("checks_per_round", "verify_seconds_per_round", "bytes_in", "bytes_out", "bytes_per_round",
           "bytes_per_round_without_blobs", "blob_bytes", "backfill_bytes", "messages_per_round",
           "protocol_cpu_seconds_per_round")
KEPT = ("nodes", "design", "rounds_requested", "rounds_measured", "stopped", "cpu_seconds", "wall_seconds",
        "simulated_seconds", "trainer_version", "honest_false_quarantines", "bad_groups_trained", "groups_lost",
        "actions", "unhandled")


def row(run: dict) -> dict:
    out = {key: run.get(key) for key in KEPT}
    for who in ("per_node", "per_node_others", "per_node_trainer"):
        values = run.get(who) or {}
        out[who] = {c: values.get(c) for c in COLUMNS if c in values}
    return out


def tickets_floor(nodes: int) -> dict:
    """The ticket design's least per-node cost a round at ``nodes`` (specs/network.md §3.2, §5):
    every group is gossiped to every node, and every verifier publishes a verdict (a check or a
    signed skip) on every group of another producer, also gossiped to every node; a verifier
    checks each producer's groups at that producer's rate, at least ``check_floor``. So a node
    receives at least ``G`` groups and ``G (N - 2)`` verdicts, ``G = groups_per_round (N - 1)``,
    and checks at least ``check_floor x G``; weights, forwards, backfill and the newcomer checks
    (every producer's first ``newcomer_checks`` groups, by everyone) come on top. Sizes are the
    simulator's real messages (the devnet's record shape)."""
    key = NodeKey.from_seed(bytes(32))
    group = Records(SimConfig()).group(key, 3, 0)
    verdict = SignedVerdict(key.node_id, key.node_id, group.digest, 3, 3, audit_ticket(key, group.digest), 0.1,
                            Outcome.SKIPPED, (), b"", "torch-2.13.0/cpu-AVX512/float32/sdpa/threads-1").signed(key)
    groups = ProtocolParams().groups_per_round * (nodes - 1)
    verdicts = groups * (nodes - 2)
    received = groups * len(group.to_bytes()) + verdicts * len(verdict.to_bytes())
    return {"nodes": nodes, "design": "tickets", "kind": "arithmetic lower bound, not simulated",
            "checks_per_round_at_least": ReputationConfig().check_floor * groups,
            "bytes_in_per_round_at_least": received, "messages_in_per_round_at_least": groups + verdicts,
            "group_bytes": len(group.to_bytes()), "verdict_bytes": len(verdict.to_bytes()),
            "newcomer_checks_per_verifier": ReputationConfig().newcomer_checks * (nodes - 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="COMMAND=PATH")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--note", default="")
    parser.add_argument("--tickets-floor", default="", help="node counts, e.g. 100,1000")
    parser.add_argument("--into", action="store_true",
                        help="add the runs to --out's table: a row of the same design and N is replaced, the "
                             "rest kept, ratios recomputed")
    args = parser.parse_args()
    earlier = json.loads(args.out.read_text()) if args.into else {}
    table: dict[str, dict[str, dict]] = earlier.get("designs", {})
    for spec in args.runs:
        command, _, path = spec.rpartition("=")
        run = json.loads(Path(path).read_text())
        entry = row(run)
        entry["command"] = command
        table.setdefault(run["design"], {})[str(run["nodes"])] = entry
    for runs in table.values():
        smallest = runs[min(runs, key=int)]
        base = smallest["per_node_others"] or smallest["per_node"]
        for entry in runs.values():
            mine = entry["per_node_others"] or entry["per_node"]
            entry["ratio_to_smallest_n"] = {c: (mine[c] / base[c] if base.get(c) and mine.get(c) is not None else None)
                                            for c in COLUMNS if c in mine}
    result = {"what": "per node and per round, means over nodes and measured rounds (bench/simulate.py); "
                      "per_node_others excludes the trainer, whose load grows with N by design "
                      "(specs/network.md §3.5); ratios are per_node_others against the design's smallest N",
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, shared with whatever else ran: "
                         "cpu_seconds is each run's own; wall_seconds is not comparable",
              "note": args.note or earlier.get("note", ""), "designs": table,
              "tickets_floor": {**earlier.get("tickets_floor", {}),
                                **{n: tickets_floor(int(n)) for n in args.tickets_floor.split(",") if n}}}
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
