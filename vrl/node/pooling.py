"""The pooled sequential test (specs/verification.md §7.1): one test per producer over the race
evidence of every committee member's drawn check of its groups, each loss confirmed by a
pre-trusted check of the same group.

Why. Each verifier's own test (vrl.rollouts.sequential, verification.md §7) sees only the
groups *it* checked. In the committee design that is ``k / N_v`` of a producer's groups, so its
evidence per producer shrinks as the network grows, and a decode spoof that loses a few races
per thousand tokens was never convicted in 12 simulated rounds at N = 100
(bench/results/simulate-adversaries-committee.json, before this rule). The draws are VRF
outputs no one chose (specs/committee.md §2), so the members' evidence may be added up, as long
as no single liar can add to it.

The rule, for a producer ``P``, over a view's reports (all pure functions of the reports, as
the rest of reputation, so an auditor recomputes the same conviction):

* ``G(P)``: ``P``'s groups with a committee-drawn check (``Report.drawn``) by a reporter of
  weight > 0. Which groups enter depends on draws, not on what the groups hold.
* ``n_g``: the race tokens of a pre-trusted reporter's check of ``g`` when there is one, else
  the largest any drawn reporter of weight > 0 states. A receiver refuses a verdict stating
  more races than the group has completion tokens (NodeProtocol.matches_group), so no
  statement is larger than the group; only a committee whose every member lies can state
  fewer: the escape event of committee.md §5.
* ``l_g``: with two or more pre-trusted checks of ``g`` (of any draw), the fewest races lost any
  of them states; with one, the smaller of its count and the most any other drawn reporter of
  weight > 0 states; with none, 0. A loss counts only when two distinct reporters state it,
  one of them pre-trusted: reputation item 3's rule, per loss. Reporters the log convicted of a
  check not made (reputation item 4) count for nothing. The trainer checks every group a
  member states a lost race on (vrl.node.rounds.committee_checks), so a spoofer's losses get
  their confirmation; a statement of losses no pre-trusted check found costs its reporter a
  soft fail, and, on a bit-exact platform the trainer shares, race counts that differ from the
  trainer's are a check not made (reputation item 4).
* ``q0``: the largest honest loss rate of the pre-trusted checks' platforms
  (vrl.rollouts.profiles.profile_of_platform): the losses counted are theirs.
* ``P`` is convicted when ``ln E(sum n_g, sum l_g) >= ln(1/alpha)``, the e-value of
  vrl.rollouts.sequential with ``alpha = ALPHA``.

Why an honest producer is convicted with probability at most ``alpha``: ``E`` grows with the
losses and falls with the tokens. Every ``l_g`` is at most the count of the first pre-trusted
checker of ``g`` in a fixed order (by node id), and every ``n_g`` at least the races ``g``'s
checks replay (the escape event aside), so the pooled value never exceeds that of a test over
all of ``G(P)``, a set chosen by no one, whose every count is one honest pre-trusted check's;
Ville's inequality bounds that one by ``alpha`` (verification.md §7). It assumes ``q0`` bounds
the honest loss rate of the producer's device as the checker sees it (a producer on another
device kind than its profile's ``same`` can lose more: verification.md §6).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from vrl.rollouts.profiles import profile_of_platform
from vrl.rollouts.sequential import ALPHA, log_e_value, threshold


class Report(Protocol):
    """What the test reads of a report (vrl.node.reputation.Report, which imports this module)."""

    @property
    def reporter(self) -> bytes: ...

    @property
    def subject(self) -> bytes: ...

    @property
    def group(self) -> bytes: ...

    @property
    def platform(self) -> str: ...

    @property
    def race_tokens(self) -> int: ...

    @property
    def races_lost(self) -> int: ...

    @property
    def drawn(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Pooled:
    """One producer's pooled evidence: ``tokens`` and confirmed ``lost`` over its groups, and the
    honest rate ``q0`` they are tested against (0.0 while no pre-trusted check is among them)."""

    tokens: int
    lost: int
    q0: float

    @property
    def log_e(self) -> float:
        return log_e_value(self.tokens, self.lost, self.q0) if self.q0 > 0 else 0.0

    def rejected(self, alpha: float = ALPHA) -> bool:
        return self.lost > 0 and self.log_e >= threshold(alpha)


class _Group:
    """What the reports on one group say, for the pooled test."""

    __slots__ = ("subject", "drawn", "anchor_tokens", "member_tokens", "anchors", "m", "q0")

    def __init__(self, subject: bytes) -> None:
        self.subject = subject
        self.drawn = False
        self.anchor_tokens = self.member_tokens = -1
        self.anchors: dict[bytes, int] = {}  # pre-trusted reporter -> the most races lost it states
        self.m = 0  # the most any other drawn reporter of weight states
        self.q0 = 0.0

    def lost(self) -> int:
        """Two pre-trusted checks: the fewer they agree on. One: no more than a member states too."""
        if len(self.anchors) >= 2:
            return min(self.anchors.values())
        if self.anchors:
            return min(next(iter(self.anchors.values())), self.m)
        return 0


@lru_cache(maxsize=64)  # only pre-trusted reporters' platforms reach it; a few in any network
def _honest_rate(platform: str) -> float:
    return profile_of_platform(platform).race_loss_rate


def pooled_evidence(reports: Sequence[Report], pretrusted: frozenset[bytes], weight: Mapping[bytes, float],
                    excluded: frozenset[bytes] | set[bytes] = frozenset()) -> dict[bytes, Pooled]:
    """Each producer's pooled evidence, for the producers some report states a lost race of
    (the others' ``l`` is 0 and their test cannot reject: they cost one pass over the reports).
    ``excluded``: reporters the log convicted of a check not made (reputation item 4), whose
    statements count for nothing, whatever weight they keep."""
    stated = {r.subject for r in reports if r.races_lost and r.reporter}
    groups: dict[bytes, _Group] = {}
    for r in reports:
        if r.subject not in stated or not r.reporter or r.reporter in excluded:
            continue
        anchor = r.reporter in pretrusted
        counted = r.drawn and weight.get(r.reporter, 0.0) > 0
        if not (anchor or counted):
            continue
        g = groups.get(r.group)
        if g is None:
            g = groups[r.group] = _Group(r.subject)
        g.drawn = g.drawn or counted
        if anchor:
            g.anchor_tokens = max(g.anchor_tokens, r.race_tokens)
            g.anchors[r.reporter] = max(g.anchors.get(r.reporter, 0), r.races_lost)
            g.q0 = max(g.q0, _honest_rate(r.platform))
        else:
            g.member_tokens = max(g.member_tokens, r.race_tokens)
            g.m = max(g.m, r.races_lost)
    totals: dict[bytes, tuple[int, int, float]] = {}  # (tokens, lost, q0) by producer
    for g in groups.values():
        if not g.drawn:
            continue  # only re-checks reached it: someone chose it, perhaps for its losses
        tokens = max(g.anchor_tokens if g.anchor_tokens >= 0 else g.member_tokens, 0)
        so_far, lost, q0 = totals.get(g.subject, (0, 0, 0.0))
        totals[g.subject] = (so_far + tokens, lost + min(g.lost(), tokens), max(q0, g.q0))
    return {subject: Pooled(*total) for subject, total in totals.items()}


def pooled_convictions(reports: Sequence[Report], pretrusted: frozenset[bytes], weight: Mapping[bytes, float],
                       excluded: frozenset[bytes] | set[bytes] = frozenset(), alpha: float = ALPHA) -> set[bytes]:
    """The producers whose pooled test rejected their sampling (the module's rule)."""
    return {subject for subject, pooled in pooled_evidence(reports, pretrusted, weight, excluded).items()
            if pooled.rejected(alpha)}
