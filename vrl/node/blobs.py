"""The files a node keeps by content hash (weights, optimizer states, step configs, reward
proofs): in its blob directory, served to peers, and fetched from them when missing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import structlog

from p2p.blobs import BlobStore, fetch_blob
from p2p.transport import Transport
from vrl.rollouts.files import write_bytes_atomic

MAX_WEIGHTS_BYTES = 2 << 30
# An optimizer state file is AdamW's two moments: twice the weights, plus a step count each.
MAX_OPTIMIZER_BYTES = 2 * MAX_WEIGHTS_BYTES + (64 << 20)


class Blobs:
    """The blob directory ``directory``, each file named by its SHA-256, served on ``transport``;
    ``trainer`` (the node id whose announcements name most blobs) is asked first."""

    def __init__(self, directory: Path, transport: Transport, trainer: bytes, log: structlog.BoundLogger) -> None:
        self.directory, self.transport, self.trainer, self.log = directory, transport, trainer, log
        self.directory.mkdir(parents=True, exist_ok=True)
        self.served = BlobStore(transport)

    def serve_stored(self) -> None:
        """Serve every blob the directory holds (at start)."""
        for path in self.directory.iterdir():
            if len(path.name) == 64:
                self.served.put(path.read_bytes())

    def serve_if_stored(self, digest: bytes) -> None:
        path = self.directory / digest.hex()
        if path.exists():
            self.served.put(path.read_bytes())

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
            write_bytes_atomic(path, blob)
        self.served.put(blob)
        return blob

    def keep(self, blob: bytes) -> bytes:
        """Store a blob this node made (weights, optimizer state, step config) and serve it."""
        digest = hashlib.sha256(blob).digest()
        write_bytes_atomic(self.directory / digest.hex(), blob)
        self.served.put(blob)
        return digest
