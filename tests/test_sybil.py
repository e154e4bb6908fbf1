"""Strangers cannot hurt an honest node (specs/security.md §3, specs/reputation.md §7).

A verdict's subject is derived from the group it names, never taken from the message; a
verdict about an unseen group waits, boundedly; failures count only by their reporter's
trust and stop counting once a pre-trusted re-check contradicts them; a quarantine needs a
re-check of one's own. The sybil test sends what 50 fresh identities can sign.
"""

from __future__ import annotations

import hashlib

import pytest

from tests.test_protocol import settle
from vrl.node import protocol as P
from vrl.node.admission import AdmissionConfig
from vrl.node.messages import Group, Outcome, PolicyAnnouncement, SignedVerdict, Submission, audit_ticket
from vrl.node.reputation import Report, Reputation, ReputationConfig
from vrl.rollouts.keys import NodeKey

TRAINER = NodeKey.from_seed(b"T" * 32)
VERIFIER = NodeKey.from_seed(b"V" * 32)
HONEST = [NodeKey.from_seed(bytes([0x30 + i]) * 32) for i in range(3)]
CHEAT = NodeKey.from_seed(b"C" * 32)
SYBILS = [NodeKey.from_seed(hashlib.sha256(b"sybil %d" % i).digest()) for i in range(50)]


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


def verdict(key: NodeKey, group: bytes, subject: bytes, outcome: str, *, version: int = 0, round_index: int = 0,
            digest: bytes = b"\x07" * 32, reasons: tuple[str, ...] = (), planted: bool = False) -> SignedVerdict:
    return SignedVerdict(key.node_id, subject, group, round_index, version, audit_ticket(key, group), 1.0, outcome,
                         reasons, digest if outcome != "skipped" else b"", "test", planted).signed(key)


def trainer_view(roles=("trainer", "verifier"), **options) -> P.NodeProtocol:
    """A trainer of the ticket design, whose verdicts these strangers sign (audit tickets)."""
    options = {"verification": "tickets", **options}
    config = P.ProtocolConfig(roles=frozenset(roles), trainer=TRAINER.node_id,
                              admission=AdmissionConfig(batch_groups=1000), **options)
    proto = P.NodeProtocol(TRAINER, config, platform="test", race_loss_rate=1e-3)
    proto.handle(P.PolicyAnnounced(announcement(0)))
    proto.handle(P.PolicyLoaded(0))
    return proto


def endorse(proto: P.NodeProtocol, key: NodeKey) -> None:
    """The view checks and passes one group of ``key``: its reports now carry some weight."""
    own = Submission((b"own work of " + key.node_id,))
    proto.handle(P.GroupReceived(held(own, key.node_id, 0, 0), 0.0))
    proto.handle(P.Checked(own.digest, (), b"\x05" * 32))
    settle(proto)


def confirm_bad(proto: P.NodeProtocol, group: Submission, subject: bytes) -> None:
    """A group the trainer saw fail twice: an endorsed verifier's hard fail, then its own re-check."""
    endorse(proto, VERIFIER)
    proto.handle(P.GroupReceived(held(group, subject, 0, 101), 0.0))
    proto.handle(P.VerdictReceived(verdict(VERIFIER, group.digest, subject, "hard_fail", reasons=("reward_mismatch",))))
    proto.handle(P.Checked(group.digest, ("reward_mismatch",), b"\x08" * 32))
    settle(proto)


def test_a_fresh_identity_cannot_get_an_honest_node_quarantined_by_naming_it_as_subject():
    """The red-team finding of issue 13 §1: once any group is confirmed bad, one signed
    verdict about it from a brand-new key, naming an honest node, quarantined that node."""
    proto = trainer_view()
    honest, bad = HONEST[0].node_id, submission(1)
    proto.handle(P.GroupReceived(held(submission(2), honest, 0, 102), 0.0))
    confirm_bad(proto, bad, CHEAT.node_id)
    assert proto.standing(CHEAT.node_id).quarantined
    forged = verdict(SYBILS[0], bad.digest, honest, "hard_fail", reasons=("reward_mismatch",))
    assert forged.valid()  # signed and ticketed correctly: only the subject lies
    actions = proto.handle(P.VerdictReceived(forged))
    assert not any(isinstance(a, (P.Quarantine, P.Persist)) for a in actions)
    assert not proto.standing(honest).quarantined
    assert proto.matches_group(forged) is False


def test_the_planted_canary_cannot_be_pinned_on_an_honest_node():
    proto = trainer_view(plant_every=1, verdict_wait=0.0)
    honest, canary = HONEST[0].node_id, submission(99)
    canary_id = NodeKey.from_seed(b"K" * 32).node_id
    proto.handle(P.Planted(canary, canary_id, 0))
    proto.handle(P.GroupReceived(held(canary, canary_id, 0, 103), 0.0))
    proto.handle(P.Trained(announcement(1), ()))  # the reveal: a planted hard fail
    assert proto.standing(canary_id).quarantined
    for outcome in ("hard_fail", "pass", "soft_fail"):
        proto.handle(P.VerdictReceived(verdict(SYBILS[1], canary.digest, honest, outcome)))
    assert not proto.standing(honest).quarantined


def test_a_verdict_that_arrives_before_its_group_waits_then_counts_and_is_persisted():
    proto = trainer_view(("trainer",), verdict_wait=1000.0, lazy_audit_rate=0.0,
                         pretrusted=frozenset({VERIFIER.node_id}))
    group, worker = submission(5), HONEST[1].node_id
    early = verdict(VERIFIER, group.digest, worker, "pass")
    assert proto.handle(P.VerdictReceived(early)) == []  # not stored: the group is unknown
    actions = proto.handle(P.GroupReceived(held(group, worker, 0, 104), 0.0))
    assert P.Persist(early) in actions
    assert proto.decided(group.digest) is True  # the waiting pass now counts
    lying = verdict(SYBILS[2], group.digest, CHEAT.node_id, "hard_fail")
    assert P.Persist(lying) not in proto.handle(P.VerdictReceived(lying))
    wrong_version = verdict(SYBILS[3], group.digest, worker, "hard_fail", version=1)
    assert P.Persist(wrong_version) not in proto.handle(P.VerdictReceived(wrong_version))


def test_verdicts_waiting_for_a_group_are_bounded():
    proto = trainer_view()
    proto.waiting.cap = 64
    for i in range(200):  # groups nobody will ever send
        proto.handle(P.VerdictReceived(verdict(SYBILS[i % 50], submission(1000 + i).digest, HONEST[0].node_id,
                                                "hard_fail")))
    assert proto.waiting_verdicts == 64
    assert not proto.verdicts  # nothing counted, nothing stored


def test_fifty_fresh_identities_move_an_honest_nodes_score_by_nothing_and_quarantine_no_one():
    """The sybil bound of specs/reputation.md §7, for reporters no trusted node has ever
    endorsed: weight 0, so every score moves by exactly 0, and no quarantine."""
    def run(hostile: bool) -> P.NodeProtocol:
        proto = trainer_view()
        for tag, worker in enumerate(HONEST):  # each honest worker has a record the trainer checked
            for i in range(4):
                group = submission(100 * (tag + 1) + i)
                proto.handle(P.GroupReceived(held(group, worker.node_id, 0, i), float(i)))
                proto.handle(P.Checked(group.digest, (), b"\x05" * 32))
        confirm_bad(proto, submission(7), CHEAT.node_id)
        if hostile:
            for sybil_index, sybil in enumerate(SYBILS):
                for tag, worker in enumerate(HONEST):
                    mine = submission(100 * (tag + 1) + sybil_index % 4).digest
                    for message in (
                        verdict(sybil, mine, worker.node_id, "hard_fail", reasons=("reward_mismatch",)),  # fraud report
                        verdict(sybil, mine, worker.node_id, "soft_fail", reasons=("logprob_mismatch",)),
                        verdict(sybil, mine, worker.node_id, "hard_fail", round_index=2**64 - 1, planted=True),
                        verdict(sybil, submission(7).digest, worker.node_id, "hard_fail"),  # wrong subject
                        verdict(sybil, submission(9000 + sybil_index).digest, worker.node_id, "hard_fail"),  # unseen
                    ):
                        assert message.valid()
                        proto.handle(P.VerdictReceived(message))
                    # ...and sybils vouching for one another and for the cheat.
                    proto.handle(P.VerdictReceived(verdict(sybil, submission(7).digest, CHEAT.node_id, "pass")))
            for _tag in range(len(HONEST)):  # the re-checks the accusations call for are already done
                assert not [a for a in proto.pending() if isinstance(a, P.Check)]
        return proto

    clean, attacked = run(hostile=False), run(hostile=True)
    for worker in HONEST:
        before, after = clean.standing(worker.node_id), attacked.standing(worker.node_id)
        assert not after.quarantined
        assert after.score == before.score and after.failures == before.failures == 0.0
        assert after.check_rate == before.check_rate
    for sybil in SYBILS:
        assert attacked.standing(sybil.node_id).trust == 0.0
    assert attacked.standing(CHEAT.node_id).quarantined  # the one real fraud still stands


def test_an_endorsed_accuser_hurts_no_one_once_a_trusted_re_check_contradicts_it():
    """The bound for reporters that earned weight w: before the re-check, a failure adds at
    most w * w_hard to b; after it, nothing (specs/reputation.md §7)."""
    me, accuser, honest = b"\x01" * 32, b"\x21" * 32, b"\x10" * 32
    config = ReputationConfig()
    history = [Report(0, me, accuser, i.to_bytes(32, "big"), Outcome.PASS) for i in range(30)]
    history += [Report(0, me, honest, (100 + i).to_bytes(32, "big"), Outcome.PASS) for i in range(10)]
    accused = (500).to_bytes(32, "big")
    rep = Reputation(frozenset({me}), config)
    for r in history:
        rep.add(r)
    clean = rep.standing(honest, 0)
    rep.add(Report(0, accuser, honest, accused, Outcome.HARD_FAIL))
    pending = rep.standing(honest, 0)
    weight = rep.standing(accuser, 0).trust
    assert 0 < weight <= 1 and pending.failures == pytest.approx(weight * config.hard_weight)
    assert not pending.quarantined  # one accuser, and no re-check of one's own
    rep.add(Report(0, me, honest, accused, Outcome.PASS))  # the re-check every failure triggers
    after = rep.standing(honest, 0)
    assert after.failures == 0.0 and after.score >= clean.score
    assert rep.standing(accuser, 0).failures == pytest.approx(config.soft_weight)


def test_many_endorsed_accusers_cannot_quarantine_without_a_re_check_of_ones_own():
    me, honest = b"\x01" * 32, b"\x10" * 32
    accusers = [bytes([0x40 + i]) * 32 for i in range(5)]
    config = ReputationConfig(quarantine_weight=0.5)  # so the accusers' weights alone would suffice
    rep = Reputation(frozenset({me}), config)
    for a in accusers:
        for i in range(40):
            rep.add(Report(0, me, a, a[:1] + i.to_bytes(31, "big"), Outcome.PASS))
        rep.add(Report(0, a, honest, b"\xee" * 32, Outcome.HARD_FAIL))
    assert sum(rep.standing(a, 0).trust for a in accusers) >= config.quarantine_weight  # together they weigh enough...
    assert not rep.standing(honest, 0).quarantined  # ...but only a re-check of one's own evicts
    rep.add(Report(0, me, honest, b"\xee" * 32, Outcome.HARD_FAIL))
    assert rep.standing(honest, 0).quarantined


def test_a_strangers_fail_on_a_group_the_trainer_skipped_is_re_checked_not_a_block():
    """Reviewer's finding: a skip counted as the trainer's verdict, so one zero-weight fail on
    a skipped group left it undecided forever, shutting the most trusted workers out."""
    proto = trainer_view(verdict_wait=1.0, lazy_audit_rate=0.0)
    worker = HONEST[0].node_id
    for i in range(300):  # a long record: the trainer now skips most of this worker's groups
        group = submission(10_000 + i)
        proto.handle(P.GroupReceived(held(group, worker, 0, i), 0.0))
        proto.handle(P.Checked(group.digest, (), b"\x05" * 32))
    settle(proto)
    skipped = None
    for i in range(300, 400):
        group = submission(10_000 + i)
        actions = proto.handle(P.GroupReceived(held(group, worker, 0, i), 0.0))
        if not any(isinstance(a, P.Check) for a in actions):
            skipped = group
            break
    assert skipped is not None and not proto.verdicts[skipped.digest][TRAINER.node_id].checked
    actions = proto.handle(P.VerdictReceived(verdict(SYBILS[0], skipped.digest, worker, "hard_fail")))
    assert P.Check(skipped.digest, 0) in actions  # the trainer re-checks over its own skip
    actions = proto.handle(P.Checked(skipped.digest, (), b"\x05" * 32))
    mine = proto.verdicts[skipped.digest][TRAINER.node_id]
    assert mine.checked and mine.outcome == "pass"
    assert any(isinstance(a, P.Publish) for a in actions)  # the check is published in place of the skip
    proto.handle(P.Tick(10.0))
    assert proto.decided(skipped.digest) is True


def test_only_a_counting_reporters_fail_makes_a_plain_verifier_re_check():
    config = P.ProtocolConfig(roles=frozenset({"verifier"}), trainer=TRAINER.node_id, verification="tickets")
    verifier = P.NodeProtocol(VERIFIER, config, platform="test", race_loss_rate=1e-3)
    verifier.handle(P.PolicyAnnounced(announcement(0)))
    verifier.handle(P.PolicyLoaded(0))
    group = submission(7)
    verifier.handle(P.GroupReceived(held(group, HONEST[0].node_id, 0, 0), 0.0))
    # Its own draw's check, set aside (as a replayed event: not asked for again at once).
    verifier.handle(P.Abandoned(P.Check(group.digest, 0)), replaying=True)
    verifier.verdicts[group.digest][VERIFIER.node_id] = verdict(VERIFIER, group.digest, HONEST[0].node_id, "skipped")
    stranger = verifier.handle(P.VerdictReceived(verdict(SYBILS[0], group.digest, HONEST[0].node_id, "hard_fail")))
    assert not [a for a in stranger if isinstance(a, P.Check)]  # a stranger cannot make everyone check
    trainer = verifier.handle(P.VerdictReceived(verdict(TRAINER, group.digest, HONEST[0].node_id, "hard_fail")))
    assert P.Check(group.digest, 0) in trainer


def test_strangers_verdicts_per_group_are_capped_so_the_report_log_stays_bounded():
    """Each accepted verdict is a report every reputation recomputation walks; strangers'
    verdicts weigh nothing, so past MAX_STRANGER_VERDICTS_PER_GROUP a group takes no more."""
    proto = trainer_view()
    group, worker = submission(3), HONEST[0].node_id
    proto.handle(P.GroupReceived(held(group, worker, 0, 0), 0.0))
    accepted = 0
    for sybil in SYBILS:
        message = verdict(sybil, group.digest, worker, "pass")
        if proto.room_for(message):
            proto.handle(P.VerdictReceived(message))
            accepted += 1
    assert accepted == P.MAX_STRANGER_VERDICTS_PER_GROUP
    endorse(proto, VERIFIER)
    assert proto.room_for(verdict(VERIFIER, group.digest, worker, "pass"))  # weight > 0: always room
