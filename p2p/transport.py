"""The transport seam: everything the node knows about the network.

The node speaks asyncio to this interface and nothing else; it never sees trio, libp2p or
sockets. Two implementations keep it honest: :mod:`p2p.loopback` (one process, fault
injection, for tests) and :mod:`p2p.libp2p_transport` (py-libp2p over TCP, Noise and Yamux).
Both pass the same contract tests (``tests/test_transport.py``).

Identity: a peer is named by its raw 32-byte Ed25519 public key, the same key that signs its
rollouts, so "who sent this" and "who signed this" are one question.

Semantics the node may rely on:

* ``publish`` delivers to every subscribed peer reachable through peers that accepted the
  message (gossip), at most once per peer (messages are content-addressed: ``msg_id`` is
  ``SHA-256(topic || 0 || data)``). It raises :class:`MessageTooLarge` instead of dropping
  silently, and paces itself (it may wait) instead of overrunning the router's queues.
* A validator runs before a message is delivered or forwarded. It must be cheap and pure (the
  libp2p transport calls it on its own network thread); a validator that raises counts as
  ``REJECT`` and never takes the transport down. ``rejections(peer)`` counts the REJECTs of
  messages that ``peer`` forwarded.
* ``request`` is one request, one response, with a deadline. Handler failures on the other
  side come back as :class:`RemoteError`; a silent peer as :class:`RequestTimeout`.
* Peers that misbehave are scored down and banned (:class:`TransportLimits`, the model being
  GossipSub v1.1's P4): each invalid message a peer sends us counts against it (a gossip
  message our validator REJECTs, counted against the peer that forwarded it to us; a request
  over the handler's limit; a malformed frame; whatever the node reports with ``penalize``).
  IGNORE never counts. A banned peer is hung up on, and its dials, ours to it and its
  streams are refused until the ban ends; its count decays meanwhile and is kept.
* Delivery is best effort, as in any gossip network: the node recovers what it missed by
  request (backfill), never by assuming gossip is reliable.
"""

from __future__ import annotations

import enum
import hashlib
import math
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from p2p.traffic import Count

PeerId = bytes
"""A peer's raw 32-byte Ed25519 public key."""

PEER_ID_BYTES = 32

# Size limits (specs/network.md §7, §9). py-libp2p 0.8.1 silently drops gossip over 1 MiB
# (libp2p/pubsub/rpc_queue.py DefaultMaxMessageSize; gossipsub.py drops the RPC as "oversized")
# and costs ~16 ms of CPU per 256 KiB message per node (measured on this machine kind; not
# reproduced in bench/ yet, whose bench/network.py sends 2 KiB); its length-prefixed reader
# gives up after 100 short reads (libp2p/io/utils.py read_exactly), which failed over ~6.5 MB on
# Yamux (measured likewise). Bigger payloads go by request in chunks (p2p/blobs.py).
MAX_GOSSIP_BYTES = 256 << 10
MAX_REQUEST_BYTES = 64 << 10
MAX_RESPONSE_BYTES = 2 << 20
DEFAULT_REQUEST_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class TransportLimits:
    """How a transport treats peers that misbehave or say nothing. Frozen; the node reads it
    from its configuration. Every default cites its source.

    Scoring follows GossipSub v1.1's P4, "Invalid Messages" (libp2p/specs
    pubsub/gossipsub/gossipsub-v1.1.md, "The Score Function" and "P4"): a counter per peer,
    +1 for each invalid message it sends us, decaying by a constant factor every decay
    interval of 1 s (go-libp2p-pubsub ``DefaultDecayInterval``) and forgotten below 0.01
    (``DefaultDecayToZero``). The score is ``invalid_message_weight * counter**2``; when a
    penalty takes it to ``ban_threshold`` or below, the peer is banned (the spec's
    graylistThreshold, where its RPCs are ignored, taken one step further, as the spec allows:
    "the application can take further steps and blacklist the peer").
    """

    invalid_message_weight: float = -1.0
    """P4's weight (negative). Only its ratio to ``ban_threshold`` matters, P4 being the only
    component: -1 makes the threshold read as a squared count."""

    invalid_message_halflife: float = 600.0
    """Seconds for a count to halve: Lighthouse's peer score half-life, ``SCORE_HALFLIFE = 600``
    (sigp/lighthouse peer_manager/peerdb/score.rs; Lodestar's ``SCORE_HALFLIFE_MS`` is the
    same 10 min). The per-interval factor is
    ``2 ** (-1 / halflife)``. A peer can then send about one invalid message every 87 s
    without ever reaching the default threshold (steady count ``rate * halflife / ln 2 < 10``)."""

    ban_threshold: float = -100.0
    """Ban at or below this score: with weight -1, 10 invalid messages inside one decay
    interval (11 when spread out), as Lighthouse's MidToleranceError ("~10 occurrences will get
    the peer banned": -5 each, ban at -50). An honest peer sends none: gossip is validated
    before it is forwarded, and requests are within limits that are protocol constants."""

    ban_seconds: float = 1800.0
    """How long a ban lasts: Lodestar's ``BANNED_BEFORE_DECAY_MS = 30 * 60 * 1000``
    (ChainSafe/lodestar, beacon-node network/peers/score/constants.ts). Lighthouse's
    ``BANNED_BEFORE_DECAY`` is 12 h; 30 min lets a node that was misconfigured come back the
    same day. The count keeps decaying meanwhile (three half-lives: to 1/8)."""

    handshake_timeout: float = 10.0
    """Seconds an inbound TCP connection has to finish the whole upgrade (multistream, Noise,
    Yamux) before its socket is closed: py-libp2p 0.8.1's own ``INBOUND_UPGRADE_TIMEOUT``
    (libp2p/network/config.py), below go-libp2p's ``defaultAcceptTimeout = 15 s``
    (p2p/net/upgrader/upgrader.go) and the 20 s rust-libp2p users put on ``.timeout()``. An
    honest handshake on loopback takes milliseconds. Also bounds our outbound upgrades."""

    max_pending_connections: int = 32
    """Inbound connections being upgraded at once; the next ones are closed as soon as they
    are accepted. go-libp2p's resource manager ``TransientBaseLimit.ConnsInbound = 32``
    (p2p/host/resource-manager/limit_defaults.go): its transient scope holds a connection
    until the handshake names its peer. Bounds the sockets a silent crowd can hold to 32 for
    ``handshake_timeout`` each."""

    def __post_init__(self) -> None:
        def number(name: str) -> float:
            value = getattr(self, name)
            try:
                if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
                    raise ValueError
                return float(value)
            except (ValueError, OverflowError):  # OverflowError: an int beyond any float
                raise ValueError(f"{name} is a number, not {value!r:.40}") from None

        if not -math.inf < number("invalid_message_weight") < 0:
            raise ValueError("invalid_message_weight is negative and finite (P4 penalises)")
        if not number("invalid_message_halflife") > 0:
            raise ValueError("invalid_message_halflife is a positive number of seconds (inf: no decay)")
        if not number("ban_threshold") < 0:
            raise ValueError("ban_threshold is negative (-inf: never ban)")
        if not 0 <= number("ban_seconds") < math.inf:
            raise ValueError("ban_seconds is a finite duration")
        if not 0 < number("handshake_timeout") < math.inf:
            raise ValueError("handshake_timeout is a positive, finite number of seconds")
        pending = self.max_pending_connections
        if isinstance(pending, bool) or not isinstance(pending, int) or pending < 1:
            raise ValueError(f"max_pending_connections is a positive int, not {pending!r:.40}")


class TransportError(Exception):
    """Base class of everything a transport raises on purpose."""


class MessageTooLarge(TransportError):
    """A publish, request or response over its size limit: refused whole, never truncated or
    dropped silently."""


class PeerUnavailable(TransportError):
    """The peer is not connected and could not be dialled."""


class RequestTimeout(TransportError):
    """The peer did not answer within the deadline."""


class RemoteError(TransportError):
    """The peer's handler failed, or it has no handler for the protocol."""


class Validation(enum.Enum):
    """A validator's answer, as in gossipsub: deliver and forward, drop quietly, or drop and
    count it against the peer that forwarded it."""

    ACCEPT = "accept"
    IGNORE = "ignore"
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class Message:
    """One gossip message as delivered: who published it and what it says."""

    topic: str
    data: bytes
    origin: PeerId
    msg_id: bytes


def message_id(topic: str, data: bytes) -> bytes:
    """Content address of a gossip message: the same bytes on the same topic are one message."""
    return hashlib.sha256(topic.encode() + b"\x00" + data).digest()


Validator = Callable[[Message], Validation]
#: A coroutine function (an ``async def``): each message's call runs as a task of its own, and
#: asyncio makes tasks of coroutines only, not of other awaitables.
MessageHandler = Callable[[Message], Coroutine[Any, Any, None]]
RequestHandler = Callable[[PeerId, bytes], Awaitable[bytes]]


@runtime_checkable
class Transport(Protocol):
    """What a node needs from a network. All methods are called from one asyncio loop."""

    @property
    def peer_id(self) -> PeerId: ...

    async def start(self) -> None:
        """Start listening; ``addresses()`` is valid afterwards."""

    async def close(self) -> None:
        """Stop; idempotent. Pending requests fail with :class:`TransportError`."""

    def addresses(self) -> list[str]:
        """Addresses other peers can ``connect`` to (each names this peer)."""

    async def connect(self, address: str) -> PeerId:
        """Dial an address that names its peer; returns that peer. Raises :class:`PeerUnavailable`."""

    def peers(self) -> set[PeerId]:
        """Peers connected now."""

    def rejections(self, peer: PeerId) -> int:
        """How many messages forwarded by ``peer`` this peer's validators rejected."""

    def traffic(self) -> dict[tuple[str, str], Count]:
        """Payload messages and bytes carried so far, by ``(kind, topic or protocol)``; the
        kinds and what each counts are :mod:`p2p.traffic`'s."""

    def score(self, peer: PeerId) -> float:
        """``peer``'s score now: 0 for a peer that sent nothing invalid, down to
        ``ban_threshold`` and below (see :class:`TransportLimits`)."""

    def banned(self, peer: PeerId) -> bool:
        """Whether ``peer`` is banned now."""

    def penalize(self, peer: PeerId) -> None:
        """Count one invalid message against ``peer``, as a rejected gossip message does: for
        what only the node can judge (a request that does not decode). May ban it."""

    def subscribe(self, topic: str, on_message: MessageHandler, validator: Validator | None = None) -> None:
        """Receive the topic's messages that ``validator`` accepts (all, without one),
        including this peer's own publishes. One subscription per topic; a topic is a
        non-empty string without NUL (the separator in ``message_id``)."""

    async def publish(self, topic: str, data: bytes) -> None:
        """Gossip ``data``; may wait for pacing. Raises :class:`MessageTooLarge`."""

    def set_handler(self, protocol: str, handler: RequestHandler, *, max_request: int = MAX_REQUEST_BYTES) -> None:
        """Answer requests on ``protocol``. A larger request, or a handler that raises, gets
        an error response (the caller's MessageTooLarge or RemoteError); neither affects other
        requests."""

    async def request(self, peer: PeerId, protocol: str, data: bytes, *, timeout: float = DEFAULT_REQUEST_TIMEOUT,
                      max_response: int = MAX_RESPONSE_BYTES) -> bytes:
        """One request and its response, within ``timeout`` seconds (the peer's handler is
        cancelled when it passes). A peer that is not connected is dialled again if this peer
        has ``connect``-ed to it before; otherwise, or if the dial fails, PeerUnavailable."""
