"""The trainer's budget of loss confirmations per committee member (specs/committee.md §8,
"Lost races"; specs/verification.md §7.1, "Getting the confirmations").

A member's committee-drawn verdict that states lost races brings the trainer's own check of the
group, so that the pooled test may count the losses both found (vrl.node.pooling). Each such
check is *charged* to one member whose claim asked for it; a charge is released once the
trainer's own verdict on the group states at least the races the member stated (a confirmed
claim: the check found what the member found, and an honest member's statement would have
asked for it too). A member's claims ask for a check only while its charges, open (the check
under way) or unconfirmed (the check found fewer losses), number fewer than the budget ``B``
(``ProtocolParams.loss_claim_budget``) over every round still kept (a charge is forgotten with
its round's manifest, ``max_staleness + 1`` rounds after that round). A charge is made about a
round after its group's round, so it lives about two rounds: a member costs the trainer at most
``B`` checks that find nothing it stated every second round (measured: 4 a liar a round at
``B = 8``, bench/results/simulate-liar-budget.json), however many seats it holds; past that, its
claims ask for nothing (they counted for nothing in the pool until confirmed anyway), and the
trainer still checks the group if another member's claim asks. The budget spanned one round
until measured: then a liar cost ``B`` a round, round after round (specs/committee.md §8).

A part of :class:`vrl.node.rounds.Rounds`, pure like it: no I/O, no clock. Its state is at most
``B`` digests per member, forgotten with their round (:meth:`LossClaims.forget`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from vrl.node.messages import SignedVerdict

#: The trainer's own verdict on a group, or None while it has none (the check is under way).
Own = Callable[[bytes], SignedVerdict | None]


class LossClaims:
    """Per member, per round still kept: the digests whose trainer check that member's claim
    asked for and that are not confirmed yet, each with the races lost the member stated."""

    def __init__(self) -> None:
        self._charged: dict[bytes, dict[int, dict[bytes, int]]] = {}

    def used(self, member: bytes, own: Own) -> int:
        """The member's open and unconfirmed charges over the rounds kept, releasing the
        confirmed ones."""
        by_version = self._charged.get(member)
        if not by_version:
            return 0
        for charged in by_version.values():
            for digest in [d for d, stated in charged.items() if (v := own(d)) is not None and v.races_lost >= stated]:
                del charged[digest]
        return sum(len(charged) for charged in by_version.values())

    def pick(self, claims: Sequence[SignedVerdict], budget: int, own: Own) -> SignedVerdict | None:
        """The claim the trainer's check of a group is charged to: of the members with room, the
        one stating the fewest lost races (the likeliest to be confirmed, so released), ties by
        id; None when every claimant's budget is spent. ``budget`` 0: no budget, the first claim."""
        ordered = sorted(claims, key=lambda v: (v.races_lost, v.verifier))
        if not budget:
            return ordered[0] if ordered else None
        return next((v for v in ordered if self.used(v.verifier, own) < budget), None)

    def open(self, claims: Sequence[SignedVerdict], own: Own) -> bool:
        """Whether a claimant has a charge whose check is still under way: it may be confirmed and
        free room, so a claim refused for want of it is looked at again."""
        return any(own(d) is None for v in claims for charged in self._charged.get(v.verifier, {}).values()
                   for d in charged)

    def charge(self, version: int, claim: SignedVerdict, budget: int) -> None:
        """Charge the trainer's check of ``claim.group``, a group of ``version``, to
        ``claim.verifier`` (nothing is kept without a budget)."""
        if budget:
            self._charged.setdefault(claim.verifier, {}).setdefault(version, {})[claim.group] = claim.races_lost

    def forget(self, floor: int) -> None:
        """Drop every round below ``floor`` (vrl.node.rounds.Rounds.forget): its groups are no
        longer fresh, so no claim on them asks for a check, and its charges no longer count."""
        for member in list(self._charged):
            by_version = self._charged[member]
            for version in [r for r in by_version if r < floor]:
                del by_version[version]
            if not by_version:
                del self._charged[member]

    def held(self) -> int:
        """Digests held over every member and round: at most ``B`` per member."""
        return sum(len(charged) for by_version in self._charged.values() for charged in by_version.values())
