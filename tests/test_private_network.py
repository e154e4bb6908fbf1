"""A private network on loopback (specs/zk.md §11): a trainer holding the answer key and two
workers holding only the public task file of committed references. The trainer proves each
trained record's correctness and binds the proofs in its announcement; every worker replays the
step from them (step_audit_rate 1) and passes it. Apart from tests/test_private_tasks.py, whose
module fixture trains and proves a step this network does not need, so the two run side by side."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import NamedTuple

import pytest
from support import QUICK, TRAINER
from test_node import drive

from p2p.loopback import LoopbackNetwork
from vrl.node.config import NodeConfig
from vrl.node.daemon import Node
from vrl.rollouts.keys import NodeKey
from vrl.tasks import RewardSpec, TaskList, open_task_set
from vrl.zk import AnswerKey, commit_answers, write_key, write_task_file

SPEC = RewardSpec()
WORKERS = [NodeKey.from_seed(f"private-worker-{i}".encode().ljust(32, b"\0")) for i in range(2)]


class Private(NamedTuple):
    public: TaskList
    key: AnswerKey
    base: object  # the quickly taught base model's directory
    workdir: object


@pytest.fixture(scope="module")
def private(zk_workdir, quick_base) -> Private:
    """The task set and key tests/test_private_tasks.py commits, without its trained step."""
    arithmetic, _ = open_task_set(QUICK.tasks)
    public_tasks, key = commit_answers(arithmetic.task(i) for i in range(96))
    return Private(TaskList("private", tuple(public_tasks)), key, quick_base, zk_workdir)


def test_a_private_network_trains_on_proven_rewards_and_its_steps_replay_clean(private, tmp_path, monkeypatch):
    """Loopback, bounded: a trainer holding the key and two workers holding only the public
    file; every node replays every step (step_audit_rate 1) from the proofs it binds."""
    monkeypatch.setenv("VRL_ZK_DIR", str(private.workdir))
    write_task_file(tmp_path / "public.jsonl", private.public.tasks)
    write_key(tmp_path / "key.jsonl", private.key)

    def config(name: str, roles: tuple[str, ...], **zk_table) -> NodeConfig:
        return NodeConfig(data_dir=str(tmp_path / name), trainer=TRAINER.node_id.hex(), transport="loopback",
                          roles=roles, zk={"dev_srs": True, **zk_table},
                          work={"model": str(private.base), "task": str(tmp_path / "public.jsonl"), "group_size": 4,
                                "max_new_tokens": 4},
                          protocol={"groups_per_round": 2, "verdict_wait": 0.5, "round_timeout": 5.0,
                                    "step_audit_rate": 1.0, "plant_every": 0},
                          admission={"batch_groups": 4, "node_cap": 0.5, "trusted_share": 0.0},
                          train={"held_out": 8, "eval_every": 1, "warmup_steps": 1})

    async def go():
        network = LoopbackNetwork(seed=5)
        nodes = {"trainer": Node(config("t", ("trainer", "verifier"), answers=str(tmp_path / "key.jsonl")),
                                 network.transport(TRAINER.private_seed()), TRAINER)}
        for i, key in enumerate(WORKERS):
            nodes[f"w{i}"] = Node(config(f"w{i}", ("worker", "verifier")), network.transport(key.private_seed()), key)
        for node in nodes.values():
            await node.transport.start()
        for name, node in nodes.items():
            if name != "trainer":
                node.config = dataclasses.replace(node.config, bootstrap=(nodes["trainer"].transport.addresses()[0],))

        def replayed(nodes) -> bool:  # both workers judged version 1's step
            return all(nodes[n].key.node_id in nodes[n].protocol.step_verdicts.get(1, {}) for n in ("w0", "w1"))
        return await drive(nodes, 240.0, replayed)

    nodes = asyncio.run(go())
    trainer = nodes["trainer"].protocol
    assert trainer.version is not None and trainer.version >= 1, "no version trained"
    first = trainer.policies[1]
    # Listed in the announcement, or in its batch file (specs/network.md §3.3.1), which a
    # replayer fetched: w0 judged version 1's step.
    trained = nodes["w0"].protocol.batch_of(1)
    assert trained is not None
    batch = [r for d, _ in trained for r in nodes["trainer"].groups.body(d).rollouts]
    decode = nodes["trainer"].work.skeleton.decode
    assert any(SPEC.given_form(decode(list(r.completion_tokens))) for r in batch), "no answer: nothing to prove"
    assert first.proofs and first.proofs_size, "records gave answers, and the step bound no proofs"
    assert len(trained) >= 1 and all(r.reward == 0.0 for r in batch)  # the workers claimed no correctness
    for name in ("w0", "w1"):
        node = nodes[name]
        mine = node.protocol.step_verdicts[1].get(node.key.node_id)
        assert mine is not None and mine.outcome == "pass", (name, mine)
        assert node.protocol.convicted is None
        assert node.answer_key is None  # it never held the answers


