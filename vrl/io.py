"""Rollout files (specs/record.md, section 4): a header, then one framed record after another.

``file   = "VRLROLL" 0x01 frame*``
``frame  = "VRLR" u32be(length) u32be(crc32(payload)) payload``

Frames make a damaged file recoverable: a record whose frame is truncated, oversized or
corrupt is reported (by index and reason) and the reader resynchronises on the next frame
marker, so every intact record is still read. Files are streamed: only one record is held in
memory at a time. Writers append whole frames and fsync, so a crash mid-write can cost at most
the frame being written, never one already written.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from vrl.rollout import MAX_RECORD_BYTES, RecordError, Rollout

FILE_MAGIC = b"VRLROLL\x01"
FRAME_MAGIC = b"VRLR"
_FRAME_HEADER = struct.Struct(">4sII")


class RolloutFileError(Exception):
    """The file as a whole is unusable: missing, unreadable, or not a rollout file."""


def iter_records(path: str | Path) -> Iterator[Rollout | RecordError]:
    """Yield each record in order: a :class:`Rollout`, or a :class:`RecordError` naming it.

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


def _frames(data: mmap.mmap, size: int) -> Iterator[Rollout | RecordError]:
    offset, index = len(FILE_MAGIC), 0
    while offset < size:
        if size - offset < _FRAME_HEADER.size:
            yield RecordError("", f"truncated: {size - offset} trailing bytes, not a whole frame header", index)
            return
        magic, length, crc = _FRAME_HEADER.unpack_from(data, offset)
        body = offset + _FRAME_HEADER.size
        problem = None
        if magic != FRAME_MAGIC:
            problem = "corrupt: no frame marker where a record should start"
        elif length > MAX_RECORD_BYTES:
            problem = f"oversized: {length} bytes exceeds the {MAX_RECORD_BYTES}-byte limit"
        elif body + length > size:
            if data.find(FRAME_MAGIC, offset + 1) < 0:
                yield RecordError("", f"truncated: expected {length} bytes, file has {size - body}", index)
                return
            problem = "corrupt: frame length runs past the end of the file"
        elif zlib.crc32(data[body : body + length]) != crc:
            problem = "corrupt: checksum mismatch"
        if problem is None:
            try:
                yield Rollout.from_bytes(data[body : body + length])
            except RecordError as error:
                yield error.at(index)
            offset = body + length
        else:
            yield RecordError("", problem, index)
            next_frame = data.find(FRAME_MAGIC, offset + 1)
            offset = size if next_frame < 0 else next_frame
        index += 1


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
    directory = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` all or nothing (see :func:`replaced_atomically`)."""
    with replaced_atomically(path) as temporary:
        with open(temporary, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
