"""What a verdict's outcome is and what it counts for, the rules the protocol and both
verification designs read alike (specs/network.md §3.2, specs/verification.md §7)."""

from __future__ import annotations

from vrl.node.committee import Draw
from vrl.node.messages import Outcome, SignedVerdict, ticket_selected
from vrl.rollouts.verify import Reason

# Rejection codes that honest numerical drift can produce just over a threshold: soft fails
# (specs/network.md §3.2). A behaviour logprob off by more than the tolerance changes no token,
# reward or commitment: it only skews GRPO's importance ratio, which is truncated (GRPOConfig
# is_cap). Every other rejection is a record that is not what the claimed model sampled.
SOFT_REASONS = frozenset({Reason.LOGPROB_MISMATCH})


def drawn(verdict: SignedVerdict) -> bool:
    """Whether the verifier's own draw chose this check: its ticket at the rate it states, or
    its committee seat (a claim checked on acceptance, specs/committee.md §4): a check no one
    else's report chose, whose race evidence its sequential test may count."""
    if verdict.draw == Draw.COMMITTEE:
        return verdict.checked
    return verdict.draw == Draw.TICKET and verdict.checked and ticket_selected(verdict.ticket, verdict.rate)


def supersedes(outcome: str, earlier: SignedVerdict) -> bool:
    """One verdict per verifier and group, except that a check replaces the verifier's own
    skip: a failure others reported made it check after all (specs/network.md §3.2)."""
    return not earlier.checked and outcome != Outcome.SKIPPED


def outcome_of(failed_reasons: tuple[str, ...]) -> Outcome:
    if not failed_reasons:
        return Outcome.PASS
    return Outcome.SOFT_FAIL if set(failed_reasons) <= SOFT_REASONS else Outcome.HARD_FAIL
