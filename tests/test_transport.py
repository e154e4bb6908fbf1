"""The transport contract (p2p/transport.py), run against both transports, then the loopback
network's fault injection.

Each transport kind gets one cluster per module: four peers on one asyncio loop that lives
across tests (libp2p connects take >= 250 ms each). Gossip peers a - b - c form a line, so
a message from a reaches c only through b; d subscribes to nothing (so it relays nothing),
connects to all three and makes the requests. Every test uses its own topics.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import random
import time
from collections.abc import Callable, Coroutine
from typing import Any

import msgpack
import pytest

from p2p.blobs import (
    BLOB_PROTOCOL,
    CHUNK_BYTES,
    MAX_BLOB_REQUEST_BYTES,
    BlobCorrupt,
    BlobStore,
    BlobUnavailable,
    fetch_blob,
)
from p2p.libp2p_transport import Libp2pTransport
from p2p.loopback import LoopbackNetwork
from p2p.traffic import (
    GOSSIP_COPIES_IN,
    GOSSIP_IN,
    GOSSIP_OUT,
    GOSSIP_RPC_OUT,
    REQUEST_IN,
    REQUEST_OUT,
    RESPONSE_IN,
    RESPONSE_OUT,
    Count,
)
from p2p.transport import (
    MAX_GOSSIP_BYTES,
    MAX_REQUEST_BYTES,
    MAX_RESPONSE_BYTES,
    Message,
    MessageTooLarge,
    PeerUnavailable,
    RemoteError,
    RequestTimeout,
    Transport,
    TransportError,
    TransportLimits,
    Validation,
    message_id,
)

MiB = 1 << 20


def seed(name: str) -> bytes:
    return hashlib.sha256(b"p2p-test:" + name.encode()).digest()


async def bounded(coroutine: Coroutine[Any, Any, Any], seconds: float) -> Any:
    async with asyncio.timeout(seconds):
        return await coroutine


async def until(condition: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


class Inbox:
    """A message handler that keeps what it is given."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def __call__(self, message: Message) -> None:
        self.messages.append(message)

    def data(self, prefix: bytes = b"") -> list[bytes]:
        return [m.data for m in self.messages if m.data.startswith(prefix)]


async def until_gossip_flows(publisher: Transport, topic: str, inboxes: list[Inbox]) -> None:
    """Publish probes until every inbox has one: libp2p meshes a new topic on its next
    heartbeat (1 s). At most 60 probes, 0.2 s apart."""
    for attempt in range(60):
        await publisher.publish(topic, b"probe-%d" % attempt)
        for _ in range(20):
            if all(inbox.data(b"probe-") for inbox in inboxes):
                return
            await asyncio.sleep(0.01)
    raise AssertionError(f"gossip on {topic!r} never reached every peer")


async def echo(peer: bytes, data: bytes) -> bytes:
    return data


async def fail(peer: bytes, data: bytes) -> bytes:
    raise ValueError("handler bug")


async def sleep(peer: bytes, data: bytes) -> bytes:
    await asyncio.sleep(30)
    return b"late"


async def sized(peer: bytes, data: bytes) -> bytes:
    return bytes(int(data))


class Cluster:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.runner = asyncio.Runner()
        self.run(self._start(), seconds=60)

    def run(self, coroutine: Coroutine[Any, Any, Any], seconds: float = 30) -> Any:
        return self.runner.run(bounded(coroutine, seconds))

    def transport(self, name: str) -> Transport:
        if self.kind == "loopback":
            return self.network.transport(seed(name))
        return Libp2pTransport(seed(name))

    async def _start(self) -> None:
        self.network = LoopbackNetwork(seed=1)
        self.a, self.b, self.c, self.d = peers = [self.transport(name) for name in "abcd"]
        for peer in peers:
            peer.set_handler("/echo", echo)
            peer.set_handler("/echo-1MiB", echo, max_request=MiB)
            peer.set_handler("/fail", fail)
            peer.set_handler("/sleep", sleep)
            peer.set_handler("/sized", sized)
        self.store_b, self.store_c = BlobStore(self.b), BlobStore(self.c)
        await asyncio.gather(*(peer.start() for peer in peers))
        a, b, c, d = peers
        await asyncio.gather(*(x.connect(y.addresses()[0]) for x, y in [(a, b), (b, c), (d, a), (d, b), (d, c)]))

    def close(self) -> None:
        async def close_all() -> None:
            await asyncio.gather(*(peer.close() for peer in (self.a, self.b, self.c, self.d)))

        self.run(close_all())
        self.runner.close()


@pytest.fixture(scope="module", params=["loopback", "libp2p"])
def cluster(request: pytest.FixtureRequest):
    cluster = Cluster(request.param)
    yield cluster
    cluster.close()


# -- connecting --

def test_transports_implement_the_protocol(cluster: Cluster) -> None:
    for peer in (cluster.a, cluster.b, cluster.c, cluster.d):
        assert isinstance(peer, Transport)
        assert len(peer.peer_id) == 32


def test_connect_names_the_peer_and_peers_are_listed(cluster: Cluster) -> None:
    async def scenario() -> None:
        a, b, c, d = cluster.a, cluster.b, cluster.c, cluster.d
        await until(lambda: a.peers() == {b.peer_id, d.peer_id}, "a's peers")
        await until(lambda: d.peers() == {a.peer_id, b.peer_id, c.peer_id}, "d's peers")
        assert await d.connect(c.addresses()[0]) == c.peer_id  # again: a no-op
        with pytest.raises(PeerUnavailable):
            await a.connect(a.addresses()[0])
        with pytest.raises(ValueError):
            await a.connect("not an address")

    cluster.run(scenario())


# -- gossip --

def test_gossip_reaches_every_subscriber_once_over_several_hops(cluster: Cluster) -> None:
    async def scenario() -> None:
        topic = "hops"
        inboxes = [Inbox() for _ in range(3)]
        for peer, inbox in zip((cluster.a, cluster.b, cluster.c), inboxes):
            peer.subscribe(topic, inbox)
        await until_gossip_flows(cluster.a, topic, inboxes[1:])
        payloads = [b"hop-%d" % i for i in range(5)]
        for data in payloads:
            await cluster.a.publish(topic, data)
        await until(lambda: all(len(inbox.data(b"hop-")) == 5 for inbox in inboxes), "5 messages everywhere")
        await cluster.a.publish(topic, payloads[0])  # the same content again is the same message
        await asyncio.sleep(0.3)
        for inbox in inboxes:
            assert sorted(inbox.data(b"hop-")) == payloads  # the publisher's own included, no duplicates
        message = next(m for m in inboxes[2].messages if m.data == b"hop-3")
        assert message == Message(topic, b"hop-3", cluster.a.peer_id, message_id(topic, b"hop-3"))

    cluster.run(scenario())


def test_validator_verdicts_decide_delivery_and_forwarding(cluster: Cluster) -> None:
    def verdict(message: Message) -> Validation:
        if message.data.startswith(b"ignore"):
            return Validation.IGNORE
        if message.data.startswith(b"reject"):
            return Validation.REJECT
        if message.data.startswith(b"raise"):
            raise ValueError("validator bug")
        return Validation.ACCEPT

    async def scenario() -> None:
        topic = "verdicts"
        at_a, at_b, at_c = Inbox(), Inbox(), Inbox()
        cluster.a.subscribe(topic, at_a)
        cluster.b.subscribe(topic, at_b, verdict)
        cluster.c.subscribe(topic, at_c)
        await until_gossip_flows(cluster.a, topic, [at_b, at_c])
        before = cluster.b.rejections(cluster.a.peer_id)
        for data in (b"ignore-1", b"reject-1", b"raise-1", b"accept-1"):
            await cluster.a.publish(topic, data)
        await until(lambda: at_c.data(b"accept-1"), "the accepted message at c")
        await until(lambda: cluster.b.rejections(cluster.a.peer_id) - before == 2, "2 rejections at b")
        assert at_b.data(b"accept") == [b"accept-1"] and at_c.data(b"accept") == [b"accept-1"]
        for kind in (b"ignore", b"reject", b"raise"):
            assert at_b.data(kind) == [] and at_c.data(kind) == []  # neither delivered nor forwarded
            assert at_a.data(kind) == [kind + b"-1"]  # a has no validator: its own are delivered to it
        assert cluster.c.rejections(cluster.b.peer_id) == 0

    cluster.run(scenario())


def test_rejections_count_against_the_forwarder_and_ignores_never(cluster: Cluster) -> None:
    """GossipSub v1.1 P4 blames the propagation source: a message reaches c from a only through
    b, so an invalid one counts against b, which forwarded it without validating, and never
    against a, which c has not heard from. IGNORE costs nobody anything."""

    def verdict(message: Message) -> Validation:
        if message.data.startswith(b"meh"):
            return Validation.IGNORE
        return Validation.REJECT if message.data.startswith(b"bad") else Validation.ACCEPT

    async def scenario() -> None:
        topic = "blame"
        at_b, at_c = Inbox(), Inbox()
        cluster.a.subscribe(topic, Inbox())
        cluster.b.subscribe(topic, at_b)  # no validator: b forwards whatever it gets
        cluster.c.subscribe(topic, at_c, verdict)
        await until_gossip_flows(cluster.a, topic, [at_b, at_c])
        for i in range(5):
            await cluster.a.publish(topic, b"meh-%d" % i)
        await cluster.a.publish(topic, b"after-meh")
        await until(lambda: at_c.data(b"after-meh"), "the message after the ignored ones")
        assert cluster.c.score(cluster.b.peer_id) == 0.0 and cluster.c.rejections(cluster.b.peer_id) == 0
        for i in range(2):
            await cluster.a.publish(topic, b"bad-%d" % i)
        await until(lambda: cluster.c.rejections(cluster.b.peer_id) == 2, "2 rejections at c")
        await until(lambda: at_b.data(b"bad") == [b"bad-0", b"bad-1"], "b to have the bad ones")
        weight = TransportLimits().invalid_message_weight
        assert weight * 2.0**2 <= cluster.c.score(cluster.b.peer_id) < weight * 1.9**2  # (w4 * count^2, decaying)
        assert cluster.c.score(cluster.a.peer_id) == 0.0 and cluster.c.rejections(cluster.a.peer_id) == 0
        assert not cluster.c.banned(cluster.b.peer_id) and cluster.b.peer_id in cluster.c.peers()

    cluster.run(scenario())


def test_own_validator_applies_to_own_publishes(cluster: Cluster) -> None:
    async def scenario() -> None:
        topic = "own"
        at_a, at_b = Inbox(), Inbox()
        cluster.a.subscribe(topic, at_a, lambda m: Validation.REJECT if m.data == b"no" else Validation.ACCEPT)
        cluster.b.subscribe(topic, at_b)
        await until_gossip_flows(cluster.a, topic, [at_a, at_b])
        await cluster.a.publish(topic, b"no")
        await cluster.a.publish(topic, b"yes")
        await until(lambda: at_b.data(b"yes") and at_a.data(b"yes"), "the accepted message")
        assert at_a.data(b"no") == [] and at_b.data(b"no") == []

    cluster.run(scenario())


def test_gossip_size_limit(cluster: Cluster) -> None:
    async def scenario() -> None:
        topic = "size"
        at_b = Inbox()
        cluster.b.subscribe(topic, at_b)
        cluster.a.subscribe(topic, Inbox())
        await until_gossip_flows(cluster.a, topic, [at_b])
        with pytest.raises(MessageTooLarge):
            await cluster.a.publish(topic, bytes(MAX_GOSSIP_BYTES + 1))
        largest = b"L" + bytes(MAX_GOSSIP_BYTES - 1)
        await cluster.a.publish(topic, largest)
        await until(lambda: at_b.data(b"L") == [largest], "the largest message")

    cluster.run(scenario())


def test_a_burst_of_publishes_is_paced_not_dropped(cluster: Cluster) -> None:
    async def scenario() -> None:
        topic = "burst"
        at_b, at_c = Inbox(), Inbox()
        cluster.a.subscribe(topic, Inbox())
        cluster.b.subscribe(topic, at_b)
        cluster.c.subscribe(topic, at_c)
        await until_gossip_flows(cluster.a, topic, [at_b, at_c])
        payloads = [b"burst-%03d-" % i + bytes(2048) for i in range(100)]
        await asyncio.gather(*(cluster.a.publish(topic, data) for data in payloads))  # all at once
        await until(lambda: len(at_b.data(b"burst")) == len(at_c.data(b"burst")) == 100, "100 at b and c", 30)
        assert sorted(at_c.data(b"burst")) == payloads

    cluster.run(scenario(), seconds=60)


# -- requests --

def test_request_response(cluster: Cluster) -> None:
    async def scenario() -> None:
        assert await cluster.d.request(cluster.a.peer_id, "/echo", b"ping") == b"ping"
        assert await cluster.d.request(cluster.b.peer_id, "/echo", b"") == b""
        big = random.Random(1).randbytes(MiB)
        assert await cluster.d.request(cluster.c.peer_id, "/echo-1MiB", big) == big
        largest = await cluster.d.request(cluster.a.peer_id, "/sized", b"%d" % MAX_RESPONSE_BYTES)
        assert largest == bytes(MAX_RESPONSE_BYTES)

    cluster.run(scenario())


def test_remote_failures_are_remote_errors_and_the_peer_keeps_serving(cluster: Cluster) -> None:
    async def scenario() -> None:
        for _ in range(3):
            with pytest.raises(RemoteError, match="ValueError"):
                await cluster.d.request(cluster.a.peer_id, "/fail", b"x")
            with pytest.raises(RemoteError, match="no handler"):
                await cluster.d.request(cluster.a.peer_id, "/nobody-home", b"x")
            assert await cluster.d.request(cluster.a.peer_id, "/echo", b"still here") == b"still here"

    cluster.run(scenario())


def test_oversize_requests_and_responses_are_refused_loudly(cluster: Cluster) -> None:
    async def scenario() -> None:
        d, a = cluster.d, cluster.a.peer_id
        with pytest.raises(MessageTooLarge):
            await d.request(a, "/echo", bytes(MAX_REQUEST_BYTES + 1))
        with pytest.raises(MessageTooLarge):  # far beyond flow-control windows
            await d.request(a, "/echo", bytes(4 * MiB))
        with pytest.raises(MessageTooLarge):
            await d.request(a, "/echo", bytes(1000), max_response=999)
        with pytest.raises(MessageTooLarge):
            await d.request(a, "/sized", b"%d" % (MAX_RESPONSE_BYTES + 1))
        assert await d.request(a, "/echo", bytes(MAX_REQUEST_BYTES)) == bytes(MAX_REQUEST_BYTES)
        assert await d.request(a, "/echo", b"x" * 1000, max_response=1000) == b"x" * 1000

    cluster.run(scenario())


def test_request_timeout(cluster: Cluster) -> None:
    async def scenario() -> None:
        started = time.monotonic()
        with pytest.raises(RequestTimeout):
            await cluster.d.request(cluster.b.peer_id, "/sleep", b"", timeout=0.5)
        assert time.monotonic() - started < 2.0
        assert await cluster.d.request(cluster.b.peer_id, "/echo", b"awake") == b"awake"

    cluster.run(scenario())


def test_requests_to_unknown_peers_are_unavailable(cluster: Cluster) -> None:
    async def scenario() -> None:
        stranger = hashlib.sha256(b"nobody").digest()
        with pytest.raises(PeerUnavailable):
            await cluster.d.request(stranger, "/echo", b"x", timeout=2)
        with pytest.raises(PeerUnavailable):
            await cluster.d.request(cluster.d.peer_id, "/echo", b"x", timeout=2)

    cluster.run(scenario())


# -- traffic counters --

def _delta(before: dict, after: dict, kind: str, name: str) -> tuple[int, int]:
    zero = Count(0, 0)
    a, b = after.get((kind, name), zero), before.get((kind, name), zero)
    return a.messages - b.messages, a.bytes - b.bytes


def test_traffic_counts_payloads_delivered_sent_and_requested(cluster: Cluster) -> None:
    """The counters the calibration reads (p2p.traffic): a delivery once per receiving peer
    and never for one's own publish, every copy written and read, request and response bodies
    on both sides."""

    async def scenario() -> None:
        topic, protocol = "traffic", "/echo-traffic"
        inboxes = [Inbox() for _ in range(3)]
        peers = (cluster.a, cluster.b, cluster.c)
        for peer, inbox in zip(peers, inboxes):
            peer.subscribe(topic, inbox)
        cluster.b.set_handler(protocol, echo)
        await until_gossip_flows(cluster.a, topic, inboxes[1:])
        await asyncio.sleep(0.5)  # probes still in flight are not this test's
        everyone = (*peers, cluster.d)
        before = [peer.traffic() for peer in everyone]
        for i in range(3):
            await cluster.a.publish(topic, b"t-%d-" % i + bytes(96))
        await until(lambda: all(len(inbox.data(b"t-")) == 3 for inbox in inboxes), "3 messages everywhere")
        assert await cluster.a.request(cluster.b.peer_id, protocol, bytes(50)) == bytes(50)

        def deltas(kind: str) -> list[tuple[int, int]]:
            return [_delta(b, p.traffic(), kind, topic) for b, p in zip(before, everyone)]

        # Every copy written reaches its peer: the sums agree once nothing is in flight.
        await until(lambda: sum(b for _, b in deltas(GOSSIP_OUT)) == sum(b for _, b in deltas(GOSSIP_COPIES_IN)),
                    "the copies written to be read")
        delivered, sent, copies = deltas(GOSSIP_IN), deltas(GOSSIP_OUT), deltas(GOSSIP_COPIES_IN)
        assert delivered == [(0, 0), (3, 300), (3, 300), (0, 0)]  # a's own are not "in"; d is not subscribed
        assert sent[0][1] >= 300 and sent[0][1] % 100 == 0  # a wrote each message to at least one peer
        assert all(c[1] >= d[1] for c, d in zip(copies, delivered))
        if cluster.kind == "libp2p":  # whole RPCs: every payload written, with its envelope
            rpc = _delta(before[0], cluster.a.traffic(), GOSSIP_RPC_OUT, "rpc")
            assert rpc[1] > sent[0][1]
        # A writer counts once its write returns, which may come after the other side has read
        # it: the request's on a, the response's on b (on a loaded machine b's counter was
        # still 0 when a had read the answer).
        await until(lambda: _delta(before[0], cluster.a.traffic(), REQUEST_OUT, protocol)[0] == 1, "the request")
        await until(lambda: _delta(before[1], cluster.b.traffic(), RESPONSE_OUT, protocol)[0] == 1, "the response")
        a_after, b_after = cluster.a.traffic(), cluster.b.traffic()
        assert _delta(before[0], a_after, REQUEST_OUT, protocol) == (1, 50)
        assert _delta(before[0], a_after, RESPONSE_IN, protocol) == (1, 50)
        assert _delta(before[1], b_after, REQUEST_IN, protocol) == (1, 50)
        assert _delta(before[1], b_after, RESPONSE_OUT, protocol) == (1, 50)
        assert _delta(before[1], b_after, REQUEST_OUT, protocol) == (0, 0)
        # A protocol nobody serves is refused and counted nowhere on the server: a caller's
        # made-up names must not grow the counters' keys.
        with pytest.raises(RemoteError):
            await cluster.a.request(cluster.b.peer_id, "/nobody-serves-this", b"x")
        assert not any(name == "/nobody-serves-this" for _, name in cluster.b.traffic())

    cluster.run(scenario())


# -- blobs --

@pytest.mark.parametrize("size", [5 * MiB + 12345, 8 * MiB], ids=["5MiB", "8MiB"])
def test_blob_fetch_checks_size_and_hash(cluster: Cluster, size: int) -> None:
    async def scenario() -> None:
        data = random.Random(size).randbytes(size)
        digest = cluster.store_b.put(data)
        assert digest == hashlib.sha256(data).digest() and digest in cluster.store_b
        # c has no such blob: the fetch falls back to b.
        peers = [cluster.c.peer_id, cluster.b.peer_id]
        assert await fetch_blob(cluster.d, peers, digest, max_size=size) == data
        with pytest.raises(BlobUnavailable, match="max_size"):
            await fetch_blob(cluster.d, peers, digest, max_size=size - 1)
        cluster.store_b.discard(digest)
        with pytest.raises(BlobUnavailable):
            await fetch_blob(cluster.d, peers, digest, max_size=size)

    cluster.run(scenario(), seconds=60)


def test_empty_blob(cluster: Cluster) -> None:
    async def scenario() -> None:
        digest = cluster.store_c.put(b"")
        assert await fetch_blob(cluster.d, [cluster.c.peer_id], digest, max_size=0) == b""

    cluster.run(scenario())


def test_corrupt_blob_server_is_caught(cluster: Cluster) -> None:
    size = CHUNK_BYTES + 1000

    async def liar(peer: bytes, request: bytes) -> bytes:
        digest, index = msgpack.unpackb(request)
        return msgpack.packb([size, bytes(min(CHUNK_BYTES, size - index * CHUNK_BYTES))])

    async def scenario() -> None:
        cluster.a.set_handler(BLOB_PROTOCOL, liar)
        digest = hashlib.sha256(b"the real weights").digest()
        with pytest.raises(BlobCorrupt) as caught:
            await fetch_blob(cluster.d, [cluster.a.peer_id], digest, max_size=2 * size)
        assert caught.value.peers == (cluster.a.peer_id,)

    cluster.run(scenario())


# -- hostile input --

def test_fuzzed_requests_and_gossip_crash_nothing(cluster: Cluster) -> None:
    rng = random.Random(7)
    blobs = [
        b"", b"\x00", b"\xff" * 64, msgpack.packb([b"x" * 32]), msgpack.packb([b"x" * 32, -1]),
        msgpack.packb([b"x" * 32, True]), msgpack.packb([b"x" * 31, 0]), msgpack.packb({"a": 1}),
        msgpack.packb([b"x" * 32, 2**64 - 1]), msgpack.packb(msgpack.ExtType(1, b"x")), b"\x92" * 1000,
        msgpack.packb([hashlib.sha256(b"").digest(), 0]) + b"trailing",
    ] + [rng.randbytes(rng.randrange(0, 2048)) for _ in range(20)]

    def strict(message: Message) -> Validation:
        kind, value = msgpack.unpackb(message.data, max_ext_len=0)  # raises on most garbage
        return Validation.ACCEPT if kind == "ok" else Validation.REJECT

    async def scenario() -> None:
        topic = "fuzz"
        at_b, at_c = Inbox(), Inbox()
        cluster.a.subscribe(topic, Inbox())
        cluster.b.subscribe(topic, at_b, strict)
        cluster.c.subscribe(topic, at_c, strict)
        # The garbage gossip comes from a peer of its own: b rejects it and bans its sender
        # after a few, which must not cut a (the honest publisher) off.
        fuzzer = cluster.transport("fuzzer")
        fuzzer.subscribe(topic, Inbox())
        await fuzzer.start()
        try:
            await fuzzer.connect(cluster.b.addresses()[0])
            for attempt in range(60):  # not even a probe passes `strict`: wait with real messages
                await fuzzer.publish(topic, msgpack.packb(["ok", attempt]))
                await asyncio.sleep(0.2)
                if at_b.messages:
                    break
            # Requests come from d, which is not banned for them: handlers that fail on garbage
            # are the handlers' business, and only a few requests are over a handler's limit.
            oversize = 0
            for peer in (cluster.b, cluster.c):
                for protocol in ("/echo", "/fail", "/sized", BLOB_PROTOCOL, "/" + "x" * 200):
                    for data in blobs:
                        if protocol == BLOB_PROTOCOL and len(data) > MAX_BLOB_REQUEST_BYTES:
                            oversize += 1
                            if oversize > 3:
                                continue
                        try:
                            await cluster.d.request(peer.peer_id, protocol, data, timeout=5)
                        except (RemoteError, MessageTooLarge):
                            pass
            for data in blobs:
                await fuzzer.publish(topic, data)
            await until(lambda: cluster.b.banned(fuzzer.peer_id), "b to ban the fuzzer")
            await until(lambda: fuzzer.peer_id not in cluster.b.peers(), "b to hang up on the fuzzer")
        finally:
            await fuzzer.close()
        await cluster.a.publish(topic, msgpack.packb(["ok", "after"]))
        await until(lambda: any(m.data == msgpack.packb(["ok", "after"]) for m in at_c.messages), "gossip after fuzz")
        assert all(msgpack.unpackb(m.data)[0] == "ok" for m in at_b.messages + at_c.messages)
        assert not cluster.b.banned(cluster.a.peer_id) and not cluster.b.banned(cluster.d.peer_id)
        for peer in (cluster.b, cluster.c):
            assert await cluster.d.request(peer.peer_id, "/echo", b"alive") == b"alive"

    cluster.run(scenario(), seconds=90)


# -- misbehaving peers --

# The third invalid message bans (3^2 = 9 >= 8.5, with room for a tick of decay between
# them). A ban long enough for the checks made during it (a refused libp2p dial takes ~0.7 s:
# the 250 ms Happy-Eyeballs wait and a handshake), short enough to see the peer come back.
STRICT = TransportLimits(ban_threshold=-8.5, ban_seconds=3.0, invalid_message_halflife=60.0)
BAN_SECONDS = {"loopback": 1.2, "libp2p": STRICT.ban_seconds}  # loopback: past one decay interval


def standalone(kind: str, network: LoopbackNetwork, name: str, limits: TransportLimits = STRICT) -> Transport:
    limits = dataclasses.replace(limits, ban_seconds=BAN_SECONDS[kind])
    if kind == "loopback":
        return network.transport(seed(name), limits=limits)
    return Libp2pTransport(seed(name), limits=limits)


@pytest.mark.parametrize("kind", ["loopback", "libp2p"])
def test_a_peer_that_sends_invalid_gossip_is_banned_then_let_back(kind: str) -> None:
    def verdict(message: Message) -> Validation:
        if message.data.startswith(b"meh"):
            return Validation.IGNORE
        return Validation.REJECT if message.data.startswith(b"bad") else Validation.ACCEPT

    async def scenario() -> None:
        network = LoopbackNetwork(seed=5)
        target, bad, honest = (standalone(kind, network, name) for name in ("target", "bad", "honest"))
        at_target = Inbox()
        target.subscribe("t", at_target, verdict)
        bad.subscribe("t", Inbox())
        for peer in (target, bad, honest):
            peer.set_handler("/echo", echo)
            await peer.start()
        try:
            await bad.connect(target.addresses()[0])
            await honest.connect(target.addresses()[0])
            await until_gossip_flows(bad, "t", [at_target])
            for i in range(20):  # IGNORE, however often, is never held against anyone
                await bad.publish("t", b"meh-%d" % i)
            await bad.publish("t", b"after-meh")
            await until(lambda: at_target.data(b"after-meh"), "the message after the ignored ones")
            assert target.score(bad.peer_id) == 0.0 and not target.banned(bad.peer_id)

            started = time.monotonic()
            for i in range(4):
                await bad.publish("t", b"bad-%d" % i)
            await until(lambda: bad.peer_id not in target.peers(), "the target to hang up on the bad peer")
            print(f"\n{kind}: invalid gossip peer disconnected {time.monotonic() - started:.3f} s after its first")
            assert target.banned(bad.peer_id)
            banned_score = target.score(bad.peer_id)
            assert banned_score <= STRICT.ban_threshold
            assert at_target.data(b"bad") == []
            await until(lambda: target.peer_id not in bad.peers(), "the bad peer to see the hang-up")
            with pytest.raises(PeerUnavailable):  # its redial is refused while the ban lasts
                await bad.connect(target.addresses()[0])
            with pytest.raises(PeerUnavailable):
                await bad.request(target.peer_id, "/echo", b"let me in", timeout=2)
            with pytest.raises(PeerUnavailable):  # and the target does not call it either
                await target.request(bad.peer_id, "/echo", b"x", timeout=2)
            assert await honest.request(target.peer_id, "/echo", b"unaffected") == b"unaffected"
            assert bad.peer_id not in target.peers()

            await until(lambda: not target.banned(bad.peer_id), "the ban to end", BAN_SECONDS[kind] + 5)
            assert time.monotonic() - started >= BAN_SECONDS[kind]
            assert await bad.connect(target.addresses()[0]) == target.peer_id
            assert await bad.request(target.peer_id, "/echo", b"back") == b"back"
            assert banned_score < target.score(bad.peer_id) < 0  # decayed, not forgotten
        finally:
            for peer in (target, bad, honest):
                await peer.close()

    asyncio.run(bounded(scenario(), 60))


@pytest.mark.parametrize("kind", ["loopback", "libp2p"])
def test_a_peer_that_sends_oversize_requests_is_banned(kind: str) -> None:
    async def scenario() -> None:
        network = LoopbackNetwork(seed=6)
        target, caller, honest = (standalone(kind, network, name) for name in ("target", "caller", "honest"))
        for peer in (target, caller, honest):
            peer.set_handler("/echo", echo)
            await peer.start()
        try:
            await caller.connect(target.addresses()[0])
            await honest.connect(target.addresses()[0])
            for _ in range(2):
                with pytest.raises(MessageTooLarge):
                    await caller.request(target.peer_id, "/echo", bytes(MAX_REQUEST_BYTES + 1))
            assert not target.banned(caller.peer_id)
            assert await caller.request(target.peer_id, "/echo", b"fine") == b"fine"
            with pytest.raises((MessageTooLarge, PeerUnavailable)):
                await caller.request(target.peer_id, "/echo", bytes(MAX_REQUEST_BYTES + 1))
            await until(lambda: caller.peer_id not in target.peers(), "the target to hang up on the caller")
            assert target.banned(caller.peer_id)
            with pytest.raises(PeerUnavailable):
                await caller.request(target.peer_id, "/echo", b"x", timeout=2)
            assert await honest.request(target.peer_id, "/echo", b"still") == b"still"
            # A response over the caller's limit is the server's doing, not the caller's.
            assert honest.score(target.peer_id) == 0.0 and target.score(honest.peer_id) == 0.0
            with pytest.raises(MessageTooLarge):
                await honest.request(target.peer_id, "/echo", b"x" * 100, max_response=99)
            assert honest.score(target.peer_id) == 0.0 and target.score(honest.peer_id) == 0.0
        finally:
            for peer in (target, caller, honest):
                await peer.close()

    asyncio.run(bounded(scenario(), 60))


@pytest.mark.parametrize("kind", ["loopback", "libp2p"])
def test_the_node_can_penalise_and_a_ban_refuses_both_ways(kind: str) -> None:
    """penalize() is for what only the node can judge (a request body that fails to decode)."""

    async def scenario() -> None:
        network = LoopbackNetwork(seed=7)
        target, other = (standalone(kind, network, name) for name in ("target", "other"))
        for peer in (target, other):
            peer.set_handler("/echo", echo)
            await peer.start()
        try:
            await other.connect(target.addresses()[0])
            with pytest.raises(ValueError):
                target.penalize(b"not a peer id")
            target.penalize(other.peer_id)
            target.penalize(other.peer_id)
            assert target.score(other.peer_id) == pytest.approx(STRICT.invalid_message_weight * 4, rel=0.05)
            assert not target.banned(other.peer_id)
            target.penalize(other.peer_id)
            assert target.banned(other.peer_id)
            await until(lambda: other.peer_id not in target.peers(), "the hang-up")
            with pytest.raises(PeerUnavailable):  # the banning side does not dial out either
                await target.connect(other.addresses()[0])
        finally:
            for peer in (target, other):
                await peer.close()

    asyncio.run(bounded(scenario(), 60))


def test_transport_limits_are_checked() -> None:
    for bad in ({"invalid_message_weight": 0.0}, {"invalid_message_weight": float("nan")},
                {"invalid_message_halflife": 0.0}, {"ban_threshold": 1.0}, {"ban_threshold": float("nan")},
                {"ban_seconds": -1.0}, {"ban_seconds": float("inf")}, {"handshake_timeout": 0.0},
                {"max_pending_connections": 0}, {"max_pending_connections": True},
                {"max_pending_connections": 1.5}, {"handshake_timeout": "10"}):
        with pytest.raises(ValueError):
            TransportLimits(**bad)
    with pytest.raises(ValueError):
        LoopbackNetwork().transport(seed("x"), limits="strict")


# -- lifecycle --

def test_close_is_idempotent_and_fails_what_is_pending(cluster: Cluster) -> None:
    async def scenario() -> None:
        peer = cluster.transport("short-lived")
        await peer.start()
        with pytest.raises(TransportError):
            await peer.start()
        await peer.connect(cluster.a.addresses()[0])
        pending = asyncio.ensure_future(peer.request(cluster.a.peer_id, "/sleep", b"", timeout=20))
        await asyncio.sleep(0.3)
        started = time.monotonic()
        await peer.close()
        await peer.close()
        with pytest.raises(TransportError):
            await pending
        assert time.monotonic() - started < 5
        with pytest.raises(TransportError):
            await peer.publish("anything", b"x")
        assert peer.peers() == set() and peer.addresses() == []
        await until(lambda: peer.peer_id not in cluster.a.peers(), "a to notice")

    cluster.run(scenario())


# -- loopback faults --

def loopback(n: int, *, seed_: int = 1) -> tuple[LoopbackNetwork, list[Transport]]:
    network = LoopbackNetwork(seed=seed_)
    return network, [network.transport(seed(f"fault-{i}")) for i in range(n)]


async def started(peers: list[Transport], links: list[tuple[int, int]]) -> None:
    for peer in peers:
        peer.set_handler("/echo", echo)
        await peer.start()
    for x, y in links:
        await peers[x].connect(peers[y].addresses()[0])


def test_loopback_drops_are_seeded_and_replayable() -> None:
    async def delivered(seed_: int) -> list[bytes]:
        network, (a, b) = loopback(2, seed_=seed_)
        await started([a, b], [(0, 1)])
        inbox = Inbox()
        b.subscribe("t", inbox)
        network.set_faults(drop_gossip=0.5)
        for i in range(200):
            await a.publish("t", b"%d" % i)
        await asyncio.sleep(0.05)
        network.set_faults(drop_requests=1.0)
        with pytest.raises(RequestTimeout):
            await a.request(b.peer_id, "/echo", b"x", timeout=0.1)
        network.set_faults()
        assert await a.request(b.peer_id, "/echo", b"x") == b"x"
        return inbox.data()

    async def scenario() -> None:
        first, again, other = await delivered(1), await delivered(1), await delivered(2)
        assert 60 < len(first) < 140
        assert first == again and first != other

    asyncio.run(bounded(scenario(), 10))


def test_loopback_delay() -> None:
    async def scenario() -> None:
        network, (a, b) = loopback(2)
        await started([a, b], [(0, 1)])
        inbox = Inbox()
        b.subscribe("t", inbox)
        network.set_faults(delay=0.2)
        started_at = time.monotonic()
        assert await a.request(b.peer_id, "/echo", b"x") == b"x"
        assert time.monotonic() - started_at >= 0.4  # there and back
        started_at = time.monotonic()
        await a.publish("t", b"m")
        await until(lambda: inbox.messages, "the delayed message")
        assert time.monotonic() - started_at >= 0.2

    asyncio.run(bounded(scenario(), 10))


def test_loopback_partition_and_heal() -> None:
    async def scenario() -> None:
        network, (a, b, c) = loopback(3)
        await started([a, b, c], [(0, 1), (1, 2), (0, 2)])
        at_b, at_c = Inbox(), Inbox()
        b.subscribe("t", at_b)
        c.subscribe("t", at_c)
        network.partition([[a.peer_id, b.peer_id], [c.peer_id]])
        await a.publish("t", b"split")
        await until(lambda: at_b.messages, "b inside the group")
        await asyncio.sleep(0.05)
        assert at_c.messages == []
        with pytest.raises(RequestTimeout):
            await a.request(c.peer_id, "/echo", b"x", timeout=0.2)
        assert c.peer_id in a.peers()  # links stay up; traffic is lost
        network.heal()
        await a.publish("t", b"healed")
        await until(lambda: at_c.data(b"healed"), "c after the heal")
        assert await a.request(c.peer_id, "/echo", b"x") == b"x"

    asyncio.run(bounded(scenario(), 10))


def test_loopback_crash_and_restart() -> None:
    async def scenario() -> None:
        network, (a, b) = loopback(2)
        await started([a, b], [(0, 1)])
        network.crash(b.peer_id)
        assert b.peer_id not in a.peers()
        with pytest.raises(RequestTimeout):
            await a.request(b.peer_id, "/echo", b"x", timeout=0.2)
        with pytest.raises(TransportError):
            await b.publish("t", b"from the dead")
        restarted = network.transport(seed("fault-1"))
        with pytest.raises(ValueError):
            network.transport(seed("fault-1"))  # one live transport per identity
        assert restarted.peer_id == b.peer_id
        restarted.set_handler("/echo", echo)
        await restarted.start()
        assert await a.request(b.peer_id, "/echo", b"back") == b"back"  # a redials it
        await b.close()  # closing the dead object is harmless

    asyncio.run(bounded(scenario(), 10))


def test_loopback_freeze_and_thaw() -> None:
    async def scenario() -> None:
        network, (a, b) = loopback(2)
        await started([a, b], [(0, 1)])
        at_b = Inbox()
        b.subscribe("t", at_b)
        network.freeze(b.peer_id)
        with pytest.raises(RequestTimeout):
            await a.request(b.peer_id, "/echo", b"x", timeout=0.2)
        await a.publish("t", b"held")
        await asyncio.sleep(0.05)
        assert at_b.messages == [] and b.peer_id in a.peers()
        network.thaw(b.peer_id)
        await until(lambda: at_b.data(b"held"), "the held message")
        assert await a.request(b.peer_id, "/echo", b"x") == b"x"

    asyncio.run(bounded(scenario(), 10))
