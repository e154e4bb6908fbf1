"""The stateless noise source of the canonical sampler (specs/sampler.md, section 2).

Every uniform draw is a pure function of ``(sample_seed, position, token_id)``: no generator
state, so the noise does not depend on batch composition, device, thread count or the order in
which positions are visited. A verifier regenerates exactly the prover's noise for any single
position of any single rollout.

Construction:

* per position, a 256-bit key ``K = SHA-256(b"vrl/gumbel/v1" || sample_seed || u32be(position))``;
* the ChaCha20 keystream of RFC 8439 under ``K``, all-zero 96-bit nonce, block counter from 0,
  read as little-endian u64 words: token ``t`` gets word ``t``;
* a word ``x`` becomes ``u = ((x >> 12) + 0.5) * 2**-52``, exactly representable in float64 and
  strictly inside (0, 1) (a 53-bit shift would round its top value to 1.0), and the Gumbel
  noise is ``g = -log(-log(u))`` in float64.

ChaCha20 is a standard PRF with test vectors in the RFC and implementations everywhere, and
through ``cryptography`` it produces the 256 KB a 32k vocabulary needs in about 0.1 ms. Because
``u`` is at most ``1 - 2**-53``, the noise is bounded: ``g <= GUMBEL_MAX``; the sampler uses
that bound to skip the logarithms of tokens that cannot win.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

DOMAIN_GUMBEL = b"vrl/gumbel/v1"
SEED_BYTES = 32
_U52_SCALE = 2.0**-52
_NONCE = bytes(16)  # cryptography's ChaCha20 nonce: u32le block counter (0) then the 96-bit nonce (0)
#: The largest noise any token can draw: u <= 1 - 2**-53.
GUMBEL_MAX = -math.log(-math.log1p(-(2.0**-53)))


def position_key(sample_seed: bytes, position: int) -> bytes:
    """The ChaCha20 key for one sampled position."""
    if len(sample_seed) != SEED_BYTES:
        raise ValueError(f"sample_seed must be {SEED_BYTES} bytes, got {len(sample_seed)}")
    if not 0 <= position < 1 << 32:
        raise ValueError(f"position out of range: {position}")
    return hashlib.sha256(DOMAIN_GUMBEL + sample_seed + position.to_bytes(4, "big")).digest()


def keystream_words(key: bytes, count: int) -> npt.NDArray[np.uint64]:
    """The first ``count`` little-endian u64 words of the RFC 8439 ChaCha20 keystream under
    ``key`` with an all-zero nonce and the block counter starting at 0."""
    encryptor = Cipher(algorithms.ChaCha20(key, _NONCE), mode=None).encryptor()
    return np.frombuffer(encryptor.update(bytes(8 * count)), dtype="<u8")


def raw_words(sample_seed: bytes, position: int, count: int) -> npt.NDArray[np.uint64]:
    """The first ``count`` 64-bit noise words for one position (one word per token id)."""
    return keystream_words(position_key(sample_seed, position), count)


def to_uniform(words: npt.NDArray[np.uint64]) -> npt.NDArray[np.float64]:
    return ((words >> np.uint64(12)).astype(np.float64) + 0.5) * _U52_SCALE


def to_gumbel(words: npt.NDArray[np.uint64]) -> npt.NDArray[np.float64]:
    noise: npt.NDArray[np.float64] = -np.log(-np.log(to_uniform(words)))  # numpy types a ufunc's result Any
    return noise


def gumbel(sample_seed: bytes, position: int, count: int) -> npt.NDArray[np.float64]:
    """Standard Gumbel noise in float64 for token ids ``0 .. count-1`` at one position."""
    return to_gumbel(raw_words(sample_seed, position, count))
