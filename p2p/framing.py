"""Framing: the bytes of the libp2p transport's request protocol, and gossipsub's RPC frames.

The request protocol (``/vrl/req/1.0.0``; its wire format is in :mod:`p2p.libp2p_transport`'s
docstring) is one request and one response per stream, each a fixed head and a
length-prefixed body. Its heads are read by parsers that hold no I/O: a parser is a generator
that yields how many bytes it needs next, is sent exactly those bytes, and returns what it
read (or raises :class:`FrameError`). :func:`read` drives one over a stream, reading no more
than it asks for (a server decides whether to read a request's body from its head alone);
:func:`parse` drives one over bytes in memory. Bodies are read by the caller once it has
checked the size a head declares against its limit.

:class:`VarintFrames` follows gossipsub's RPC framing (an unsigned varint length, then that
many bytes) to tell a frame over the RPC limit from an honest end of stream.

Nothing here imports libp2p or trio: a stream is anything with ``async read(n) -> bytes``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from p2p import _common
from p2p._common import Status

T = TypeVar("T")

READ_CHUNK = 1 << 20  # bytes per read() in our own loop; any size works, this keeps copies few

NAME_SIZE = struct.Struct(">H")
REQUEST_TAIL = struct.Struct(">III")
RESPONSE_HEAD = struct.Struct(">BI")
U32_MAX = 2**32 - 1

Parser = Generator[int, bytes, T]
"""Yields the number of bytes it needs next, is sent exactly that many, returns a ``T``."""


class FrameError(Exception):
    """Bytes that are not a frame of the request protocol. Raised by this module only."""


class Truncated(FrameError):
    """The stream or the bytes ended inside a frame."""


class MalformedRequest(FrameError):
    """A request head no honest peer sends: its protocol name is longer than
    MAX_PROTOCOL_NAME_BYTES or not UTF-8 (``check_protocol`` lets a node use no other)."""


class ReadStream(Protocol):
    async def read(self, n: int | None = None) -> bytes: ...


@dataclass(frozen=True, slots=True)
class RequestHead:
    """A request as declared before its body: which protocol, what the caller accepts back,
    how long it waits, and how many body bytes follow."""

    protocol: str
    max_response: int
    deadline_ms: int
    size: int


def encode_request(protocol: str, data: bytes, *, timeout: float, max_response: int) -> bytes:
    """A whole request. The deadline (ms) and the response limit are clamped to u32."""
    name = protocol.encode()
    deadline_ms = min(math.ceil(timeout * 1000), U32_MAX)
    max_response_field = min(max_response, U32_MAX)
    return NAME_SIZE.pack(len(name)) + name + REQUEST_TAIL.pack(max_response_field, deadline_ms, len(data)) + data


def encode_response(status: Status, body: bytes) -> bytes:
    """A whole response."""
    return RESPONSE_HEAD.pack(status, len(body)) + body


def protocol_name(raw: bytes) -> str | None:
    """A request protocol name off the wire, or None if it is not one: at most
    MAX_PROTOCOL_NAME_BYTES of UTF-8 (``check_protocol`` lets a node use no other)."""
    if not isinstance(raw, bytes) or len(raw) > _common.MAX_PROTOCOL_NAME_BYTES:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def request_head() -> Parser[RequestHead]:
    """Parses a request's head. It asks for at most 2 + MAX_PROTOCOL_NAME_BYTES + 12 bytes, and
    for no name at all when the declared one is too long."""
    (name_size,) = NAME_SIZE.unpack((yield NAME_SIZE.size))
    protocol = None
    if name_size <= _common.MAX_PROTOCOL_NAME_BYTES:
        protocol = protocol_name((yield name_size))
    if protocol is None:
        raise MalformedRequest(f"a protocol name of {name_size} bytes that is not a name")
    max_response, deadline_ms, size = REQUEST_TAIL.unpack((yield REQUEST_TAIL.size))
    return RequestHead(protocol, max_response, deadline_ms, size)


def response_head() -> Parser[tuple[int, int]]:
    """Parses a response's head: ``(status, body size)``. The status may be one this version
    does not know (:class:`Status` is append only)."""
    status, size = RESPONSE_HEAD.unpack((yield RESPONSE_HEAD.size))
    return status, size


def response_limit(status: int, max_response: int) -> int:
    """The most body bytes a response with ``status`` may carry: the caller's limit for a
    response, MAX_ERROR_DETAIL_BYTES for an error's detail."""
    return max_response if status == Status.OK else _common.MAX_ERROR_DETAIL_BYTES


def parse(parser: Parser[T], data: bytes) -> tuple[T, int]:
    """Run ``parser`` over ``data``: what it read, and how many bytes of ``data`` it took.
    Raises :class:`FrameError` only."""
    at = 0
    try:
        size = next(parser)
        while True:
            if len(data) - at < size:
                raise Truncated(f"the bytes end after {len(data) - at} of {size}")
            piece, at = data[at:at + size], at + size
            size = parser.send(piece)
    except StopIteration as done:
        value: T = done.value  # a Parser[T] returns a T; StopIteration.value is Any
        return value, at


async def read(stream: ReadStream, parser: Parser[T]) -> T:
    """Run ``parser`` over a stream, reading exactly what it asks for. Raises
    :class:`FrameError`, or what the stream raises."""
    try:
        size = next(parser)
        while True:
            size = parser.send(await read_exactly(stream, size))
    except StopIteration as done:
        value: T = done.value  # as in parse()
        return value


async def read_exactly(stream: ReadStream, size: int) -> bytes:
    """Our own read loop: msgio's gives up after 100 short reads (``read_exactly``,
    libp2p/io/utils.py). Raises :class:`Truncated` if the stream ends first."""
    buffer = bytearray()
    while len(buffer) < size:
        chunk = await stream.read(min(size - len(buffer), READ_CHUNK))
        if not chunk:
            raise Truncated(f"stream ended after {len(buffer)} of {size} bytes")
        buffer += chunk
    return bytes(buffer)


class VarintFrames:
    """Follows a byte stream of frames, each an unsigned-varint length then that many bytes
    (gossipsub's RPC framing), in whatever chunks it arrives, and tells whether a frame
    announced more than ``limit`` bytes or a length prefix ran past 10 bytes (the most a
    64-bit varint takes; py-libp2p's reader stops there too). O(1) memory and O(prefix bytes)
    work per chunk: frame bodies are skipped, not looked at."""

    MAX_PREFIX_BYTES = 10

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.oversized = False
        self.malformed = False
        self._length = 0
        self._prefix_bytes = 0
        self._remaining = 0

    def feed(self, data: bytes) -> None:
        at = 0
        while at < len(data) and not (self.oversized or self.malformed):
            if self._remaining:
                step = min(self._remaining, len(data) - at)
                self._remaining -= step
                at += step
                continue
            byte = data[at]
            at += 1
            self._length |= (byte & 0x7F) << (7 * self._prefix_bytes)
            self._prefix_bytes += 1
            if byte & 0x80:
                self.malformed = self._prefix_bytes >= self.MAX_PREFIX_BYTES
                continue
            self.oversized = self._length > self.limit
            self._remaining, self._length, self._prefix_bytes = self._length, 0, 0


class FrameWatch:
    """A gossipsub stream, as ``continuously_read_stream`` reads it, with its frames followed
    (:class:`VarintFrames`) to tell a frame over the RPC limit from an honest end of stream:
    py-libp2p handles the first itself and says so only in its log."""

    def __init__(self, stream: ReadStream, limit: int) -> None:
        self._stream = stream
        self.frames = VarintFrames(limit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    async def read(self, n: int | None = None) -> bytes:
        data = await self._stream.read(n)
        self.frames.feed(data)
        return data
