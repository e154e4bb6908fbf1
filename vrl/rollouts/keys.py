"""Node keys: Ed25519 through pyca/cryptography. A node's id is its raw 32-byte public key."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from vrl.errors import VrlError

NODE_ID_BYTES = 32
SIGNATURE_BYTES = 64


class KeyFileError(VrlError):
    """A key file that cannot be read as an Ed25519 private key."""


@dataclass(frozen=True, eq=False)
class NodeKey:
    """An Ed25519 signing key. Immutable; the private bytes never appear in ``repr``."""

    _private: Ed25519PrivateKey = field(repr=False)

    @classmethod
    def generate(cls) -> NodeKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> NodeKey:
        """Deterministic key from 32 seed bytes (tests, devnets); never for real nodes."""
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    @classmethod
    def load(cls, path: str | Path) -> NodeKey:
        try:
            key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as error:
            raise KeyFileError(f"{path}: not a readable key file: {error}") from error
        if not isinstance(key, Ed25519PrivateKey):
            raise KeyFileError(f"{path}: not an Ed25519 key")
        return cls(key)

    def save(self, path: str | Path) -> None:
        """Write PKCS#8 PEM, readable by the owner only; refuses to overwrite a key
        (FileExistsError). Written whole or not at all: a temporary file beside it, synced,
        then linked into place, which fails rather than replace a key written meanwhile."""
        pem = self._private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        path = Path(path)
        if path.exists():
            raise FileExistsError(errno.EEXIST, "a key is never overwritten", str(path))
        write_new_private(path, pem)

    @cached_property  # read for every record signed; the key never changes
    def node_id(self) -> bytes:
        return self._private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def private_seed(self) -> bytes:
        """The raw 32-byte private key, for the network identity (libp2p uses the same Ed25519
        key, so the peer that sends a record is the key that signed it). Handle as a secret."""
        return self._private.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                           serialization.NoEncryption())

    def sign(self, message: bytes) -> bytes:
        return self._private.sign(message)


def signature_valid(node_id: bytes, message: bytes, signature: bytes) -> bool:
    """Ed25519 verification (constant-time inside the library); False on any malformed input."""
    if len(node_id) != NODE_ID_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(node_id).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


def write_new_private(path: Path, data: bytes) -> None:
    """Write a secret (a node key, an answer key) as a new file, readable by its owner only from
    its first byte, whole or not at all: a temporary file beside it, synced, then linked into
    place, which raises FileExistsError rather than replace a file that exists."""
    staging = path.with_name(f".{path.name}.{os.getpid()}.partial")
    descriptor = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.link(staging, path)
    finally:
        staging.unlink(missing_ok=True)
