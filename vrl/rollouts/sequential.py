"""The per-producer sequential test on lost races (specs/verification.md §7).

One rollout cannot show a node that samples with slightly wrong numerics (int8 weights, a
1% weight change, a temperature a little off, a cheaper model's token kept when it almost
wins) and then commits and reports logprobs honestly: every token it claims either won its
seeded race under the verifier's recomputation, or lost it by less than honest drift can.
What such a node cannot hide is *how often* its tokens lose. An honest node's token loses
its race (margin > 0) only when numerical drift flips a near-tie, at a per-token rate the
calibration bounds by ``q0`` for its profile (:mod:`vrl.rollouts.profiles`); a deviating
sampler loses more often.

The test is a test martingale (an e-process, Ramdas et al. 2023, "Game-theoretic statistics
and safe anytime-valid inference" §3): the average, over a grid of alternative rates
``q_j = q0 * 2^j`` (j = 1 .. J, capped at 1/2), of the Bernoulli likelihood ratios

    E_j(n, k) = (q_j / q0)^k * ((1 - q_j) / (1 - q0))^(n - k)

after ``n`` tokens of which ``k`` lost their races. Under the honest hypothesis (each token
loses with probability at most ``q0``, whatever came before) every ``E_j`` and so their
average is a nonnegative supermartingale starting at 1, and Ville's inequality gives

    P(E ever reaches 1/alpha) <= alpha,

over any number of rollouts: the bound the honest-flag goal asks for holds for an unbounded
horizon, not only for 10,000 rollouts. Why this and not Wald's SPRT: Wald's test needs one
fixed alternative and two boundaries, and accepting "honest" would end the monitoring of a
node that keeps producing; the mixture keeps Ville's guarantee while adapting to whichever
loss rate the cheat has (a "mixture SPRT", Robbins 1970), at the price of ``ln J`` nats of
evidence (2.4 for the float32 profile's J = 11, 2.1 for bfloat16's J = 8).

The state is the pair of totals ``(n, k)``, which is also the evidence: any verifier that
re-verifies the same rollouts gets the same counts (bit for bit on a bit-exact profile) and
recomputes the same e-value from :func:`log_e_value`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: The honest-flag bound: P(an honest node is ever flagged) <= ALPHA (Ville's inequality),
#: the goal of issue 16 ("<= 1e-4 over a 10,000-rollout horizon").
ALPHA = 1e-4
#: The reason code of a verdict whose check took its producer's test to rejection
#: (specs/network.md §3.2): a finding about the node, not about that one group.
RACE_LOSSES = "race_losses"
#: The largest alternative loss rate on the grid: a sampler whose tokens lose half their races
#: is caught by one rollout's hard limits long before, so the grid need not go further.
MAX_ALTERNATIVE = 0.5


def alternatives(q0: float) -> tuple[float, ...]:
    """The grid ``q0 * 2^j``, j = 1, 2, ..., while below MAX_ALTERNATIVE, then MAX_ALTERNATIVE."""
    if not 0.0 < q0 < MAX_ALTERNATIVE:
        raise ValueError(f"the honest loss rate q0 must be in (0, {MAX_ALTERNATIVE}), got {q0!r}")
    grid, q = [], 2 * q0
    while q < MAX_ALTERNATIVE:
        grid.append(q)
        q *= 2
    grid.append(MAX_ALTERNATIVE)
    return tuple(grid)


def log_e_value(tokens: int, lost: int, q0: float) -> float:
    """ln of the mixture e-value after ``tokens`` replayed races of which ``lost`` were lost."""
    if not (isinstance(tokens, int) and isinstance(lost, int) and 0 <= lost <= tokens):
        raise ValueError(f"need integers 0 <= lost <= tokens, got lost={lost!r}, tokens={tokens!r}")
    grid = alternatives(q0)
    terms = [lost * math.log(q / q0) + (tokens - lost) * (math.log1p(-q) - math.log1p(-q0)) for q in grid]
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms)) - math.log(len(grid))


def threshold(alpha: float = ALPHA) -> float:
    """ln(1/alpha): the evidence at which a producer is flagged."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    return -math.log(alpha)


@dataclass(frozen=True, slots=True)
class RaceTest:
    """One verifier's test of one producer: the totals so far, and what they say.

    Immutable; :meth:`add` returns the next state. ``q0`` is the producer's profile's
    calibrated honest loss rate per token (its upper confidence bound)."""

    q0: float
    tokens: int = 0
    lost: int = 0
    alpha: float = ALPHA

    def __post_init__(self) -> None:
        alternatives(self.q0)  # a rate outside (0, MAX_ALTERNATIVE) is a ValueError here
        threshold(self.alpha)

    def add(self, tokens: int, lost: int) -> RaceTest:
        if not (isinstance(tokens, int) and isinstance(lost, int) and 0 <= lost <= tokens):
            raise ValueError(f"need integers 0 <= lost <= tokens, got lost={lost!r}, tokens={tokens!r}")
        return RaceTest(self.q0, self.tokens + tokens, self.lost + lost, self.alpha)

    @property
    def log_e(self) -> float:
        return log_e_value(self.tokens, self.lost, self.q0)

    @property
    def rejected(self) -> bool:
        """Whether the evidence reached ln(1/alpha): the producer is not sampling as claimed."""
        return self.log_e >= threshold(self.alpha)
