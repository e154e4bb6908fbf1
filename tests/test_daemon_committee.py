"""Whole nodes of the committee design (specs/committee.md) on the in-process loopback network,
with real (tiny) models: the daemon subscribes to round manifests, stores them (the protocol's
PersistManifest and its own), replays them at a restart, and serves them to a late joiner by
backfill. Every run is bounded in rounds and seconds; nothing touches a socket."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from p2p.loopback import LoopbackNetwork
from tests.support import COMMITTEE
from tests.test_node import TRAINER, config, drive, failed_groups, trained_groups
from vrl.harness.adversary import node_for
from vrl.node import protocol as P
from vrl.node.catchup import replay_store
from vrl.node.committee import Draw
from vrl.node.daemon import Node
from vrl.node.messages import SignedVerdict
from vrl.node.startup import protocol_for
from vrl.node.store import Store
from vrl.rollouts.keys import NodeKey

KEYS = [NodeKey.from_seed(f"committee-{i}".encode().ljust(32, b"\0")) for i in range(4)]
def committee_config(data_dir: Path, **changes) -> object:
    base = config(data_dir, **changes)
    return dataclasses.replace(base, protocol=dataclasses.replace(base.protocol, **COMMITTEE))


def stored(path: Path) -> tuple[list, list[SignedVerdict]]:
    store = Store(path / "node.sqlite")
    try:
        verdicts = [SignedVerdict.from_bytes(d) for k, d, _ in store.replay() if k == "verdict"]
        return store.manifests(), verdicts
    finally:
        store.close()


async def committee_network(tmp_path: Path, rounds: int, deadline: float, late: bool = False) -> dict[str, Node]:
    """The trainer (+verifier), two honest worker-verifiers and a cheat (fabricated rewards);
    with ``late``, a third honest node joins (from an empty store) once the trainer is at
    version 2, and the run goes on until it holds every manifest the trainer does."""
    network = LoopbackNetwork(seed=3)
    specs = {"trainer": (TRAINER, committee_config(tmp_path / "trainer", roles=("trainer", "verifier"))),
             "honest-0": (KEYS[0], committee_config(tmp_path / "h0")),
             "honest-1": (KEYS[1], committee_config(tmp_path / "h1")),
             "cheat": (KEYS[2], committee_config(tmp_path / "c", adversary="fabricated-reward", roles=("worker",)))}
    nodes = {name: node_for(cfg.adversary)(cfg, network.transport(key.private_seed()), key)
             for name, (key, cfg) in specs.items()}
    for node in nodes.values():
        await node.transport.start()
    address = nodes["trainer"].transport.addresses()[0]
    for name, node in nodes.items():
        if name != "trainer":
            node.config = dataclasses.replace(node.config, bootstrap=(address,))
    nodes = await drive(nodes, deadline, lambda n: (n["trainer"].protocol.version or 0) >= rounds)
    if late:
        # Every node restarts from its store (new transports: a loopback one starts once); the
        # joiner has only what backfill brings.
        restarted = {name: node_for(node.config.adversary)(node.config, network.transport(node.key.private_seed()),
                                                           node.key) for name, node in nodes.items()}
        restarted["late"] = Node(dataclasses.replace(committee_config(tmp_path / "late"), bootstrap=(address,)),
                                 network.transport(KEYS[3].private_seed()), KEYS[3])
        for node in restarted.values():
            await node.transport.start()
        nodes = restarted
        nodes = await drive(nodes, deadline, lambda n: set(n["late"].protocol.rounds.manifests)
                            >= set(n["trainer"].protocol.rounds.manifests) - {n["trainer"].protocol.version})
    return nodes


def test_a_committee_network_stores_manifests_catches_the_cheat_and_restarts_from_its_store(tmp_path):
    nodes = asyncio.run(committee_network(tmp_path, rounds=3, deadline=240.0, late=True))
    trainer = nodes["trainer"].protocol
    cheat = KEYS[2].node_id
    assert trainer.version >= 3
    # The cheat is caught and never trained on; no honest node is quarantined.
    assert cheat in trainer.quarantined and trainer.quarantined <= {cheat}
    assert not set(trained_groups(tmp_path / "trainer" / "node.sqlite")) & failed_groups(
        tmp_path / "trainer" / "node.sqlite")
    # Every node stored the trainer's manifests (its own publish, or PersistManifest of gossip
    # and backfill): the same bytes for each round, the first of its round.
    held, _ = stored(tmp_path / "trainer")
    # At version 3 at least rounds 0 and 1 were closed (a batch holds listed groups only, of
    # rounds within max_staleness): round 2's may still be open when the run stops.
    assert len(held) >= 2 and all(m.trainer == TRAINER.node_id and m.valid() for m in held)
    for name in ("h0", "h1", "late"):
        manifests, _ = stored(tmp_path / name)
        rounds = {m.round: m for m in manifests}
        assert rounds and all(rounds[m.round] == m for m in held if m.round in rounds), name
        assert set(rounds) >= {m.round for m in held[:-1]}, name  # the late joiner's came by backfill
    # Verdicts of the committee design were stored: members' claims, and the trainer's own.
    _, verdicts = stored(tmp_path / "h0")
    assert {Draw.NONE} <= {v.draw for v in verdicts}
    assert all(v.draw != Draw.TICKET for v in verdicts)
    # A restart: the store replayed into a fresh protocol holds the same manifests and the same
    # counted verdicts, so its committees are drawn, and others' claims checked, as before.
    node = nodes["honest-0"]
    fresh = protocol_for(node.config, node.key, node.work)
    store = Store(tmp_path / "h0" / "node.sqlite")
    try:
        replay_store(store, fresh)
    finally:
        store.close()
    # Its first live event forgets the rounds no fresh group is of, and the groups below the floor
    # (vrl.node.rounds.Rounds.forget, vrl.node.forgetting), as the running node did: a replay is
    # absorbed, and state upkeep runs with actions.
    assert isinstance(fresh.handle(P.Tick(0.0)), list)
    assert fresh.rounds.manifests == node.protocol.rounds.manifests
    assert {d: set(v) for d, v in fresh.verdicts.items() if v} == {
        d: set(v) for d, v in node.protocol.verdicts.items() if v}
    # The trainer's store holds the lists behind each manifest it signed (specs/committee.md
    # §3.6): a restarted trainer holds them again, proven against the headers, and serves them.
    restarted = protocol_for(nodes["trainer"].config, TRAINER, nodes["trainer"].work)
    store = Store(tmp_path / "trainer" / "node.sqlite")
    try:
        assert set(store.manifest_lists()) == {m.round for m in held}
        replay_store(store, restarted)
    finally:
        store.close()
    restarted.handle(P.Tick(0.0))
    assert set(restarted.rounds.lists) == set(trainer.rounds.lists)
    for round_, lists in trainer.rounds.lists.items():
        assert restarted.rounds.lists[round_].header == lists.header
    assert restarted.reputation.withheld() == trainer.reputation.withheld()
