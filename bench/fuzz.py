"""Fuzz every decoder and handler at depth, and print what each met.

    python bench/fuzz.py                      # 10,000 cases per target and strategy
    python bench/fuzz.py --cases 500 --only verdict,group

The targets are the suite's (``tests/fuzzing.py``; ``tests/test_fuzz.py`` runs them briefly):
each one gets raw bytes and mutated valid inputs from Hypothesis. A case ends in a value, a
refusal with the target's own error type, or a crash (any other exception, a case slower than
``CASE_SECONDS``, or a node that lost something it had accepted). The table shows, per target,
the cases run, the distinct refusals (messages with numbers and quoted values masked), the
crashes, and the slowest case; it is saved to ``bench/results/fuzz.json``. Exit status 1 on
any crash.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import fuzzing  # noqa: E402  (tests/ is not a package; the suite imports it the same way)

console = Console(width=120)


def run(target: fuzzing.Target, strategy: str, cases: int) -> fuzzing.Tally:
    tally = fuzzing.Tally()

    # Generation only: a crash is recorded and the run goes on, so the table counts them all.
    @settings(max_examples=cases, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(data=getattr(target, strategy)())
    def case(data: bytes) -> None:
        tally.record(target, data)

    case()
    return tally


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000, help="cases per target and strategy")
    parser.add_argument("--only", default="", help="comma-separated target names")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "fuzz.json")
    args = parser.parse_args()

    node = fuzzing.NodeUnderFire(Path(tempfile.mkdtemp(prefix="vrl-fuzz-")))
    chosen = {n.strip() for n in args.only.split(",") if n.strip()}
    targets = [t for t in fuzzing.all_targets(node) if not chosen or t.name in chosen]
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rows, crashes = [], 0
    table = Table(title=f"fuzz: {args.cases:,} cases per target and strategy", title_justify="left")
    for column in ("target", "strategy", "cases", "distinct errors", "crashes", "slowest case", "seconds", "peak MB"):
        table.add_column(column, justify="left" if column in ("target", "strategy") else "right")
    for target in targets:
        for strategy in ("raw", "structured"):
            started = time.perf_counter()
            tally = run(target, strategy, args.cases)
            seconds = time.perf_counter() - started
            crashes += len(tally.crashes)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            rows.append({"peak_rss_mb": peak, "target": target.name, "strategy": strategy, "cases": tally.cases,
                         "values": tally.values,
                         "distinct_errors": len(tally.errors), "crashes": tally.crashes[:20],
                         "crash_count": len(tally.crashes), "slowest_seconds": tally.slowest, "seconds": seconds,
                         "errors": dict(tally.errors.most_common(30))})
            table.add_row(target.name, strategy, f"{tally.cases:,}", str(len(tally.errors)),
                          f"[red]{len(tally.crashes)}[/]" if tally.crashes else "0",
                          f"{tally.slowest * 1000:.1f} ms", f"{seconds:.0f}", f"{peak:.0f}")
            for crash in tally.crashes[:3]:
                console.print(f"  [red]crash[/] {target.name}/{strategy}: {crash}", highlight=False)
    node.close()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    console.print(table)
    console.print(f"{sum(r['cases'] for r in rows):,} cases, {crashes} crashes; peak memory {peak_mb:.0f} MB "
                  f"({(peak_mb - rss_before / 1024):.0f} MB over the start, which loads torch and the tiny model)",
                  highlight=False)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"cases_per_strategy": args.cases, "peak_rss_mb": peak_mb, "targets": rows},
                                   indent=1) + "\n")
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
