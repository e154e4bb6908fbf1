"""Weight deltas: a policy version's weights file as a delta against its parent's (specs/network.md
§6.1), and the full file rebuilt from the parent's and the delta, bit for bit.

The delta is the XOR of the two files' bytes, region by region (the safetensors header, then
each tensor), each region's XOR split into byte planes (byte 0 of every element, then byte 1,
...), all of it in one zstd frame. Between two GRPO steps most weights keep their sign,
exponent and high mantissa bits, so the planes of high bytes are nearly all zero and compress to
almost nothing; in bfloat16 most weights do not change at all (bench/delta.py measured the
candidates: results in bench/results/delta.json).

The delta is a transport detail, never a trust assumption: :func:`rebuild` checks the parent's
SHA-256 and the rebuilt file's against the delta's header, and the caller checks the rebuilt
file against the announcement (its ``blob`` and ``model_hash``) as it checks a full file.
Hostile input: every length is checked against the parent, which the receiver already holds and
trusts, before anything is allocated; all failures are :class:`DeltaError`.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar, TypeVarTuple

import numpy as np
import structlog
import zstandard

from vrl.errors import VrlError

if TYPE_CHECKING:
    from vrl.node.blobs import Blobs
    from vrl.node.messages import PolicyAnnouncement

MAGIC = b"VRLDELTA"
FORMAT_VERSION = 1
CODEC_ZSTD = 1
# Level 3 is zstd's default. bench/delta.py: higher levels saved little on XOR planes and cost
# encode time the trainer pays every version (results in bench/results/delta.json).
ZSTD_LEVEL = 3
# magic, format version, codec, parent hash, target hash, file size, region count
_HEADER = struct.Struct(">8sBB32s32sQI")
_REGION = struct.Struct(">QB")  # region length in bytes, element width in bytes
# Bytes per element of each safetensors dtype (the safetensors format's dtype list).
DTYPE_WIDTHS = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
                "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
# A safetensors header longer than this is not one the project writes (its JSON is about 100
# bytes per tensor; 100 MB is safetensors' own limit).
MAX_SAFETENSORS_HEADER = 100_000_000


T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class Run(Protocol):
    """What runs ``fn(*args)`` off the event loop as a job of ``kind`` (the node's model thread,
    vrl.node.work.ModelThread.run)."""

    def __call__(self, kind: str, fn: Callable[[*Ts], T], *args: *Ts) -> Awaitable[T]: ...


class DeltaError(VrlError, ValueError):
    """A delta that does not decode, does not fit its parent, or does not rebuild its target."""


@dataclass(frozen=True)
class DeltaHeader:
    """What a delta says of itself: the SHA-256 of the parent and target files, their common
    ``size``, and the ``regions`` (length, element width) that tile them."""

    parent: bytes
    target: bytes
    size: int
    regions: tuple[tuple[int, int], ...]


def layout(blob: bytes) -> tuple[tuple[int, int], ...]:
    """The regions of a safetensors file: its header (8-byte length and JSON, width 1), then
    each tensor in the order of its data offsets, with its dtype's width. Raises DeltaError
    for a file that is not safetensors or whose tensors do not tile its data exactly."""
    if len(blob) < 8:
        raise DeltaError("not a safetensors file: shorter than its 8-byte header length")
    (length,) = struct.unpack_from("<Q", blob)
    if length > min(MAX_SAFETENSORS_HEADER, len(blob) - 8):
        raise DeltaError("not a safetensors file: header length past the file's end")
    try:
        header = json.loads(blob[8:8 + length])
    except (UnicodeDecodeError, ValueError):
        raise DeltaError("not a safetensors file: its header is not JSON") from None
    if not isinstance(header, dict):
        raise DeltaError("not a safetensors file: its header is not a JSON object")
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
                or entry.get("dtype") not in DTYPE_WIDTHS):
            raise DeltaError(f"not a safetensors file: tensor {name[:64]!r} has no dtype or data offsets")
        spans.append((offsets[0], offsets[1], DTYPE_WIDTHS[entry["dtype"]]))
    regions, at = [(8 + length, 1)], 0
    for begin, end, width in sorted(spans):
        if begin != at or end < begin or (end - begin) % width:
            raise DeltaError("not a safetensors file: its tensors do not tile the data section")
        if end > begin:
            regions.append((end - begin, width))
        at = end
    if 8 + length + at != len(blob):
        raise DeltaError("not a safetensors file: its tensors do not end where the file does")
    return tuple(regions)


def _planes(data: np.ndarray, regions: tuple[tuple[int, int], ...]) -> np.ndarray:
    """Each region's bytes regrouped by byte position within an element (a byte shuffle)."""
    out, at = np.empty_like(data), 0
    for length, width in regions:
        chunk = data[at:at + length]
        out[at:at + length] = chunk if width == 1 else chunk.reshape(-1, width).T.reshape(-1)
        at += length
    return out


def _unplanes(planes: np.ndarray, regions: tuple[tuple[int, int], ...]) -> np.ndarray:
    out, at = np.empty_like(planes), 0
    for length, width in regions:
        chunk = planes[at:at + length]
        out[at:at + length] = chunk if width == 1 else chunk.reshape(width, -1).T.reshape(-1)
        at += length
    return out


def encode(parent: bytes, target: bytes) -> bytes:
    """The delta that rebuilds ``target`` from ``parent``: two weights files of one architecture
    (same tensors, shapes and dtypes). Raises DeltaError when they are not."""
    regions = layout(parent)
    if len(parent) != len(target) or layout(target) != regions:
        raise DeltaError("the two files do not have the same tensors, shapes and dtypes: no delta between them")
    # The XOR is let go once in planes, and zstd reads the planes in place: twice the file's size at most.
    planes = _planes(np.bitwise_xor(np.frombuffer(parent, np.uint8), np.frombuffer(target, np.uint8)), regions)
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True, write_checksum=True)
    body = compressor.compress(planes.data)
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, CODEC_ZSTD, hashlib.sha256(parent).digest(),
                          hashlib.sha256(target).digest(), len(target), len(regions))
    return header + b"".join(_REGION.pack(length, width) for length, width in regions) + body


def read_header(delta: bytes) -> DeltaHeader:
    """The delta's header, checked for form only (what it is a delta of is :func:`rebuild`'s)."""
    if not isinstance(delta, (bytes, bytearray, memoryview)):
        raise DeltaError(f"a delta is bytes, not {type(delta).__name__}")
    if len(delta) < _HEADER.size:
        raise DeltaError(f"truncated delta: {len(delta)} bytes, shorter than its {_HEADER.size}-byte header")
    magic, version, codec, parent, target, size, count = _HEADER.unpack_from(delta)
    if magic != MAGIC:
        raise DeltaError("not a weights delta (wrong magic bytes)")
    if version != FORMAT_VERSION or codec != CODEC_ZSTD:
        raise DeltaError(f"unknown delta format {version} or codec {codec} (this node reads format "
                         f"{FORMAT_VERSION}, codec {CODEC_ZSTD}: zstd)")
    if len(delta) < _HEADER.size + count * _REGION.size:
        raise DeltaError(f"truncated delta: its {count} regions do not fit in {len(delta)} bytes")
    regions = tuple(_REGION.unpack_from(delta, _HEADER.size + i * _REGION.size) for i in range(count))
    return DeltaHeader(parent, target, size, regions)


def rebuild(parent: bytes, delta: bytes) -> bytes:
    """The target file of ``delta``, rebuilt from ``parent``; checked against the delta's own
    header (the parent's hash, every region's length and width against the parent's tensors,
    the rebuilt file's hash). Memory: twice the parent's size besides it, whatever the
    delta declares."""
    header = read_header(delta)
    if hashlib.sha256(parent).digest() != header.parent:
        raise DeltaError(f"a delta against another parent (it names {header.parent.hex()[:16]}, "
                         f"this node's parent is {hashlib.sha256(parent).hexdigest()[:16]})")
    if header.size != len(parent) or header.regions != layout(parent):
        raise DeltaError("the delta's size or tensor layout is not its parent's")
    body = memoryview(delta)[_HEADER.size + len(header.regions) * _REGION.size:]
    try:
        declared = zstandard.frame_content_size(body)
    except zstandard.ZstdError as error:
        raise DeltaError(f"corrupt delta: not a zstd frame ({error})") from None
    if declared != header.size:
        raise DeltaError(f"corrupt delta: its zstd frame holds {declared} bytes, not the parent's {header.size}")
    try:
        # One frame, bounded by the parent's size (checked above); what follows it is refused.
        decompressor = zstandard.ZstdDecompressor().decompressobj()
        planes = decompressor.decompress(body)
        trailing = decompressor.unused_data
        done = decompressor.eof
    except zstandard.ZstdError as error:
        raise DeltaError(f"corrupt delta: {error}") from None
    if len(planes) != header.size or not done or trailing:
        raise DeltaError("corrupt or truncated delta: its zstd frame does not end where the delta does")
    xor = _unplanes(np.frombuffer(planes, np.uint8), header.regions)
    del planes
    np.bitwise_xor(xor, np.frombuffer(parent, np.uint8), out=xor)
    target = xor.tobytes()
    del xor
    if hashlib.sha256(target).digest() != header.target:
        raise DeltaError("the rebuilt weights do not hash to the delta's target (corrupt bytes)")
    return target


# -- the receiver's path (specs/network.md §6.1) ---------------------------------------------------


async def fetch_weights(blobs: Blobs, announcement: PolicyAnnouncement, max_size: int,
                        run: Run, log: structlog.BoundLogger) -> bytes:
    """The weights file of ``announcement``, hash-checked against its ``blob``: rebuilt from its
    delta when it names one and this node holds the delta's parent file, else (and on any failure
    of the delta: unavailable, truncated, against another parent, corrupt, rebuilding to another
    hash) fetched whole, with the reason logged. ``run(name, fn, *args)`` runs the rebuild off the
    event loop (the node's model thread)."""
    what = f"weights of version {announcement.version}"
    parent_path = blobs.directory / announcement.delta_parent.hex()
    if announcement.delta and not (blobs.directory / announcement.blob.hex()).exists() and parent_path.exists():
        try:
            delta = await blobs.get(announcement.delta, min(announcement.delta_size, max_size),
                                    f"weights delta of version {announcement.version}")
            blob = await run("rebuild", rebuild, parent_path.read_bytes(), delta)
            if hashlib.sha256(blob).digest() != announcement.blob:
                raise DeltaError("the delta rebuilds a file other than the announced one")
        except Exception as error:  # whatever failed, the full file is the way: the delta is an optimization
            log.warning("weights delta not used; fetching the full file", version=announcement.version,
                        reason=str(error) or repr(error))
        else:
            blobs.keep(blob)
            log.info("weights rebuilt from a delta", version=announcement.version, delta_bytes=len(delta),
                     full_bytes=len(blob))
            return blob
    return await blobs.get(announcement.blob, max_size, what)
