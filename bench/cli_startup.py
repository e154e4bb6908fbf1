"""How long `vrl` takes to answer, per command, against a bare Python start in the same run.

    python bench/cli_startup.py [--repeat 5]

Each command runs ``--repeat`` times as its own process; the median wall time is printed, with
its ratio to ``python -c pass``, the interpreter's own start on this machine at this moment.
`inspect` reads a small rollout file written first. Results: ``bench/results/cli_startup.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent


# The `vrl` command of this checkout, as its console script runs it (``vrl.cli:app``).
VRL = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); from vrl.cli import app; app()"]


def timed(command: Callable[[int], list[str]], repeat: int) -> float:
    """The median wall time of ``command(i)`` for i in 0 .. repeat - 1, each a process."""
    times = []
    for i in range(repeat):
        started = time.perf_counter()
        subprocess.run(command(i), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    import vrl

    work = Path(tempfile.mkdtemp(prefix="vrl-bench-cli-"))
    model = vrl.load_model("tiny")
    key = vrl.NodeKey.generate()
    records = vrl.generate(model, vrl.Arithmetic(digits=1), key, round_seed=bytes(32),
                           sampling=vrl.sampling_for(model, max_new_tokens=4), groups=1, group_size=2)
    vrl.write_rollouts(work / "r.vrl", records)
    commands = {
        "--help": lambda i: ["--help"],
        "--version": lambda i: ["--version"],
        "keygen": lambda i: ["keygen", "--out", str(work / f"k{i}-{time.monotonic_ns()}.pem")],  # never overwritten
        "inspect FILE": lambda i: ["inspect", str(work / "r.vrl")],
        "train --help": lambda i: ["train", "--help"],
    }
    base = timed(lambda i: [sys.executable, "-c", "pass"], args.repeat)
    seconds: dict[str, dict[str, float]] = {}
    for name, command in commands.items():
        seconds[name] = {"this": timed(lambda i, command=command: [*VRL, *command(i)], args.repeat)}
    table = Table("vrl ...", "median s (x python -c pass)",
                  title=f"start-up, median of {args.repeat}; python -c pass {base:.2f} s")
    for name, by in seconds.items():
        table.add_row(name, f"{by['this']:.2f} ({by['this'] / base:.1f}x)")
    Console().print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "cli_startup.json").write_text(json.dumps(
        {"repeat": args.repeat, "python -c pass": base, "checkouts": {"this": str(ROOT)}, "seconds": seconds},
        indent=1))


if __name__ == "__main__":
    main()
