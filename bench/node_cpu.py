"""A node's CPU time per received group: the gossip path, and the check a verifier then runs.

    python bench/node_cpu.py                # 32 groups, the median of 3 processes
    python bench/node_cpu.py --walk         # the rooms one group walks through (bench/walk.py)

It drives a real :class:`vrl.node.daemon.Node` (loopback transport, the ``tiny`` preset as the
policy, one torch thread) through the daemon's own methods, so what is timed is what a node
does with a group that arrives by gossip:

* receive: the validator, storing, and the protocol's handling (``validate`` + ``_on_message``);
* check: what the ``Check`` action runs (``_check``: the group's records, verified with one
  prefill; the signed verdict published).

It also counts, per record, how often a record is decoded and its signature checked on the
way (the counting wraps ``Rollout.from_bytes`` and ``Rollout.signature_valid``).

CPU time is ``time.process_time()``, every thread of the process, divided by the groups; each
of ``--repeats`` measurements runs in a process of its own, and their medians are printed.
Absolute times are noisy on a shared machine: to compare two revisions, run each one's
script in its own checkout (``git worktree add``), alternately.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


async def settle(node) -> None:
    """Cancel what handling a group spawned (the protocol's own check, at its audit rate)."""
    for task in list(node._tasks):
        task.cancel()
    await asyncio.gather(*node._tasks, return_exceptions=True)


@contextlib.contextmanager
def verifier(groups: int, group_size: int, new_tokens: int):
    """A verifier node (loopback transport, the ``tiny`` preset as version 0) and ``groups``
    signed groups of another node's for it to receive: ``(node, loop, submissions, validate)``."""
    import logging

    import structlog
    import torch

    import vrl
    from p2p.loopback import LoopbackNetwork
    from vrl.node import protocol as P
    from vrl.node.config import NodeConfig
    from vrl.node.daemon import Node
    from vrl.node.messages import PolicyAnnouncement, Submission

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    torch.manual_seed(0)
    trainer, verifier, worker = (vrl.NodeKey.from_seed(hashlib.sha256(b"bench/node_cpu " + n).digest())
                                 for n in (b"trainer", b"verifier", b"worker"))
    with tempfile.TemporaryDirectory() as directory:
        work = dict(model="tiny", task="arithmetic:digits=2", group_size=group_size, max_new_tokens=new_tokens)
        config = NodeConfig(data_dir=directory, trainer=trainer.node_id.hex(), transport="loopback",
                            roles=("verifier",), work=work, protocol=dict(groups_per_round=groups))
        transport = LoopbackNetwork().transport(verifier.private_seed())
        node = Node(config, transport, verifier)
        model = node.work.skeleton
        announcement = PolicyAnnouncement(trainer.node_id, 0, model.model_hash, bytes(32), 1).signed(trainer)
        node.protocol.handle(P.PolicyAnnounced(announcement))
        node.work.install(0, model, 1)
        node.protocol.handle(P.PolicyLoaded(0))
        expect = node._expectations(0)
        made = vrl.iter_generate(model, node.tasks, worker, round_seed=expect.round_seed, sampling=node.work.sampling,
                                 groups=groups, group_size=group_size, policy_version=0,
                                 reward_spec=expect.reward_spec, batch_size=32)
        submissions = [Submission.of(group) for group in made]
        loop = asyncio.new_event_loop()
        loop.run_until_complete(transport.start())  # verdicts are published as on a live node
        try:
            yield node, loop, submissions, node.validate
            node.model_thread.shutdown()
            loop.run_until_complete(transport.close())
        finally:
            node.store.close()
            loop.close()


def message_of(submission):
    from p2p.transport import Message, message_id
    from vrl.node.messages import TOPIC_GROUPS

    data = submission.to_bytes()
    return Message(TOPIC_GROUPS, data, b"\x09" * 32, message_id(TOPIC_GROUPS, data))


def measure(groups: int, group_size: int, new_tokens: int) -> dict:
    import vrl
    from p2p.transport import Validation

    with verifier(groups, group_size, new_tokens) as (node, loop, submissions, validate):
        # Count what the node does per group: records decoded, signatures checked. Counting
        # costs a call per event.
        counts = {"decodes": 0, "signature_checks": 0}
        decode, check_signature = vrl.Rollout.from_bytes.__func__, vrl.Rollout.signature_valid

        def counted_decode(cls, data):
            counts["decodes"] += 1
            return decode(cls, data)

        def counted_check(self):
            counts["signature_checks"] += 1
            return check_signature(self)

        vrl.Rollout.from_bytes, vrl.Rollout.signature_valid = classmethod(counted_decode), counted_check
        receive = check = 0.0
        for submission in submissions:
            message = message_of(submission)
            started = time.process_time()
            assert validate(message) is Validation.ACCEPT
            loop.run_until_complete(node._on_message(message))
            receive += time.process_time() - started
            # The protocol may have asked for a check (at its audit rate): the one timed
            # below stands for it, for every group.
            loop.run_until_complete(settle(node))
            started = time.process_time()
            loop.run_until_complete(node._check(submission.digest, 0))
            check += time.process_time() - started
        assert node.store.counts()["groups"] == groups
    return {"groups": groups, "group_size": group_size, "new_tokens": new_tokens,
            "decodes_per_record": counts["decodes"] / (groups * group_size),
            "signature_checks_per_record": counts["signature_checks"] / (groups * group_size),
            "receive_ms_per_group": 1000 * receive / groups, "check_ms_per_group": 1000 * check / groups,
            "total_ms_per_group": 1000 * (receive + check) / groups}


def walks(group_size: int, new_tokens: int) -> dict:
    """The rooms (modules) one received group walks through (bench/walk.py): on arrival, the
    validator and ``Node._on_message`` (issue 29 named this walk), and then the check the
    protocol asks for, on the event loop (the prefill runs on the model thread, not traced)."""
    from walk import Walk  # bench/walk.py: this script's folder is first on sys.path

    import vrl
    from p2p.transport import Validation

    root = Path(vrl.__file__).resolve().parents[1]  # the tree under test
    with verifier(1, group_size, new_tokens) as (node, loop, (submission,), validate):
        arrival, check = Walk(root), Walk(root)
        message = message_of(submission)
        with arrival:
            assert validate(message) is Validation.ACCEPT
            loop.run_until_complete(node._on_message(message))
        loop.run_until_complete(settle(node))
        with check:
            loop.run_until_complete(node._check(submission.digest, 0))
    return {"arrival": arrival.summary(), "check": check.summary()}


def _run(args: argparse.Namespace) -> dict:
    """One measurement in a process of its own (one torch thread), as JSON."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, __file__, "--measure", *(["--walk"] if args.walk else []), "--groups",
                           str(args.groups), "--group-size", str(args.group_size),
                           "--new-tokens", str(args.new_tokens)],
                          env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the measurement failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # one measurement, as JSON
    parser.add_argument("--walk", action="store_true",
                        help="the rooms one group walks through (bench/walk.py) instead of CPU time")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "node-cpu.json")
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(walks(args.group_size, args.new_tokens) if args.walk else
                         measure(args.groups, args.group_size, args.new_tokens)))
        return

    from rich.console import Console
    from rich.table import Table

    if args.walk:  # a count, not a time: one run
        show_walks({"this tree": _run(args)}, args.out)
        return
    runs = {"this tree": [_run(args) for _ in range(args.repeats)]}
    keys = ("receive_ms_per_group", "check_ms_per_group", "total_ms_per_group", "decodes_per_record",
            "signature_checks_per_record")
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in keys} for name, rs in runs.items()}
    table = Table(title=f"CPU per received group ({args.groups} groups of {args.group_size}, "
                        f"{args.new_tokens} new tokens, tiny preset, median of {args.repeats})")
    table.add_column("code")
    for k in keys:
        table.add_column(k.replace("_ms_per_group", " ms").replace("_per_record", " / record").replace("_", " "),
                         justify="right")
    for name, m in medians.items():
        table.add_row(name, *(f"{m[k]:.2f}" for k in keys))
    Console().print(table)
    args.out.write_text(json.dumps({"settings": vars(args) | {"out": None}, "medians": medians, "runs": runs},
                                   indent=2) + "\n")


def show_walks(found: dict[str, dict], out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="The rooms (modules) one received group walks through: edges between project functions")
    for column in ("code", "walk", "rooms", "stays", "entries", "returns"):
        table.add_column(column, justify="left" if column in ("code", "walk") else "right")
    for name, walk in found.items():
        for part, summary in walk.items():
            table.add_row(name, part, *(str(summary[k]) for k in ("rooms", "stays", "entries", "returns")))
    Console().print(table)
    out.with_name("node-walk.json").write_text(json.dumps(found, indent=2) + "\n")


if __name__ == "__main__":
    main()
