"""Whole nodes on the in-process loopback network, with real (tiny) models.

Every run is bounded: a deadline in seconds and a round count; nothing touches a socket.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest

from p2p.loopback import LoopbackNetwork
from vrl.keys import NodeKey
from vrl.node.config import ConfigError, NodeConfig
from vrl.node.daemon import Node
from vrl.node.messages import SignedVerdict, Submission
from vrl.node.store import Store

TRAINER = NodeKey.from_seed(b"trainer".ljust(32, b"\0"))
WORKERS = [NodeKey.from_seed(f"worker-{i}".encode().ljust(32, b"\0")) for i in range(3)]


def config(data_dir: Path, **changes) -> NodeConfig:
    base = NodeConfig(data_dir=str(data_dir), trainer=TRAINER.node_id.hex(), model="tiny", task="arithmetic:digits=1",
                      group_size=4, groups_per_round=2, max_new_tokens=4, batch_groups=4, node_cap=0.5,
                      trusted_share=0.0, verdict_wait=0.5, round_timeout=5.0, held_out=8, eval_every=1,
                      transport="loopback", warmup_steps=1)
    return dataclasses.replace(base, **changes)


async def run_network(tmp_path: Path, adversary: str = "", rounds: int = 2, deadline: float = 150.0,
                      until=None) -> dict[str, Node]:
    """Trainer (+verifier), two honest worker-verifiers and one worker that may cheat; runs
    until the trainer has published ``rounds`` new versions (or ``until(nodes)`` holds) or
    the deadline passes."""
    network = LoopbackNetwork(seed=1)
    specs = {
        "trainer": (TRAINER, config(tmp_path / "trainer", roles=("trainer", "verifier"), plant_every=0)),
        "honest-0": (WORKERS[0], config(tmp_path / "w0")),
        "honest-1": (WORKERS[1], config(tmp_path / "w1")),
        "suspect": (WORKERS[2], config(tmp_path / "w2", roles=("worker",), adversary=adversary)),
    }
    nodes = {name: Node(cfg, network.transport(key.private_seed()), key) for name, (key, cfg) in specs.items()}
    stop = asyncio.Event()
    for node in nodes.values():
        await node.transport.start()
    trainer_address = nodes["trainer"].transport.addresses()[0]
    for name, node in nodes.items():
        if name != "trainer":
            node.config = dataclasses.replace(node.config, bootstrap=(trainer_address,))
    tasks = [asyncio.create_task(node.run(stop)) for node in nodes.values()]
    started = time.monotonic()
    try:
        while time.monotonic() - started < deadline:
            await asyncio.sleep(0.25)
            if any(t.done() for t in tasks):
                break
            done = until(nodes) if until is not None else (nodes["trainer"].protocol.version or 0) >= rounds
            if done:
                break
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        for node in nodes.values():
            await node.transport.close()
    for task in tasks:
        if task.exception() is not None:
            raise task.exception()
    return nodes


def trained_subjects(store_path: Path) -> list[bytes]:
    store = Store(store_path)
    try:
        subjects = []
        for _, groups, _ in store.trained_versions():
            for digest in groups:
                subjects.append(store.group(digest).rollouts()[0].node_id)
        return subjects
    finally:
        store.close()


def test_honest_network_trains_on_verified_groups_from_every_worker(tmp_path):
    nodes = asyncio.run(run_network(tmp_path, rounds=2))
    trainer = nodes["trainer"]
    assert trainer.protocol.version >= 2
    subjects = trained_subjects(tmp_path / "trainer" / "node.sqlite")
    assert subjects and set(subjects) <= {w.node_id for w in WORKERS}
    assert not trainer.protocol.quarantined
    # Every verdict in every store is signed and carries a digest when it checked.
    store = Store(tmp_path / "w0" / "node.sqlite")
    verdicts = [SignedVerdict.from_bytes(d) for k, d, _ in store.replay() if k == "verdict"]
    store.close()
    assert verdicts and all(v.valid() for v in verdicts)
    assert all(len(v.digest) == 32 for v in verdicts if v.checked)
    # Honest verifiers on one platform recompute identical digests for the same group.
    by_group: dict[bytes, set[bytes]] = {}
    for v in verdicts:
        if v.checked:
            by_group.setdefault(v.group, set()).add(v.digest)
    assert all(len(digests) == 1 for digests in by_group.values())


@pytest.mark.parametrize("adversary", ["fabricated-reward", "tampered-tokens"])
def test_a_cheating_worker_is_caught_quarantined_and_never_trained_on(tmp_path, adversary):
    nodes = asyncio.run(run_network(tmp_path, adversary=adversary, rounds=2))
    trainer = nodes["trainer"]
    cheat = WORKERS[2].node_id
    assert cheat in trainer.protocol.quarantined
    assert cheat not in trained_subjects(tmp_path / "trainer" / "node.sqlite")
    assert trainer.protocol.version >= 2  # training went on without it
    for honest in ("honest-0", "honest-1"):
        assert not nodes[honest].protocol.standing(WORKERS[0].node_id).quarantined


def test_a_restarted_node_loses_nothing_and_continues(tmp_path):
    """Stop a worker mid-run (its store is closed as a crash would leave it), start it again
    from the same directory: everything it had stored is still there and it keeps working."""
    nodes = asyncio.run(run_network(tmp_path, rounds=1))
    before = Store(tmp_path / "w0" / "node.sqlite")
    counts_before = before.counts()
    before.close()
    generated = max(nodes["honest-0"].protocol.generated)
    nodes = asyncio.run(run_network(tmp_path, until=lambda n: max(n["honest-0"].protocol.generated) > generated))
    after = Store(tmp_path / "w0" / "node.sqlite")
    counts_after = after.counts()
    after.close()
    assert all(counts_after[k] >= counts_before[k] for k in counts_before)
    assert counts_after["groups"] > counts_before["groups"]
    assert max(nodes["honest-0"].protocol.generated) > generated


def test_node_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="roles"):
        config(tmp_path, roles=("miner",))
    with pytest.raises(ConfigError, match="trainer"):
        NodeConfig(data_dir="x", trainer="nothex")
    with pytest.raises(ConfigError, match="unknown key 'rols'"):
        NodeConfig.from_dict({"data_dir": "x", "trainer": TRAINER.node_id.hex(), "rols": []})
    path = tmp_path / "node.toml"
    path.write_text(config(tmp_path / "d").to_toml())
    assert NodeConfig.from_toml(path) == config(tmp_path / "d")


def test_submissions_decode_strictly(tmp_path):
    from vrl.node.messages import MessageError

    with pytest.raises(MessageError, match="group"):
        Submission.from_bytes(b"\x81\xa4kind\xa5group")
