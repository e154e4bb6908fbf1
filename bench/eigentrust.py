"""Where a reputation view's EigenTrust should run dense: the sparse (scipy) and the dense
(numpy) power iteration of ``vrl.node.reputation._eigentrust`` timed side by side on the same
reports, for views of 1 to 1,024 nodes.

    python bench/eigentrust.py [--repeats 20]

Each view holds ``nodes`` nodes, 3 of them pre-trusted, and 4 reports per node (a member's
handful of failures and its own checks; the trainer's view at N = 1,000 holds ~10^6 and is
sparse whatever the cutoff). The row "0 reports" is the view of a member that heard of no
failure, the common case at N = 1,000 (bench/simulate.py): the walk never leaves the anchors.
Each figure is the median of ``--repeats`` recomputations. Results:
``bench/results/eigentrust.json``; the cutoff they support is ``reputation.DENSE_NODES``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vrl.node.messages import Outcome  # noqa: E402
from vrl.node.reputation import DENSE_NODES, Report, ReputationConfig, _eigentrust  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
OUTCOMES = (Outcome.PASS, Outcome.PASS, Outcome.PASS, Outcome.SOFT_FAIL, Outcome.HARD_FAIL)


def view(nodes: int, per_node: int, rng: random.Random) -> tuple[list[Report], frozenset[bytes]]:
    ids = [rng.randbytes(32) for _ in range(max(nodes, 2))]
    reports = sorted((Report(rng.randrange(8), rng.choice(ids), rng.choice(ids), rng.randbytes(32),
                             rng.choice(OUTCOMES)) for _ in range(per_node * nodes)), key=Report.sort_key)
    return [r for r in reports if r.reporter != r.subject], frozenset(ids[:3])


def seconds(reports, pretrusted, dense_nodes: int, repeats: int) -> float:
    config = ReputationConfig()

    def decay(at: int) -> float:
        return 0.9 ** (8 - at)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        _eigentrust(reports, pretrusted, decay, config, dense_nodes=dense_nodes)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    rng = random.Random(0)
    rows = []
    for nodes, per_node in ((3, 0), (4, 4), (8, 4), (16, 4), (32, 4), (64, 4), (128, 4), (256, 4), (1024, 4)):
        reports, pretrusted = view(nodes, per_node, rng)
        sparse = seconds(reports, pretrusted, 0, args.repeats)
        dense = seconds(reports, pretrusted, nodes, args.repeats)
        rows.append({"nodes": nodes, "reports": len(reports), "sparse_ms": sparse * 1e3, "dense_ms": dense * 1e3,
                     "dense_over_sparse": dense / sparse})
    table = Table(title=f"EigenTrust recomputation, median of {args.repeats} (cutoff DENSE_NODES = {DENSE_NODES})")
    for column in ("nodes", "reports", "sparse ms", "dense ms", "dense / sparse"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(str(r["nodes"]), str(r["reports"]), f"{r['sparse_ms']:.3f}", f"{r['dense_ms']:.3f}",
                      f"{r['dense_over_sparse']:.2f}")
    Console().print(table)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "eigentrust.json"
    out.write_text(json.dumps({"machine": {"processor": platform.processor() or platform.machine(),
                                           "cpus": os.cpu_count()},
                               "repeats": args.repeats, "dense_nodes": DENSE_NODES, "rows": rows}, indent=1) + "\n")
    Console().print(f"wrote {out}")


if __name__ == "__main__":
    main()
