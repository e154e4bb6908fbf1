"""The stateless noise source of the canonical sampler (specs/sampler.md, section 2).

Every uniform draw is a pure function of ``(sample_seed, position, token_id)``: no generator
state, so the noise does not depend on batch composition, device, thread count or the order in
which positions are visited. A verifier regenerates exactly the prover's noise for any single
position of any single rollout.

Construction:

* per position, a 128-bit Philox key is ``SHA-256(b"vrl/gumbel/v1" || sample_seed ||
  u32be(position))[:16]``, read as two little-endian u64 words;
* Philox4x64-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) is run
  in counter mode, block ``j`` using counter ``(j, 0, 0, 0)``; its four output words are taken
  in order, so token ``t`` gets word ``t % 4`` of block ``t // 4``;
* a 64-bit word ``x`` becomes the uniform ``u = ((x >> 11) + 0.5) * 2**-53``, which lies
  strictly inside (0, 1), so the Gumbel transform below is always finite.

NumPy's ``Philox`` bit generator is this exact algorithm (checked against the Random123
known-answer vectors and against the pure-Python reference in ``tests/``); it advances its
counter before producing a block, so we start it at ``2**256 - 1`` to make block 0 use
counter 0.
"""

from __future__ import annotations

import hashlib

import numpy as np

DOMAIN_GUMBEL = b"vrl/gumbel/v1"
SEED_BYTES = 32
_COUNTER_BEFORE_BLOCK_0 = (1 << 256) - 1
_U53_SCALE = 2.0**-53


def position_key(sample_seed: bytes, position: int) -> tuple[int, int]:
    """The Philox key (k0, k1) for one sampled position."""
    if len(sample_seed) != SEED_BYTES:
        raise ValueError(f"sample_seed must be {SEED_BYTES} bytes, got {len(sample_seed)}")
    if not 0 <= position < 1 << 32:
        raise ValueError(f"position out of range: {position}")
    digest = hashlib.sha256(DOMAIN_GUMBEL + sample_seed + position.to_bytes(4, "big")).digest()
    return int.from_bytes(digest[0:8], "little"), int.from_bytes(digest[8:16], "little")


def raw_words(sample_seed: bytes, position: int, count: int) -> np.ndarray:
    """The first ``count`` 64-bit Philox words for one position (one word per token id)."""
    k0, k1 = position_key(sample_seed, position)
    generator = np.random.Philox(
        key=np.array([k0, k1], dtype=np.uint64), counter=_COUNTER_BEFORE_BLOCK_0
    )
    return generator.random_raw(count)


def uniforms(sample_seed: bytes, position: int, count: int) -> np.ndarray:
    """float64 uniforms in (0, 1) for token ids ``0 .. count-1`` at one position."""
    words = raw_words(sample_seed, position, count)
    return ((words >> np.uint64(11)).astype(np.float64) + 0.5) * _U53_SCALE


def gumbel(sample_seed: bytes, position: int, count: int) -> np.ndarray:
    """Standard Gumbel noise ``-log(-log(u))`` in float64 for token ids ``0 .. count-1``."""
    return -np.log(-np.log(uniforms(sample_seed, position, count)))


def gumbel_rows(sample_seed: bytes, positions: range | list[int], count: int) -> np.ndarray:
    """Noise for several positions of one rollout, shape ``(len(positions), count)``."""
    out = np.empty((len(positions), count), dtype=np.float64)
    for row, position in enumerate(positions):
        out[row] = gumbel(sample_seed, position, count)
    return out
