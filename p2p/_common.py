"""What both transports share, so that they behave the same where the contract says so:
checking names and keys, running a validator, answering a request, running the node's
handlers (peers are scored and judged by :mod:`p2p.policing`).

The request outcome travels as a :class:`Status` plus a body. Loopback passes the pair in
memory; libp2p puts it on the wire (see :mod:`p2p.libp2p_transport`). :func:`outcome` turns it
back into the caller's bytes or exception, in one place for both.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Coroutine
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

GOSSIP_DEGREE, GOSSIP_DEGREE_LOW, GOSSIP_DEGREE_HIGH = 6, 4, 12
"""GossipSub mesh degree D / D_low / D_high: the spec's defaults (libp2p/specs
pubsub/gossipsub/gossipsub-v1.0.md, "Parameters"; v1.1 extends v1.0 and leaves them). Here, not
in :mod:`p2p.libp2p_transport`, so that the simulator's mesh (vrl.harness.simulator) reads them
without importing libp2p."""

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


def check_limits(limits: TransportLimits) -> TransportLimits:
    if not isinstance(limits, TransportLimits):
        raise ValueError(f"limits is a TransportLimits, not {type(limits).__name__}")
    return limits
