"""Each verification design alone (vrl.node.designs), over a plain view of a node's state:
what it claims, refuses, routes and decides where the two designs differ."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vrl.node.committee import Draw, Refusal
from vrl.node.designs import CommitteeDesign, TicketDesign, design_of
from vrl.node.events import Persist, Publish, Send
from vrl.node.manifests import Rounds
from vrl.node.messages import TOPIC_VERDICTS, Outcome, SignedVerdict, audit_ticket
from vrl.node.state import HeldGroup, ProtocolConfig
from vrl.rollouts.keys import NodeKey

TRAINER = NodeKey.from_seed(b"T" * 32)
VERIFIER = NodeKey.from_seed(b"V" * 32)
WORKER = NodeKey.from_seed(b"W" * 32)
DIGEST = b"\x05" * 32


def config(design: str, roles: tuple[str, ...] = ("verifier",)) -> ProtocolConfig:
    return ProtocolConfig(roles=frozenset(roles), trainer=TRAINER.node_id, verification=design)


def view(key: NodeKey = VERIFIER, design: str = "committee", roles: tuple[str, ...] = ("verifier",),
         **state: object) -> SimpleNamespace:
    """The parts of a NodeView the designs read, as plain data."""
    cfg = config(design, roles)
    return SimpleNamespace(key=key, me=key.node_id, config=cfg, now=0.0, planted={},
                           rounds=Rounds(key, TRAINER.node_id), reputation=SimpleNamespace(pretrusted=frozenset()),
                           has=lambda role: role in cfg.roles, fresh=lambda version: version >= 0, **state)


def verdict(outcome: str = Outcome.PASS, draw: Draw = Draw.TICKET, key: NodeKey = VERIFIER) -> SignedVerdict:
    return SignedVerdict(key.node_id, WORKER.node_id, DIGEST, 0, 0, audit_ticket(key, DIGEST), 1.0, outcome, (),
                         b"\x07" * 32, "test", False, draw=draw).signed(key)


def test_the_design_is_chosen_from_the_configuration():
    assert isinstance(design_of(config("tickets")), TicketDesign)
    assert isinstance(design_of(config("committee")), CommitteeDesign)


def test_a_ticket_verdict_claims_its_own_ticket_and_the_design_refuses_any_other_draw():
    tickets, node = TicketDesign(), view(design="tickets")
    assert tickets.claim(node, DIGEST, Draw.COMMITTEE, b"pi") == {"draw": Draw.TICKET, "pi": b"",
                                                                  "ticket": audit_ticket(VERIFIER, DIGEST)}
    assert tickets.refusal(node, verdict()) is None
    assert tickets.refusal(node, verdict(draw=Draw.COMMITTEE)) == Refusal.WRONG_DESIGN
    assert tickets.route(node, v := verdict()) == [Publish(TOPIC_VERDICTS, v.to_bytes())]
    assert tickets.own_draw(node, DIGEST, Draw.NONE, 1.0) and not tickets.own_draw(node, DIGEST, Draw.NONE, 0.0)
    assert tickets.audit_divisor(node.config) == 1 and tickets.step_committee(node.config) == 0
    assert not tickets.left_out(node, DIGEST, 0) and not tickets.closed(node, 0) and tickets.listed(node, DIGEST, 0)


def test_a_ticket_group_no_pass_reached_is_decided_after_verdict_wait():
    tickets, node = TicketDesign(), view(design="tickets")
    group = HeldGroup(WORKER.node_id, 0, arrived=0.0)
    assert tickets.unreached(node, group) is None
    node.now = node.config.verdict_wait
    assert tickets.unreached(node, group) is True


def test_a_committee_verdict_claims_only_a_proven_place_but_a_plants_reveal_claims_none():
    committee, node = CommitteeDesign(), view()
    assert committee.claim(node, DIGEST, Draw.COMMITTEE, b"pi") is None  # no manifest, no place
    assert committee.claim(node, DIGEST, Draw.NONE, b"") is None
    node.planted[DIGEST] = 0
    assert committee.claim(node, DIGEST, Draw.NONE, b"") == {"draw": Draw.NONE, "pi": b"", "ticket": b""}
    assert committee.refusal(node, verdict(draw=Draw.COMMITTEE)) == Refusal.MANIFEST_MISSING
    assert committee.listed(node, DIGEST, 0) is None
    assert committee.unreached(node, HeldGroup(WORKER.node_id, 0, 0.0)) is None
    assert committee.audit_divisor(node.config) == node.config.committee_size
    assert committee.seated(verdict(draw=Draw.RECHECK)) and not committee.seated(verdict(draw=Draw.NONE))


@pytest.mark.parametrize("roles", [("verifier",), ("trainer", "verifier")])
def test_a_committee_pass_goes_to_the_trainer_alone_and_a_failure_is_gossiped(roles):
    committee, node = CommitteeDesign(), view(roles=roles)
    passed, failed = verdict(), verdict(Outcome.HARD_FAIL)
    expected = [Persist(passed)] if "trainer" in roles else [Send(TRAINER.node_id, TOPIC_VERDICTS, passed.to_bytes())]
    assert committee.route(node, passed) == expected
    assert committee.route(node, failed) == [Publish(TOPIC_VERDICTS, failed.to_bytes())]


def test_the_committee_trainer_re_checks_a_failure_that_came_once_its_group_was_stale():
    committee = CommitteeDesign()
    node = view(TRAINER, roles=("trainer",))
    node.fresh = lambda version: False
    committee.counted(node, verdict(Outcome.PASS), HeldGroup(WORKER.node_id, 0, 0.0))
    assert not node.rounds.late_failures
    committee.counted(node, verdict(Outcome.HARD_FAIL), HeldGroup(WORKER.node_id, 0, 0.0))
    assert node.rounds.late_failures == {DIGEST}
    member = view(roles=("verifier",))
    member.fresh = lambda version: False
    committee.counted(member, verdict(Outcome.HARD_FAIL), HeldGroup(WORKER.node_id, 0, 0.0))
    assert not member.rounds.late_failures
