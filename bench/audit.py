"""What an audit costs (issue 15 §4): a real devnet, then `vrl.audit` over its stores.

    python bench/audit.py                      # 5 nodes, 20 rounds, the base model (built first if needed)
    python bench/audit.py --model tiny --task arithmetic:digits=1 --rounds 6   # a quick one
    python bench/audit.py --dir DIR            # audit a devnet folder that already exists

It prints and writes (bench/results/audit-<model>.json): the devnet's size; the whole audit
at --all and at the default sample, each check's seconds; groups re-verified per second
against the devnet's own checks per second on the same groups (the nodes' check latency is
a different measure: it includes waiting); step replays per second; the HTML report's size
and time; and the audit's peak traced memory on the whole log against on its first half,
with the bytes of each log, to show what memory grows with. Times are wall-clock on this
2-core machine, so read them as ratios measured side by side in one run.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sqlite3
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import vrl.audit  # noqa: E402
from vrl.harness import devnet  # noqa: E402

console = Console(stderr=True)
RESULTS = Path(__file__).resolve().parent / "results"
LOG_CHECKS = ["signatures", "reputation", "duplicates", "lazy_verifiers", "admission", "quarantine"]


def make_devnet(directory: Path, args) -> dict:
    if args.model == "base":
        from vrl.rl.base_model import ensure_base_model

        with console.status("the base model (built once)"):
            ensure_base_model()
    summary = devnet.run(directory, args.nodes, ["fabricated-reward"], args.rounds, deadline_s=args.deadline,
                         base_port=random.Random().randrange(20000, 27000), console=console,
                         work={"model": args.model, "task": args.task}, protocol={"plant_every": 2})
    if summary["failure"]:
        raise SystemExit(f"the devnet failed: {summary['failure']}")
    return summary


def log_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("node-*/node.sqlite*"))


def first_half(directory: Path, target: Path) -> Path:
    """A copy of the devnet whose stores keep only the first half of the versions: a log half
    as long, to compare the audit's memory with."""
    shutil.copytree(directory, target, ignore=shutil.ignore_patterns("blobs", "trainer", "*.log"))
    for store in target.glob("node-*/node.sqlite"):
        db = sqlite3.connect(store, isolation_level=None)
        try:
            (last,) = db.execute("SELECT max(version) FROM policies").fetchone()
            half = (int.from_bytes(last, "big") // 2).to_bytes(8, "big")
            for table in ("policies", "groups", "verdicts", "steps", "trained"):
                db.execute(f"DELETE FROM {table} WHERE version > ?", (half,))  # noqa: S608 (fixed names)
            db.execute("VACUUM")
        finally:
            db.close()
    return target


def peak_memory(directory: Path) -> int:
    """The log checks' peak traced Python memory over one devnet folder."""
    tracemalloc.start()
    with vrl.audit.open([directory]) as audit:
        audit.run(checks=LOG_CHECKS)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def audit(directory: Path, sample: float) -> tuple[vrl.audit.Report, float]:
    started = time.perf_counter()
    with vrl.audit.open([directory]) as auditor:
        report = auditor.run(sample=sample)
    return report, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="audit this devnet folder instead of running one")
    parser.add_argument("--model", default="base")
    parser.add_argument("--task", default="arithmetic:digits=2,ops=+")
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--deadline", type=float, default=1200)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="vrl-bench-audit-"))
    directory = args.dir or scratch / "dn"
    devnet_seconds = None
    if args.dir is None:
        started = time.perf_counter()
        make_devnet(directory, args)
        devnet_seconds = time.perf_counter() - started

    everything, everything_seconds = audit(directory, 1.0)
    sampled, sampled_seconds = audit(directory, vrl.audit.DEFAULT_SAMPLE)
    started = time.perf_counter()
    page = everything.to_html()
    html_seconds = time.perf_counter() - started

    groups = everything.stats["groups"]
    steps = everything.series.get("steps", [])
    inputs = everything.inputs
    counts = {k: sum(i["counts"].get(k, 0) for i in inputs) for k in ("policies", "groups", "verdicts", "steps")}
    half = first_half(directory, scratch / "half")
    memory = {"whole": {"log_bytes": log_bytes(directory), "peak_bytes": peak_memory(directory)},
              "first_half": {"log_bytes": log_bytes(half), "peak_bytes": peak_memory(half)}}
    result = {
        "devnet": {"directory": str(directory), "nodes": len(inputs), "seconds": devnet_seconds,
                   "versions": max((i["counts"]["policies"] for i in inputs), default=0), "rows": counts,
                   "model": args.model},
        "audit_all": {"seconds": everything_seconds, "per_check": everything.seconds,
                      "findings": {str(s): len(everything.of(s)) for s in vrl.audit.Severity},
                      "clean_nodes": sorted(n["name"] for n in everything.verdicts_by_node().values()
                                            if n["verdict"] == "clean"),
                      "convicted_nodes": sorted(n["name"] or "?" for n in everything.verdicts_by_node().values()
                                                if n["verdict"] == "convicted")},
        "audit_default_sample": {"sample": vrl.audit.DEFAULT_SAMPLE, "seconds": sampled_seconds,
                                 "per_check": sampled.seconds},
        "groups_reverified_per_second": groups["re-verified"] / max(everything.seconds["groups"], 1e-9),
        "step_replays": {"count": len(steps), "seconds_mean": sum(s["seconds"] for s in steps) / max(len(steps), 1),
                         "per_second": len(steps) / max(everything.seconds["steps"], 1e-9)},
        "html": {"bytes": len(page.encode()), "seconds": html_seconds},
        "memory": memory,
    }
    table = Table(title=f"vrl audit of a {len(inputs)}-node, {result['devnet']['versions']}-version devnet "
                        f"({args.model})", title_justify="left")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("log rows (policies, groups, verdicts, step verdicts)",
                  ", ".join(str(counts[k]) for k in ("policies", "groups", "verdicts", "steps")))
    table.add_row("whole audit, --all", f"{everything_seconds:.1f} s")
    table.add_row(f"whole audit, sample {vrl.audit.DEFAULT_SAMPLE}", f"{sampled_seconds:.1f} s")
    for name, seconds in everything.seconds.items():
        table.add_row(f"  {name} (--all)", f"{seconds:.2f} s")
    table.add_row("groups re-verified per second", f"{result['groups_reverified_per_second']:.2f}")
    table.add_row("step replays per second", f"{result['step_replays']['per_second']:.2f}")
    table.add_row("HTML report", f"{len(page.encode()) / 1024:.0f} KiB in {html_seconds:.2f} s")
    table.add_row("peak memory, whole log / first half",
                  f"{memory['whole']['peak_bytes'] / 2**20:.1f} / {memory['first_half']['peak_bytes'] / 2**20:.1f} MiB")
    table.add_row("log bytes, whole / first half",
                  f"{memory['whole']['log_bytes'] / 2**20:.1f} / {memory['first_half']['log_bytes'] / 2**20:.1f} MiB")
    table.add_row("findings (--all)", ", ".join(f"{k} {v}" for k, v in result["audit_all"]["findings"].items()))
    console.print(table)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"audit-{args.model}.json"
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    console.print(f"written to {out}; devnet folder kept at {directory}")


if __name__ == "__main__":
    main()
