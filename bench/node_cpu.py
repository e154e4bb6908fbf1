"""A node's CPU time per received group: the gossip path, and the check a verifier then runs.

    python bench/node_cpu.py                          # this tree, 32 groups
    python bench/node_cpu.py --against c270bf5        # this tree and another revision, interleaved
    python bench/node_cpu.py --walk --against 522d110 # the rooms one group walks through (bench/walk.py)

It drives a real :class:`vrl.node.daemon.Node` (loopback transport, the ``tiny`` preset as the
policy, one torch thread) through the daemon's own methods, so what is timed is what a node
does with a group that arrives by gossip:

* receive: the validator, storing, and the protocol's handling (``validate`` + ``_on_message``);
* check: what the ``Check`` action runs (``_check``: the group's records, verified with one
  prefill; the signed verdict published).

It also counts, per record, how often a record is decoded and its signature checked on the
way (the counting wraps ``Rollout.from_bytes`` and ``Rollout.signature_valid`` in both trees).

CPU time is ``time.process_time()``, every thread of the process, divided by the groups. With
``--against REV`` the same measurement runs on a checkout of REV (through ``PYTHONPATH``, in
its own process) alternately with this tree, ``--repeats`` times each, and the medians and
their ratio are printed: absolute times are noisy on a shared machine, ratios side by side
are the result. The measurement itself uses only what both layouts have (``Node``,
``NodeConfig``, ``Submission``, ``vrl.iter_generate``), so a revision before the
architecture pass can be measured with it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
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
#: What a revision measured with --against needs from its tree.
CODE = ("vrl", "proofs", "p2p", "specs")


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
        if "work" in {f.name for f in dataclasses.fields(NodeConfig)}:  # node.toml's tables (issue 14 §2)
            settings = dict(work=work, protocol=dict(groups_per_round=groups))
        else:  # a revision before them, measured with --against: every key at the top level
            settings = dict(work, groups_per_round=groups)
        config = NodeConfig(data_dir=directory, trainer=trainer.node_id.hex(), transport="loopback",
                            roles=("verifier",), **settings)
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
        # The validator is the node's ``validate`` collaborator since issue 29, its
        # ``_validate`` method before; likewise its model thread.
        validate = getattr(node, "validate", None) or node._validate
        try:
            yield node, loop, submissions, validate
            if hasattr(node, "model_thread"):
                node.model_thread.shutdown()
            else:
                node._model_thread.shutdown(wait=True)
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
        # Count what the node does per group: records decoded, signatures checked (both
        # layouts export Rollout on the package face). Counting costs a call per event, in
        # both trees alike.
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


def _run(pythonpath: str | None, args: argparse.Namespace) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, __file__, "--measure", *(["--walk"] if args.walk else []), "--groups",
                           str(args.groups), "--group-size", str(args.group_size),
                           "--new-tokens", str(args.new_tokens)],
                          env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the measurement failed on {pythonpath or 'this tree'}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--against", metavar="REV", help="also measure this git revision, interleaved")
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

    trees: dict[str, str | None] = {"this tree": None}
    with tempfile.TemporaryDirectory() as other:
        if args.against:
            # The packages, and specs/: the tolerance table the verifier loads (specs/tolerances.json).
            subprocess.run(["git", "--work-tree", other, "checkout", args.against, "--", *CODE], cwd=ROOT, check=True)
            subprocess.run(["git", "reset", "-q", "--", *CODE], cwd=ROOT, check=True)
            trees[args.against] = other
        if args.walk:  # a count, not a time: one run each
            show_walks({name: _run(path, args) for name, path in trees.items()}, args.out)
            return
        runs: dict[str, list[dict]] = {name: [] for name in trees}
        for _ in range(args.repeats):
            for name, path in trees.items():
                runs[name].append(_run(path, args))
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
    if args.against:
        table.add_row(f"{args.against} / this tree",
                      *(f"{medians[args.against][k] / medians['this tree'][k]:.2f}x" for k in keys))
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
