"""The pooled sequential test (vrl/node/pooling.py, specs/verification.md §7.1): members' drawn
race evidence pooled per producer, a loss counting only where a pre-trusted check found it too."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_protocol_committee import VERIFIERS, WORKER, round_zero, verifier
from vrl.node import protocol as P
from vrl.node.committee import Draw
from vrl.node.events import Send
from vrl.node.messages import Outcome, SignedVerdict
from vrl.node.pooling import Pooled, pooled_convictions, pooled_evidence
from vrl.node.reputation import Report, ReputationConfig, compute
from vrl.rollouts.profiles import profile_of_platform
from vrl.rollouts.sequential import RaceTest

PLATFORM = "torch-2.13.0+cpu/cpu-AVX512/float32/sdpa/threads-1"  # the cpu/float32/sdpa profile
Q0 = profile_of_platform(PLATFORM).race_loss_rate
TRAINER = b"\x01" * 32
MEMBERS = [bytes([0x20 + i]) * 32 for i in range(8)]
SPOOFER, HONEST = b"\x11" * 32, b"\x12" * 32
ANCHORS = frozenset({TRAINER})
WEIGHT = {TRAINER: 1.0, **{m: 0.8 for m in MEMBERS}}
TOKENS = 40  # a group's completion tokens


def report(reporter: bytes, subject: bytes, group: int, lost: int, *, drawn: bool = True, tokens: int = TOKENS,
           outcome: Outcome = Outcome.PASS) -> Report:
    return Report(0, reporter, subject, subject[:1] + bytes([group]) * 31, outcome, b"\x09" * 32, PLATFORM,
                  race_tokens=tokens, races_lost=lost, drawn=drawn)


def spoofed(groups: int, lost: int = 1, confirmed: bool = True) -> list[Report]:
    """Each of ``groups`` groups checked by three members (drawn), stating ``lost`` races each,
    and, when ``confirmed``, by the trainer's own (undrawn) check finding the same."""
    out = []
    for g in range(groups):
        out += [report(MEMBERS[(g + i) % len(MEMBERS)], SPOOFER, g, lost) for i in range(3)]
        if confirmed:
            out.append(report(TRAINER, SPOOFER, g, lost, drawn=False))
    return out


def test_members_confirmed_losses_pool_into_one_test_that_convicts_where_no_members_own_test_does():
    reports = spoofed(4)
    pooled = pooled_evidence(reports, ANCHORS, WEIGHT)[SPOOFER]
    assert (pooled.tokens, pooled.lost, pooled.q0) == (4 * TOKENS, 4, Q0)
    assert pooled.rejected() and pooled_convictions(reports, ANCHORS, WEIGHT) == {SPOOFER}
    for member in MEMBERS:  # each member saw at most 3 of the 4 groups: its own test does not reject
        own = [r for r in reports if r.reporter == member]
        assert not RaceTest(Q0).add(sum(r.race_tokens for r in own), sum(r.races_lost for r in own)).rejected
    assert not pooled_convictions(spoofed(3), ANCHORS, WEIGHT)  # three groups' evidence is not enough yet


def test_a_loss_no_pretrusted_check_found_never_counts():
    unconfirmed = spoofed(40, lost=5, confirmed=False)
    assert pooled_evidence(unconfirmed, ANCHORS, WEIGHT)[SPOOFER].lost == 0
    assert not pooled_convictions(unconfirmed, ANCHORS, WEIGHT)
    # The trainer checked and found none: the members' claims still count for nothing.
    denied = unconfirmed + [report(TRAINER, SPOOFER, g, 0, drawn=False) for g in range(40)]
    assert pooled_evidence(denied, ANCHORS, WEIGHT)[SPOOFER] == Pooled(40 * TOKENS, 0, Q0)
    # The trainer's own losses, with no member stating any: one reporter, no second opinion.
    alone = [report(MEMBERS[0], SPOOFER, g, 0) for g in range(40)]
    alone += [report(TRAINER, SPOOFER, g, 5, drawn=False) for g in range(40)]
    assert pooled_evidence(alone, ANCHORS, WEIGHT)[SPOOFER].lost == 0


def test_only_groups_a_committee_draw_reached_enter_and_only_members_of_weight_count():
    rechecked = [report(TRAINER, SPOOFER, g, 5, drawn=False) for g in range(6)]
    rechecked += [report(MEMBERS[0], SPOOFER, g, 5, drawn=False) for g in range(6)]  # re-check seats: chosen
    assert pooled_evidence(rechecked, ANCHORS, WEIGHT) == {}
    stranger = b"\x99" * 32  # a fresh key: weight 0, its committee claim never counts
    strangers = [report(stranger, SPOOFER, g, 5) for g in range(6)]
    strangers += [report(TRAINER, SPOOFER, g, 5, drawn=False) for g in range(6)]
    assert pooled_evidence(strangers, ANCHORS, WEIGHT) == {}


def test_a_lone_liar_can_neither_shrink_a_groups_tokens_nor_add_losses():
    honest = [report(MEMBERS[0], HONEST, g, 0) for g in range(10)]
    liar = [report(MEMBERS[1], HONEST, g, 1, tokens=1) for g in range(10)]  # few tokens, a loss in each
    assert pooled_evidence(honest + liar, ANCHORS, WEIGHT)[HONEST] == Pooled(10 * TOKENS, 0, 0.0)
    # Where the trainer checked, its tokens are the group's, whatever the members state.
    checked = [report(TRAINER, HONEST, g, 0, drawn=False, tokens=TOKENS + 2) for g in range(10)]
    assert pooled_evidence(liar + checked, ANCHORS, WEIGHT)[HONEST] == Pooled(10 * (TOKENS + 2), 0, Q0)


def test_pretrusted_checks_that_disagree_count_the_fewer_losses_so_picking_the_larger_frames_no_one():
    """Two honest anchors' drift losses on one group are independent; the larger of the two is
    no honest checker's own rate (it would frame an honest producer), the smaller is."""
    other = b"\x02" * 32
    anchors = frozenset({TRAINER, other})
    reports = [report(TRAINER, HONEST, g, 3, drawn=False) for g in range(6)]
    reports += [report(other, HONEST, g, 0) for g in range(6)]
    reports += [report(MEMBERS[0], HONEST, g, 9) for g in range(6)]  # a liar states many
    assert pooled_evidence(reports, anchors, WEIGHT)[HONEST].lost == 0
    # One anchor's two reports on a group (a check that replaced an earlier one) are one opinion.
    twice = [report(TRAINER, SPOOFER, 0, 4, drawn=False), report(TRAINER, SPOOFER, 0, 4, drawn=False,
                                                                 outcome=Outcome.HARD_FAIL)]
    assert pooled_evidence(twice + [report(MEMBERS[0], SPOOFER, 0, 0)], ANCHORS, WEIGHT)[SPOOFER].lost == 0


def test_a_reporter_the_log_convicted_counts_for_nothing():
    liar = MEMBERS[0]
    reports = spoofed(4) + [report(liar, SPOOFER, 9, 0, tokens=2**40)]  # a dilution: tokens the group lacks
    assert pooled_evidence(reports, ANCHORS, WEIGHT)[SPOOFER].tokens > 2**40
    assert pooled_convictions(reports, ANCHORS, WEIGHT, excluded={liar}) == {SPOOFER}


def test_two_pretrusted_checks_confirm_each_other():
    other = b"\x02" * 32
    reports = [report(TRAINER, SPOOFER, g, 1) for g in range(4)] + [report(other, SPOOFER, g, 1) for g in range(4)]
    assert pooled_evidence(reports, frozenset({TRAINER, other}), WEIGHT)[SPOOFER].lost == 4
    assert pooled_evidence(reports, ANCHORS, {**WEIGHT, other: 0.8})[SPOOFER].lost == 4
    assert pooled_evidence(reports[:4], ANCHORS, WEIGHT)[SPOOFER].lost == 0  # one reporter


def test_reputation_quarantines_the_pooled_conviction_and_a_member_whose_race_counts_differ_from_the_trainers():
    # The trainer passed a group of each member: the weight members have in every view (EigenTrust).
    endorsed = [report(TRAINER, m, 100 + i, 0, drawn=False) for i, m in enumerate(MEMBERS)]
    assert not compute(endorsed + spoofed(3), ANCHORS, 0, ReputationConfig())[SPOOFER].quarantined
    standings = compute(endorsed + spoofed(4), ANCHORS, 0, ReputationConfig())
    assert standings[SPOOFER].quarantined and standings[SPOOFER].score == 0.0
    assert not any(standings[m].quarantined for m in MEMBERS[:6])
    # A member stating losses the trainer's check on the same platform did not find lied about
    # its check (reputation item 4): a check not made, like a digest that differs.
    framed = [report(MEMBERS[0], HONEST, 0, 3), report(TRAINER, HONEST, 0, 0, drawn=False)]
    standings = compute(endorsed + framed, ANCHORS, 0, ReputationConfig())
    assert standings[MEMBERS[0]].quarantined and not standings[HONEST].quarantined


def test_losses_no_pretrusted_check_found_cost_a_soft_fail_and_only_bit_exact_platforms_compare_counts():
    endorsed = [report(TRAINER, m, 100 + i, 0, drawn=False) for i, m in enumerate(MEMBERS)]
    drifting = "torch-2.13.0+cpu/cpu-AVX512/float32/sdpa/threads-2"  # two threads: not bit-exact
    claim = dataclasses.replace(report(MEMBERS[0], HONEST, 0, 3), platform=drifting)
    check = dataclasses.replace(report(TRAINER, HONEST, 0, 0, drawn=False), platform=drifting)
    standings = compute(endorsed + [claim, check], ANCHORS, 0, ReputationConfig())
    member = standings[MEMBERS[0]]
    assert not member.quarantined and member.failures > 0  # a soft fail, not a check not made
    fewer = dataclasses.replace(claim, races_lost=0)  # stating no more than the trainer found costs nothing
    assert compute(endorsed + [fewer, check], ANCHORS, 0, ReputationConfig())[MEMBERS[0]].failures == 0


reports_strategy = st.lists(st.builds(
    report, reporter=st.sampled_from([TRAINER, *MEMBERS[:3], b"\x99" * 32]), subject=st.sampled_from([SPOOFER, HONEST]),
    group=st.integers(0, 5), lost=st.integers(0, 50), drawn=st.booleans(), tokens=st.integers(50, 60),
    outcome=st.sampled_from([Outcome.PASS, Outcome.HARD_FAIL])), max_size=60)


@settings(max_examples=200, deadline=None)
@given(reports_strategy)
def test_pooled_evidence_of_any_reports_is_bounded_and_no_more_than_the_trainer_found(reports):
    pooled = pooled_evidence(reports, ANCHORS, WEIGHT)
    for subject, evidence in pooled.items():
        assert 0 <= evidence.lost <= evidence.tokens
        trainer_found = sum(max((r.races_lost for r in reports if r.reporter == TRAINER and r.group == group),
                                default=0) for group in {r.group for r in reports if r.subject == subject})
        assert evidence.lost <= trainer_found
        assert evidence.q0 in (0.0, Q0)
    assert pooled_convictions(reports, ANCHORS, WEIGHT) <= set(pooled)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(MEMBERS), st.integers(0, 7), st.integers(0, 40), st.integers(1, 40)),
                max_size=80))
def test_no_claims_by_members_convict_a_producer_the_trainer_found_no_loss_on(claims):
    reports = [report(m, HONEST, g, min(lost, tokens), tokens=tokens) for m, g, lost, tokens in claims]
    reports += [report(TRAINER, HONEST, g, 0, drawn=False) for g in range(8)]
    assert pooled_convictions(reports, ANCHORS, WEIGHT) == set()


def test_the_trainer_checks_each_group_a_member_states_lost_races_on_so_the_losses_count():
    """The node protocol's side (vrl.node.rounds.committee_checks): a member's drawn pass that
    states lost races brings the trainer's own check of the group, and the losses both found
    enter the trainer's pooled evidence of the worker; a pass that states none brings nothing."""
    trainer, manifest, received = round_zero(lazy_audit_rate=0.0)  # no audit draws: only losses ask
    seats = {}
    for key in VERIFIERS:
        proto, actions = verifier(key, manifest, received, trainer)
        for check in (a for a in actions if isinstance(a, P.Check)):
            seats.setdefault(check.group, proto)
    plain, *stating = sorted(seats)
    assert stating, "these keys seat members on at least two groups"

    def member_pass(digest: bytes, lost: int) -> list:
        (sent,) = [a for a in seats[digest].handle(P.Checked(digest, (), b"\x09" * 32, 200, lost))
                   if isinstance(a, Send)]
        verdict = SignedVerdict.from_bytes(sent.data)
        assert verdict.outcome == Outcome.PASS and verdict.draw == Draw.COMMITTEE
        return [a for a in trainer.handle(P.VerdictReceived(verdict)) if isinstance(a, P.Check)]

    assert member_pass(plain, 0) == []
    for digest in stating:
        assert member_pass(digest, 1) == [P.Check(digest, 0)]
        trainer.handle(P.Checked(digest, (), b"\x09" * 32, 200, 1))
    view = trainer.reputation
    weights = {v: 1.0 for v in view.pretrusted}
    evidence = pooled_evidence(view.reports(), view.pretrusted, weights)[WORKER.node_id]
    assert (evidence.tokens, evidence.lost) == (200 * len(seats), len(stating))


def test_a_verdict_stating_more_races_than_its_group_has_tokens_is_refused():
    """race_tokens is derivable from the group: a receiver that holds the group's records
    refuses a verdict that replayed more races than they have completion tokens."""
    from tests.fuzzing import rollout
    from tests.test_protocol import TRAINER as T
    from tests.test_protocol import VERIFIER, endorse, ready
    from tests.test_protocol import node as ticket_node
    from vrl.node.messages import Group, audit_ticket

    trainer = ticket_node(T, "trainer")
    ready(trainer)
    endorse(trainer, VERIFIER)
    group = Group.of([rollout(i, 2) for i in range(2)])  # 2 records of 2 completion tokens
    trainer.handle(P.GroupReceived(group, 0.0))

    def stating(tokens: int) -> SignedVerdict:
        return SignedVerdict(VERIFIER.node_id, group.subject, group.digest, 0, 0, audit_ticket(VERIFIER, group.digest),
                             1.0, Outcome.PASS, (), b"\x07" * 32, "test", race_tokens=tokens).signed(VERIFIER)

    assert trainer.matches_group(stating(5)) is False
    assert not any(isinstance(a, P.Persist) for a in trainer.handle(P.VerdictReceived(stating(5))))
    assert trainer.matches_group(stating(4)) is True
    assert P.Persist(stating(4)) in trainer.handle(P.VerdictReceived(stating(4)))
