"""Withholding and a flood of fresh keys in the committee design, simulated (issue 30 item 3;
specs/committee.md §7): the real NodeProtocol state machines of vrl.harness.simulator.

For each N it runs, with one seed, side by side:

* ``honest``: no adversary (the baseline the flood's cost is measured against);
* ``withhold``: 30% of the nodes submit only half of their assigned groups;
* ``withhold+sybil``: the same, plus a flood: each round every sybil slot (10% of N) mints a
  fresh key that submits a round of bad groups and hard-fails honest groups;
* ``churn``: no adversary, 10% of the nodes leave for a round at each new version (honest
  leavers must not be quarantined, nor charged as withholding).

It reports withholders' standing and share of batches against honest workers', and the flood's
cost per fresh key at an honest node: what the flood run cost beyond the withholding run with
the same seed (checks, verify-seconds, bytes, protocol CPU), and what the flood's own messages
cost a receiver (bytes, signature checks, refusals by reason), against the bound of
specs/committee.md §7.

    python bench/simulate_withhold.py --nodes 11,50 --rounds 6 --out bench/results/simulate-withhold.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from vrl.harness.simulator import SimConfig, Simulation, parse_adversaries  # noqa: E402
from vrl.harness.simulator.spec import sybil_slots  # noqa: E402

RUNS = {"honest": ("", 0.0), "withhold": ("withhold:0.3", 0.0), "withhold+sybil": ("withhold:0.3,sybil:0.1", 0.0),
        "churn": ("", 0.1)}
# Per-node, per-round figures whose difference between the flood run and the withholding run
# (same seed) is the flood's cost to an honest node.
DELTAS = ("checks_per_round", "verify_seconds_per_round", "bytes_per_round", "bytes_per_round_without_blobs",
          "messages_per_round", "protocol_cpu_seconds_per_round", "backfill_bytes", "blob_bytes")
KEPT = ("nodes", "design", "rounds_measured", "stopped", "cpu_seconds", "wall_seconds", "per_node",
        "honest_false_quarantines", "bad_groups_trained", "groups_lost", "honest_groups_published",
        "withheld_groups", "withholding", "sybil", "sybil_cost_at_honest_nodes", "trained_by_kind",
        "honest_verdicts_not_counted_by_trainer", "trainer_waiting_verdicts", "churn", "rounds_to_quarantine")


def per_message_costs(repeat: int = 2000) -> dict:
    """What one fresh key's verdict costs a receiver that holds the round's manifest (decode and
    the claim's table lookup, specs/committee.md §4 steps 1-2), beside what an eligible one costs
    on top (its Ed25519 signature, its VRF proof): microseconds, median of 5 runs of ``repeat``."""
    import hashlib
    import statistics
    import timeit

    from proofs import vrf
    from vrl.node.committee import Draw, List
    from vrl.node.messages import SignedVerdict
    from vrl.node.rounds import Rounds
    from vrl.rollouts.keys import NodeKey

    trainer, member, stranger = (NodeKey.from_seed(hashlib.sha256(b"bench " + t).digest()) for t in (b"t", b"m", b"s"))
    groups = [(hashlib.sha256(b"g%d" % i).digest(), hashlib.sha256(b"w%d" % (i // 4)).digest()) for i in range(400)]
    rounds = Rounds(trainer, trainer.node_id)
    # A table of 1,000 eligible verifiers: the lookup's cost at the N the design is for.
    members = {hashlib.sha256(b"v%d" % i).digest(): 0.5 for i in range(999)} | {member.node_id: 1.0}
    manifest = rounds.close(0, 13, groups, members, 0.0)
    lists = rounds.lists[0]
    pi = vrf.prove(stranger.private_seed(), manifest.header.alpha(Draw.COMMITTEE))
    # The stranger claims a real weights entry's place and path (the most a refusal hashes: the
    # whole path, specs/committee.md §4 step 2), with its own key in the leaf.
    verdict = SignedVerdict(verifier=stranger.node_id, subject=groups[0][1], group=lists.content.groups[0], round=0,
                            policy_version=0, ticket=b"", rate=1.0, outcome="hard_fail", reasons=("reward_mismatch",),
                            digest=bytes(32), platform="bench", draw="committee", pi=pi, seat=0,
                            seat_path=lists.trees[List.GROUPS].prove([0]), weight_at=0, weight=65536,
                            weight_path=lists.trees[List.WEIGHTS].prove([0])).signed(stranger)
    data = verdict.to_bytes()
    assert rounds.refusal(verdict, frozenset()) == "not_eligible"

    def us(fn) -> float:
        return statistics.median(timeit.repeat(fn, number=repeat, repeat=5)) / repeat * 1e6

    return {"verdict_bytes": len(data), "manifest_groups": manifest.groups,
            "decode_us": us(lambda: SignedVerdict.from_bytes(data)),
            "refusal_not_eligible_us": us(lambda: rounds.refusal(verdict, frozenset())),
            "signature_check_us": us(lambda: verdict.signature_ok()),
            "vrf_verify_us": us(lambda: vrf.verify(stranger.node_id, pi, manifest.header.alpha(Draw.COMMITTEE)))}


class AdmissionPool:
    """How many decided groups each of the trainer's admission draws chose from, and of which
    kind (honest, withhold, ...): wraps ``admit`` where the trainer's batch rule calls it
    (vrl.node.batches) for the run, measuring only."""

    def __init__(self, simulation: Simulation) -> None:
        import vrl.node.batches as batches

        self.batches, self.admit, self.steps = batches, batches.admit, []
        kinds = {n.key.node_id: n.kind or "honest" for n in simulation.nodes}

        def counted(candidates, config, seed):
            candidates = list(candidates)
            batch = self.admit(candidates, config, seed)
            kind = [kinds.get(c.node, "other") for c in candidates]
            self.steps.append({"candidates": len(candidates), "batch": len(batch),
                               "candidates_by_kind": {k: kind.count(k) for k in sorted(set(kind))},
                               "batch_by_kind": {k: sum(kinds.get(c.node, "other") == k for c, _ in batch)
                                                 for k in sorted(set(kind))}})
            return batch

        batches.admit = counted

    def close(self) -> dict:
        self.batches.admit = self.admit
        full = sum(s["candidates"] <= s["batch"] for s in self.steps)
        return {"steps": len(self.steps), "steps_with_no_choice": full, "per_step": self.steps}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="11,50")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu-limit", type=float, default=900.0, help="per run")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    # Runs of other N already in --out are kept (a sweep may be run in parts); its commands listed.
    earlier = json.loads(args.out.read_text()) if args.out and args.out.exists() else {}
    out = {"commands": [*earlier.get("commands", [earlier["command"]] if "command" in earlier else []),
                        "python " + " ".join(sys.argv)], "machine": "2 cores shared with ~6 other jobs",
           "design": "committee", "what": __doc__.split("\n\n")[0], "runs": earlier.get("runs", {}),
           "per_message_costs": per_message_costs()}
    print(f"per message: {out['per_message_costs']}", file=sys.stderr)
    for nodes in (int(n) for n in args.nodes.split(",")):
        runs = {}
        for name, (adversaries, churn) in RUNS.items():
            config = SimConfig(nodes=nodes, rounds=args.rounds, adversaries=parse_adversaries(adversaries),
                               seed=args.seed, design="committee", churn=churn)
            started = time.perf_counter()
            simulation = Simulation(config)
            pool = AdmissionPool(simulation)
            try:
                summary = simulation.run(None, args.cpu_limit).summary
            finally:
                drawn = pool.close()
            runs[name] = {k: summary[k] for k in KEPT if k in summary}
            runs[name]["admission_pool"] = drawn
            print(f"N={nodes} {name}: {time.perf_counter() - started:.0f} s wall ({summary['stopped']})",
                  file=sys.stderr)
        flood, base = runs["withhold+sybil"], runs["withhold"]
        keys_per_round = sybil_slots(parse_adversaries(RUNS["withhold+sybil"][0]), nodes)  # one fresh key a slot
        if flood.get("per_node") and base.get("per_node") and keys_per_round:
            runs["flood_cost_per_key_per_honest_node"] = {
                "keys_per_round": keys_per_round,
                **{m: (flood["per_node"][m] - base["per_node"][m]) / keys_per_round for m in DELTAS}}
        out["runs"][str(nodes)] = runs
        text = json.dumps(out, indent=1, sort_keys=True, default=str)
        if args.out:
            args.out.write_text(text + "\n")
    print(json.dumps(out, indent=1, sort_keys=True, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
