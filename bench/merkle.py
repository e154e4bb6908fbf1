"""What a round manifest's Merkle lists cost the trainer that holds them: building a tree, the
memory it keeps, and proving and checking a member's seats, beside the floor of the same number
of bare SHA-256 calls in the same run.

    python bench/merkle.py [--rounds 5]

For lists of 2^12, 2^15 and 2^18 entries (36-byte weights leaves; 2^18 is the cap of a list,
specs/committee.md §3.2): ``proofs.merkle.Tree`` build seconds and the ratio to ``2n - 1``
``hashlib.sha256`` calls of the same sizes (the hashing a build cannot avoid); the bytes the
tree keeps beyond its leaves (tracemalloc, in a pass of its own, since tracing slows the
timed ones); and the multiproof of 44 seats spread over the list (a member's share at k = 11,
specs/committee.md §6) made by ``Tree.prove`` and checked by ``merkle.verify``. Each figure is
the median over ``--rounds``. Results: ``bench/results/merkle.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proofs import merkle  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SEATS = 44


def floor_seconds(n: int) -> float:
    """2n - 1 bare SHA-256 calls: n of 37 bytes (a leaf), n - 1 of 65 (a node)."""
    leaf, node = b"\x00" * 37, b"\x01" * 65
    started = time.perf_counter()
    for _ in range(n):
        hashlib.sha256(leaf).digest()
    for _ in range(n - 1):
        hashlib.sha256(node).digest()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for bits in (12, 15, 18):
        n = 1 << bits
        leaves = [hashlib.sha256(b"bench merkle %d" % i).digest() + (i % 997).to_bytes(4, "big") for i in range(n)]
        seats = sorted({(i * 2_654_435_761) % n for i in range(SEATS)})
        builds, floors, proves, verifies = [], [], [], []
        for _ in range(args.rounds):
            floors.append(floor_seconds(n))
            started = time.perf_counter()
            tree = merkle.Tree(leaves)
            built = time.perf_counter()
            proof = tree.prove(seats)
            proved = time.perf_counter()
            merkle.verify(tree.root, n, seats, [leaves[i] for i in seats], proof)
            verified = time.perf_counter()
            builds.append(built - started)
            proves.append(proved - built)
            verifies.append(verified - proved)
        del tree
        tracemalloc.start()
        kept = merkle.Tree(leaves)
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del kept
        rows.append({"entries": n, "build_s": statistics.median(builds),
                     "build_over_bare_hashes": statistics.median(b / f for b, f in zip(builds, floors)),
                     "held_bytes": held, "held_bytes_per_entry": held / n, "seats": len(seats),
                     "proof_hashes": len(proof), "prove_ms": statistics.median(proves) * 1e3,
                     "verify_ms": statistics.median(verifies) * 1e3})
    table = Table(title="proofs.merkle.Tree: one list of a round manifest")
    for column in ("entries", "build s", "x bare SHA-256", "held MiB", "B / entry", "proof hashes", "prove ms",
                   "verify ms"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(f"{r['entries']:,}", f"{r['build_s']:.3f}", f"{r['build_over_bare_hashes']:.2f}",
                      f"{r['held_bytes'] / 2**20:.1f}", f"{r['held_bytes_per_entry']:.0f}", str(r["proof_hashes"]),
                      f"{r['prove_ms']:.2f}", f"{r['verify_ms']:.2f}")
    Console().print(table)
    out = {"what": __doc__.split("\n\n")[0].replace("\n", " "), "command": "python bench/merkle.py "
           + " ".join(sys.argv[1:]), "machine": f"{platform.machine()}, {os.cpu_count()} cores", "rows": rows}
    (RESULTS / "merkle.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {RESULTS / 'merkle.json'}")


if __name__ == "__main__":
    main()
