"""What a NodeProtocol keeps over a run, measured (vrl.node.forgetting): the simulator's N real
protocols through R rounds, sampling after each of the trainer's rounds this process's resident
memory and the sizes of what the protocols keep, with forgetting on or (``--no-forget``) off.

    PYTHONHASHSEED=0 python bench/protocol_memory.py --nodes 100 --rounds 40 --design committee
    PYTHONHASHSEED=0 python bench/protocol_memory.py --nodes 100 --rounds 40 --design committee --no-forget

Each prints one JSON object; ``--out FILE`` adds it to FILE's ``runs``. Run the two modes in
separate processes: resident memory is per process, and the peak (``ru_maxrss``) never falls.
Growth per round is a least-squares slope over the second half of the rounds (after the
bootstrap rounds, in the steady state).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from vrl.harness.simulator import SimConfig, Simulation  # noqa: E402
from vrl.node import forgetting  # noqa: E402


def rss_bytes() -> int:
    """This process's resident set now (Linux: /proc/self/status VmRSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def kept(sim: Simulation) -> dict[str, int]:
    """What every protocol keeps, summed over the nodes: per group, per verdict, per report."""
    sizes = dict.fromkeys(("groups", "verdicts", "slots", "audit_draws", "forgotten", "reports",
                           "waiting_verdicts", "policies", "step_verdicts"), 0)
    for node in sim.nodes:
        p = node.protocol
        if p is None:
            continue
        sizes["groups"] += len(p.groups)
        sizes["verdicts"] += sum(len(v) for v in p.verdicts.values())
        sizes["slots"] += len(p._slots)
        sizes["audit_draws"] += len(p._audit_draws)
        sizes["forgotten"] += len(getattr(p, "forgotten", ()))
        sizes["reports"] += len(p.reputation)
        sizes["waiting_verdicts"] += p.waiting_verdicts
        sizes["policies"] += len(p.policies)
        sizes["step_verdicts"] += sum(len(v) for v in p.step_verdicts.values())
    return sizes


def deep_size(obj, seen: set[int]) -> int:
    """Bytes of ``obj`` and all it refers to through containers and attributes, each object
    counted once over every call that shares ``seen`` (what one view holds that an earlier part
    does not)."""
    total, stack = 0, [obj]
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        if isinstance(o, dict):
            stack += [*o.keys(), *o.values()]
        elif isinstance(o, list | tuple | set | frozenset):
            stack += list(o)
        elif hasattr(o, "__dict__") and not isinstance(o, type):
            stack.append(o.__dict__)
        elif hasattr(o, "__slots__"):
            stack += [getattr(o, name) for name in o.__slots__ if hasattr(o, name)]
    return total


def deep_sizes(p) -> dict[str, int]:
    """One protocol's state by part, in KiB; the reports first, so what they share with the
    verdicts and groups counts as theirs (they outlive both)."""
    seen: set[int] = set()
    parts = {"reports": (p.reputation._reports, p.reputation._ordered, p.reputation._new),
             "verdicts": p.verdicts, "groups": (p.groups, p._by_version, p._slots),
             "forgotten": (p.forgotten, p.forgotten_fails), "audit_draws": p._audit_draws,
             "waiting": p.waiting._held, "policies": p.policies, "steps": p.steps.__dict__,
             "rounds": p.rounds.__dict__, "scans": p.scans.__dict__}
    return {name: deep_size(part, seen) // 1024 for name, part in parts.items()}


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of y over x."""
    n = len(points)
    if n < 2:
        return 0.0
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--design", default="committee", choices=("committee", "tickets"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-forget", action="store_true",
                        help="switch vrl.node.forgetting off (the protocol before it)")
    parser.add_argument("--deep", action="store_true",
                        help="also the deep sizes by part of the trainer's, node 1's and the middle node's state")
    parser.add_argument("--out", type=Path, help="add the run to this JSON file's 'runs'")
    args = parser.parse_args()
    if args.no_forget:
        forgetting.forget = lambda node, version: None
    sim = Simulation(SimConfig(nodes=args.nodes, rounds=args.rounds, design=args.design, seed=args.seed))
    samples: list[dict] = []
    ended = sim.metrics.round_ended

    def round_ended(s, version: int) -> None:
        ended(s, version)
        samples.append({"version": version, "rss_bytes": rss_bytes(), **kept(s)})

    sim.metrics.round_ended = round_ended
    started = time.process_time()
    summary = sim.run().summary
    half = samples[len(samples) // 2:]
    growth = {name: slope([(s["version"], s[name]) for s in half]) for name in samples[0] if name != "version"}
    result = {
        "command": "PYTHONHASHSEED=0 python " + " ".join(sys.argv),
        "nodes": args.nodes, "rounds": args.rounds, "design": args.design, "forgetting": not args.no_forget,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "cpu_seconds": time.process_time() - started,
        "growth_per_round_second_half": growth,
        "last": samples[-1] if samples else {},
        "samples": samples,
        "metrics": {"per_node": summary["per_node"], "per_node_trainer": summary["per_node_trainer"],
                    "quarantines": summary["rounds_to_quarantine"],
                    "honest_false_quarantines": summary["honest_false_quarantines"],
                    "groups_lost": summary["groups_lost"],
                    "honest_verdicts_not_counted_by_trainer": summary["honest_verdicts_not_counted_by_trainer"],
                    "trainer_waiting_verdicts": summary["trainer_waiting_verdicts"],
                    "stopped": summary["stopped"]},
    }
    if args.deep:
        result["deep_kib"] = {str(i): {"reports_held": len(sim.nodes[i].protocol.reputation),
                                       **deep_sizes(sim.nodes[i].protocol)}
                              for i in (0, 1, args.nodes // 2)}
    if args.out:
        existing = json.loads(args.out.read_text()) if args.out.exists() else {"runs": []}
        existing["runs"].append(result)
        args.out.write_text(json.dumps(existing, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
