"""Content-addressed payloads too big for one response (policy weights: several MB), in chunks.

A :class:`BlobStore` serves the blobs it holds on :data:`BLOB_PROTOCOL`; :func:`fetch_blob`
gets a blob by its SHA-256 from any of several peers, chunk by chunk, and returns it only once
its size and hash check out. Works over any :class:`p2p.transport.Transport`.

Wire format, msgpack without extension types, one request per chunk:

    request:  [digest: bin 32, index: uint]
    response: [size: uint, chunk: bin]    chunk ``index`` of a blob of ``size`` bytes
              nil                         this peer does not have it (or no such chunk)

Chunk ``i`` is bytes ``[i * CHUNK_BYTES, (i + 1) * CHUNK_BYTES)``; an empty blob is one empty
chunk.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgpack

from p2p.transport import DEFAULT_REQUEST_TIMEOUT, PeerId, Transport, TransportError

BLOB_PROTOCOL = "/vrl/blob/1"

CHUNK_BYTES = 1 << 20
"""1 MiB, the blob chunk of specs/network.md §6 and §9: far below the ~6.5 MB where py-libp2p's
own length-prefixed reader failed on Yamux (measured on this machine kind, not reproduced in
bench/ yet; see p2p/transport.py) and below the transport's MAX_RESPONSE_BYTES.
bench/network.py fetches an 8 MiB blob in these chunks."""

DIGEST_BYTES = 32  # SHA-256

MAX_BLOB_REQUEST_BYTES = 64
"""A request packs to at most 44 bytes: array header 1, bin 8 header 2 + 32, uint64 9."""

MAX_CHUNK_RESPONSE_BYTES = CHUNK_BYTES + 16
"""A full chunk's response: array header 1, uint64 9, bin 32 header 5, and the chunk."""


class BlobError(TransportError):
    """Base class of the blob errors."""


class BlobUnavailable(BlobError):
    """No peer served the blob; ``failures`` says why for each peer asked."""

    def __init__(self, digest: bytes, failures: dict[PeerId, str]) -> None:
        reasons = "; ".join(f"{peer.hex()[:16]}: {why}" for peer, why in failures.items()) or "no peers"
        super().__init__(f"blob {digest.hex()[:16]} unavailable ({reasons})")
        self.digest = digest
        self.failures = failures


class BlobCorrupt(BlobError):
    """The chunks served add up to bytes whose SHA-256 is not the digest asked for. ``peers``
    are those that served chunks: at least one of them lied."""

    def __init__(self, digest: bytes, peers: tuple[PeerId, ...]) -> None:
        super().__init__(f"blob {digest.hex()[:16]} failed its hash check; served by "
                         + ", ".join(peer.hex()[:16] for peer in peers))
        self.digest = digest
        self.peers = peers


class BlobStore:
    """Blobs this peer serves, keyed by SHA-256: those :meth:`put` in memory, and, with
    ``files``, those on disk, where ``files(digest)`` names the file that should hold one (or
    None). A file is read a chunk at a time (a node's blobs are up to GBs each, and an archive
    holds thousands), its hash checked when chunk 0 is asked for, so a damaged or vanished
    file (pruned meanwhile) is answered as not here, and the fetcher moves on to the next
    peer. Registers the request handler of :data:`BLOB_PROTOCOL` on ``transport``."""

    def __init__(self, transport: Transport, files: Callable[[bytes], Path | None] | None = None) -> None:
        self._blobs: dict[bytes, bytes] = {}
        self._files = files
        transport.set_handler(BLOB_PROTOCOL, self._serve, max_request=MAX_BLOB_REQUEST_BYTES)

    def put(self, data: bytes) -> bytes:
        """Serve ``data``; returns its digest."""
        data = bytes(data)
        digest = hashlib.sha256(data).digest()
        self._blobs[digest] = data
        return digest

    def discard(self, digest: bytes) -> None:
        """Stop serving the blob, if it was served."""
        self._blobs.pop(digest, None)

    def __contains__(self, digest: object) -> bool:
        return digest in self._blobs

    async def _serve(self, peer: PeerId, request: bytes) -> bytes:
        digest, index = _decode_request(request)
        data = self._blobs.get(digest)
        if data is None:
            path = self._files(digest) if self._files is not None else None
            answer = None if path is None else await asyncio.to_thread(_file_chunk, path, digest, index)
            return _pack(answer)
        if index >= _chunk_count(len(data)):
            return _pack(None)
        return _pack([len(data), data[index * CHUNK_BYTES:(index + 1) * CHUNK_BYTES]])


def _file_chunk(path: Path, digest: bytes, index: int) -> list[int | bytes] | None:
    """``[size, chunk index]`` of the file at ``path``, or None if it is gone, unreadable, too
    short for that chunk, or (checked at chunk 0) not the blob ``digest`` names."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if index >= _chunk_count(size):
                return None
            if index == 0:
                hashed = hashlib.sha256()
                for block in iter(lambda: handle.read(CHUNK_BYTES), b""):
                    hashed.update(block)
                if hashed.digest() != digest:
                    return None
            handle.seek(index * CHUNK_BYTES)
            chunk = handle.read(CHUNK_BYTES)
    except OSError:
        return None
    return [size, chunk] if len(chunk) == min(CHUNK_BYTES, size - index * CHUNK_BYTES) else None


async def fetch_blob(transport: Transport, peers: Sequence[PeerId], digest: bytes, *, max_size: int,
                     timeout: float = DEFAULT_REQUEST_TIMEOUT) -> bytes:
    """The blob whose SHA-256 is ``digest``, fetched chunk by chunk from ``peers``: each chunk
    from the first peer in order that has not failed yet, so a peer that fails (error, timeout,
    wrong answer) is dropped and the next one takes over. ``timeout`` bounds each chunk
    request, not the whole fetch.

    Raises :class:`BlobUnavailable` when every peer failed (a blob over ``max_size`` counts as
    a failure of the peer that claimed it), :class:`BlobCorrupt` when the bytes do not hash to
    ``digest``.
    """
    if len(digest) != DIGEST_BYTES:
        raise ValueError(f"a digest is {DIGEST_BYTES} bytes")
    candidates = list(dict.fromkeys(peers))
    failures: dict[PeerId, str] = {}
    served: Counter[PeerId] = Counter()
    chunks: list[bytes] = []
    size: int | None = None
    while size is None or len(chunks) < _chunk_count(size):
        index = len(chunks)
        for peer in candidates:
            if peer in failures:
                continue
            try:
                answer = await _fetch_chunk(transport, peer, digest, index, timeout)
            except (TransportError, _Malformed) as error:
                failures[peer] = str(error)
                continue
            if answer is None:
                failures[peer] = f"does not have chunk {index}"
                continue
            claimed, chunk = answer
            if claimed > max_size:
                failures[peer] = f"claims {claimed} bytes > max_size {max_size}"
            elif size is not None and claimed != size:
                failures[peer] = f"claims {claimed} bytes, chunk 0 said {size}"
            elif len(chunk) != min(CHUNK_BYTES, claimed - index * CHUNK_BYTES):
                failures[peer] = f"chunk {index} of {len(chunk)} bytes does not fit a {claimed}-byte blob"
            else:
                size = claimed
                chunks.append(chunk)
                served[peer] += 1
                break
        else:
            raise BlobUnavailable(digest, failures)
    data = b"".join(chunks)
    if hashlib.sha256(data).digest() != digest:
        raise BlobCorrupt(digest, tuple(served))
    return data


class _Malformed(Exception):
    """A blob request or response that does not follow the wire format."""


async def _fetch_chunk(transport: Transport, peer: PeerId, digest: bytes, index: int,
                       timeout: float) -> tuple[int, bytes] | None:
    """``(blob size, chunk)``, or None if the peer does not have it."""
    response = await transport.request(peer, BLOB_PROTOCOL, _pack([digest, index]),
                                       timeout=timeout, max_response=MAX_CHUNK_RESPONSE_BYTES)
    decoded = _unpack(response, max_bin_len=CHUNK_BYTES)
    if decoded is None:
        return None
    match decoded:
        case [int() as size, bytes() as chunk] if not isinstance(size, bool) and size >= 0:
            return size, chunk
    raise _Malformed("malformed chunk response")


def _decode_request(request: bytes) -> tuple[bytes, int]:
    match _unpack(request, max_bin_len=DIGEST_BYTES):
        case [bytes() as digest, int() as index] if (len(digest) == DIGEST_BYTES and not isinstance(index, bool)
                                                     and index >= 0):
            return digest, index
    raise _Malformed("malformed blob request")


def _pack(value: list[int | bytes] | None) -> bytes:
    packed: bytes = msgpack.packb(value)  # msgpack has no types: Any to mypy
    return packed


def _unpack(data: bytes, *, max_bin_len: int) -> Any:
    """Strict msgpack: at most a 2-array of bytes and ints, no maps, strings or extensions."""
    try:
        return msgpack.unpackb(data, max_bin_len=max_bin_len, max_array_len=2, max_map_len=0, max_str_len=0,
                               max_ext_len=0)
    except ValueError as error:  # msgpack's errors (ExtraData, FormatError, ...) are ValueErrors
        raise _Malformed(f"not a blob message: {error}") from None


def _chunk_count(size: int) -> int:
    return max(1, -(-size // CHUNK_BYTES))
