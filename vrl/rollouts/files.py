"""Rollout files (specs/record.md, section 4): a header, then one framed record after another.

``file   = "VRLROLL" 0x01 frame*``
``frame  = "VRLR" u32be(length) u32be(crc32(payload)) payload``

Frames make a damaged file recoverable: a stretch of bytes that holds no intact frame is
reported once, as a :class:`DamagedRange` with its byte offsets, and the reader resynchronises
on the next frame marker whose frame checks out, so every intact record is still read (unless
someone hides it behind 16 or more overlapping forged headers: record.md §4). The
skipping is linear in the file and constant in memory, whatever the damage: a 256 KiB file of
repeated markers once cost ``vrl verify`` 54 s and 3 GB, one error per marker (issue 13).
Files are streamed: only one record is held in memory at a time. Writers append whole frames
and fsync, so a crash mid-write can cost at most the frame being written, never one already
written.
"""

from __future__ import annotations

import heapq
import mmap
import os
import struct
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from vrl.errors import VrlError
from vrl.rollouts.record import MAX_RECORD_BYTES, RecordError, RecordFault, Rollout

TRUNCATED, CORRUPT, OVERSIZED = RecordFault.TRUNCATED, RecordFault.CORRUPT, RecordFault.OVERSIZED

FILE_MAGIC = b"VRLROLL\x01"
FRAME_MAGIC = b"VRLR"
_FRAME_HEADER = struct.Struct(">4sII")


#: Failed checksums that may cover one byte (specs/record.md section 4). A reader checksums each
#: candidate frame it meets while skipping damage, and a hostile file can make every candidate
#: claim a payload that runs over all the later ones: without a bound that is quadratic work
#: (a 256 KiB file of such headers took 23 s, bench/hostile_files.py crc-storm). With it, each
#: byte is checksummed at most 17 times (16 failed frames plus the one intact frame, since
#: intact frames never overlap): about 12 ns per byte at zlib's 1.4 GB/s measured here. Honest
#: damage overlaps far fewer: a torn last frame is one, each flipped length field one more.
MAX_OVERLAPPING_CHECKS = 16


class RolloutFileError(VrlError):
    """The file as a whole is unusable: missing, unreadable, or not a rollout file."""


class DamagedRange(RecordError):
    """Bytes ``[start, end)`` of a rollout file that hold no intact frame, reported once.

    ``kind`` is what was wrong at ``start`` (truncated, oversized or corrupt), and ``problem``
    says so and names the range."""

    def __init__(self, first: tuple[RecordFault, str], start: int, end: int, index: int | None = None) -> None:
        super().__init__("", f"{first[1]}; skipped bytes {start} to {end} ({end - start} bytes)", index, first[0])
        self.first, self.start, self.end = first, start, end

    def at(self, index: int) -> DamagedRange:
        return DamagedRange(self.first, self.start, self.end, index)


def iter_records(path: str | Path) -> Iterator[Rollout | RecordError]:
    """Yield each record in order: a :class:`Rollout`, or a :class:`RecordError` naming it (a
    record that does not decode, or a :class:`DamagedRange` of bytes with no intact frame).

    Raises :class:`RolloutFileError` only when the file itself cannot be used.
    """
    try:
        handle = open(path, "rb")
    except OSError as error:
        raise RolloutFileError(f"{path}: {error.strerror}") from error
    with handle:
        size = os.fstat(handle.fileno()).st_size
        if size < len(FILE_MAGIC) or handle.read(len(FILE_MAGIC)) != FILE_MAGIC:
            raise RolloutFileError(f"{path}: not a vrl rollout file (bad or missing header)")
        if size == len(FILE_MAGIC):
            return
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            yield from _frames(data, size)


def records_from_bytes(data: bytes, name: str = "<bytes>") -> Iterator[Rollout | RecordError]:
    """:func:`iter_records` over the bytes of a whole rollout file held in memory."""
    if len(data) < len(FILE_MAGIC) or data[: len(FILE_MAGIC)] != FILE_MAGIC:
        raise RolloutFileError(f"{name}: not a vrl rollout file (bad or missing header)")
    yield from _frames(data, len(data))


def _frames(data: bytes | mmap.mmap, size: int) -> Iterator[Rollout | RecordError]:
    """The frame loop of specs/record.md section 4: in step, one frame after the other; after a
    frame that fails, resynchronising on the next marker whose frame checks out. The bytes in
    between are one :class:`DamagedRange`, however many markers they hold."""
    offset, index = len(FILE_MAGIC), 0
    damaged: tuple[int, tuple[RecordFault, str]] | None = None  # (start, first problem) of the range skipped
    failed_ends: list[int] = []  # min-heap: where the failed checksummed frames end
    with memoryview(data) as view:
        while offset < size:
            if damaged is not None:
                offset = data.find(FRAME_MAGIC, offset)
                if offset < 0:
                    break
            problem, stop = None, False
            body = offset + _FRAME_HEADER.size
            if size - offset < _FRAME_HEADER.size:
                problem = (TRUNCATED, f"truncated: {size - offset} trailing bytes, not a whole frame header")
                stop = True
            else:
                magic, length, crc = _FRAME_HEADER.unpack_from(data, offset)
                if magic != FRAME_MAGIC:
                    problem = (CORRUPT, "corrupt: no frame marker where a record should start")
                elif length > MAX_RECORD_BYTES:
                    problem = (OVERSIZED, f"oversized: {length} bytes exceeds the {MAX_RECORD_BYTES}-byte limit")
                elif body + length > size:
                    if data.find(FRAME_MAGIC, offset + 1) < 0:
                        problem, stop = (TRUNCATED, f"truncated: expected {length} bytes, file has {size - body}"), True
                    else:
                        problem = (CORRUPT, "corrupt: frame length runs past the end of the file")
                else:
                    while failed_ends and failed_ends[0] <= offset:
                        heapq.heappop(failed_ends)
                    if len(failed_ends) >= MAX_OVERLAPPING_CHECKS:
                        problem = (CORRUPT,
                                   f"corrupt: not checksummed, {MAX_OVERLAPPING_CHECKS} failed frames overlap it")
                    elif zlib.crc32(view[body : body + length]) != crc:
                        problem = (CORRUPT, "corrupt: checksum mismatch")
                        heapq.heappush(failed_ends, body + length)
            if problem is not None:
                if damaged is None:
                    damaged = (offset, problem)
                if stop:
                    break
                offset += 1
                continue
            if damaged is not None:
                yield DamagedRange(damaged[1], damaged[0], offset, index)
                index, damaged = index + 1, None
            try:
                yield Rollout.from_bytes(data[body : body + length])
            except RecordError as error:
                yield error.at(index)
            index, offset = index + 1, body + length
    if damaged is not None:
        yield DamagedRange(damaged[1], damaged[0], size, index)


def read_rollouts(path: str | Path) -> Iterator[Rollout]:
    """Stream the rollouts of a file, raising the first :class:`RecordError`."""
    for item in iter_records(path):
        if isinstance(item, RecordError):
            raise item
        yield item


def frame(rollout: Rollout) -> bytes:
    payload = rollout.to_bytes()
    return _FRAME_HEADER.pack(FRAME_MAGIC, len(payload), zlib.crc32(payload)) + payload


class RolloutWriter:
    """Appends rollouts to a file, each frame written whole and fsynced on :meth:`flush`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._handle = open(self.path, "ab")
        if self._handle.tell() == 0:
            self._handle.write(FILE_MAGIC)
            self.flush()

    def write(self, rollout: Rollout) -> None:
        self._handle.write(frame(rollout))

    def flush(self) -> None:
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        if not self._handle.closed:
            self.flush()
            self._handle.close()

    def __enter__(self) -> RolloutWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_rollouts(path: str | Path, rollouts: Iterable[Rollout]) -> int:
    """Write a complete file atomically (temp file, fsync, rename); returns the count.

    An existing file at ``path`` is replaced only once the new one is complete on disk.
    """
    count = 0
    with replaced_atomically(path) as temporary:
        with RolloutWriter(temporary) as writer:
            for rollout in rollouts:
                writer.write(rollout)
                count += 1
    return count


@contextmanager
def replaced_atomically(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path``: write it in the block; when the block succeeds it is
    renamed over ``path`` and the directory fsynced, so readers see the old file or the whole
    new one, never a part."""
    target = Path(path)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        yield temporary
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)
    fsync(target.parent)


def fsync(path: str | Path) -> None:
    """Make ``path`` durable; for a folder, the names created, renamed or removed in it (a crash
    after this cannot bring a removed name back, nor lose a renamed one)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` all or nothing (see :func:`replaced_atomically`)."""
    with replaced_atomically(path) as temporary:
        with open(temporary, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
