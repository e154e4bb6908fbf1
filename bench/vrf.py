"""What the VRF costs, side by side with Ed25519 signing and verifying in the same run.

    python bench/vrf.py [--rounds 7] [--calls 300]

Times ``proofs.vrf`` (ECVRF-EDWARDS25519-SHA512-TAI, specs/vrf.md): prove, verify and
proof_to_hash, and the rejection of random 80-byte proofs and of the slowest inputs to reject
(what a flood of forged committee claims costs a node). The baseline is `cryptography`'s
Ed25519 sign and verify of a message of the committee input's size (57 bytes). Each round
times ``--calls`` calls of every operation in turn, on fresh keys and inputs; a row's
microseconds are the median over rounds, and its ratio to Ed25519 is the median of the
per-round ratios, so both sides of a ratio ran under the same load (this machine is shared).

Then a member's whole draw of a round (``vrl.node.committee.seats``, specs/committee.md §2) over
groups lists of 4,096 and 2^18 positions (the cap), under seat rule 1 (a SHA-256 a position)
and rule 2 (8 positions a SHA-512), side by side in each round, at a threshold of k = 11 among
1,000 equal verifiers. Results: ``bench/results/vrf.json``.
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
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from nacl import bindings as na
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proofs import vrf  # noqa: E402
from vrl.node import committee  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
#: The committee input is 57 bytes (specs/vrf.md section 4).
ALPHA_BYTES = 57


def per_call_us(operation: Callable[[int], object], calls: int) -> float:
    started = time.perf_counter()
    for i in range(calls):
        operation(i)
    return (time.perf_counter() - started) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()

    secrets = [hashlib.sha256(b"bench vrf key %d" % i).digest() for i in range(args.calls)]
    publics = [vrf.public_key(secret) for secret in secrets]
    alphas = [hashlib.sha512(b"bench vrf alpha %d" % i).digest()[:ALPHA_BYTES] for i in range(args.calls)]
    proofs = [vrf.prove(s, a) for s, a in zip(secrets, alphas)]
    garbage = [hashlib.sha512(b"bench vrf garbage %d" % i).digest() + bytes(16) for i in range(args.calls)]
    # The slowest input to reject: Gamma and the key both off the prime-order subgroup (plus the
    # point of order 2), which verify must split before multiplying (proofs/vrf.py _mul).
    order_two = bytes.fromhex("ec" + "ff" * 30 + "7f")
    twisted = [(na.crypto_core_ed25519_add(y, order_two), na.crypto_core_ed25519_add(p[:32], order_two) + p[32:])
               for y, p in zip(publics, proofs)]
    keys = [Ed25519PrivateKey.from_private_bytes(secret) for secret in secrets]
    ed_publics = [key.public_key() for key in keys]
    signatures = [key.sign(a) for key, a in zip(keys, alphas)]

    def reject(i: int) -> None:
        try:
            vrf.verify(publics[i], garbage[i], alphas[i])
        except vrf.VrfError:
            return
        raise AssertionError("a random proof verified")

    def reject_twisted(i: int) -> None:
        try:
            vrf.verify(twisted[i][0], twisted[i][1], alphas[i])
        except vrf.VrfError:
            return
        raise AssertionError("a proof for another key verified")

    operations: dict[str, Callable[[int], object]] = {
        "vrf.prove": lambda i: vrf.prove(secrets[i], alphas[i]),
        "vrf.verify": lambda i: vrf.verify(publics[i], proofs[i], alphas[i]),
        "vrf.proof_to_hash": lambda i: vrf.proof_to_hash(proofs[i]),
        "vrf.verify (random pi, rejected)": reject,
        "vrf.verify (torsion in key and Gamma, rejected)": reject_twisted,
        "ed25519.sign": lambda i: keys[i].sign(alphas[i]),
        "ed25519.verify": lambda i: ed_publics[i].verify(signatures[i], alphas[i]),
    }
    runs: dict[str, list[float]] = {name: [] for name in operations}
    for _ in range(args.rounds):
        for name, operation in operations.items():
            runs[name].append(per_call_us(operation, args.calls))

    def ratio(name: str, baseline: str) -> float:
        return statistics.median(a / b for a, b in zip(runs[name], runs[baseline]))

    baselines = {"vrf.prove": "ed25519.sign", "vrf.verify": "ed25519.verify",
                 "vrf.proof_to_hash": "ed25519.verify", "vrf.verify (random pi, rejected)": "ed25519.verify",
                 "vrf.verify (torsion in key and Gamma, rejected)": "ed25519.verify"}
    rows = {name: {"us_median": statistics.median(times), "us_min": min(times), "us_max": max(times),
                   **({"vs": baselines[name], "ratio": ratio(name, baselines[name])} if name in baselines else {})}
            for name, times in runs.items()}
    draws = draw_seconds(args.rounds, proofs)
    # The simulator's load (bench/simulate.py, N = 1,000): about 20,000 proofs and as many verifications a run.
    simulator_seconds = 20_000 * (rows["vrf.prove"]["us_median"] + rows["vrf.verify"]["us_median"]) / 1e6
    result = {
        "command": f"python bench/vrf.py --rounds {args.rounds} --calls {args.calls}",
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "pynacl": version("pynacl"),
                    "cryptography": version("cryptography"),
                    "note": "shared by other jobs while measured; compare ratios, not absolute times"},
        "rounds": args.rounds, "calls_per_round": args.calls, "alpha_bytes": ALPHA_BYTES,
        "operations": rows,
        "simulator_20000_prove_and_verify_seconds": simulator_seconds,
        "draw": draws,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "vrf.json").write_text(json.dumps(result, indent=1) + "\n")

    table = Table(title=f"VRF against Ed25519 ({args.rounds} rounds x {args.calls} calls; medians)")
    for column in ("operation", "µs", "against", "ratio"):
        table.add_column(column, justify="left" if column in ("operation", "against") else "right")
    for name, row in rows.items():
        shown = f"{row['ratio']:.2f}" if "ratio" in row else ""
        table.add_row(name, f"{row['us_median']:.1f}", row.get("vs", ""), shown)
    console = Console()
    console.print(table)
    draw_table = Table(title="A member's draw of a round (committee.seats; medians)")
    for column in ("positions", "rule 1 ms", "rule 2 ms", "rule 2 / rule 1"):
        draw_table.add_column(column, justify="right")
    for n, row in draws.items():
        draw_table.add_row(f"{int(n):,}", f"{row['rule_1_ms']:.2f}", f"{row['rule_2_ms']:.2f}", f"{row['ratio']:.3f}")
    console.print(draw_table)
    console.print(f"20,000 proves + 20,000 verifies: {simulator_seconds:.1f} s; wrote bench/results/vrf.json")


def draw_seconds(rounds: int, proofs: list[bytes]) -> dict[str, dict[str, float]]:
    """Per list size, each rule's milliseconds for one member's draw (median over rounds, each
    over a fresh beta) and the median per-round ratio of rule 2 to rule 1."""
    threshold = (11 << 64) // 1000  # k = 11 among 1,000 verifiers of equal weight
    out = {}
    for n in (4096, committee.MAX_PAGED_ENTRIES):
        times: dict[int, list[float]] = {1: [], 2: []}
        for r in range(rounds):
            beta = vrf.proof_to_hash(proofs[r % len(proofs)])
            for rule in committee.SEAT_RULES:
                started = time.perf_counter()
                committee.seats(beta, n, threshold, rule)
                times[rule].append((time.perf_counter() - started) * 1e3)
        out[str(n)] = {"rule_1_ms": statistics.median(times[1]), "rule_2_ms": statistics.median(times[2]),
                       "ratio": statistics.median(b / a for a, b in zip(times[1], times[2]))}
    return out


if __name__ == "__main__":
    main()
