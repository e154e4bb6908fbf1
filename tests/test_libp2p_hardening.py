"""Libp2pTransport against the py-libp2p 0.8.1 failure modes that p2p/libp2p_transport.py's
module docstring lists with their sources: downgraded security and muxers, malformed request
frames, a killed and restarted peer (the 60 s negative dial cache), a SIGSTOPped peer, and the
identity binding.

Hostile dialers are raw py-libp2p hosts, run with trio in a worker thread while the asyncio
loop keeps serving. Peers to kill run tests/p2p_peer.py in a process of their own.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path

import multiaddr
import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from libp2p import new_host
from libp2p.crypto.ed25519 import Ed25519PublicKey, create_new_key_pair
from libp2p.crypto.secp256k1 import create_new_key_pair as create_secp256k1_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.stream.exceptions import StreamReset
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.pubsub.pb import rpc_pb2
from libp2p.security.insecure.transport import PLAINTEXT_PROTOCOL_ID, InsecureTransport
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.security.secio import transport as secio
from libp2p.stream_muxer.mplex.mplex import MPLEX_PROTOCOL_ID, Mplex
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux
from libp2p.utils.varint import encode_uvarint

from p2p.libp2p_hooks import libp2p_id
from p2p.libp2p_transport import PACE_MAX_WAIT_SECONDS, REQUEST_PROTOCOL, Libp2pTransport, multiaddr_for
from p2p.transport import PeerUnavailable, RequestTimeout, TransportError, TransportLimits

# The third invalid message bans (3^2 = 9 >= 8.5); a short ban, as in tests/test_transport.py.
STRICT = TransportLimits(ban_threshold=-8.5, ban_seconds=3.0, invalid_message_halflife=60.0)

PEER_SCRIPT = Path(__file__).with_name("p2p_peer.py")


def seed(name: str) -> bytes:
    return hashlib.sha256(b"p2p-hardening:" + name.encode()).digest()


async def echo(peer: bytes, data: bytes) -> bytes:
    return data


def run(scenario, seconds: float = 60):
    async def bounded():
        async with asyncio.timeout(seconds):
            return await scenario()

    return asyncio.run(bounded())


# -- hostile dialers --

def raw_host(security: str, muxer: str, key: str = "ed25519"):
    key_pair = {"ed25519": create_new_key_pair, "secp256k1": create_secp256k1_key_pair}[key]()
    sec_opt = {
        "noise": {NOISE_PROTOCOL_ID: NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)},
        "plaintext": {PLAINTEXT_PROTOCOL_ID: InsecureTransport(key_pair)},
        "secio": {secio.ID: secio.Transport(key_pair)},
    }[security]
    muxer_opt = {"yamux": {YAMUX_PROTOCOL_ID: Yamux}, "mplex": {MPLEX_PROTOCOL_ID: Mplex}}[muxer]
    return new_host(key_pair=key_pair, sec_opt=sec_opt, muxer_opt=muxer_opt)


def dial(security: str, muxer: str, address: str, then=None, key: str = "ed25519"):
    """In trio, on a worker thread: dial ``address`` with a raw host speaking only these
    protocols; returns whether the connection was made (and ``then(host, peer)`` if given)."""

    async def attempt():
        host = raw_host(security, muxer, key)
        async with host.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
            try:
                info = info_from_p2p_addr(multiaddr.Multiaddr(address))
                with trio.fail_after(10):
                    try:
                        await host.connect(info)
                    except Exception:
                        return False
                    if then is not None:
                        await then(host, info.peer_id)
                    return True
            finally:
                await host.close()

    return asyncio.to_thread(trio.run, attempt)


@pytest.mark.parametrize(("security", "muxer", "accepted"), [
    ("noise", "yamux", True),  # the control: the harness itself can connect
    ("plaintext", "yamux", False),
    ("secio", "yamux", False),
    ("noise", "mplex", False),
])
def test_only_noise_and_yamux_are_accepted(security: str, muxer: str, accepted: bool) -> None:
    async def scenario() -> None:
        target = Libp2pTransport(seed("target"))
        await target.start()
        try:
            assert await dial(security, muxer, target.addresses()[0]) is accepted
            if not accepted:
                assert target.peers() == set()
        finally:
            await target.close()

    run(scenario)


def test_a_peer_without_an_ed25519_key_is_hung_up_on() -> None:
    async def stays_connected(host, peer) -> None:
        await trio.sleep(0.5)
        assert host.get_connected_peers() == []

    async def scenario() -> None:
        target = Libp2pTransport(seed("target"))
        await target.start()
        try:
            assert await dial("noise", "yamux", target.addresses()[0], then=stays_connected, key="secp256k1")
            assert target.peers() == set()
        finally:
            await target.close()

    run(scenario)


def request_frame(protocol: bytes, body: bytes, *, declared: int | None = None) -> bytes:
    size = len(body) if declared is None else declared
    return struct.pack(">H", len(protocol)) + protocol + struct.pack(">III", 1 << 20, 5000, size) + body


def test_malformed_request_frames_leave_the_connection_serving() -> None:
    frames = [
        b"",  # open and close at once
        b"\x00",
        b"\xff\xff" + b"x" * 100,  # a protocol name over the limit
        request_frame(b"/echo", b"")[:7],  # cut inside the header
        request_frame(b"/echo", b"short", declared=100),  # body cut short
        request_frame(b"/echo", b"", declared=2**32 - 1),  # over the handler's limit
        request_frame(b"\xff\xfe", b"x"),  # a name that is not UTF-8
        request_frame(b"/nobody", b"x"),
        bytes(range(256)) * 4,
    ]

    async def abuse(host, peer) -> None:
        for frame in frames:
            stream = await host.new_stream(peer, [REQUEST_PROTOCOL])
            await stream.write(frame)
            await stream.close()
            with trio.move_on_after(2):
                try:
                    await stream.read(1 << 16)
                except Exception:
                    pass  # a reset or EOF is an answer too
        # The same connection still takes a well-formed request.
        stream = await host.new_stream(peer, [REQUEST_PROTOCOL])
        await stream.write(request_frame(b"/echo", b"still serving"))
        answer = b""
        with trio.fail_after(5):
            while len(answer) < 5 + len(b"still serving"):
                answer += await stream.read(1 << 16)
        assert answer == struct.pack(">BI", 0, 13) + b"still serving"

    async def scenario() -> None:
        target = Libp2pTransport(seed("target"))
        target.set_handler("/echo", echo)
        client = Libp2pTransport(seed("client"))
        await target.start()
        await client.start()
        try:
            assert await dial("noise", "yamux", target.addresses()[0], then=abuse)
            peer = await client.connect(target.addresses()[0])
            assert await client.request(peer, "/echo", b"ok") == b"ok"
        finally:
            await client.close()
            await target.close()

    run(scenario)


def test_malformed_request_frames_get_their_sender_banned() -> None:
    """A protocol name over the limit (or not UTF-8) is no honest peer's frame: each counts as
    an invalid message, and the third gets the sender hung up on and refused."""

    senders: list[bytes] = []

    async def abuse(host, peer) -> None:
        senders.append(raw_key(host))
        for frame in [b"\xff\xff" + b"x" * 100, request_frame(b"\xff\xfe", b"x"), b"\x01\x01" + b"x" * 300]:
            try:
                stream = await host.new_stream(peer, [REQUEST_PROTOCOL])
                await stream.write(frame)
                with trio.move_on_after(2):
                    await stream.read(1 << 16)
            except Exception:
                pass  # the target may hang up while we write: that is the point
        with trio.fail_after(5):
            while host.get_connected_peers():
                await trio.sleep(0.01)
        host.get_network().unblock_peer(peer)  # past py-libp2p's own 60 s negative dial cache
        with pytest.raises(Exception):  # noqa: B017 (the redial is refused; py-libp2p raises a dozen types)
            await host.connect(PeerInfo(peer, host.get_peerstore().addrs(peer)))
        assert host.get_connected_peers() == []

    async def scenario() -> None:
        target = Libp2pTransport(seed("target"), limits=STRICT)
        target.set_handler("/echo", echo)
        await target.start()
        try:
            assert await dial("noise", "yamux", target.addresses()[0], then=abuse)
            assert target.banned(senders[0])
        finally:
            await target.close()

    run(scenario)


def raw_key(host) -> bytes:
    return host.get_id().extract_public_key().to_bytes()


def meshsub_stream_then(payload: bytes, senders: list[bytes], wait: float = 0.5):
    """A raw host that writes ``payload`` on a gossipsub stream of its own."""

    async def then(host, peer) -> None:
        senders.append(raw_key(host))
        stream = await host.new_stream(peer, [TProtocol("/meshsub/1.1.0")])
        await stream.write(payload)
        await trio.sleep(wait)

    return then


def test_malformed_gossip_frames_crash_nothing_and_count_against_their_sender() -> None:
    bad_key = rpc_pb2.RPC(publish=[rpc_pb2.Message(
        from_id=b"\x01\x02", data=b"x", seqno=bytes(8), topicIDs=["t"], signature=b"sig", key=b"not a key",
    )]).SerializeToString()
    payloads = [
        encode_uvarint(5) + b"\xff" * 5,  # a frame that is not an RPC protobuf: stopped the host
        encode_uvarint(len(bad_key)) + bad_key,  # a message whose key does not parse: stopped the host
        encode_uvarint(3 << 20),  # a frame over the 1 MiB RPC limit, announced
        b"\xff" * 11,  # a length prefix that never ends
    ]

    async def ignore(message) -> None:
        pass

    async def scenario() -> None:
        target = Libp2pTransport(seed("target"))
        target.set_handler("/echo", echo)
        target.subscribe("t", ignore)
        client = Libp2pTransport(seed("client"))
        await target.start()
        await client.start()
        try:
            peer = await client.connect(target.addresses()[0])
            for payload in payloads:  # each from a sender of its own
                senders: list[bytes] = []
                assert await dial("noise", "yamux", target.addresses()[0], then=meshsub_stream_then(payload, senders))
                assert await client.request(peer, "/echo", b"alive", timeout=5) == b"alive"
                assert target.score(senders[0]) < 0, payload[:12]
            assert target.score(client.peer_id) == 0.0
        finally:
            await client.close()
            await target.close()

    run(scenario)


# -- silent TCP peers --

def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the other end has closed ``sock`` (non-blocking; drains what was sent)."""
    try:
        while True:
            if sock.recv(1 << 16) == b"":
                return True
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def silent_sockets(port: int, count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.setblocking(False)
        sockets.append(sock)
    return sockets


def port_of(address: str) -> int:
    return int(multiaddr.Multiaddr(address).value_for_protocol("tcp"))


def test_a_subscription_made_while_a_peer_is_being_registered_still_reaches_that_peer() -> None:
    """py-libp2p writes its hello (our topics) to a new peer before it lists the peer among those
    a subscribe announces to. Here b's hello to a is held until b has subscribed: that
    subscription is in neither, and without PolicedPubsub's catch-up a never learns it and never
    sends b the topic's messages (the flake tests/test_transport.py's line once showed in CI)."""
    a, b = Libp2pTransport(seed("register-a")), Libp2pTransport(seed("register-b"))
    hello_held, subscribed = threading.Event(), threading.Event()
    received: list[bytes] = []

    async def keep(message) -> None:
        received.append(message.data)

    async def ignore(message) -> None:
        pass

    def hold_hello_to(peer: ID) -> None:
        """Wrap b's host so that its first pubsub stream to ``peer`` holds its first write (the
        hello, already built) until ``subscribed`` is set. Installed on b's trio thread."""
        host = b._host
        open_stream = host.new_stream

        async def new_stream(peer_id, protocols):
            stream = await open_stream(peer_id, protocols)
            if peer_id == peer and any("meshsub" in protocol for protocol in protocols) and not hello_held.is_set():
                write = stream.write

                async def held_write(data: bytes) -> None:
                    hello_held.set()
                    with trio.move_on_after(10):
                        while not subscribed.is_set():
                            await trio.sleep(0.01)
                    stream.write = write
                    await write(data)

                stream.write = held_write
            return stream

        host.new_stream = new_stream

    async def scenario() -> None:
        a.subscribe("late", ignore)
        await asyncio.gather(a.start(), b.start())
        try:
            await b._bridge.call(_sync_to_async(hold_hello_to), libp2p_id(a.peer_id))
            await a.connect(b.addresses()[0])
            for _ in range(1000):
                if hello_held.is_set():
                    break
                await asyncio.sleep(0.01)
            assert hello_held.is_set(), "b never opened its pubsub stream to a"
            b.subscribe("late", keep)
            for _ in range(1000):  # the announcement skipped a (not yet listed) and b joined
                if "late" in b._pubsub.router.mesh:
                    break
                await asyncio.sleep(0.01)
            assert "late" in b._pubsub.router.mesh
            subscribed.set()
            for attempt in range(50):  # 10 s: heartbeats are 1 s
                await a.publish("late", b"probe-%d" % attempt)
                await asyncio.sleep(0.2)
                if received:
                    break
            assert received, "a never sent b the topic b subscribed to while it was being registered"
        finally:
            subscribed.set()
            await asyncio.gather(a.close(), b.close())

    run(scenario)


def test_a_peer_keeps_its_topics_when_only_our_stream_to_it_fails() -> None:
    """py-libp2p forgot every topic of a peer whenever one of the two pubsub streams with it
    failed, and re-opened only ours (our hello, not the peer's). Here a's stream to b fails on
    a's next write while b's stream to a is fine (as after two connections race and one closes:
    b re-opens at once, a finds out at its next write): b never says its topics again, so a must
    keep them, or a sends b nothing on them for good; and forget them once b has gone."""
    a, b = Libp2pTransport(seed("dead-a")), Libp2pTransport(seed("dead-b"))
    received: list[bytes] = []

    async def keep(message) -> None:
        received.append(message.data)

    async def ignore(message) -> None:
        pass

    def break_stream_to(peer: ID):
        """Make a's current pubsub stream to ``peer`` fail its next write; returns that stream.
        Nothing crosses the network, so b's side of it stays open."""
        stream = a._pubsub.peers[peer]

        async def failing_write(data: bytes) -> None:
            raise StreamReset("broken for the test")

        stream.write = failing_write
        return stream

    async def publish_until_received(tag: bytes) -> bool:
        received.clear()
        for attempt in range(50):  # 10 s: heartbeats are 1 s
            await a.publish("kept", tag + b"-%d" % attempt)
            await asyncio.sleep(0.2)
            if received:
                return True
        return False

    async def scenario() -> None:
        a.subscribe("kept", ignore)
        b.subscribe("kept", keep)
        await asyncio.gather(a.start(), b.start())
        try:
            await a.connect(b.addresses()[0])
            assert await publish_until_received(b"before"), "a never reached b"
            b_id = libp2p_id(b.peer_id)
            broken = await a._bridge.call(_sync_to_async(break_stream_to), b_id)
            for _ in range(100):  # a's next write fails; a opens a new stream to b
                await a.publish("kept", b"breaks")
                await asyncio.sleep(0.1)
                if a._pubsub.peers.get(b_id) not in (None, broken):
                    break
            assert a._pubsub.peers.get(b_id) not in (None, broken), "a never re-opened its stream to b"
            assert await publish_until_received(b"after"), "a forgot b's topic when its own stream to b failed"
            await b.close()
            for _ in range(100):  # and once b is gone, a forgets its topics
                if b_id not in a._pubsub.peer_topics.get("kept", ()):
                    break
                await asyncio.sleep(0.1)
            assert b_id not in a._pubsub.peer_topics.get("kept", ()), "a kept the topics of a peer gone"
        finally:
            await asyncio.gather(a.close(), b.close())

    run(scenario)


def _sync_to_async(fn):
    async def call(*args):
        return fn(*args)

    return call


def test_a_silent_tcp_connection_is_closed_at_the_handshake_deadline() -> None:
    limits = TransportLimits(handshake_timeout=0.5)

    async def scenario() -> None:
        target = Libp2pTransport(seed("target"), limits=limits)
        await target.start()
        sockets = []
        try:
            started = time.monotonic()
            sockets = silent_sockets(port_of(target.addresses()[0]), 3)
            sockets[1].sendall(b"\x13/multistream/1.0.0\n")  # says hello, then nothing
            sockets[2].sendall(b"\x13/multistream/1.0.0\n\x07/noise\n")  # picks Noise, then nothing
            for _ in range(300):  # 3 s at most
                if all(closed_by_peer(sock) for sock in sockets):
                    break
                await asyncio.sleep(0.01)
            elapsed = time.monotonic() - started
            print(f"\nsilent sockets closed {elapsed:.3f} s after connecting (deadline {limits.handshake_timeout} s)")
            assert all(closed_by_peer(sock) for sock in sockets)
            assert limits.handshake_timeout - 0.05 <= elapsed < limits.handshake_timeout + 1.5
        finally:
            for sock in sockets:
                sock.close()
            await target.close()

    run(scenario)


def test_silent_connections_over_the_pending_cap_are_closed_at_once_and_honest_peers_served() -> None:
    cap, flood = 8, 60
    limits = TransportLimits(handshake_timeout=1.5, max_pending_connections=cap)

    async def scenario() -> None:
        target = Libp2pTransport(seed("target"), limits=limits)
        target.set_handler("/echo", echo)
        client = Libp2pTransport(seed("client"))
        await target.start()
        await client.start()
        sockets: list[socket.socket] = []
        try:
            peer = await client.connect(target.addresses()[0])
            assert await client.request(peer, "/echo", b"before") == b"before"
            baseline = open_fds()
            started = time.monotonic()
            sockets = silent_sockets(port_of(target.addresses()[0]), flood)
            await asyncio.sleep(0.5)
            refused = [sock for sock in sockets if closed_by_peer(sock)]
            assert len(refused) == flood - cap  # closed at once, long before the deadline
            for sock in refused:
                sock.close()
            # Ours: `cap` client ends still open; the node's: `cap` pending ones, no more.
            during = open_fds() - baseline
            print(f"\n{flood} silent sockets, cap {cap}: {during} more fds in this process "
                  f"(both ends of the {cap} pending)")
            assert during <= 2 * cap + 4
            assert await client.request(peer, "/echo", b"during") == b"during"
            assert time.monotonic() - started < limits.handshake_timeout
            waiting = [sock for sock in sockets if sock not in refused]
            for _ in range(500):  # 5 s at most
                if all(closed_by_peer(sock) for sock in waiting):
                    break
                await asyncio.sleep(0.01)
            assert all(closed_by_peer(sock) for sock in waiting)
            for sock in waiting:
                sock.close()
            assert open_fds() <= baseline + 2
            # Once the pending ones are gone, a new peer gets in.
            newcomer = Libp2pTransport(seed("newcomer"))
            newcomer.set_handler("/echo", echo)
            await newcomer.start()
            try:
                assert await newcomer.connect(target.addresses()[0]) == target.peer_id
                assert await newcomer.request(target.peer_id, "/echo", b"hello") == b"hello"
            finally:
                await newcomer.close()
        finally:
            for sock in sockets:
                sock.close()
            await client.close()
            await target.close()

    run(scenario)


# -- the identity binding --

def test_the_libp2p_peer_id_is_the_nodes_ed25519_key() -> None:
    private_seed = seed("identity")
    node_key = Ed25519PrivateKey.from_private_bytes(private_seed)
    port = free_port()
    transport = Libp2pTransport(private_seed, port=port)
    assert transport.peer_id == node_key.public_key().public_bytes_raw()

    async def listen() -> str:
        await transport.start()
        try:
            return transport.addresses()[0]
        finally:
            await transport.close()

    address = run(listen)
    assert address == multiaddr_for(transport.peer_id, "127.0.0.1", port)  # known before start
    libp2p_id = info_from_p2p_addr(multiaddr.Multiaddr(address)).peer_id
    libp2p_key = libp2p_id.extract_public_key()
    assert libp2p_key is not None and libp2p_key.to_bytes() == transport.peer_id
    record = b"a rollout record"
    assert libp2p_key.verify(record, node_key.sign(record))  # what the node signs, libp2p verifies
    node_key.public_key().verify(create_new_key_pair(private_seed).private_key.sign(record), record)


# -- peers that die or hang --

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PeerProcess:
    """tests/p2p_peer.py running with a fixed key and port."""

    def __init__(self, private_seed: bytes, port: int) -> None:
        self.seed, self.port = private_seed, port
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> str:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, str(PEER_SCRIPT), "--seed", self.seed.hex(), "--port", str(self.port),
            "--lifetime", "60", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        line = await asyncio.wait_for(self.process.stdout.readline(), 30)
        assert line, "the peer process died before listening"
        return line.decode().strip()

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    async def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGCONT)  # a stopped process would not die until continued
            self.process.kill()
            await self.process.wait()


def test_a_killed_peer_restarted_on_the_same_key_and_port_is_reached_again() -> None:
    async def scenario() -> None:
        peer_process = PeerProcess(seed("restarted"), free_port())
        client = Libp2pTransport(seed("client"))
        await client.start()
        try:
            peer = await client.connect(await peer_process.start())
            assert await client.request(peer, "/echo", b"before") == b"before"
            await peer_process.kill()
            for _ in range(100):  # the connection's end is noticed within ms; allow 10 s
                if peer not in client.peers():
                    break
                await asyncio.sleep(0.1)
            with pytest.raises(PeerUnavailable):  # the redial is refused
                await client.request(peer, "/echo", b"while down", timeout=5)
            # The failed dial put the peer in the swarm's negative cache, which would refuse
            # it for 60 s (``_NegativePeerCache``, libp2p/network/swarm.py) had the transport
            # not lifted it.
            negative_cache = client._host.get_network()._negative_peer_cache
            assert negative_cache.is_blocked(str(ID.from_pubkey(Ed25519PublicKey.from_bytes(peer))))
            await peer_process.start()
            started = time.monotonic()
            assert await client.request(peer, "/echo", b"after", timeout=10) == b"after"
            assert time.monotonic() - started < 5
        finally:
            await peer_process.kill()
            await client.close()

    run(scenario)


def test_a_stopped_peer_times_out_and_recovers_when_continued() -> None:
    async def ignore(message) -> None:
        pass

    async def scenario() -> None:
        peer_process = PeerProcess(seed("stopped"), free_port())
        client = Libp2pTransport(seed("client"))
        client.subscribe("t", ignore)
        await client.start()
        try:
            peer = await client.connect(await peer_process.start())
            for attempt in range(50):  # until the peer is in our gossip mesh (a heartbeat, 1 s)
                await client.publish("t", b"probe-%d" % attempt)
                if await client.request(peer, "/count", b"") != b"0":
                    break
                await asyncio.sleep(0.1)
            peer_process.signal(signal.SIGSTOP)
            started = time.monotonic()
            with pytest.raises(RequestTimeout):
                await client.request(peer, "/echo", b"hung", timeout=1.0)
            assert time.monotonic() - started < 2.0
            # Gossip to the stopped peer soon fills its flow-control window (256 KiB) and then
            # the router's queue: publishing waits for it once, then goes on without it.
            started = time.monotonic()
            for index in range(60):
                await client.publish("t", b"%d" % index + bytes(16 << 10))
            assert time.monotonic() - started < PACE_MAX_WAIT_SECONDS + 5
            peer_process.signal(signal.SIGCONT)
            assert await client.request(peer, "/echo", b"after", timeout=10) == b"after"
        finally:
            await peer_process.kill()
            await client.close()

    run(scenario)


def test_a_transport_whose_port_is_taken_refuses_to_start():
    """py-libp2p 0.8.1 listens with SO_REUSEPORT, so a second node on a taken port started, and
    the kernel split incoming dials between the two processes."""
    async def scenario() -> None:
        first = Libp2pTransport(seed("first"))
        await first.start()
        try:
            port = int(first.addresses()[0].split("/tcp/")[1].split("/")[0])
            second = Libp2pTransport(seed("second"), port=port)
            with pytest.raises(PeerUnavailable, match="cannot listen"):
                await asyncio.wait_for(second.start(), 30)
            await second.close()
        finally:
            await first.close()

    asyncio.run(scenario())


def libp2p_threads() -> int:
    import threading

    return sum(t.name.startswith("libp2p") and t.is_alive() for t in threading.enumerate())


def test_a_start_given_up_on_or_closed_midway_leaves_no_host_running():
    """A start that is cancelled, or raced by close(), before the host serves: close() used to
    find the trio side unset (AttributeError) and leave its thread running, and a cancelled
    start left the transport new, to be started twice."""
    async def scenario() -> None:
        before = libp2p_threads()
        cancelled = Libp2pTransport(seed("cancelled"))
        starting = asyncio.ensure_future(cancelled.start())
        await asyncio.sleep(0)  # the thread is started; the host is not up yet
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        await asyncio.wait_for(cancelled.close(), 30)
        with pytest.raises(TransportError, match="starts once"):
            await cancelled.start()

        raced = Libp2pTransport(seed("raced"))
        starting = asyncio.ensure_future(raced.start())
        await asyncio.sleep(0)
        await asyncio.wait_for(raced.close(), 30)
        with pytest.raises(TransportError, match="closed while it started"):
            await starting
        assert raced.peers() == set() and raced.addresses() == []
        for _ in range(100):  # bounded: the threads end within CLOSE_TIMEOUT of their close
            if libp2p_threads() == before:
                break
            await asyncio.sleep(0.1)
        assert libp2p_threads() == before

    asyncio.run(scenario())
