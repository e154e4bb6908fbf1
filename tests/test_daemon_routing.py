"""The daemon's request handlers of the committee design's routing (specs/network.md §3.5):
`/vrl/send/1`, `/vrl/group/1` and `/vrl/entries/1` take any bytes from any peer and either answer or raise the
error their table names, counting a malformed or invalid request against its sender and
storing nothing it did not accept. On a real node (tiny model, loopback transport)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2p.loopback import LoopbackNetwork
from tests.support import COMMITTEE
from tests.test_node import TRAINER, WORKERS, config
from vrl.node import committee
from vrl.node.daemon import Node
from vrl.node.messages import TOPIC_POLICIES, MessageError, PolicyAnnouncement, RoundManifest, topic_of
from vrl.node.requests import EntriesAnswer, EntriesRequest, GroupRequest
from vrl.node.wire import schema_of
from vrl.rollouts.keys import NodeKey

STRANGER = NodeKey.from_seed(b"stranger".ljust(32, b"\0"))


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Node:
    data = Path(tmp_path_factory.mktemp("routing"))
    base = config(data / "w0")
    cfg = dataclasses.replace(base, protocol=dataclasses.replace(base.protocol, **COMMITTEE))
    made = Node(cfg, LoopbackNetwork(seed=5).transport(WORKERS[0].private_seed()), WORKERS[0])
    yield made
    made.store.close()


def held(node: Node) -> int:
    return sum(1 for _ in node.store.replay())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=2048))
def test_a_sent_message_of_any_bytes_is_handled_or_refused_as_a_message_error(node, data):
    peer = NodeKey.generate().node_id  # a fresh sender each time: a banned one's score stops moving
    before = held(node)
    try:
        assert asyncio.run(node._serve_send(peer, data)) == b""
    except MessageError:
        assert node.transport.score(peer) < 0  # counted against the sender
    assert held(node) == before  # random bytes are never a valid group or verdict: nothing stored


def test_a_sent_message_of_another_topic_is_refused_and_counted(node):
    policy = msgpack.packb({"kind": schema_of(PolicyAnnouncement).name})  # a policy's kind: not sent
    assert topic_of(policy) == TOPIC_POLICIES
    score = node.transport.score(TRAINER.node_id)
    with pytest.raises(MessageError):
        asyncio.run(node._serve_send(TRAINER.node_id, policy))
    assert node.transport.score(TRAINER.node_id) < score


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=512))
def test_a_group_request_of_any_bytes_is_answered_or_refused_with_its_error(node, data):
    peer = NodeKey.generate().node_id
    try:
        answer = asyncio.run(node._serve_group(peer, data))
    except MessageError:
        assert node.transport.score(peer) < 0  # a malformed request counts
    except LookupError:
        assert node.transport.score(peer) == 0  # a group it lacks: no fault of the peer
    else:
        raise AssertionError(f"answered {answer!r} though it holds no group")


def test_a_well_formed_request_for_a_group_not_held_is_not_here_and_counts_nothing(node):
    score = node.transport.score(STRANGER.node_id)
    with pytest.raises(LookupError):
        asyncio.run(node._serve_group(STRANGER.node_id, GroupRequest(b"\x07" * 32, 0).to_bytes()))
    assert node.transport.score(STRANGER.node_id) == score


def test_a_fetch_by_digest_asks_the_trainer_then_peers_drawn_afresh_at_each_attempt(node, monkeypatch):
    """specs/network.md §3.5: each attempt asks the trainer, then at most FETCH_PEERS other
    peers drawn at random, so that attempts reach different holders. In node id order every
    attempt asked the same lowest ids, and a replayer whose trainer was busy never reached the
    peers that held the group."""
    import random

    from p2p.transport import TransportError
    from vrl.node import daemon
    from vrl.node import protocol as P

    trainer = bytes.fromhex(node.config.trainer)
    peers = [trainer] + [bytes([i]) * 32 for i in range(1, 11)]
    asked: list[list[bytes]] = []
    fed = []

    async def request(peer, protocol, data, timeout, max_response):
        assert protocol == daemon.GROUP_PROTOCOL and timeout == daemon.DIRECT_TIMEOUT_SECONDS
        asked[-1].append(peer)
        raise TransportError("not there")

    async def feed(event):
        fed.append(event)

    monkeypatch.setattr(node.transport, "peers", lambda: list(peers))
    monkeypatch.setattr(node.transport, "request", request)
    monkeypatch.setattr(node, "_feed", feed)
    random.seed(7)
    for _ in range(6):
        asked.append([])
        asyncio.run(node._fetch_group(b"\x05" * 32, 0))
    assert all(a[0] == trainer and len(a) == 1 + daemon.FETCH_PEERS and len(set(a)) == len(a) for a in asked)
    assert len({p for a in asked for p in a[1:]}) > daemon.FETCH_PEERS  # not the same four every time
    assert [type(e) for e in fed] == [P.Abandoned] * 6


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=512), st.builds(
    lambda r, which, positions, keys: EntriesRequest(r, which, positions, keys).to_bytes() if bool(positions) != bool(
        keys) else b"", st.integers(0, 2**64 - 1), st.sampled_from(list(committee.List)),
    st.lists(st.integers(0, 2**18 - 1), max_size=4, unique=True).map(lambda p: tuple(sorted(p))),
    st.lists(st.binary(min_size=32, max_size=32), max_size=4, unique=True).map(lambda k: tuple(sorted(k))))))
def test_an_entries_request_of_any_bytes_is_answered_or_refused_with_its_error(node, data):
    """/vrl/entries/1 (specs/committee.md §3.5) from a node that holds no lists: a malformed
    request counts against its sender, a well-formed one is "not here" and counts nothing."""
    peer = NodeKey.generate().node_id
    try:
        answer = asyncio.run(node._serve_entries(peer, data))
    except MessageError:
        assert node.transport.score(peer) < 0
    except LookupError:
        assert node.transport.score(peer) == 0
    else:
        raise AssertionError(f"answered {answer!r} though it holds no lists")


def test_an_entries_answer_the_header_does_not_prove_counts_against_its_peer_and_the_next_is_asked(node, monkeypatch):
    """The daemon checks an answer against the round's header before the protocol sees it: one
    that does not decode or does not prove counts against its peer; a proven one is fed."""
    from p2p.transport import TransportError
    from vrl.node import daemon
    from vrl.node import protocol as P

    lists = committee.PagedManifest(committee.ManifestContent(
        9, committee.WeightsTable(2, ((WORKERS[0].node_id, 65536),)), tuple(bytes([i]) * 32 for i in range(1, 6)),
        ((WORKERS[1].node_id, 5),)))
    manifest = RoundManifest.of(TRAINER.node_id, lists.header).signed(TRAINER)
    monkeypatch.setitem(node.protocol.rounds.manifests, 9, manifest)
    good = EntriesAnswer.of(lists.answer(committee.List.GROUPS, positions=(1, 3))).to_bytes()
    forged = EntriesAnswer(9, committee.List.GROUPS, (1, 3), (b"\x07" * 32, bytes([4]) * 32),
                           lists.answer(committee.List.GROUPS, positions=(1, 3)).proof).to_bytes()
    trainer = bytes.fromhex(node.config.trainer)
    peers = [trainer, b"\x01" * 32, b"\x02" * 32]
    answers = {trainer: b"not msgpack", b"\x01" * 32: forged, b"\x02" * 32: good}
    fed = []

    async def request(peer, protocol, data, timeout):
        assert protocol == daemon.ENTRIES_PROTOCOL
        if peer not in answers:
            raise TransportError("not there")
        return answers[peer]

    async def feed(event):
        fed.append(event)

    monkeypatch.setattr(node.transport, "peers", lambda: list(peers))
    monkeypatch.setattr(node.transport, "request", request)
    monkeypatch.setattr(node, "_feed", feed)
    monkeypatch.setattr(daemon.random, "sample", lambda population, k: sorted(population)[:k])
    scores = {p: node.transport.score(p) for p in peers}
    asyncio.run(node._fetch_entries(P.FetchEntries(9, "groups", (1, 3), ())))
    assert [type(e) for e in fed] == [P.EntriesReceived] and fed[0].answer.leaves == (bytes([2]) * 32, bytes([4]) * 32)
    assert node.transport.score(trainer) < scores[trainer] and node.transport.score(b"\x01" * 32) < scores[b"\x01" * 32]
    assert node.transport.score(b"\x02" * 32) == scores[b"\x02" * 32]
