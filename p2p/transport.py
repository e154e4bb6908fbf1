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
* Delivery is best effort, as in any gossip network: the node recovers what it missed by
  request (backfill), never by assuming gossip is reliable.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

PeerId = bytes
"""A peer's raw 32-byte Ed25519 public key."""

PEER_ID_BYTES = 32

# Size limits. py-libp2p 0.8.1 silently drops gossip over 1 MiB and costs ~16 ms of CPU per
# 256 KiB message per node (shared/research/py-libp2p.md §2.2, §5.2); its length-prefixed
# reader fails over ~6.5 MB on Yamux (§3.1 #4). Bigger payloads go by request in chunks.
MAX_GOSSIP_BYTES = 256 << 10
MAX_REQUEST_BYTES = 64 << 10
MAX_RESPONSE_BYTES = 2 << 20
DEFAULT_REQUEST_TIMEOUT = 10.0


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
MessageHandler = Callable[[Message], Awaitable[None]]
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
