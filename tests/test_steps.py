"""The trainer made accountable (specs/training.md), as the protocol state machine sees it:
which steps a verifier judges and how, what a step verdict counts for, and when trainer
fraud is confirmed and what follows. No models here; tests/test_replay.py runs real steps."""

from __future__ import annotations

import dataclasses
import hashlib

from vrl.node import protocol as P
from vrl.node.messages import (
    TOPIC_STEPS,
    BatchFile,
    Group,
    Outcome,
    PolicyAnnouncement,
    SignedVerdict,
    StepFault,
    StepOutcome,
    StepVerdict,
    Submission,
    audit_ticket,
)
from vrl.rollouts.keys import NodeKey

TRAINER = NodeKey.from_seed(b"T" * 32)
VERIFIER = NodeKey.from_seed(b"V" * 32)
OTHER = NodeKey.from_seed(b"U" * 32)
WORKER = NodeKey.from_seed(b"W" * 32)
PLATFORM = "torch-2.13.0/cpu-AVX512/float32/default/threads-1"


def h(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


def group(tag: int, version: int = 0) -> Group:
    return Group(Submission((tag.to_bytes(8, "big"),)), (), WORKER.node_id, version, tag)


def chain(length: int, batch: dict[int, tuple[Group, ...]] | None = None, **changes) -> list[PolicyAnnouncement]:
    """Versions 0..length-1 of an honest trainer, each bound to its parent; ``changes`` maps a
    version to the fields its announcement gets instead (``changes={2: {...}}``)."""
    out = []
    for v in range(length):
        fields = dict(parent=out[-1].model_hash if out else b"", config=h("config"),
                      optimizer_before=out[-1].optimizer if out else b"", optimizer=h(f"optimizer-{v}"),
                      optimizer_size=100, platform=PLATFORM,
                      batch=tuple((g.digest, 1.0) for g in (batch or {}).get(v, ())))
        fields.update(changes.get("changes", {}).get(v, {}))
        out.append(PolicyAnnouncement(TRAINER.node_id, v, h(f"model-{v}"), h(f"blob-{v}"), 1000, **fields)
                   .signed(TRAINER))
    return out


def verifier(key: NodeKey = VERIFIER, platform: str = PLATFORM, **options) -> P.NodeProtocol:
    """A verifier of the ticket design, whose step verdicts and batch groups come by gossip,
    unless ``verification`` says otherwise."""
    options = {"verification": "tickets", **options}
    config = P.ProtocolConfig(roles=frozenset({"verifier"}), trainer=TRAINER.node_id, pretrusted=frozenset(
        options.pop("pretrusted", ())), **options)
    return P.NodeProtocol(key, config, platform=platform, race_loss_rate=1e-3)


def feed(node: P.NodeProtocol, announcements: list[PolicyAnnouncement], groups: tuple[Group, ...] = (),
         now: float = 0.0) -> list:
    actions = []
    for g in groups:
        actions += node.handle(P.GroupReceived(g, now))
    for a in announcements:
        actions += node.handle(P.Tick(now))
        actions += node.handle(P.PolicyAnnounced(a))
        actions += node.handle(P.PolicyLoaded(a.version))
    return actions


def published_steps(actions: list) -> list[StepVerdict]:
    return [StepVerdict.from_bytes(a.data) for a in actions if isinstance(a, P.Publish) and a.topic == TOPIC_STEPS]


def replays(actions: list) -> list[int]:
    return [a.announcement.version for a in actions if isinstance(a, P.ReplayStep)]


def test_an_honest_step_drawn_for_replay_is_replayed_and_passes_without_conviction():
    g = group(1)
    node = verifier(step_audit_rate=1.0)
    actions = feed(node, chain(2, {1: (g,)}), (g,))
    assert replays(actions) == [1] and not published_steps(actions)
    actions = node.handle(P.StepReplayed(1, (), h("model-1"), 0.0))
    (verdict,) = published_steps(actions)
    assert verdict.valid() and verdict.outcome == StepOutcome.PASS and verdict.replayed == h("model-1")
    assert verdict.announcement == node.policies[1].id and node.convicted is None
    assert replays(node.handle(P.Tick(1.0))) == []  # judged once


def test_at_rate_zero_nothing_is_replayed_but_the_rules_still_apply_to_every_step():
    node = verifier(step_audit_rate=0.0)
    assert replays(feed(node, chain(3))) == [] and node.convicted is None
    node = verifier(step_audit_rate=0.0)
    actions = feed(node, chain(3, changes={2: {"parent": h("somewhere else")}}))
    (verdict,) = published_steps(actions)
    assert verdict.outcome == StepOutcome.FRAUD and verdict.reasons == (StepFault.WRONG_PARENT,)


def test_self_evident_faults_convict_at_once_and_the_node_stops_following_the_trainer():
    for changes, fault in [({"parent": h("x")}, StepFault.WRONG_PARENT),
                           ({"optimizer_before": h("x")}, StepFault.WRONG_OPTIMIZER_BEFORE),
                           ({"config": h("another config")}, StepFault.WRONG_CONFIG)]:
        node = verifier(step_audit_rate=0.0)
        actions = feed(node, chain(3, changes={2: changes}))
        convictions = [a for a in actions if isinstance(a, P.ConvictTrainer)]
        assert [(c.version, c.reasons) for c in convictions] == [(2, (fault,))], fault
        assert node.version == 1 and not node.follows(2)
        later = chain(4)[3]
        # Stored (an audit's evidence) and ignored from now on.
        assert node.handle(P.PolicyAnnounced(later)) == [P.PersistPolicy(later)] and 3 not in node.policies


def test_training_on_a_group_the_trainer_itself_failed_a_round_earlier_is_fraud():
    bad = group(7, version=0)
    own_fail = SignedVerdict(TRAINER.node_id, WORKER.node_id, bad.digest, 0, 0, audit_ticket(TRAINER, bad.digest),
                             1.0, Outcome.HARD_FAIL, ("reward_mismatch",), h("digest"), PLATFORM).signed(TRAINER)
    node = verifier(step_audit_rate=0.0)
    feed(node, chain(2), (bad,))
    node.handle(P.VerdictReceived(own_fail))
    actions = feed(node, [chain(3, {2: (bad,)})[2]])
    (verdict,) = published_steps(actions)
    assert verdict.reasons == (StepFault.REJECTED_GROUP,) and node.convicted.version == 2


def test_a_fail_the_trainer_signed_in_the_steps_own_round_is_not_evidence():
    """An honest trainer may re-check a group it already trained on (a late failure report):
    a fail signed while the parent was current may follow the step, so it proves nothing."""
    g = group(7, version=1)
    late = SignedVerdict(TRAINER.node_id, WORKER.node_id, g.digest, 1, 1, audit_ticket(TRAINER, g.digest), 1.0,
                         Outcome.HARD_FAIL, ("reward_mismatch",), h("digest"), PLATFORM).signed(TRAINER)
    node = verifier(step_audit_rate=0.0)
    feed(node, chain(2), (g,))
    node.handle(P.VerdictReceived(late))
    assert published_steps(feed(node, [chain(3, {2: (g,)})[2]])) == [] and node.convicted is None


def test_a_group_older_than_max_staleness_in_a_batch_is_fraud():
    old = group(3, version=0)
    node = verifier(step_audit_rate=0.0, max_staleness=1)
    actions = feed(node, chain(4, {3: (old,)}), (old,))
    assert [v.reasons for v in published_steps(actions)] == [(StepFault.STALE_GROUP,)]


def test_a_long_forgotten_group_in_a_batch_is_still_stale_and_rejected_where_it_was_held():
    """vrl.node.forgetting: a node forgets the groups below version - 2 max_staleness - 1 with
    their verdicts, but keeps each one's version and the trainer's own hard fail on it, so the
    step rules still find a forgotten group stale (and rejected), not missing (specs/training.md §5)."""
    old = group(3, version=0)
    own_fail = SignedVerdict(TRAINER.node_id, WORKER.node_id, old.digest, 0, 0, audit_ticket(TRAINER, old.digest),
                             1.0, Outcome.HARD_FAIL, ("reward_mismatch",), h("digest"), PLATFORM).signed(TRAINER)
    node = verifier(step_audit_rate=0.0, max_staleness=1)
    feed(node, chain(1), (old,))
    node.handle(P.VerdictReceived(own_fail))
    node.handle(P.Checked(old.digest, ("reward_mismatch",), h("digest")))  # its own check ends: none under way
    assert published_steps(feed(node, chain(7)[1:])) == []
    assert old.digest not in node.groups and old.digest not in node.verdicts  # forgotten: version 0 < 6 - 3
    assert node.forgotten[old.digest] == 0 and node.group_version(old.digest) == 0
    # Stored as it came, and never taken again.
    assert node.handle(P.GroupReceived(old, 0.0)) == [P.PersistGroup(old, 0.0)] and old.digest not in node.groups
    actions = feed(node, [chain(8, {7: (old,)})[7]])
    assert [v.reasons for v in published_steps(actions)] == [(StepFault.REJECTED_GROUP, StepFault.STALE_GROUP)]
    assert not [a for a in actions if isinstance(a, P.FetchGroup)]  # not looked for as a missing group


def test_a_replay_mismatch_on_the_trainers_own_platform_convicts_alone():
    g = group(1)
    node = verifier(step_audit_rate=1.0)
    feed(node, chain(2, {1: (g,)}), (g,))
    actions = node.handle(P.StepReplayed(1, (StepFault.WEIGHTS_MISMATCH,), h("replayed"), 0.3))
    assert [type(a).__name__ for a in actions][:2] == ["Publish", "ConvictTrainer"]


def test_on_another_platform_a_mismatch_needs_a_second_reporter_whose_word_counts():
    g = group(1)
    elsewhere = "torch-2.13.0/cpu-AVX2/float32/default/threads-2"
    node = verifier(step_audit_rate=1.0, platform=elsewhere)
    announcements = chain(2, {1: (g,)})
    feed(node, announcements, (g,))
    node.handle(P.StepReplayed(1, (StepFault.WEIGHTS_MISMATCH,), h("replayed"), 0.3))
    assert node.convicted is None  # tolerance-based evidence alone is not enough
    stranger = StepVerdict(WORKER.node_id, TRAINER.node_id, 1, announcements[1].id, StepOutcome.FRAUD,
                           (StepFault.WEIGHTS_MISMATCH,), h("replayed"), 0.3, PLATFORM).signed(WORKER)
    node.handle(P.StepVerdictReceived(stranger))
    assert node.convicted is None  # a stranger's word counts for nothing
    anchor = StepVerdict(OTHER.node_id, TRAINER.node_id, 1, announcements[1].id, StepOutcome.FRAUD,
                         (StepFault.WEIGHTS_MISMATCH,), h("replayed"), 0.3, PLATFORM).signed(OTHER)
    trusting = verifier(step_audit_rate=1.0, platform=elsewhere, pretrusted={OTHER.node_id})
    feed(trusting, announcements, (g,))
    trusting.handle(P.StepVerdictReceived(anchor))
    trusting.handle(P.StepReplayed(1, (StepFault.WEIGHTS_MISMATCH,), h("replayed"), 0.3))
    assert trusting.convicted is not None and trusting.convicted.reporters == (VERIFIER.node_id, OTHER.node_id)


def test_a_fraud_report_that_counts_makes_a_verifier_replay_a_step_it_did_not_draw():
    g = group(1)
    announcements = chain(2, {1: (g,)})
    node = verifier(step_audit_rate=0.0, pretrusted={OTHER.node_id})
    assert replays(feed(node, announcements, (g,))) == []
    report = StepVerdict(OTHER.node_id, TRAINER.node_id, 1, announcements[1].id, StepOutcome.FRAUD,
                         (StepFault.WEIGHTS_MISMATCH,), h("replayed"), 0.3, PLATFORM).signed(OTHER)
    assert [type(a).__name__ for a in node.handle(P.StepVerdictReceived(report))] == ["PersistStep", "ReplayStep"]
    stranger_only = verifier(step_audit_rate=0.0)
    feed(stranger_only, announcements, (g,))
    assert replays(stranger_only.handle(P.StepVerdictReceived(report))) == []


def test_a_step_verdict_naming_another_announcement_or_an_unknown_version_is_dropped():
    announcements = chain(2)
    node = verifier(step_audit_rate=0.0)
    feed(node, announcements)
    forged = StepVerdict(OTHER.node_id, TRAINER.node_id, 1, h("not the announcement"), StepOutcome.FRAUD,
                         (StepFault.WEIGHTS_MISMATCH,), b"", 0.0, PLATFORM).signed(OTHER)
    future = StepVerdict(OTHER.node_id, TRAINER.node_id, 9, h("x"), StepOutcome.PASS, (), b"", 0.0,
                         PLATFORM).signed(OTHER)
    assert node.handle(P.StepVerdictReceived(forged)) == [] and node.handle(P.StepVerdictReceived(future)) == []


def test_a_batch_group_nobody_serves_is_fraud_after_step_wait_but_never_convicts_alone():
    ghost = group(99)  # listed in the batch, never gossiped
    node = verifier(step_audit_rate=1.0, step_wait=30.0)
    feed(node, chain(2, {1: (ghost,)}))
    assert published_steps(node.handle(P.Tick(10.0))) == []
    (verdict,) = published_steps(node.handle(P.Tick(31.0)))
    assert verdict.reasons == (StepFault.UNAVAILABLE_GROUP,) and node.convicted is None


def test_step_state_that_cannot_be_fetched_is_asked_for_again_at_the_next_tick_then_is_fraud():
    """A replay whose config or optimizer files cannot be had: no verdict and no new replay at
    once (a fetch that fails at once would loop), the replay again at the next tick, and fraud
    once the trainer has had step_wait to serve them."""
    g = group(1)
    node = verifier(step_audit_rate=1.0, step_wait=30.0)
    assert replays(feed(node, chain(2, {1: (g,)}), (g,))) == [1]
    assert node.handle(P.StepStateMissing(1)) == []
    assert replays(node.handle(P.Tick(1.0))) == [1]
    node.handle(P.Tick(31.0))
    (verdict,) = published_steps(node.handle(P.StepStateMissing(1)))
    assert verdict.reasons == (StepFault.UNAVAILABLE_STATE,)


def test_a_node_replaying_its_log_reaches_the_same_conviction():
    node = verifier(step_audit_rate=0.0)
    announcements = chain(3, changes={2: {"parent": h("x")}})
    actions = feed(node, announcements)
    (mine,) = published_steps(actions)
    restarted = verifier(step_audit_rate=0.0)
    for a in announcements:
        restarted.handle(P.PolicyAnnounced(a), replaying=True)
    restarted.handle(P.StepVerdictReceived(mine), replaying=True)
    assert restarted.convicted == node.convicted and restarted.version == 1


def test_the_rules_see_a_batch_group_and_the_trainers_fail_that_arrive_after_the_step():
    """The step judge keeps each step's rule faults incrementally (vrl.node.steps._Rules): what
    arrives after the announcement (a stale batch group, the trainer's own earlier fail) is
    found as if it had been there first, and equals step_rule_faults over the same state."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    old, failed, fine = group(3, version=0), group(7, version=1), group(9, version=2)
    own_fail = SignedVerdict(TRAINER.node_id, WORKER.node_id, failed.digest, 1, 1,
                             audit_ticket(TRAINER, failed.digest), 1.0, Outcome.HARD_FAIL, ("reward_mismatch",),
                             h("digest"), PLATFORM).signed(TRAINER)
    announcements = chain(4, {3: (old, failed, fine)})
    events = [P.GroupReceived(old, 0.0), P.GroupReceived(failed, 0.0), P.GroupReceived(fine, 0.0),
              P.VerdictReceived(own_fail)]

    @settings(max_examples=30, deadline=None)
    @given(st.permutations(range(len(events))), st.integers(0, len(events)))
    def check(order, announced_after):
        node = verifier(step_audit_rate=0.0, max_staleness=1)
        feed(node, announcements[:3])
        judged = []
        for position, i in enumerate(order):
            if position == announced_after:
                feed(node, announcements[3:])
            node.handle(events[i])
            if 3 in node.policies:
                a = node.policies[3]
                fails = {d: v.round for d, _ in a.batch if (v := node.verdicts.get(d, {}).get(TRAINER.node_id))
                         and v.outcome == Outcome.HARD_FAIL}
                versions = {d: node.groups[d].version for d, _ in a.batch if d in node.groups}
                want = P.step_rule_faults(a, node.policies[2], a.batch, versions, fails, 1)
                judged.append((node.steps._rule_faults(a, node), want))
        if announced_after == len(events):
            feed(node, announcements[3:])
        a = node.policies[3]
        assert all(got == want for got, want in judged)
        assert node.steps._rule_faults(a, node) == (StepFault.REJECTED_GROUP, StepFault.STALE_GROUP)

    check()


# -- a batch in a file (specs/network.md §3.3.1): fetched by the step's replayers only ---------------


def in_file(a: PolicyAnnouncement) -> PolicyAnnouncement:
    """``a`` as a committee network's trainer announces it: its batch in a batch file."""
    file = BatchFile(a.trainer, a.version, a.batch).to_bytes()
    return dataclasses.replace(a, batch=(), batch_file=hashlib.sha256(file).digest(),
                               batch_size=len(file)).signed(TRAINER)


def fetches(actions: list) -> list[int]:
    return [a.announcement.version for a in actions if isinstance(a, P.FetchBatch)]


def test_a_batch_in_a_file_is_fetched_by_a_replayer_alone_and_then_judged_as_if_listed():
    g = group(1)
    listed = chain(2, {1: (g,)})
    named = [listed[0], in_file(listed[1])]
    idle = verifier(step_audit_rate=0.0)
    actions = feed(idle, named, (g,)) + idle.handle(P.Tick(100.0))
    assert fetches(actions) == [] and published_steps(actions) == [] and idle.batch_of(1) is None
    node = verifier(step_audit_rate=1.0)
    actions = feed(node, named, (g,))
    assert fetches(actions) == [1] and replays(actions) == []
    assert fetches(node.handle(P.Tick(1.0))) == []  # one fetch under way at a time
    actions = node.handle(P.BatchFetched(named[1], listed[1].batch))
    assert replays(actions) == [1] and node.batch_of(1) == listed[1].batch
    (verdict,) = published_steps(node.handle(P.StepReplayed(1, (), h("model-1"), 0.0)))
    assert verdict.outcome == StepOutcome.PASS and verdict.announcement == named[1].id


def test_a_stale_group_in_a_batch_file_is_fraud_found_by_the_replayer_once_it_has_the_file():
    old = group(3, version=0)
    listed = chain(4, {3: (old,)})
    named = [*listed[:3], in_file(listed[3])]
    node = verifier(step_audit_rate=1.0, max_staleness=1)
    actions = feed(node, named, (old,))
    assert fetches(actions) == [3] and not [v for v in published_steps(actions) if v.version == 3]
    actions = node.handle(P.BatchFetched(named[3], listed[3].batch))
    assert [v.reasons for v in published_steps(actions)] == [(StepFault.STALE_GROUP,)]
    node.handle(P.Tick(1.0))
    assert node.convicted is not None and node.convicted.version == 3  # self-evident


def test_a_batch_file_that_is_no_batch_of_its_announcement_convicts_and_one_not_served_is_unavailable():
    g = group(1)
    listed = chain(2, {1: (g,)})
    named = [listed[0], in_file(listed[1])]
    node = verifier(step_audit_rate=1.0)
    feed(node, named, (g,))
    (verdict,) = published_steps(node.handle(P.BatchFetched(named[1], None)))
    assert verdict.reasons == (StepFault.BAD_BATCH,) and node.convicted.version == 1  # self-evident
    node = verifier(step_audit_rate=1.0, step_wait=30.0)
    assert fetches(feed(node, named, (g,))) == [1]
    # Asked again once abandoned: the daemon backs off before it reports Abandoned (Node._fetch_failed).
    node.handle(P.Tick(1.0))
    assert fetches(node.handle(P.Abandoned(P.FetchBatch(named[1])))) == [1]
    assert fetches(node.handle(P.Tick(5.0))) == []
    # step_wait after the announcement, but a fetch is under way and the first failure was at 1 s.
    assert published_steps(node.handle(P.Tick(31.0))) == []
    (verdict,) = published_steps(node.handle(P.Abandoned(P.FetchBatch(named[1]))))
    assert verdict.reasons == (StepFault.UNAVAILABLE_STATE,) and node.convicted is None  # needs a second reporter
    # A node whose first try comes after step_wait (it was loading weights) gives the trainer
    # step_wait from that try: one timed-out request is not fraud.
    node = verifier(step_audit_rate=1.0, step_wait=30.0)
    feed(node, named, (g,))
    node.handle(P.Tick(40.0))
    assert published_steps(node.handle(P.Abandoned(P.FetchBatch(named[1])))) == []
    node.handle(P.Tick(69.0))
    assert published_steps(node.handle(P.Abandoned(P.FetchBatch(named[1])))) == []
    node.handle(P.Tick(70.0))
    (verdict,) = published_steps(node.handle(P.Abandoned(P.FetchBatch(named[1]))))
    assert verdict.reasons == (StepFault.UNAVAILABLE_STATE,)
    # A file fetched for another announcement of the version (an equivocation) is not taken.
    other = dataclasses.replace(named[1], optimizer_size=101).signed(TRAINER)
    node = verifier(step_audit_rate=1.0)
    feed(node, named, (g,))
    assert node.handle(P.BatchFetched(other, listed[1].batch)) == [] and node.batch_of(1) is None


def test_a_batch_file_that_comes_late_leaves_its_groups_their_own_step_wait():
    """unavailable_group counts step_wait from when the batch's digests were known (specs/training.md
    §5): a replayer cannot fetch a group it cannot name."""
    ghost = group(99)  # listed, served by nobody
    listed = chain(2, {1: (ghost,)})
    named = [listed[0], in_file(listed[1])]
    node = verifier(step_audit_rate=1.0, step_wait=30.0)
    assert fetches(feed(node, named)) == [1]
    node.handle(P.Tick(25.0))
    assert published_steps(node.handle(P.BatchFetched(named[1], listed[1].batch))) == []
    assert published_steps(node.handle(P.Tick(31.0))) == []  # 30 s after the announcement, 6 after the file
    (verdict,) = published_steps(node.handle(P.Tick(55.5)))
    assert verdict.reasons == (StepFault.UNAVAILABLE_GROUP,) and node.convicted is None


def test_a_committee_replayer_calls_a_batch_group_unavailable_step_wait_after_its_first_failed_fetch():
    """In a committee network a replayer fetches the batch's groups by digest (specs/network.md
    §3.5); unavailable_group counts step_wait from its first fetch that failed, not from the
    announcement: a devnet replayer busy loading weights for 30 s must not report the trainer
    on its first try (specs/training.md §5)."""
    ghost = group(99)  # listed, served by nobody
    listed = chain(2, {1: (ghost,)})
    named = [listed[0], in_file(listed[1])]
    node = verifier(step_audit_rate=1.0, step_wait=30.0, verification="committee")
    assert fetches(feed(node, named)) == [1]
    actions = node.handle(P.BatchFetched(named[1], listed[1].batch))
    actions += node.handle(P.Tick(1.0))
    assert [a.digest for a in actions if isinstance(a, P.FetchGroup)] == [ghost.digest]
    assert published_steps(node.handle(P.Tick(31.0))) == []  # 31 s after the file, but never asked in vain
    node.handle(P.Abandoned(P.FetchGroup(ghost.digest, 0)))
    assert published_steps(node.handle(P.Tick(60.0))) == []  # 29 s after the failed fetch
    (verdict,) = published_steps(node.handle(P.Tick(61.5)))
    assert verdict.reasons == (StepFault.UNAVAILABLE_GROUP,) and node.convicted is None


def test_a_replayer_takes_a_batch_group_older_than_the_groups_it_receives():
    """specs/network.md §3.1: a node receives groups of its last max_staleness versions, but a
    step it still judges may list groups max_staleness + 1 versions older than the step. A
    replayer at version 4 judging step 3, whose batch lists a group of version 0, takes that
    group (and no other of version 0): refusing it made honest replayers of a 12-node devnet
    report their trainer's steps unavailable_group while the trainer served the group."""
    old, other = group(1, version=0), group(2, version=0)
    node = verifier(step_audit_rate=1.0)
    feed(node, chain(5, {3: (old,)}))
    assert node.version == 4 and not node.may_hold(0)
    assert node.takes_group(0, old.digest) and not node.takes_group(0, other.digest)
    actions = node.handle(P.GroupReceived(old, 1.0))
    assert node.group_version(old.digest) == 0
    assert [a.announcement.version for a in actions if isinstance(a, P.ReplayStep)] == [3]  # its batch is whole
