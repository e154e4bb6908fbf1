"""What a rollout was sampled with (specs/sampler.md §1): the parameters every record signs,
checked at the boundary. Apart from the sampler (:mod:`proofs.sampler`, which needs torch),
so that decoding a record or a config costs no tensor library."""

from __future__ import annotations

import math
from dataclasses import dataclass

from proofs.errors import InvalidParameters


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """What a rollout was sampled with; all of it is signed into the record."""

    temperature: float = 1.0
    top_k: int = 0  # 0 = no top-k mask
    top_p: float = 1.0  # 1.0 = no nucleus mask
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        # Types first: a record decoder or a config file hands over whatever it read, and a
        # string or a bool must end here as InvalidParameters, not as a TypeError further on.
        if not (_real(self.temperature) and 0.0 <= self.temperature <= 100.0):
            raise InvalidParameters("sampling.temperature", "must be finite and in [0, 100]")
        if not (_integer(self.top_k) and 0 <= self.top_k <= 1 << 24):
            raise InvalidParameters("sampling.top_k", "must be an integer in [0, 2^24]")
        if not (_real(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise InvalidParameters("sampling.top_p", "must be in (0, 1]")
        if not (_integer(self.max_new_tokens) and 1 <= self.max_new_tokens <= 1 << 20):
            raise InvalidParameters("sampling.max_new_tokens", "must be an integer in [1, 2^20]")
        if not (isinstance(self.stop_token_ids, tuple)
                and all(_integer(t) and 0 <= t < 1 << 32 for t in self.stop_token_ids)):
            raise InvalidParameters("sampling.stop_token_ids", "must be a tuple of u32 token ids")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _real(value: object) -> bool:
    """A finite int or float (what msgpack and TOML produce); an int too large for a float is
    then out of range, not an OverflowError."""
    if _integer(value):
        return True
    return isinstance(value, float) and math.isfinite(value)
