"""Where the libp2p transport reaches into py-libp2p 0.8.1's stack: the pubsub that delivers,
judges and blames through the transport (:class:`PolicedPubsub`), the upgrader that refuses
banned peers (:class:`GatedUpgrader`), the notifee that keeps the peer set (:class:`PeerWatch`),
how a libp2p peer id maps to ours, and the stream cleanups they share with the transport.
Why each is needed is in :mod:`p2p.libp2p_transport`'s docstring; the decisions are
:mod:`p2p.policing`'s. Everything here runs on the transport's trio thread.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from typing import Any, cast

import multiaddr
import trio
from libp2p.abc import INetConn, INetStream, INetwork, INotifee
from libp2p.crypto.ed25519 import Ed25519PublicKey
from libp2p.crypto.keys import KeyType
from libp2p.exceptions import ValidationError
from libp2p.io.exceptions import IOException
from libp2p.network.connection.exceptions import RawConnError
from libp2p.network.stream.exceptions import StreamError
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.transport.exceptions import SecurityUpgradeFailure
from libp2p.transport.upgrader import TransportUpgrader

from p2p import _common
from p2p import traffic as T
from p2p.framing import FrameWatch
from p2p.transport import PeerId

log = _common.log

# The topics the hello being written announces (PolicedPubsub._handle_new_peer): each trio
# task runs in a context of its own, so concurrent registrations do not mix theirs.
_HELLO_TOPICS: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar("hello_topics", default=None)

# Resetting a stream sends one frame; if even that blocks the connection is gone.
RESET_TIMEOUT = 1.0


class PolicedPubsub(Pubsub):
    """Pubsub wired to the transport:

    * each accepted message goes straight to the transport: the stock ``notify_subscriptions``
      puts it on a 32-slot channel per topic and drops it when that is full
      (SUBSCRIPTION_CHANNEL_SIZE, libp2p/pubsub/pubsub.py), which a burst can fill before any
      reader runs;
    * ``validate_msg`` asks the transport (ACCEPT / IGNORE / REJECT, with blame), instead of
      py-libp2p's boolean validators and their cache, which would replay an IGNORE as a failure
      and skip the validator, and so the blame, for a copy of a rejected message;
    * a message dropped for a bad signature, a frame that is not an RPC protobuf, and a frame
      over ``max_inbound_rpc_size`` count against the peer that sent them, and none of them
      can stop the host (0.8.1 lets ``DecodeError`` out of ``stream_handler``, and out of
      ``push_msg`` for a message whose ``key`` does not parse: both stopped the host);
    * a new peer hears of every subscription we change while it is being registered: 0.8.1
      builds the hello (our topics) before the write that registers the peer, and a subscribe
      or unsubscribe in between is announced to the registered peers only, so the new one never
      learns of it, and never sends us that topic's messages (``_handle_new_peer``);
    * a peer's subscriptions are forgotten when it disconnects, not when one of its streams
      fails (``_forget_all_subscriptions``);
    * a banned peer's gossip streams are reset unread;
    * the gossip payload written to each peer (publishes, mesh forwards, IWANT answers) and
      every copy read from one are counted (``count(kind, topic, bytes)``, :mod:`p2p.traffic`):
      both happen inside the router, out of the transport's sight.

    The transport answers through five callbacks: ``deliver(topic, message)``,
    ``judge(forwarder, message) -> bool`` (deliver and forward?), ``penalize(peer)``,
    ``banned(peer) -> bool`` and ``count``.
    """

    def __init__(self, *args: Any, deliver: Callable[[str, rpc_pb2.Message], None],
                 judge: Callable[[ID, rpc_pb2.Message], bool], penalize: Callable[[ID], None],
                 banned: Callable[[ID], bool], count: Callable[[str, str, int], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._count = count
        self._deliver = deliver
        self._judge = judge
        self._penalize = penalize
        self._banned = banned
        self._validated: set[int] = set()  # id() of the messages push_msg took to validate_msg

    def get_hello_packet(self) -> rpc_pb2.RPC:
        hello = super().get_hello_packet()
        _HELLO_TOPICS.set(frozenset(option.topicid for option in hello.subscriptions))
        return hello

    async def _handle_new_peer(self, peer_id: ID) -> None:
        # py-libp2p writes the hello, a checkpoint, and only then lists the peer among those a
        # subscribe announces to: a subscription changed in that gap reached no one. Seen under
        # load (tests/test_transport.py's line a - b - c: a never learnt b's topic, so it sent
        # b nothing, for good). So once the peer is listed, announce what changed since the
        # hello. The hello is built in this task, so the context variable is this call's own.
        token = _HELLO_TOPICS.set(None)
        try:
            await super()._handle_new_peer(peer_id)
            announced = _HELLO_TOPICS.get()
        finally:
            _HELLO_TOPICS.reset(token)
        queue = self.peer_queues.get(peer_id)
        if announced is None or queue is None:  # no hello written: registered before, or failed
            return
        now = frozenset(self.topic_ids)
        changes = [(topic, True) for topic in sorted(now - announced)]
        changes += [(topic, False) for topic in sorted(announced - now)]
        for topic, subscribe in changes:
            packet, option = self._build_announce_rpc(topic, subscribe=subscribe)
            # As a subscribe's own announcement is queued: a full queue retries later.
            self._enqueue_or_retry_announce(peer_id, queue, packet, option)

    def _forget_all_subscriptions(self, peer_id: ID) -> None:
        # 0.8.1 forgets every topic of a peer whenever either of its two pubsub streams fails
        # (``_handle_dead_peer``: a failed read, a failed write, an oversized frame) and, the peer
        # still connected, opens a new stream to it with our hello. The peer says its topics only
        # in its own hello, so unless its stream to us failed too it never says them again, and
        # gossipsub sends it nothing on them for good. A write fails late: after two connections
        # race and one closes, the peer re-opens its stream on the other at once, and our next
        # write, on the closed one, wipes what its new hello just told us. Its subscriptions are
        # the peer's state, not a stream's: forgotten once it has no connection left (the dead-peer
        # channel calls here then). The transport never unsubscribes (p2p.transport has no such
        # call), so a topic kept this way is never stale.
        if self._peer_is_connected(peer_id):
            return
        super()._forget_all_subscriptions(peer_id)

    def notify_subscriptions(self, publish_message: rpc_pb2.Message) -> None:
        for topic in publish_message.topicIDs:
            if topic in self.topic_ids:
                try:
                    self._deliver(topic, publish_message)
                except Exception:
                    log.exception("gossip delivery failed")

    async def validate_msg(self, msg_forwarder: ID, msg: rpc_pb2.Message) -> None:
        self._validated.add(id(msg))
        if not self._judge(msg_forwarder, msg):
            raise ValidationError("rejected or ignored")

    async def push_msg(self, msg_forwarder: ID, msg: rpc_pb2.Message) -> None:
        # Everything push_msg checks before validate_msg runs without a checkpoint, and looks
        # at the message alone: one neither seen before nor taken to validation failed its
        # signature, or raised while it was checked (a ``key`` that is not a protobuf key
        # raises DecodeError out of signature_validator). (We blacklist no one, and
        # py-libp2p's score gates are open: its ScoreParams thresholds are -inf.)
        seen = self._is_msg_seen(msg)
        if msg_forwarder != self.my_id:
            # Our topics only: a peer's topic list must not grow the counters' keys.
            for topic in set(msg.topicIDs) & self.topic_ids:
                self._count(T.GOSSIP_COPIES_IN, topic, len(msg.data))
        try:
            await super().push_msg(msg_forwarder, msg)
        except Exception:  # a service task: an escaping error stops pubsub and the host
            log.debug("a gossip message from %s failed", msg_forwarder, exc_info=True)
        finally:
            validated = id(msg) in self._validated
            self._validated.discard(id(msg))
        if not seen and not validated:
            self._penalize(msg_forwarder)

    async def write_msg(self, stream: INetStream, rpc_msg: rpc_pb2.RPC) -> bool:
        # Every RPC to a peer goes through here (the router's per-peer sending loop).
        written = await super().write_msg(stream, rpc_msg)
        if written:
            self._count(T.GOSSIP_RPC_OUT, "rpc", rpc_msg.ByteSize())
            for msg in rpc_msg.publish:
                for topic in msg.topicIDs:
                    self._count(T.GOSSIP_OUT, topic, len(msg.data))
        return written

    async def stream_handler(self, stream: INetStream) -> None:
        peer = stream.muxed_conn.peer_id
        if self._banned(peer):
            await reset_stream(stream)
            return
        watched = FrameWatch(stream, self.max_inbound_rpc_size)
        try:
            # FrameWatch is the stream itself to its reader: it forwards every attribute to it.
            await self.continuously_read_stream(cast(INetStream, watched))
        except (StreamError, IOException, RawConnError):
            pass  # the peer went away, perhaps mid-frame: not its fault as far as we can tell
        except Exception:  # ParseError (a length prefix that never ends), DecodeError, ...
            log.debug("malformed gossip from %s", peer, exc_info=True)
            self._penalize(peer)
        else:
            # continuously_read_stream resets the stream of a frame over the limit itself.
            if watched.frames.oversized:
                self._penalize(peer)
            return
        await reset_stream(stream)
        self._handle_dead_peer(peer)


class GatedUpgrader(TransportUpgrader):
    """The swarm's upgrader, refusing banned peers as soon as Noise has named them, inbound or
    outbound, before the muxer (so before any stream): go-libp2p's ConnectionGater
    ``InterceptSecured`` (p2p/net/upgrader/upgrader.go). The swarm treats the refusal like any
    failed handshake: it closes the socket."""

    def __init__(self, inner: TransportUpgrader, admits: Callable[[ID], bool]) -> None:
        # Shares the configured multistreams of the upgrader new_host built.
        self.security_multistream = inner.security_multistream
        self.muxer_multistream = inner.muxer_multistream
        self._admits = admits

    async def upgrade_security(self, raw_conn: Any, is_initiator: bool, peer_id: ID | None = None) -> Any:
        secured = await super().upgrade_security(raw_conn, is_initiator, peer_id)
        if not self._admits(secured.get_remote_peer()):
            await close_shielded(secured)
            raise SecurityUpgradeFailure(f"{secured.get_remote_peer()} is banned")
        return secured


class PeerWatch(INotifee):
    """Keeps the transport's peer set current (``changed()`` on every connect and
    disconnect), and hangs up on peers that are not Ed25519 (they have no name in this network:
    a peer id is a raw Ed25519 key) or that ``admits`` refuses."""

    def __init__(self, changed: Callable[[], None], admits: Callable[[ID], bool]) -> None:
        self._changed = changed
        self._admits = admits

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        self._changed()
        peer = conn.muxed_conn.peer_id
        # Banned peers are refused at the handshake (GatedUpgrader); this catches one banned
        # while its connection was being set up.
        if raw_key(peer.to_bytes()) is None or not self._admits(peer):
            await network.close_peer(peer)

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        self._changed()

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        pass  # INotifee asks for it; streams are not our concern here

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        pass  # as opened_stream

    async def listen(self, network: INetwork, multiaddr: multiaddr.Multiaddr) -> None:
        pass  # as opened_stream: the transport reads its addresses from the host

    async def listen_close(self, network: INetwork, multiaddr: multiaddr.Multiaddr) -> None:
        pass  # as listen


# The two conversions are cached; each is called through a plain function, because a call of
# an lru_cache wrapper is typed as taking any hashable arguments, so its callers' arguments would
# go unchecked.

def raw_key(libp2p_peer_id: bytes) -> PeerId | None:
    """The raw Ed25519 key a libp2p peer id embeds (identity multihash), or None if it is
    not such an id."""
    return _raw_key(libp2p_peer_id)


def libp2p_id(peer: PeerId) -> ID:
    return _libp2p_id(peer)


@functools.lru_cache(maxsize=4096)
def _raw_key(libp2p_peer_id: bytes) -> PeerId | None:
    key = ID(libp2p_peer_id).extract_public_key()  # None for hashed (RSA) ids or garbage
    if key is None or key.get_type() != KeyType.Ed25519:
        return None
    return key.to_bytes()


@functools.lru_cache(maxsize=4096)
def _libp2p_id(peer: PeerId) -> ID:
    return ID.from_pubkey(Ed25519PublicKey.from_bytes(peer))


async def reset_stream(stream: INetStream) -> None:
    # Shielded: this is cleanup, and it often runs because we were cancelled.
    with trio.CancelScope(shield=True), trio.move_on_after(RESET_TIMEOUT):
        try:
            await stream.reset()
        except Exception:
            pass  # it is going away either way


async def close_shielded(connection: Any) -> None:
    """Close a connection we are refusing, even while being cancelled, within RESET_TIMEOUT."""
    with trio.CancelScope(shield=True), trio.move_on_after(RESET_TIMEOUT):
        try:
            await connection.close()
        except Exception:
            pass  # refused either way: a close that fails leaves nothing of ours open


async def close_stream(stream: INetStream) -> None:
    with trio.move_on_after(RESET_TIMEOUT):
        try:
            await stream.close()
        except Exception:
            pass  # the stream is done either way; the peer may have reset it first
