"""Combine bench/simulate.py --json runs into one results file: the per-node table by design and
N, each run's command, and the ratio of each per-node cost to the same design's smallest N
(issue 30: the committee design at N = 1,000 within 1.5x of N = 10).

    python bench/simulate_table.py --out bench/results/simulate-scale.json \\
        "python bench/simulate.py --nodes 10 --rounds 20 --design committee --json=/tmp/c10.json" ...

Each argument is COMMAND=PATH: the command that wrote the run, and the JSON it wrote (--out).
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="COMMAND=PATH")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    table: dict[str, dict[str, dict]] = {}
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
              "machine": f"{platform.machine()}, 2 cores shared with ~5 other helpers (load 10-15): cpu_seconds "
                         "is this process's own; wall_seconds is not comparable",
              "note": args.note, "designs": table}
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
