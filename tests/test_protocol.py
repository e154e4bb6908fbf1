"""The node protocol as a state machine: events in, actions out; no sockets, no models."""

from __future__ import annotations

import pytest

from vrl.node import protocol as P
from vrl.node.admission import AdmissionConfig
from vrl.node.messages import (
    TOPIC_GROUPS,
    TOPIC_POLICIES,
    TOPIC_VERDICTS,
    Group,
    PolicyAnnouncement,
    SignedVerdict,
    Submission,
    audit_ticket,
)
from vrl.node.reputation import ReputationConfig
from vrl.node.rounds import REPUTATION_EVERY_SECONDS
from vrl.rollouts.keys import NodeKey

TRAINER = NodeKey.from_seed(b"T" * 32)
VERIFIER = NodeKey.from_seed(b"V" * 32)
OTHER_VERIFIER = NodeKey.from_seed(b"U" * 32)
WORKER = NodeKey.from_seed(b"W" * 32)
CHEAT = NodeKey.from_seed(b"C" * 32)
#: Any honest per-token race-loss rate will do for a protocol without models.
RACE_LOSS_RATE = 1e-3


def announcement(version: int) -> PolicyAnnouncement:
    # Bound to its parent, as an honest trainer's is (specs/training.md §3).
    return PolicyAnnouncement(TRAINER.node_id, version, bytes([version]) * 32, bytes([100 + version]) * 32,
                              1000, parent=bytes([version - 1]) * 32 if version else b"",
                              optimizer_before=bytes(32) if version else b"").signed(TRAINER)


def submission(tag: int) -> Submission:
    return Submission((tag.to_bytes(8, "big"),))

def held(sub: Submission, subject: bytes, version: int, index: int) -> Group:
    """A group as the protocol sees it; its records are the daemon's concern, not the protocol's."""
    return Group(sub, (), subject, version, index)


def node(key: NodeKey, *roles: str, **options) -> P.NodeProtocol:
    """A node of the ticket design, these tests' (the committee design's: test_protocol_committee.py)."""
    options = {"verification": "tickets", **options}
    config = P.ProtocolConfig(roles=frozenset(roles), trainer=TRAINER.node_id, **options)
    return P.NodeProtocol(key, config, platform="test", race_loss_rate=RACE_LOSS_RATE)


def kinds(actions: list) -> list[str]:
    return [type(a).__name__ for a in actions]


def ready(proto: P.NodeProtocol, version: int = 0) -> list:
    proto.handle(P.PolicyAnnounced(announcement(version)))
    return proto.handle(P.PolicyLoaded(version))


def verdict_from(key: NodeKey, sub: Submission, subject: bytes, outcome: str, digest: bytes = b"\x07" * 32,
                 **fields) -> SignedVerdict:
    return SignedVerdict(key.node_id, subject, sub.digest, 0, 0, audit_ticket(key, sub.digest), 1.0, outcome,
                         (), digest, "test", **fields).signed(key)


def test_a_worker_fetches_the_policy_generates_once_and_publishes_its_groups():
    worker = node(WORKER, "worker")
    assert kinds(worker.handle(P.PolicyAnnounced(announcement(0)))) == ["PersistPolicy", "FetchPolicy"]
    assert kinds(worker.handle(P.PolicyLoaded(0))) == ["Generate"]
    assert worker.handle(P.Tick(1.0)) == []  # already under way
    groups = (submission(1), submission(2))
    actions = worker.handle(P.Generated(0, groups))
    assert [(a.topic, a.data) for a in actions] == [(TOPIC_GROUPS, g.to_bytes()) for g in groups]
    assert worker.handle(P.Tick(2.0)) == []


def test_policies_from_anyone_but_the_trainer_are_ignored():
    worker = node(WORKER, "worker")
    forged = PolicyAnnouncement(CHEAT.node_id, 0, b"\x01" * 32, b"\x02" * 32, 10).signed(CHEAT)
    # Stored, as every announcement that validated is (an audit's evidence), and not followed.
    assert worker.handle(P.PolicyAnnounced(forged)) == [P.PersistPolicy(forged)] and worker.version is None


def test_a_verifier_checks_a_newcomer_and_signs_a_verdict_with_its_digest():
    verifier = node(VERIFIER, "verifier")
    ready(verifier)
    sub = submission(1)
    assert kinds(verifier.handle(P.GroupReceived(held(sub, WORKER.node_id, 0, 101), 0.0))) == ["PersistGroup", "Check"]
    (publish,) = verifier.handle(P.Checked(sub.digest, (), b"\x09" * 32))
    assert publish.topic == TOPIC_VERDICTS
    verdict = SignedVerdict.from_bytes(publish.data)
    assert verdict.valid() and verdict.outcome == "pass" and verdict.digest == b"\x09" * 32
    assert verdict.subject == WORKER.node_id and verdict.rate == 1.0


def test_a_trusted_node_is_spot_checked_and_skips_are_signed_and_provable():
    verifier = node(VERIFIER, "verifier")
    ready(verifier)
    for i in range(300):  # build trust: checked and passed
        sub = submission(i)
        verifier.handle(P.GroupReceived(held(sub, WORKER.node_id, 0, i), 0.0))
        verifier.handle(P.Checked(sub.digest, (), b"\x09" * 32))
    settle(verifier)
    assert verifier.standing(WORKER.node_id).check_rate < 0.2
    checked = skipped = 0
    for i in range(1000, 1100):
        stored, *actions = verifier.handle(P.GroupReceived(held(submission(i), WORKER.node_id, 0, i), 0.0))
        assert isinstance(stored, P.PersistGroup)
        if kinds(actions) == ["Check"]:
            checked += 1
            verifier.handle(P.Abandoned(actions[0]))
        else:
            (publish,) = actions
            verdict = SignedVerdict.from_bytes(publish.data)
            assert verdict.outcome == "skipped" and verdict.valid()
            skipped += 1
    assert 0 < checked < 40 and skipped == 100 - checked


def test_a_skip_the_ticket_does_not_allow_is_invalid():
    sub = submission(1)
    lying = SignedVerdict(VERIFIER.node_id, WORKER.node_id, sub.digest, 0, 0, audit_ticket(VERIFIER, sub.digest),
                          1.0, "skipped", (), b"", "test").signed(VERIFIER)
    assert not lying.valid()  # at rate 1 every ticket draws a check


def settle(proto: P.NodeProtocol) -> list:
    """Time enough passes for the node to evaluate reputation again (specs/reputation.md §2: at
    most every REPUTATION_EVERY_SECONDS); returns the actions, its quarantines among them."""
    return proto.handle(P.Tick(proto.now + REPUTATION_EVERY_SECONDS))


def endorse(proto: P.NodeProtocol, key: NodeKey) -> None:
    """The node checks and passes one group of ``key``: its reports now carry some weight."""
    own = Submission((b"own work of " + key.node_id,))
    proto.handle(P.GroupReceived(held(own, key.node_id, 0, 0), 0.0))
    proto.handle(P.Checked(own.digest, (), b"\x05" * 32))
    settle(proto)


def test_a_reported_fail_is_re_checked_before_quarantine_and_then_purged():
    trainer = node(TRAINER, "trainer", admission=AdmissionConfig(batch_groups=50))
    ready(trainer)
    endorse(trainer, VERIFIER)
    bad, other = submission(1), submission(2)
    trainer.handle(P.GroupReceived(held(bad, CHEAT.node_id, 0, 104), 0.0))
    trainer.handle(P.GroupReceived(held(other, CHEAT.node_id, 0, 105), 0.0))
    actions = trainer.handle(P.VerdictReceived(verdict_from(VERIFIER, bad, CHEAT.node_id, "hard_fail", b"\x08" * 32)))
    assert [a for a in actions if isinstance(a, P.Check)] == [P.Check(bad.digest, 0)]
    assert trainer.decided(bad.digest) is None
    actions = trainer.handle(P.Checked(bad.digest, ("reward_mismatch",), b"\x08" * 32))
    assert not [a for a in actions if isinstance(a, P.Quarantine)]  # at the next evaluation, not at once
    quarantines = [a for a in settle(trainer) if isinstance(a, P.Quarantine)]
    assert quarantines == [P.Quarantine(CHEAT.node_id, tuple(sorted((bad.digest, other.digest))))]
    assert trainer.decided(other.digest) is False


def accused(producer: NodeKey, count: int) -> tuple[P.NodeProtocol, list[Submission], list]:
    """A trainer holding ``count`` groups of ``producer``, and the actions of receiving a
    counting verifier's race_losses fail on the first: its sequential test rejected them."""
    trainer = node(TRAINER, "trainer", admission=AdmissionConfig(batch_groups=50))
    ready(trainer)
    endorse(trainer, VERIFIER)
    groups = [submission(200 + i) for i in range(count)]
    for i, sub in enumerate(groups):
        trainer.handle(P.GroupReceived(held(sub, producer.node_id, 0, 200 + i), 0.0))
    # The counts the trainer's own check of the group finds below: on one platform a check of
    # a group recomputes them bit for bit, and others would be a lie (specs/reputation.md §4).
    accusation = verdict_from(VERIFIER, groups[0], producer.node_id, "hard_fail", b"\x08" * 32,
                              race_tokens=300, races_lost=3)
    accusation = SignedVerdict(**{**accusation.__dict__, "reasons": ("race_losses",),
                                  "signature": b""}).signed(VERIFIER)
    return trainer, groups, trainer.handle(P.VerdictReceived(accusation))


def test_a_sequential_test_failure_makes_others_check_every_group_and_convicts_on_their_own_evidence():
    """race_losses (specs/verification.md §7): no record of the group is wrong, the producer's
    tokens lose their races too often. The reporter's fail makes the trainer check every group
    of the producer; its own test, over those checks, convicts."""
    trainer, groups, actions = accused(CHEAT, 6)
    assert CHEAT.node_id in trainer.suspects
    assert {a.group for a in actions if isinstance(a, P.Check)} == {g.digest for g in groups}
    quarantined, published = [], []
    for sub in groups:  # each group passes on its own; the losses add up
        actions = trainer.handle(P.Checked(sub.digest, (), b"\x08" * 32, race_tokens=300, races_lost=3))
        quarantined += [a for a in actions if isinstance(a, P.Quarantine)]
        published += [SignedVerdict.from_bytes(a.data) for a in actions
                      if isinstance(a, P.Publish) and a.topic == TOPIC_VERDICTS]
        if published[-1].outcome == "hard_fail":
            break
    quarantined += [a for a in settle(trainer) if isinstance(a, P.Quarantine)]
    assert published[0].outcome == "pass" and published[0].race_tokens == 300 and published[0].races_lost == 3
    assert published[-1].outcome == "hard_fail" and published[-1].reasons == ("race_losses",)
    assert trainer.race_test(CHEAT.node_id).rejected
    assert quarantined and quarantined[0].node == CHEAT.node_id


def test_an_honest_loss_rate_never_fails_the_sequential_test_and_one_accusation_convicts_no_one():
    trainer, groups, _ = accused(WORKER, 8)
    for i, sub in enumerate(groups):  # about 1 loss in 1,000 tokens: the calibrated honest rate
        # (the accused group's counts are the accuser's: a check on one platform finds the same)
        evidence = (300, 3) if i == 0 else (1000, 1)
        actions = trainer.handle(P.Checked(sub.digest, (), b"\x08" * 32, *evidence))
        assert not any(isinstance(a, P.Quarantine) for a in actions)
    assert not trainer.race_test(WORKER.node_id).rejected
    assert not trainer.standing(WORKER.node_id).quarantined


def test_re_checks_that_others_prompted_add_no_evidence_to_the_sequential_test():
    """An attacker who soft-fails exactly the groups in which an honest node lost a race gets
    them re-checked, but a re-check its own ticket did not draw is evidence someone chose:
    it is signed with its counts, and kept out of the test (specs/verification.md §7)."""
    quiet = ReputationConfig(newcomer_checks=0, prior_pass=1000.0, check_floor=0.0, check_gamma=50.0)
    trainer = node(TRAINER, "trainer", reputation=quiet, admission=AdmissionConfig(batch_groups=50))
    ready(trainer)
    groups = [submission(400 + i) for i in range(10)]
    published = []
    for i, sub in enumerate(groups):
        trainer.handle(P.GroupReceived(held(sub, WORKER.node_id, 0, 400 + i), 0.0))
        actions = trainer.handle(P.VerdictReceived(verdict_from(CHEAT, sub, WORKER.node_id, "soft_fail")))
        actions += settle(trainer)  # the reporter's weight, as of the next evaluation
        assert P.Check(sub.digest, 0) in actions
        actions = trainer.handle(P.Checked(sub.digest, (), b"\x08" * 32, race_tokens=12, races_lost=1))
        published += [SignedVerdict.from_bytes(a.data) for a in actions
                      if isinstance(a, P.Publish) and a.topic == TOPIC_VERDICTS]
    assert [(v.race_tokens, v.races_lost, v.outcome) for v in published] == [(12, 1, "pass")] * 10
    assert not any(P.drawn(v) for v in published)
    assert trainer.race_test(WORKER.node_id).tokens == 0


def test_a_false_accusation_is_cleared_by_the_re_check_and_the_group_admitted():
    trainer = node(TRAINER, "trainer", admission=AdmissionConfig(batch_groups=1, trusted_share=0.0))
    ready(trainer)
    sub = submission(1)
    trainer.handle(P.GroupReceived(held(sub, WORKER.node_id, 0, 106), 0.0))
    trainer.handle(P.VerdictReceived(verdict_from(VERIFIER, sub, WORKER.node_id, "hard_fail", b"\x08" * 32)))
    actions = trainer.handle(P.Checked(sub.digest, (), b"\x08" * 32))
    assert not any(isinstance(a, P.Quarantine) for a in actions)
    assert trainer.decided(sub.digest) is True
    assert [a for a in actions if isinstance(a, P.Train)] == [P.Train(0, ((sub.digest, 1.0),))]
    settle(trainer)
    assert trainer.standing(VERIFIER.node_id).failures > 0


def test_the_trainer_waits_for_verdicts_then_trains_once_and_announces():
    trainer = node(TRAINER, "trainer", verdict_wait=5.0,
                   admission=AdmissionConfig(batch_groups=2, trusted_share=0.0, node_cap=1.0))
    ready(trainer)
    a, b = submission(1), submission(2)
    trainer.handle(P.GroupReceived(held(a, WORKER.node_id, 0, 107), 100.0))
    trainer.handle(P.GroupReceived(held(b, WORKER.node_id, 0, 108), 100.0))
    assert trainer.handle(P.Tick(102.0)) == []  # verifiers still have time
    train = [x for x in trainer.handle(P.Tick(106.0)) if isinstance(x, P.Train)]
    assert len(train) == 1 and {d for d, _ in train[0].batch} == {a.digest, b.digest}
    assert not any(isinstance(x, P.Train) for x in trainer.handle(P.Tick(107.0)))
    actions = trainer.handle(P.Trained(announcement(1), (a.digest, b.digest)))
    assert P.Publish(TOPIC_POLICIES, announcement(1).to_bytes()) in actions
    assert trainer.version == 1 and trainer.decided(a.digest) is False  # trained groups are spent
    assert not any(isinstance(x, P.Train) for x in trainer.handle(P.Tick(200.0)))


def test_a_group_the_trainers_own_pass_refuses_is_reported_and_never_trained():
    """specs/network.md §5.4: the step's forward pass failed it. The failure is this node's
    check, published; the round goes on without the group, even over the trainer's earlier pass."""
    trainer = node(TRAINER, "trainer", verdict_wait=5.0,
                   admission=AdmissionConfig(batch_groups=3, trusted_share=0.0, node_cap=1.0))
    ready(trainer)
    bad, good, passed = submission(1), submission(2), submission(3)
    for i, sub in enumerate((bad, good, passed)):
        trainer.handle(P.GroupReceived(held(sub, WORKER.node_id, 0, 120 + i), 100.0))
    trainer.handle(P.Checked(passed.digest, (), b"\x01" * 32, 12, 0))  # its own pass, published before
    train = [x for x in trainer.handle(P.Tick(106.0)) if isinstance(x, P.Train)]
    assert len(train) == 1 and {d for d, _ in train[0].batch} == {bad.digest, good.digest, passed.digest}
    refused = [P.Refused(P.Checked(d, ("sampling_mismatch",), b"\x02" * 32, 12, 1))
               for d in (bad.digest, passed.digest)]
    published = [SignedVerdict.from_bytes(a.data) for r in refused for a in trainer.handle(r)
                 if isinstance(a, P.Publish) and a.topic == TOPIC_VERDICTS]
    assert [(v.group, v.outcome, v.reasons, v.race_tokens, v.races_lost) for v in published] == [
        (bad.digest, "hard_fail", ("sampling_mismatch",), 12, 1)]  # one verdict per group: the pass stands
    assert trainer.decided(bad.digest) is False and trainer.decided(passed.digest) is False
    # Every group was refused, say, and no step taken: the protocol asks again, without them.
    again = [x for x in trainer.handle(P.Abandoned(train[0])) if isinstance(x, P.Train)]
    assert again and {d for d, _ in again[0].batch} == {good.digest}


def test_a_pass_verdict_decides_a_group_without_waiting():
    trainer = node(TRAINER, "trainer", verdict_wait=1000.0, lazy_audit_rate=0.0, pretrusted=frozenset({
        VERIFIER.node_id}))
    ready(trainer)
    sub = submission(1)
    trainer.handle(P.GroupReceived(held(sub, WORKER.node_id, 0, 109), 0.0))
    assert trainer.decided(sub.digest) is None
    trainer.handle(P.VerdictReceived(verdict_from(VERIFIER, sub, WORKER.node_id, "pass")))
    assert trainer.decided(sub.digest) is True


def test_a_pass_from_a_verifier_of_no_weight_decides_nothing():
    """A stranger's pass must not rush a group into a batch before honest checks land: the
    group waits verdict_wait as if no verdict had come."""
    trainer = node(TRAINER, "trainer", verdict_wait=5.0, lazy_audit_rate=0.0)
    ready(trainer)
    sub = submission(1)
    trainer.handle(P.GroupReceived(held(sub, CHEAT.node_id, 0, 0), 0.0))
    trainer.handle(P.VerdictReceived(verdict_from(OTHER_VERIFIER, sub, CHEAT.node_id, "pass")))
    assert trainer.standing(OTHER_VERIFIER.node_id).trust == 0.0
    assert trainer.decided(sub.digest) is None
    trainer.handle(P.Tick(6.0))
    assert trainer.decided(sub.digest) is True  # admitted on reputation alone, as with no verdict


def test_the_trainer_audits_other_verifiers_passes_at_its_lazy_audit_rate():
    trainer = node(TRAINER, "trainer", lazy_audit_rate=1.0)
    ready(trainer)
    sub = submission(1)
    trainer.handle(P.GroupReceived(held(sub, WORKER.node_id, 0, 110), 0.0))
    actions = trainer.handle(P.VerdictReceived(verdict_from(VERIFIER, sub, WORKER.node_id, "pass")))
    assert P.Check(sub.digest, 0) in actions


def test_planted_groups_are_never_trained_and_revealed_after_the_step():
    trainer = node(TRAINER, "trainer", plant_every=1, verdict_wait=0.0,
                   admission=AdmissionConfig(batch_groups=1, trusted_share=0.0))
    actions = ready(trainer)
    assert P.Plant(0) in actions
    canary = submission(99)
    published = trainer.handle(P.Planted(canary, CHEAT.node_id, 0))
    assert P.Publish(TOPIC_GROUPS, canary.to_bytes()) in published
    trainer.handle(P.GroupReceived(held(canary, CHEAT.node_id, 0, 111), 0.0))
    trainer.handle(P.VerdictReceived(verdict_from(VERIFIER, canary, CHEAT.node_id, "pass")))
    assert trainer.decided(canary.digest) is False
    actions = trainer.handle(P.Trained(announcement(1), ()))
    reveals = [SignedVerdict.from_bytes(a.data) for a in actions if isinstance(a, P.Publish)
               and a.topic == TOPIC_VERDICTS]
    assert [(v.group, v.outcome, v.planted) for v in reveals] == [(canary.digest, "hard_fail", True)]
    assert trainer.standing(VERIFIER.node_id).quarantined  # it passed a known-bad group


def test_replay_rebuilds_the_state_silently_and_pending_resumes_the_work():
    live = node(VERIFIER, "worker", "verifier")
    events = [P.PolicyAnnounced(announcement(0)), P.PolicyLoaded(0),
              P.GroupReceived(held(submission(1), WORKER.node_id, 0, 112), 0.0),
              P.GroupReceived(held(submission(2), WORKER.node_id, 0, 113), 0.0),
              P.VerdictReceived(verdict_from(VERIFIER, submission(1), WORKER.node_id, "pass"))]
    for event in events:
        live.handle(event)
    restarted = node(VERIFIER, "worker", "verifier")
    for event in events[:1] + events[2:]:  # PolicyLoaded is not stored: weights are reloaded
        assert restarted.handle(event, replaying=True) == []
    assert kinds(restarted.pending()) == ["FetchPolicy"]
    restarted.handle(P.Abandoned(P.FetchPolicy(announcement(0))))
    actions = restarted.handle(P.PolicyLoaded(0))
    assert sorted(kinds(actions)) == ["Check", "Generate"]  # group 2 still needs its check
    assert [a.group for a in actions if isinstance(a, P.Check)] == [submission(2).digest]


def test_groups_older_than_the_staleness_bound_are_not_checked_or_trained():
    trainer = node(TRAINER, "trainer", "verifier", max_staleness=1)
    ready(trainer, 0)
    old = submission(5)
    trainer.handle(P.PolicyAnnounced(announcement(2)))
    trainer.handle(P.PolicyLoaded(2))
    actions = trainer.handle(P.GroupReceived(held(old, WORKER.node_id, 0, 114), 0.0))
    assert not any(isinstance(a, P.Check) for a in actions)
    assert not trainer.fresh(0)


def test_config_refuses_unknown_roles():
    with pytest.raises(ValueError, match="roles"):
        P.ProtocolConfig(roles=frozenset({"miner"}), trainer=TRAINER.node_id)


def test_the_trainer_publishes_no_version_after_its_last():
    trainer = node(TRAINER, "trainer", verdict_wait=0.0, last_version=1,
                   admission=AdmissionConfig(batch_groups=1, trusted_share=0.0))
    ready(trainer, 1)
    trainer.handle(P.GroupReceived(held(submission(1), WORKER.node_id, 1, 115), 0.0))
    assert not any(isinstance(a, P.Train) for a in trainer.handle(P.Tick(10.0)))


def test_one_group_per_slot_so_a_re_signed_copy_is_never_trained_twice():
    """Ed25519 lets a signer make many valid signatures of one record; each gives the group a
    new digest. The slot (subject, version, group index) keeps the first group only."""
    trainer = node(TRAINER, "trainer", verdict_wait=0.0, admission=AdmissionConfig(
        batch_groups=8, trusted_share=0.0, node_cap=1.0))
    ready(trainer)
    first, copy = submission(1), submission(2)
    trainer.handle(P.GroupReceived(held(first, WORKER.node_id, 0, 3), 0.0))
    trainer.handle(P.GroupReceived(held(copy, WORKER.node_id, 0, 3), 0.0))
    assert copy.digest not in trainer.groups and first.digest in trainer.groups
    trainer.handle(P.GroupReceived(held(copy, WORKER.node_id, 0, 4), 0.0))  # another slot is another group
    assert copy.digest in trainer.groups


def test_a_quarantined_nodes_later_groups_cost_no_checks():
    trainer = node(TRAINER, "trainer", "verifier", admission=AdmissionConfig(batch_groups=50))
    ready(trainer)
    endorse(trainer, VERIFIER)
    bad = submission(1)
    trainer.handle(P.GroupReceived(held(bad, CHEAT.node_id, 0, 0), 0.0))
    trainer.handle(P.VerdictReceived(verdict_from(VERIFIER, bad, CHEAT.node_id, "hard_fail", b"\x08" * 32)))
    trainer.handle(P.Checked(bad.digest, ("reward_mismatch",), b"\x08" * 32))
    settle(trainer)
    assert trainer.standing(CHEAT.node_id).quarantined
    actions = trainer.handle(P.GroupReceived(held(submission(2), CHEAT.node_id, 0, 1), trainer.now))
    assert not [a for a in actions if isinstance(a, P.Check)]

