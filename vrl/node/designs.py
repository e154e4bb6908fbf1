"""The verification designs, one class each behind :class:`vrl.node.state.Design`, chosen once
from ``config.verification`` (:func:`design_of`): where the ticket design and the committee
design differ, the protocol asks its design, and each design can be tested alone over a
:class:`vrl.node.state.NodeState`.

* :class:`TicketDesign` (specs/network.md §5): every verifier draws an audit ticket per group
  at the producer's check rate and gossips a signed check or skip; a group is decided by a
  counting pass, or after ``verdict_wait`` with no failure.
* :class:`CommitteeDesign` (specs/committee.md): the trainer closes each round with a signed
  manifest; a VRF-drawn committee of members checks each listed group and claims its seat; a
  pass goes to the trainer alone, which decides.

A third design, the swarm's consumer checks (issue 48: every node a learner, no trainer),
implements the same interface: its checks are those a learner makes of the external groups it
chose to train on (``pending``), its verdicts claim that choice (``claim``, ``refusal``), and a
group is decided for the learner that checked it (``listed``, ``unreached``, ``decisions``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vrl.node import rounds
from vrl.node.committee import SEATS, Draw, Refusal
from vrl.node.events import Action, Publish
from vrl.node.messages import (
    TOPIC_GROUPS,
    TOPIC_VERDICTS,
    Group,
    Outcome,
    SignedVerdict,
    audit_ticket,
    ticket_selected,
)
from vrl.node.params import Verification
from vrl.node.state import Design, HeldGroup, NodeState, NodeView, ProtocolConfig
from vrl.node.tickets import ticket_checks


class TicketDesign:
    """Audit tickets (specs/network.md §5): a verifier's own draw per group, gossiped."""

    name = Verification.TICKETS
    manifests = False

    def step_committee(self, config: ProtocolConfig) -> int:
        return 0

    def audit_divisor(self, config: ProtocolConfig) -> int:
        return 1

    def pending(self, node: NodeState, version: int) -> list[Action]:
        return ticket_checks(node) if node.has("verifier") or node.has("trainer") else []

    def publish_groups(self, node: NodeState, groups: Sequence[Group]) -> list[Action]:
        return [Publish(TOPIC_GROUPS, g.to_bytes()) for g in groups]

    def left_out(self, node: NodeView, digest: bytes, version: int) -> bool:
        return False

    def closed(self, node: NodeView, version: int) -> bool:
        return False

    def own_draw(self, node: NodeView, digest: bytes, draw: Draw, rate: float) -> bool:
        return ticket_selected(audit_ticket(node.key, digest), rate)

    def claim(self, node: NodeView, digest: bytes, draw: Draw, pi: bytes) -> dict[str, Any] | None:
        return {"draw": Draw.TICKET, "pi": b"", "ticket": audit_ticket(node.key, digest)}

    def route(self, node: NodeView, verdict: SignedVerdict) -> list[Action]:
        return [Publish(TOPIC_VERDICTS, verdict.to_bytes())]

    def refusal(self, node: NodeView, verdict: SignedVerdict) -> Refusal | None:
        return None if verdict.draw == Draw.TICKET else Refusal.WRONG_DESIGN

    def counted(self, node: NodeView, verdict: SignedVerdict, group: HeldGroup) -> None:
        return None

    def listed(self, node: NodeView, digest: bytes, version: int) -> bool | None:
        return True

    def unreached(self, node: NodeView, group: HeldGroup) -> bool | None:
        return node.now - group.arrived >= node.config.verdict_wait or None

    def decisions(self, node: NodeView, fresh: list[bytes]) -> dict[bytes, bool | None]:
        # Made over every fresh group: they depend on the clock (verdict_wait), which no scan follows.
        return {d: node.decided(d) for d in fresh}

    def seated(self, verdict: SignedVerdict) -> bool:
        return False


class CommitteeDesign:
    """Round manifests and VRF committees (specs/committee.md); its rules are vrl.node.rounds,
    its part of the state vrl.node.manifests.Rounds."""

    name = Verification.COMMITTEE
    manifests = True

    def step_committee(self, config: ProtocolConfig) -> int:
        return config.committee_size

    def audit_divisor(self, config: ProtocolConfig) -> int:
        # ~lazy_audit_rate x groups_per_round audits of each verifier a round, as with tickets,
        # not k times more: a pass reaches the trainer from each of a group's k members (§8).
        return config.committee_size

    def pending(self, node: NodeState, version: int) -> list[Action]:
        # Rounds no fresh group belongs to, with one to spare (Rounds.forget; specs/security.md,
        # disk and memory growth).
        node.rounds.forget(version - node.config.max_staleness - 1)
        actions = rounds.close_rounds(node) if node.has("trainer") else []
        if node.has("verifier") or node.has("trainer"):
            actions += rounds.committee_checks(node)
        elif node.has("worker"):
            actions += rounds.own_listing(node)  # a worker's own groups (specs/committee.md §3.5)
        return actions

    def publish_groups(self, node: NodeState, groups: Sequence[Group]) -> list[Action]:
        if node.has("trainer"):  # a trainer's own groups are gossiped: it has no one to send them to
            return [Publish(TOPIC_GROUPS, g.to_bytes()) for g in groups]
        return rounds.submit(node, groups)

    def left_out(self, node: NodeView, digest: bytes, version: int) -> bool:
        # After its round's manifest, which does not list it (specs/committee.md §1).
        return node.rounds.listed(digest, version) is False

    def closed(self, node: NodeView, version: int) -> bool:
        return version in node.rounds.manifests

    def own_draw(self, node: NodeView, digest: bytes, draw: Draw, rate: float) -> bool:
        return draw == Draw.COMMITTEE

    def claim(self, node: NodeView, digest: bytes, draw: Draw, pi: bytes) -> dict[str, Any] | None:
        claim = node.rounds.claim(digest, draw)
        if claim is None and not (draw == Draw.NONE and digest in node.planted):
            return None  # a place or weight this node has not proven: no one could check it
        # (The trainer's reveal of a plant its round's lists do not hold, planted after the
        # round closed, claims no place: it is its own record; others refuse it, as the audit
        # expects of such a reveal, specs/audit.md §3.)
        return {"draw": draw, "pi": pi, "ticket": b"", **(claim or {})}

    def route(self, node: NodeView, verdict: SignedVerdict) -> list[Action]:
        return rounds.route_verdict(node, verdict)

    def refusal(self, node: NodeView, verdict: SignedVerdict) -> Refusal | None:
        return node.rounds.refusal(verdict, node.reputation.pretrusted)

    def counted(self, node: NodeView, verdict: SignedVerdict, group: HeldGroup) -> None:
        if (node.has("trainer") and verdict.outcome != Outcome.PASS and verdict.verifier != node.me
                and not node.fresh(group.version)):
            node.rounds.late_failures.add(verdict.group)  # re-checked all the same (rounds.late_rechecks)

    def listed(self, node: NodeView, digest: bytes, version: int) -> bool | None:
        return node.rounds.listed(digest, version)

    def unreached(self, node: NodeView, group: HeldGroup) -> bool | None:
        return None  # a member's pass or the trainer's own check decides (specs/committee.md §8)

    def decisions(self, node: NodeView, fresh: list[bytes]) -> dict[bytes, bool | None]:
        return node.scans.decide(node, fresh)

    def seated(self, verdict: SignedVerdict) -> bool:
        return verdict.draw in SEATS


DESIGNS: dict[Verification, type[TicketDesign] | type[CommitteeDesign]] = {
    Verification.TICKETS: TicketDesign, Verification.COMMITTEE: CommitteeDesign}


def design_of(config: ProtocolConfig) -> Design:
    """The design ``config.verification`` names."""
    return DESIGNS[config.verification]()
