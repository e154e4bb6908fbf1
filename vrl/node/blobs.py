"""The files a node keeps by content hash (weights, optimizer states, step configs, reward
proofs): in its blob directory, served to peers from there, and fetched from them when
missing. Which of them a node keeps, and the prune of the rest, is its storage tier's
(:mod:`vrl.node.storage`); a duty that will read blobs pins them (:meth:`Blobs.pinned`) so
that no prune removes them meanwhile."""

from __future__ import annotations

import contextlib
import hashlib
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

import structlog

from p2p.blobs import BlobStore, fetch_blob
from p2p.transport import Transport
from vrl.errors import VrlError
from vrl.rollouts.files import write_bytes_atomic

MAX_WEIGHTS_BYTES = 2 << 30
# An optimizer state file is AdamW's two moments: twice the weights, plus a step count each.
MAX_OPTIMIZER_BYTES = 2 * MAX_WEIGHTS_BYTES + (64 << 20)


class BlobWriteError(VrlError):
    """A blob could not be written (a full disk, a read-only folder): the message names the
    file and the reason. Nothing was replaced: the write goes to a temporary file that is
    removed, so the folder holds what it held before (specs/storage.md §5)."""


def _write(path: Path, blob: bytes, what: str) -> None:
    try:
        write_bytes_atomic(path, blob)
    except OSError as error:
        raise BlobWriteError(f"{path}: cannot store {what} ({len(blob)} bytes): {error.strerror or error}; "
                             "nothing was replaced, and the blobs already there are as they were") from None


class Blobs:
    """The blob directory ``directory``, each file named by its SHA-256, served on ``transport``;
    ``trainer`` (the node id whose announcements name most blobs) is asked first."""

    def __init__(self, directory: Path, transport: Transport, trainer: bytes, log: structlog.BoundLogger) -> None:
        self.directory, self.transport, self.trainer, self.log = directory, transport, trainer, log
        self.directory.mkdir(parents=True, exist_ok=True)
        # Served from the directory as it is at each request: a pruned blob is not here.
        self.served = BlobStore(transport, files=self.path_of)
        self.pins: Counter[bytes] = Counter()  # digest -> duties in flight that will read it

    def path_of(self, digest: bytes) -> Path | None:
        path = self.directory / digest.hex()
        return path if path.is_file() else None

    @contextlib.contextmanager
    def pinned(self, digests: Iterable[bytes]) -> Iterator[None]:
        """No prune removes these blobs while the block runs (vrl.node.storage.Pruner)."""
        held = [d for d in set(digests) if d]
        self.pins.update(held)
        try:
            yield
        finally:
            self.pins.subtract(held)
            for digest in held:
                if self.pins[digest] <= 0:
                    del self.pins[digest]

    async def get(self, digest: bytes, max_size: int, what: str) -> bytes:
        """A blob by its SHA-256: from this node's blob directory, else fetched from peers
        (the trainer first), hash-checked, stored and served onward. Raises on failure."""
        path = self.directory / digest.hex()
        blob = path.read_bytes() if path.exists() else None
        if blob is not None and hashlib.sha256(blob).digest() != digest:
            # Damaged on disk (bit rot, a hand edit): fetch it again rather than fail forever.
            self.log.warning("stored blob does not match its hash; fetching again", what=what)
            path.unlink()
            blob = None
        if blob is None:
            peers = sorted(self.transport.peers(), key=lambda p: p != self.trainer)
            blob = await fetch_blob(self.transport, peers, digest, max_size=max_size, timeout=60.0)
            _write(path, blob, what)
        return blob

    def keep(self, blob: bytes) -> bytes:
        """Store a blob this node made (weights, optimizer state, step config) and serve it.
        Raises :class:`BlobWriteError`, naming the file, when it cannot be written."""
        digest = hashlib.sha256(blob).digest()
        _write(self.directory / digest.hex(), blob, "a blob")
        return digest
