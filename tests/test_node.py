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
from vrl.harness.adversary import node_for
from vrl.node.config import ConfigError, NodeConfig
from vrl.node.daemon import Node
from vrl.node.messages import Group, SignedVerdict, Submission
from vrl.node.store import Store
from vrl.rollouts.keys import NodeKey

TRAINER = NodeKey.from_seed(b"trainer".ljust(32, b"\0"))
WORKERS = [NodeKey.from_seed(f"worker-{i}".encode().ljust(32, b"\0")) for i in range(3)]


def config(data_dir: Path, plant_every: int = 0, train: dict | None = None, verification: str | None = None,
           **changes) -> NodeConfig:
    """A small, fast node; its tables are given as node.toml gives them, on the node's defaults
    (``verification``: the design, if not the node's default)."""
    return NodeConfig(data_dir=str(data_dir), trainer=TRAINER.node_id.hex(), transport="loopback",
                      work={"model": "tiny", "task": "arithmetic:digits=1", "group_size": 4, "max_new_tokens": 4},
                      protocol={"groups_per_round": 2, "verdict_wait": 0.5, "round_timeout": 5.0,
                                "plant_every": plant_every, **({"verification": verification} if verification else {})},
                      admission={"batch_groups": 4, "node_cap": 0.5, "trusted_share": 0.0},
                      train={"held_out": 8, "eval_every": 1, "warmup_steps": 1, **(train or {})}, **changes)


async def run_network(tmp_path: Path, adversary: str = "", rounds: int = 2, deadline: float = 150.0,
                      until=None, plant_every: int = 0, train: dict | None = None,
                      verification: str | None = None) -> dict[str, Node]:
    """Trainer (+verifier), two honest worker-verifiers and one worker that may cheat; runs
    until the trainer has published ``rounds`` new versions (or ``until(nodes)`` holds) or
    the deadline passes. ``train``: keys of the trainer's [train] table; ``verification``: the
    design, if not the node's default."""
    network = LoopbackNetwork(seed=1)
    specs = {
        "trainer": (TRAINER, config(tmp_path / "trainer", roles=("trainer", "verifier"), plant_every=plant_every,
                                    train=train, verification=verification)),
        "honest-0": (WORKERS[0], config(tmp_path / "w0", verification=verification)),
        "honest-1": (WORKERS[1], config(tmp_path / "w1", verification=verification)),
        "suspect": (WORKERS[2], config(tmp_path / "w2", adversary=adversary, verification=verification, roles=(
            ("worker", "verifier") if adversary == "lazy-verifier" else ("worker",)))),
    }
    nodes = {name: node_for(cfg.adversary)(cfg, network.transport(key.private_seed()), key)
             for name, (key, cfg) in specs.items()}
    for node in nodes.values():
        await node.transport.start()
    trainer_address = nodes["trainer"].transport.addresses()[0]
    for name, node in nodes.items():
        if name != "trainer":
            node.config = dataclasses.replace(node.config, bootstrap=(trainer_address,))
    return await drive(nodes, deadline,
                       until or (lambda nodes: (nodes["trainer"].protocol.version or 0) >= rounds))


async def drive(nodes: dict[str, Node], deadline: float, until) -> dict[str, Node]:
    """Run started nodes until ``until(nodes)`` holds, one of them stops, or ``deadline``
    seconds pass; then stop them all (within 60 s) and raise what any of them raised."""
    stop = asyncio.Event()
    tasks = [asyncio.create_task(node.run(stop)) for node in nodes.values()]
    started = time.monotonic()
    try:
        while time.monotonic() - started < deadline:
            await asyncio.sleep(0.25)
            if any(t.done() for t in tasks) or until(nodes):
                break
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
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


def trained_groups(store_path: Path) -> list[bytes]:
    store = Store(store_path)
    try:
        return [d for _, groups, _ in store.trained_versions() for d in groups]
    finally:
        store.close()


def stored_verdicts(store_path: Path) -> list[SignedVerdict]:
    """Every verdict a node stored: the protocol forgets old groups' verdicts (vrl.node.forgetting)."""
    store = Store(store_path)
    try:
        return [SignedVerdict.from_bytes(d) for k, d, _ in store.replay() if k == "verdict"]
    finally:
        store.close()


def failed_groups(store_path: Path) -> set[bytes]:
    return {v.group for v in stored_verdicts(store_path) if v.outcome in ("hard_fail", "soft_fail")}


def test_honest_network_trains_on_verified_groups_from_every_worker(tmp_path):
    nodes = asyncio.run(run_network(tmp_path, rounds=2))
    trainer = nodes["trainer"]
    assert trainer.protocol.version >= 2
    subjects = trained_subjects(tmp_path / "trainer" / "node.sqlite")
    assert subjects and set(subjects) <= {w.node_id for w in WORKERS}
    assert not trainer.protocol.quarantined
    # Every verdict in every store is signed and carries a digest when it checked.
    verdicts = [v for name in ("trainer", "w0", "w1") for v in stored_verdicts(tmp_path / name / "node.sqlite")]
    assert verdicts and all(v.valid() for v in verdicts)
    assert all(len(v.digest) == 32 for v in verdicts if v.checked)
    # Honest verifiers on one platform recompute identical digests for the same group.
    by_group: dict[bytes, set[bytes]] = {}
    for v in verdicts:
        if v.checked:
            by_group.setdefault(v.group, set()).add(v.digest)
    assert all(len(digests) == 1 for digests in by_group.values())


@pytest.mark.parametrize("adversary", ["fabricated-reward", "tampered-tokens", "quantized-model", "other-model",
                                       "replay"])
def test_a_cheating_worker_is_caught_quarantined_and_never_trained_on(tmp_path, adversary):
    cheat = WORKERS[2].node_id
    # Until two versions are out and the cheat is quarantined (or the deadline passes): a
    # replayer has nothing to copy before another node's group reaches it, so its cheat, the
    # failed check and the re-check can come after the second version.
    # A replayer copies the groups the ticket design gossips; in the committee design it has none
    # to copy (groups go to the trainer alone: tests/test_simulator.py, the replayer).
    nodes = asyncio.run(run_network(tmp_path, adversary=adversary, until=lambda nodes: (
        (nodes["trainer"].protocol.version or 0) >= 2 and cheat in nodes["trainer"].protocol.quarantined),
        verification="tickets" if adversary == "replay" else None))
    trainer = nodes["trainer"]
    assert cheat in trainer.protocol.quarantined
    assert not set(trained_groups(tmp_path / "trainer" / "node.sqlite")) & failed_groups(
        tmp_path / "trainer" / "node.sqlite")  # nothing any check rejected was trained on
    if adversary != "replay":  # a replayer is honest until it has someone else's group to copy
        assert cheat not in trained_subjects(tmp_path / "trainer" / "node.sqlite")
    assert trainer.protocol.version >= 2  # training went on without it
    for honest in ("honest-0", "honest-1"):
        assert not nodes[honest].protocol.standing(WORKERS[0].node_id).quarantined


@pytest.mark.parametrize("adversary", ["spoof-int8", "spoof-temperature"])
def test_a_decode_spoofing_worker_is_caught_by_its_races_and_quarantined(tmp_path, adversary):
    """It commits and reports logprobs by an honest prefill, so only its races show it
    (specs/verification.md §7): in float32 a lost race beyond honest drift is proof at once."""
    cheat = WORKERS[2].node_id
    nodes = asyncio.run(run_network(tmp_path, adversary=adversary, deadline=240.0, until=lambda nodes: (
        cheat in nodes["trainer"].protocol.quarantined and cheat in nodes["honest-0"].protocol.quarantined)))
    assert cheat in nodes["trainer"].protocol.quarantined
    reasons = {r for v in stored_verdicts(tmp_path / "trainer" / "node.sqlite") if v.subject == cheat
               for r in v.reasons}
    assert reasons & {"sampling_mismatch", "stop_not_sampled", "race_losses"}
    assert not {WORKERS[0].node_id, WORKERS[1].node_id} & nodes["trainer"].protocol.quarantined
    # Nothing any check failed was trained, the trainer's own pass included (specs/network.md §5.4).
    assert not set(trained_groups(tmp_path / "trainer" / "node.sqlite")) & failed_groups(
        tmp_path / "trainer" / "node.sqlite")


def test_a_lazy_verifier_is_caught_by_a_planted_group_and_quarantined(tmp_path):
    nodes = asyncio.run(run_network(tmp_path, adversary="lazy-verifier", plant_every=1,
                                    until=lambda n: WORKERS[2].node_id in n["trainer"].protocol.quarantined))
    trainer = nodes["trainer"]
    assert WORKERS[2].node_id in trainer.protocol.quarantined
    assert not {WORKERS[0].node_id, WORKERS[1].node_id} & trainer.protocol.quarantined


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


def test_every_validator_and_handler_survives_malformed_and_mutated_messages(tmp_path):
    """Fuzz: random bytes and single-byte mutations of valid messages, into every gossip
    validator, the message path and the backfill handler. Nothing raises out of a validator,
    nothing malformed is accepted, and the node keeps its state."""
    import random

    from p2p.transport import Message, Validation, message_id
    from vrl.node.messages import TOPIC_GROUPS, TOPIC_POLICIES, TOPIC_VERDICTS, PolicyAnnouncement, audit_ticket

    async def fuzz() -> None:
        network = LoopbackNetwork()
        # The ticket design, whose verdicts (audit tickets) need no manifest to be accepted.
        node = Node(config(tmp_path / "fuzz", verification="tickets"), network.transport(WORKERS[0].private_seed()),
                    WORKERS[0])
        worker = Node(config(tmp_path / "w", verification="tickets"), network.transport(WORKERS[1].private_seed()),
                      WORKERS[1])
        policy = PolicyAnnouncement(TRAINER.node_id, 0, b"\x01" * 32, b"\x02" * 32, 10).signed(TRAINER)
        node.protocol.policies[0] = policy
        worker.work.install(0, worker.work.skeleton, 3)
        worker.protocol.policies[0] = policy
        group = worker.work.generate(0)[0]
        verdict = SignedVerdict(WORKERS[1].node_id, WORKERS[0].node_id, group.digest, 0, 0,
                                audit_ticket(WORKERS[1], group.digest), 1.0, "pass", (), b"\x03" * 32,
                                "p").signed(WORKERS[1])
        valid = {TOPIC_GROUPS: group.to_bytes(), TOPIC_VERDICTS: verdict.to_bytes(), TOPIC_POLICIES: policy.to_bytes()}
        for topic, data in valid.items():
            assert node.validate(Message(topic, data, b"x" * 32, b"")) is Validation.ACCEPT
        draw = random.Random(7)
        accepted_mutants = 0
        for trial in range(600):  # bounded
            topic = draw.choice(list(valid))
            data = bytearray(valid[topic])
            if trial % 3 == 0:
                data = bytearray(draw.randbytes(draw.randrange(0, 300)))
            else:
                for _ in range(draw.randrange(1, 4)):
                    data[draw.randrange(len(data))] = draw.randrange(256)
            message = Message(topic, bytes(data), b"x" * 32, message_id(topic, bytes(data)))
            verdict_of = node.validate(message)
            assert isinstance(verdict_of, Validation)
            if verdict_of is Validation.ACCEPT and bytes(data) != valid[topic]:
                accepted_mutants += 1  # a mutation inside a float or text field can stay valid...
                assert topic != TOPIC_POLICIES  # ...but never a signed policy
            if verdict_of is Validation.ACCEPT:  # what the transport hands on
                await node._on_message(message)
            try:
                await node.catchup.serve(b"x" * 32, bytes(data))
            except ValueError:
                pass  # the transport answers the caller with an error; the node is unaffected
        assert accepted_mutants < 30
        for n in (node, worker):
            n.store.close()

    asyncio.run(asyncio.wait_for(fuzz(), 120))


def test_a_partitioned_network_heals_and_catches_up(tmp_path):
    """Cut one honest worker off for a while; after the heal, periodic backfill brings it the
    groups, verdicts and policies it missed, and it works on the current version again."""
    from vrl.node import daemon

    original = daemon.BACKFILL_EVERY_SECONDS
    daemon.BACKFILL_EVERY_SECONDS = 1.0
    state = {}

    def until(nodes):
        net = nodes["trainer"].transport._network
        isolated = nodes["honest-1"]
        version = nodes["trainer"].protocol.version or 0
        if "cut" not in state and version >= 1:
            others = [n.transport.peer_id for name, n in nodes.items() if name != "honest-1"]
            net.partition([others, [isolated.transport.peer_id]])
            state["cut"] = version
        elif "cut" in state and "healed" not in state and version >= state["cut"] + 1:
            net.heal()
            state["healed"] = version
        return "healed" in state and (isolated.protocol.version or 0) >= state["healed"] and max(
            isolated.protocol.generated, default=-1) >= state["healed"]

    try:
        nodes = asyncio.run(run_network(tmp_path, until=until, deadline=120))
    finally:
        daemon.BACKFILL_EVERY_SECONDS = original
    assert "healed" in state
    isolated = nodes["honest-1"]
    assert (isolated.protocol.version or 0) >= state["healed"]


def test_metrics_count_what_the_node_did(tmp_path):
    nodes = asyncio.run(run_network(tmp_path, rounds=3))
    values = {}
    from prometheus_client import generate_latest

    text = generate_latest(nodes["honest-0"].metrics.registry).decode()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    assert values["vrl_rollouts_produced_total"] > 0
    assert sum(v for k, v in values.items() if k.startswith("vrl_groups_checked_total")) > 0
    assert values["vrl_policy_version"] >= 2
    checked = sum(v for k, v in values.items() if k.startswith("vrl_groups_checked_total"))
    store = Store(tmp_path / "w0" / "node.sqlite")
    mine = [SignedVerdict.from_bytes(d) for d, in store._rows("SELECT data FROM verdicts WHERE verifier=?",
                                                               (WORKERS[0].node_id,))]
    store.close()
    assert values["vrl_groups_skipped_total"] == sum(not v.checked for v in mine)
    assert checked == sum(v.checked for v in mine)


def test_fifty_sybil_peers_serving_hostile_backfill_pages_neither_crash_nor_move_an_honest_node(tmp_path):
    """Issue 13 §1-2: a page such as {"messages": 1} crashed a node while it started; and
    signed verdicts from fresh identities naming an honest node as subject quarantined it.
    50 fresh peers each answer backfill with garbage pages and with valid, signed, hostile
    verdicts; the node survives every page, stores none of the lies, and no score moves."""
    import hashlib

    import msgpack

    from vrl.node.daemon import BACKFILL_PROTOCOL
    from vrl.node.messages import PolicyAnnouncement, audit_ticket
    from vrl.node.requests import BackfillPage

    async def attack() -> None:
        network = LoopbackNetwork(seed=3)
        victim_key, honest_key = WORKERS[0], WORKERS[1]
        # The ticket design, whose verdicts (audit tickets) a page may carry without a manifest.
        node = Node(config(tmp_path / "victim", roles=("worker", "verifier"), verification="tickets"),
                    network.transport(victim_key.private_seed()), victim_key)
        await node.transport.start()
        policy = PolicyAnnouncement(TRAINER.node_id, 0, b"\x01" * 32, b"\x02" * 32, 10).signed(TRAINER)
        node.protocol.handle(__import__("vrl.node.protocol", fromlist=["P"]).PolicyAnnounced(policy))
        honest_group = Submission((b"honest group",))
        from vrl.node import protocol as P
        node.protocol.handle(P.GroupReceived(Group(honest_group, (), honest_key.node_id, 0, 101), 0.0))
        before = node.protocol.standing(honest_key.node_id)
        garbage = [msgpack.packb(p, use_bin_type=True) for p in (
            {"messages": 1, "next": None}, {1: 2, "a": 3}, {"messages": [1, "x"], "next": None},
            {"messages": [], "next": 2**63 + 5}, [], {"messages": [], "next": 0})] + [b"\xc1", b""]
        sybils = [NodeKey.from_seed(hashlib.sha256(b"sybil peer %d" % i).digest()) for i in range(50)]
        for index, sybil in enumerate(sybils):
            transport = network.transport(sybil.private_seed())
            await transport.start()
            lies = tuple(SignedVerdict(sybil.node_id, honest_key.node_id, digest, 2**64 - 1, 0,
                                       audit_ticket(sybil, digest), 1.0, "hard_fail", ("reward_mismatch",),
                                       b"\x09" * 32, "p").signed(sybil).to_bytes()
                         for digest in (honest_group.digest, hashlib.sha256(b"unseen %d" % index).digest()))
            # A well-formed page answers the client's cursor with one (specs/network.md §6).
            answer = garbage[index % len(garbage)] if index % 2 else BackfillPage(lies, None, (1,) * 6).to_bytes()

            async def serve(peer: bytes, data: bytes, answer: bytes = answer) -> bytes:
                return answer

            transport.set_handler(BACKFILL_PROTOCOL, serve)
            await node.transport.connect(transport.addresses()[0])
        fed = await asyncio.wait_for(node.backfill(since=0), 60)
        from vrl.node.protocol import MAX_STRANGER_VERDICTS_PER_GROUP as cap

        assert fed == cap + 25  # the valid pages' verdicts were validated and fed, up to the cap
        after = node.protocol.standing(honest_key.node_id)
        assert (after.score, after.failures, after.quarantined) == (before.score, before.failures, False)
        assert node.store.counts()["verdicts"] == cap  # accusations of the real group: kept, weighing 0
        assert node.protocol.waiting_verdicts == 25  # those about unseen groups wait, unstored
        scores = {index: node.transport.score(s.node_id) for index, s in enumerate(sybils)}
        assert all(scores[i] < 0 for i in range(1, 50, 2))  # each malformed page counted against its server
        assert all(scores[i] == 0 for i in range(0, 50, 2))  # well-formed pages cost nothing
        node.store.close()

    asyncio.run(asyncio.wait_for(attack(), 120))


def verifier_and_worker(tmp_path: Path, verification: str | None = None) -> tuple[Node, Node]:
    """Two nodes that know policy 0, the worker holding its weights: to hand the first groups
    the second makes, through the daemon's own validator and handler."""
    from vrl.node.messages import PolicyAnnouncement

    network = LoopbackNetwork()
    node = Node(config(tmp_path / "v", verification=verification), network.transport(WORKERS[0].private_seed()),
                WORKERS[0])
    worker = Node(config(tmp_path / "w", verification=verification), network.transport(WORKERS[1].private_seed()),
                  WORKERS[1])
    policy = PolicyAnnouncement(TRAINER.node_id, 0, b"\x01" * 32, b"\x02" * 32, 10).signed(TRAINER)
    for n in (node, worker):
        n.protocol.policies[0] = policy
    worker.work.install(0, worker.work.skeleton, 3)
    return node, worker


def test_only_groups_a_round_can_hold_are_accepted(tmp_path):
    """Assignment binds a task to each group index; without a bound on the index a worker
    could generate groups 0..999 and submit the ones whose tasks it likes; without a fixed
    group size it could cut a group to the samples it likes; and a group of a version no one
    can train on would only fill the disk and every backfill page."""
    from p2p.transport import Message, Validation, message_id
    from vrl.node.messages import TOPIC_GROUPS

    node, worker = verifier_and_worker(tmp_path)
    honest = worker.work.generate(0)[0]
    extra = Submission.of([r.signed(WORKERS[1], group_index=node.config.protocol.groups_per_round)
                           for r in honest.rollouts])
    cut = Submission.of([r.signed(WORKERS[1], group_size=2) for r in honest.rollouts[:2]])
    future = Submission.of([r.signed(WORKERS[1], policy_version=2) for r in honest.rollouts])
    verdicts = {name: node.validate(Message(TOPIC_GROUPS, sub.to_bytes(), b"x" * 32,
                                             message_id(TOPIC_GROUPS, sub.to_bytes())))
                for name, sub in (("honest", honest), ("extra", extra), ("cut", cut), ("future", future))}
    assert verdicts == {"honest": Validation.ACCEPT, "extra": Validation.IGNORE, "cut": Validation.IGNORE,
                        "future": Validation.IGNORE}
    for n in (node, worker):
        n.store.close()


def test_weights_damaged_on_disk_are_fetched_again(tmp_path):
    """A blob file that no longer matches its hash was re-read (and refused) forever."""
    import hashlib

    from p2p.blobs import BlobStore
    from vrl.node.messages import PolicyAnnouncement
    from vrl.node.weights import to_blob

    async def scenario() -> None:
        network = LoopbackNetwork()
        node = Node(config(tmp_path / "n"), network.transport(WORKERS[0].private_seed()), WORKERS[0])
        holder = network.transport(WORKERS[1].private_seed())
        await node.transport.start()
        await holder.start()
        blob = to_blob(node.work.skeleton)
        BlobStore(holder).put(blob)
        await node.transport.connect(holder.addresses()[0])
        announcement = PolicyAnnouncement(TRAINER.node_id, 0, node.work.skeleton.model_hash,
                                          hashlib.sha256(blob).digest(), len(blob)).signed(TRAINER)
        node.protocol.handle(__import__("vrl.node.protocol", fromlist=["P"]).PolicyAnnounced(announcement))
        path = node.blobs.directory / announcement.blob.hex()
        path.write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))  # one flipped bit
        await asyncio.wait_for(node._fetch_policy(announcement), 60)
        assert 0 in node.protocol.loaded and path.read_bytes() == blob
        node.store.close()

    asyncio.run(scenario())


def test_a_replayed_round_starts_when_its_policy_arrived_not_at_zero(tmp_path):
    """Replay fed no clock, so a restarted trainer saw its current round as started at time 0,
    long timed out, and stepped at once with whatever was decided."""
    from vrl.node.catchup import replay_store
    from vrl.node.messages import PolicyAnnouncement

    network = LoopbackNetwork()
    node = Node(config(tmp_path / "n"), network.transport(WORKERS[0].private_seed()), WORKERS[0])
    policy = PolicyAnnouncement(TRAINER.node_id, 0, b"\x01" * 32, b"\x02" * 32, 10).signed(TRAINER)
    node.store.put_policy(policy, 1000.0)
    replay_store(node.store, node.protocol)
    assert node.protocol.round_started == {0: 1000.0}
    node.store.close()


def test_a_group_whose_decoded_records_were_let_go_is_read_back_from_the_store(tmp_path):
    """Decoded groups are held in a cache bounded by bytes (a decoded group is ~9x its
    message); a check or training step for one that left it reads the stored bytes back and
    decodes them, signatures checked again, rather than being abandoned."""
    from p2p.transport import Message, Validation, message_id
    from vrl.node.messages import TOPIC_GROUPS

    node, worker = verifier_and_worker(tmp_path)
    first, second = worker.work.generate(0)[:2]
    node.groups.max_bytes = sum(map(len, first.submission.records))
    for group in (first, second):
        message = Message(TOPIC_GROUPS, group.to_bytes(), b"x" * 32, message_id(TOPIC_GROUPS, group.to_bytes()))
        assert node.validate(message) is Validation.ACCEPT
        asyncio.run(node._on_message(message))
    assert list(node.groups.bodies) == [second.digest]  # the first went: the bound holds one
    again = node.groups.body(first.digest)
    assert again is not None and again.rollouts == first.rollouts and again is not first
    assert node.groups.body(b"\x00" * 32) is None  # never stored
    node.store.close()
    worker.store.close()


def test_max_new_tokens_past_the_models_context_is_a_config_error(tmp_path):
    """Generation past the model's positions would fail every round deep inside the model."""
    settings = NodeConfig(data_dir=str(tmp_path), trainer=TRAINER.node_id.hex(), transport="loopback",
                          work={"model": "tiny", "task": "arithmetic:digits=1", "max_new_tokens": 100000})
    with pytest.raises(ConfigError, match="max_new_tokens"):
        Node(settings, LoopbackNetwork(seed=1).transport(TRAINER.private_seed()), TRAINER)


def test_a_trainer_node_reports_each_version_to_its_trackers(tmp_path):
    """[train] report_to (issue 18, item 6): each published version's metrics, as the store
    records them, in TensorBoard's event files of the trainer's directory, at step = version."""
    import json

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from vrl.rl.trackers import scalars

    nodes = asyncio.run(run_network(tmp_path, rounds=2, train={"report_to": ["tensorboard"]}))
    assert nodes["trainer"].protocol.version >= 2
    store = Store(tmp_path / "trainer" / "node.sqlite")
    try:
        stored = {version: scalars(json.loads(metrics)) for version, _, metrics in store.trained_versions()}
    finally:
        store.close()
    events = EventAccumulator(str(tmp_path / "trainer" / "trainer" / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    board = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    assert {1, 2} <= set(stored) and "held_out_accuracy" in board
    for version, values in stored.items():
        for key, value in values.items():
            assert board[key][version] == pytest.approx(value, rel=1e-6), (version, key)


def test_a_check_this_machine_cannot_reward_now_is_asked_again_not_judged(tmp_path, monkeypatch):
    """specs/rewards.md §6: a reward that cannot be computed mid-run (the code sandbox cannot
    fork, the disk is full) makes the check reward_unknown: this machine's limit, not the
    producer's fault. No verdict is published or counted, the check is no longer in flight, so
    the protocol asks for it again; once the reward can be computed, the group is judged."""
    from prometheus_client import generate_latest

    from p2p.transport import Message, Validation, message_id
    from vrl.node import protocol as P
    from vrl.node.messages import TOPIC_GROUPS, Outcome, PolicyAnnouncement
    from vrl.tasks import RewardSpec
    from vrl.tasks.rewards import RewardUnavailable

    def checks_counted() -> float:
        text = generate_latest(node.metrics.registry).decode()
        return sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
                   if line.startswith("vrl_groups_checked_total"))

    def no_fork(self, task, text):
        raise RewardUnavailable("reward_spec[0]", "the sandbox cannot fork: resource temporarily unavailable")

    node, worker = verifier_and_worker(tmp_path, verification="tickets")  # a check its own ticket drew
    # Version 0 is the model both hold, so that the group's round seed is the one expected.
    policy = PolicyAnnouncement(TRAINER.node_id, 0, node.work.skeleton.model_hash, b"\x02" * 32, 10).signed(TRAINER)
    for n in (node, worker):
        n.protocol.policies[0] = policy
    group = worker.work.generate(0)[0]
    message = Message(TOPIC_GROUPS, group.to_bytes(), b"x" * 32, message_id(TOPIC_GROUPS, group.to_bytes()))
    assert node.validate(message) is Validation.ACCEPT
    asyncio.run(node._on_message(message))
    node.work.install(0, node.work.skeleton, 3)
    check = P.Check(group.digest, 0)
    with monkeypatch.context() as patch:
        patch.setattr(RewardSpec, "reward", no_fork)
        assert node.protocol.once(check) == [check]
        asyncio.run(node._check(group.digest, 0))
    assert node.protocol.verdicts[group.digest].get(node.protocol.me) is None
    assert checks_counted() == 0
    assert node.protocol.once(check) == [check]  # asked for again

    # A check that raises what nothing expected is left for later too: were it neither ended
    # nor abandoned, it would hold a slot of the node's check queue for good (vrl.node.rounds).
    def broken(*args):
        raise RuntimeError("a bug on the model thread")

    with monkeypatch.context() as patch:
        patch.setattr(node.work, "check", broken)
        asyncio.run(node._check(group.digest, 0))
    assert not node.protocol.checking(group.digest)
    assert node.protocol.abandoned_checks[group.digest] == 2 and checks_counted() == 0
    assert node.protocol.once(check) == [check]

    asyncio.run(node._check(group.digest, 0))  # the sandbox is back
    assert node.protocol.verdicts[group.digest][node.protocol.me].outcome == Outcome.PASS
    assert checks_counted() == 1 and group.digest not in node.protocol.abandoned_checks
    node.store.close()
    worker.store.close()


def test_a_check_that_cannot_run_now_is_abandoned_after_a_back_off_not_at_once(tmp_path, monkeypatch):
    """A check whose group body is not here (or whose weights are still loading, or whose
    producer is out of reach) is reported abandoned after the back-off of a failed fetch for its
    abandons in a row: reported at once, the protocol asked for it again at once, in a loop
    while nothing else waited."""
    from vrl.node import daemon
    from vrl.node import protocol as P

    node, worker = verifier_and_worker(tmp_path)
    happened = []
    feed = node._feed

    async def sleep(seconds):
        happened.append(("sleep", seconds))

    async def recorded(event):
        if isinstance(event, P.Abandoned):
            happened.append(("abandoned", node.protocol.abandoned_checks[event.action.group]))
        await feed(event)

    monkeypatch.setattr(daemon.asyncio, "sleep", sleep)
    monkeypatch.setattr(node, "_feed", recorded)
    digest = b"\x01" * 32  # a seat whose group never came
    assert node.protocol.once(P.Check(digest, 0)) == [P.Check(digest, 0)]
    asyncio.run(node._check(digest, 0))  # (its abandon asks again at once: that task runs on too)
    abandons = [i for i, (what, _) in enumerate(happened) if what == "abandoned"]
    assert abandons and all(i > 0 and happened[i - 1][0] == "sleep" for i in abandons)
    for i in abandons:  # each after a back-off whose ceiling doubles with the abandons before it
        assert 0 <= happened[i - 1][1] <= daemon.FETCH_RETRY_FIRST_SECONDS * 2 ** happened[i][1]
    node.store.close()
    worker.store.close()


def test_a_trainer_cheating_with_groups_it_failed_adds_them_to_the_batch_it_trains(tmp_path, monkeypatch):
    """The trainer-rejected-group cheat, wired by vrl.harness.adversary.node_for around an honest node:
    the batch its Training is asked to train is admission's, plus the fresh groups the trainer
    failed itself a round or more ago (no honest class has a hook for it)."""
    from vrl.node import protocol as P
    from vrl.node.messages import Outcome, PolicyAnnouncement, audit_ticket
    from vrl.node.training import Training

    trained = []

    async def train(self, version, batch):
        trained.append(batch)
        yield P.Abandoned(P.Train(version, batch))

    monkeypatch.setattr(Training, "train", train)
    kind = "trainer-rejected-group"
    node = node_for(kind)(config(tmp_path / "t", roles=("trainer", "verifier"), adversary=kind),
                          LoopbackNetwork(seed=1).transport(TRAINER.private_seed()), TRAINER)
    monkeypatch.setattr(node.trainer, "_cheating", lambda: True)  # past its honest start (CHEAT_FROM)
    protocol, failed, admitted = node.protocol, Submission((b"failed",)), Submission((b"admitted",))
    for version in (0, 1):
        protocol.handle(P.PolicyAnnounced(PolicyAnnouncement(TRAINER.node_id, version, bytes([version]) * 32,
                                                             b"\x02" * 32, 10).signed(TRAINER)))
    for index, sub in enumerate((failed, admitted)):
        protocol.handle(P.GroupReceived(Group(sub, (), WORKERS[0].node_id, 0, index), 1.0))
    protocol.verdicts[failed.digest][TRAINER.node_id] = SignedVerdict(
        TRAINER.node_id, WORKERS[0].node_id, failed.digest, 0, 0, audit_ticket(TRAINER, failed.digest), 1.0,
        Outcome.HARD_FAIL, ("logprob_mismatch",), b"\x07" * 32, "test").signed(TRAINER)
    asyncio.run(_drain(node.training.train(1, ((admitted.digest, 1.0),))))
    assert trained == [((admitted.digest, 1.0), (failed.digest, 1.0))]
    node.store.close()


async def _drain(events) -> None:
    async for _ in events:
        pass
