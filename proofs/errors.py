"""Specific exception types of the proof systems. Verification outcomes are data (scores),
never exceptions: these are raised only for inputs that cannot be interpreted at all."""


class ProofsError(Exception):
    """Base class of every error raised by :mod:`proofs`."""


class InvalidParameters(ProofsError, ValueError):
    """A parameter is out of its specified range; ``field`` names it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class MalformedCommitment(ProofsError, ValueError):
    """Commitment bytes that do not parse under the specified layout."""


class UndefinedRace(ProofsError, ArithmeticError):
    """A seeded race that float64 cannot compute for these parameters and logits: some
    ``z / T`` is not finite (specs/sampler.md section 1), so scores, margins and logprobs would
    be infinite or NaN. Raised instead of returning a NaN, which compares false with every
    tolerance and so would pass any check."""
