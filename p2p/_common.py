"""What both transports share, so that they behave the same where the contract says so:
checking names and keys, running a validator, answering a request, running the node's
handlers, and scoring peers (the decisions built on the scores are :mod:`p2p.policing`'s).

The request outcome travels as a :class:`Status` plus a body. Loopback passes the pair in
memory; libp2p puts it on the wire (see :mod:`p2p.libp2p_transport`). :func:`outcome` turns it
back into the caller's bytes or exception, in one place for both.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from p2p.transport import (
    PEER_ID_BYTES,
    Message,
    MessageHandler,
    MessageTooLarge,
    PeerId,
    RemoteError,
    RequestHandler,
    TransportLimits,
    Validation,
    Validator,
)

log = logging.getLogger("p2p")

SEED_BYTES = 32
"""An Ed25519 private key is its 32-byte seed (RFC 8032 §5.1.5)."""

MAX_PROTOCOL_NAME_BYTES = 256
"""Longest request protocol name; ours are ~15 bytes. It bounds what a server reads before it
knows whether it has a handler."""

MAX_ERROR_DETAIL_BYTES = 256
"""Longest error text in an error response: enough for an exception's type name, too short to
be a channel for anything else."""


class Status(enum.IntEnum):
    """How a request ended, as the server saw it. The values are on the libp2p wire: append only."""

    OK = 0
    HANDLER_FAILED = 1
    UNKNOWN_PROTOCOL = 2
    REQUEST_TOO_LARGE = 3
    RESPONSE_TOO_LARGE = 4


def check_seed(private_seed: bytes) -> bytes:
    if not isinstance(private_seed, bytes) or len(private_seed) != SEED_BYTES:
        raise ValueError(f"an Ed25519 private seed is {SEED_BYTES} bytes")
    return private_seed


def check_peer(peer: PeerId) -> PeerId:
    if not isinstance(peer, bytes) or len(peer) != PEER_ID_BYTES:
        raise ValueError(f"a peer id is a raw {PEER_ID_BYTES}-byte Ed25519 public key")
    return peer


def check_topic(topic: str) -> str:
    # A NUL in a topic would let two (topic, data) pairs share one message_id (it is the
    # separator in SHA-256(topic || 0 || data)), so topics may not contain one.
    if not isinstance(topic, str) or not topic or "\x00" in topic:
        raise ValueError(f"a topic is a non-empty str without NUL, not {topic!r}")
    return topic


def check_protocol(protocol: str) -> str:
    if not isinstance(protocol, str) or not protocol or len(protocol.encode()) > MAX_PROTOCOL_NAME_BYTES:
        raise ValueError(f"a protocol is a non-empty str of at most {MAX_PROTOCOL_NAME_BYTES} bytes")
    return protocol


def check_request_limits(timeout: float, max_response: int) -> None:
    if not timeout > 0:
        raise ValueError(f"a request timeout is a positive number of seconds, not {timeout}")
    if max_response < 0:
        raise ValueError(f"max_response is a size, not {max_response}")


def judge(validator: Validator | None, message: Message) -> Validation:
    """The validator's verdict. One that raises, or answers anything but a :class:`Validation`,
    rejects: the message came from the network and must not take the node down."""
    if validator is None:
        return Validation.ACCEPT
    try:
        verdict = validator(message)
    except Exception:
        # Debug, not warning: any peer can make a validator raise, as often as it likes.
        log.debug("validator for %r raised; rejecting the message", message.topic, exc_info=True)
        return Validation.REJECT
    if not isinstance(verdict, Validation):
        log.debug("validator for %r returned %r, not a Validation; rejecting", message.topic, verdict)
        return Validation.REJECT
    return verdict


class Subscription:
    """A topic's handler and validator, as ``subscribe`` took them."""

    __slots__ = ("on_message", "validator")

    def __init__(self, on_message: MessageHandler, validator: Validator | None) -> None:
        self.on_message = on_message
        self.validator = validator


class Tasks:
    """The node's handlers that a transport runs, each an asyncio task on the node's loop: one
    that raises is logged, and closing the transport cancels those still running."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("message handler raised", exc_info=task.exception())


def refuse(handler: RequestHandler | None, max_request: int, size: int) -> tuple[Status, bytes] | None:
    """The error answer to a request that must not reach a handler, or None. Decided on the
    declared size alone, so a server refuses an oversize request before reading it."""
    if handler is None:
        return Status.UNKNOWN_PROTOCOL, b""
    if size > max_request:
        return Status.REQUEST_TOO_LARGE, f"{size} > {max_request} bytes".encode()
    return None


async def serve(handler: RequestHandler, peer: PeerId, data: bytes, max_response: int) -> tuple[Status, bytes]:
    """Run a handler on one request. Never raises (except cancellation): a failure is a status."""
    try:
        response = await handler(peer, data)
    except Exception as error:
        # Debug, as for validators; the caller learns the exception's type.
        log.debug("request handler raised", exc_info=True)
        return Status.HANDLER_FAILED, type(error).__name__.encode()[:MAX_ERROR_DETAIL_BYTES]
    if not isinstance(response, bytes | bytearray | memoryview):
        log.debug("request handler returned %s, not bytes", type(response).__name__)
        return Status.HANDLER_FAILED, b"not bytes"
    if len(response) > max_response:
        return Status.RESPONSE_TOO_LARGE, f"{len(response)} > {max_response} bytes".encode()
    return Status.OK, bytes(response)


def outcome(status: int, body: bytes, protocol: str) -> bytes:
    """The caller's view of a server's answer: the response, or the exception it stands for."""
    if status == Status.OK:
        return body
    detail = body[:MAX_ERROR_DETAIL_BYTES].decode("utf-8", "replace")
    if status == Status.REQUEST_TOO_LARGE:
        raise MessageTooLarge(f"{protocol}: request refused by the peer ({detail})")
    if status == Status.RESPONSE_TOO_LARGE:
        raise MessageTooLarge(f"{protocol}: response over the limit ({detail})")
    if status == Status.UNKNOWN_PROTOCOL:
        raise RemoteError(f"{protocol}: the peer has no handler for it")
    if status == Status.HANDLER_FAILED:
        raise RemoteError(f"{protocol}: the peer's handler failed ({detail})")
    raise RemoteError(f"{protocol}: the peer answered with unknown status {status}")


DECAY_INTERVAL = 1.0
"""Seconds between two decays of a count: go-libp2p-pubsub's ``DefaultDecayInterval``. Whole
intervals only, as GossipSub decays at its heartbeat: so n invalid messages inside one interval
count exactly n, and a threshold of -n**2 bans at the n-th."""

DECAY_TO_ZERO = 0.01
"""A count that decays below this is forgotten: go-libp2p-pubsub's ``DefaultDecayToZero``."""

MAX_SCORED_PEERS = 10_000
"""Peers with a count (or a ban) remembered at once. Every one of them completed a Noise
handshake with a key of its own and sent something invalid; past this many, the smallest count
is forgotten first. ~200 bytes each: 2 MB at most."""


def check_limits(limits: TransportLimits) -> TransportLimits:
    if not isinstance(limits, TransportLimits):
        raise ValueError(f"limits is a TransportLimits, not {type(limits).__name__}")
    return limits


class PeerScores:
    """GossipSub v1.1 P4 scores and bans, per peer (see :class:`p2p.transport.TransportLimits`).
    Thread-safe: the libp2p transport counts on its network thread, the node reads on its own."""

    def __init__(self, limits: TransportLimits, clock: Callable[[], float] = time.monotonic, *,
                 max_peers: int = MAX_SCORED_PEERS) -> None:
        self.limits = self._limits = check_limits(limits)
        self._clock = clock
        self._max_peers = max_peers
        self._decay = 0.5 ** (DECAY_INTERVAL / limits.invalid_message_halflife)
        self._counts: dict[PeerId, tuple[float, float]] = {}  # peer -> (count, start of its interval)
        self._banned_until: dict[PeerId, float] = {}
        self._lock = threading.Lock()

    def penalize(self, peer: PeerId) -> bool:
        """Count one invalid message against ``peer``. True if this is what bans it."""
        with self._lock:
            now = self._clock()
            if self._is_banned(peer, now):
                return False  # what a banned peer still gets through (in flight) adds nothing
            count = self._count(peer, now) + 1.0
            self._counts[peer] = (count, self._counts.get(peer, (0.0, now))[1])
            if len(self._counts) > self._max_peers:
                self._forget_smallest(keep=peer)
            if self._limits.invalid_message_weight * count * count > self._limits.ban_threshold:
                return False
            self._banned_until[peer] = now + self._limits.ban_seconds
            if len(self._banned_until) > self._max_peers:
                del self._banned_until[min(self._banned_until, key=self._banned_until.__getitem__)]
            return True

    def score(self, peer: PeerId) -> float:
        with self._lock:
            count = self._count(peer, self._clock())
        return self._limits.invalid_message_weight * count * count if count else 0.0

    def banned(self, peer: PeerId) -> bool:
        with self._lock:
            return self._is_banned(peer, self._clock())

    def _is_banned(self, peer: PeerId, now: float) -> bool:
        until = self._banned_until.get(peer)
        if until is None:
            return False
        if now < until:
            return True
        del self._banned_until[peer]
        return False

    def _count(self, peer: PeerId, now: float) -> float:
        """The peer's count decayed to ``now`` (and stored so)."""
        entry = self._counts.get(peer)
        if entry is None:
            return 0.0
        count, since = entry
        intervals = math.floor((now - since) / DECAY_INTERVAL)
        if intervals <= 0:
            return count
        count *= self._decay ** intervals
        if count < DECAY_TO_ZERO:
            del self._counts[peer]
            return 0.0
        self._counts[peer] = (count, since + intervals * DECAY_INTERVAL)
        return count

    def _forget_smallest(self, keep: PeerId) -> None:
        now = self._clock()
        for peer in list(self._counts):
            self._count(peer, now)  # drops the ones that have decayed away
        while len(self._counts) > self._max_peers:
            del self._counts[min((p for p in self._counts if p != keep), key=lambda p: self._counts[p][0])]
