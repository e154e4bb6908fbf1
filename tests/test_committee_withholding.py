"""Withholding and floods in the committee design's protocol (specs/committee.md §7): the trainer,
which holds a round's lists, charges its cut-short workers withheld slots, and a worker sees
for itself which of its groups were left out; an honest worker that went offline is absent, not
withholding; the manifest leaves out whole workers, never part of one; and a flood of fresh keys
costs an honest node no signature, no proof check, no stored state and no honest waiting verdict."""

from __future__ import annotations

import dataclasses

from proofs import vrf
from tests.test_protocol import announcement
from tests.test_protocol_committee import (
    ANCHORS,
    TRAINER,
    VERIFIERS,
    WORKER,
    checked,
    committee,
    groups,
    lists,
    node,
    ready,
    round_zero,
    seats,
    served,
    verifier,
)
from vrl.node import protocol as P
from vrl.node.messages import TOPIC_MANIFESTS, Group, RoundManifest, Submission
from vrl.node.reputation import ReputationConfig, Withheld
from vrl.node.rounds import REPUTATION_EVERY_SECONDS, Rounds
from vrl.rollouts.keys import NodeKey

OTHER = NodeKey.from_seed(b"O" * 32)


def close(trainer: P.NodeProtocol, at: float) -> RoundManifest | None:
    published = [a for a in trainer.handle(P.Tick(at)) if isinstance(a, P.Publish) and a.topic == TOPIC_MANIFESTS]
    return RoundManifest.from_bytes(published[0].data) if published else None


def test_a_worker_cut_short_pays_per_missing_slot_at_the_trainer_sees_what_was_left_out_and_is_never_quarantined():
    trainer = node(TRAINER, "trainer", submission_window=5.0)
    ready(trainer)
    for event in groups(2) + groups(4, subject=OTHER):
        trainer.handle(event)
    manifest = close(trainer, 6.0)
    assert manifest is not None and dict(lists(trainer).workers) == {WORKER.node_id: 2, OTHER.node_id: 4}
    expected = [Withheld(0, WORKER.node_id, 2, 2)]
    assert trainer.reputation.withheld() == expected
    # A member holds the header alone: the workers list is behind its root (specs/committee.md
    # §7.1), so the records are the trainer's and the audit's (tests/test_reputation_withheld.py).
    member = node(VERIFIERS[0], "verifier")
    ready(member)
    served(member, trainer, member.handle(P.ManifestReceived(manifest, 7.0)))
    member.handle(P.ManifestReceived(manifest, 8.0))
    assert member.reputation.withheld() == [] and trainer.rounds.omitted[0] == {}
    # The worker made all four, and asks by key whether each is listed: the two left out are its
    # own evidence of framing (specs/committee.md §3.5, §7.1), which it can show, not prove.
    worker = node(WORKER, "worker")
    ready(worker)
    for event in groups(4):
        worker.handle(event)
    asked = [a for a in worker.handle(P.ManifestReceived(manifest, 7.0)) if isinstance(a, P.FetchEntries)]
    assert [(a.list, len(a.keys), a.positions) for a in asked] == [("groups", 4, ())]
    served(worker, trainer, asked)
    assert worker.rounds.omitted[0] == {WORKER.node_id: 2}
    assert sorted(worker.rounds.listed(e.group.digest, 0) for e in groups(4)) == [False, False, True, True]
    assert not [a for a in worker.handle(P.Tick(9.0)) if isinstance(a, P.FetchEntries)]  # asked once
    # Reputation is evaluated at batch boundaries (specs/committee.md §8): the trainer's
    # evaluation at the close takes the records in.
    member.handle(P.Tick(7.0 + REPUTATION_EVERY_SECONDS))
    floor = 2 * ReputationConfig().withheld_weight
    for view in (trainer,):
        assert view.standing(WORKER.node_id).failures == floor  # no passes yet: the floor per slot
        assert view.standing(OTHER.node_id).failures == 0
        assert WORKER.node_id not in view.quarantined and not view.standing(WORKER.node_id).quarantined
    assert member.standing(WORKER.node_id).failures == 0
    # Once its listed groups earn passes, a missing slot weighs what a listed one earned.
    for digest in lists(trainer).groups:
        if trainer.groups[digest].subject != WORKER.node_id:
            continue
        for key in VERIFIERS:
            if digest in seats(key, trainer, committee.Draw.COMMITTEE):
                proto, _ = verifier(key, manifest, groups(2) + groups(4, subject=OTHER), trainer)
                trainer.handle(P.VerdictReceived(checked(proto, digest)))
    trainer.handle(P.Tick(6.0 + 2 * REPUTATION_EVERY_SECONDS))  # its next evaluation, after the verdicts
    worker = trainer.standing(WORKER.node_id)
    assert worker.passes > 0 and worker.failures == max(floor, worker.passes)  # 2 of 2 listed, 2 missing
    assert not worker.quarantined


def test_an_honest_worker_that_goes_offline_is_absent_not_withholding():
    trainer = node(TRAINER, "trainer", submission_window=5.0)
    ready(trainer)
    for event in groups(4) + groups(4, subject=OTHER):
        trainer.handle(event)
    assert close(trainer, 6.0) is not None
    # Round 1: WORKER left (churn) before generating; OTHER submits as usual.
    trainer.handle(P.Tick(10.0))
    trainer.handle(P.PolicyAnnounced(announcement(1)))
    trainer.handle(P.PolicyLoaded(1))
    for i in range(4):  # (other bytes than round 0's, so other digests)
        trainer.handle(P.GroupReceived(Group(Submission((b"round 1 group %d" % i,)), (), OTHER.node_id, 1, i), 11.0))
    # The trainer waits for a worker of the last manifest until submission_window, then closes
    # without it: absent, so no withheld slot, and no standing lost.
    assert close(trainer, 12.0) is None
    manifest = close(trainer, 16.0)
    assert manifest is not None and dict(lists(trainer, 1).workers) == {OTHER.node_id: 4}
    assert trainer.reputation.withheld() == []
    assert trainer.standing(WORKER.node_id).failures == 0 and not trainer.standing(WORKER.node_id).quarantined
    assert not trainer.quarantined


def test_past_its_capacity_the_manifest_leaves_out_whole_workers_lowest_rank_first(monkeypatch):
    """At a capacity of 4,096 entries a list (2^18 in the protocol: too slow a flood for a unit
    test, the same rule)."""
    monkeypatch.setattr(committee, "MAX_PAGED_ENTRIES", 4096)
    rounds = Rounds(TRAINER, TRAINER.node_id)
    established = b"\xff" * 32  # last by node id, first by rank
    fresh = [i.to_bytes(2, "big") * 16 for i in range(1100)]  # a flood: 1,100 workers of 4 groups
    offered = [(bytes([j]) + w[1:], w) for w in [*fresh, established] for j in range(4)]
    rounds.close(0, 3, offered, {VERIFIERS[0].node_id: 1.0}, 0.0, rank=lambda w: (w != established, w))
    content = rounds.lists[0].content
    listed = dict(content.workers)
    assert listed[established] == 4  # never pushed out by keys that rank below it
    assert all(count == 4 for count in listed.values())  # nobody cut short: no one framed as withholding
    assert len(content.groups) == 4 * len(listed) == 4096


def test_a_flood_waiting_for_the_manifest_never_pushes_out_a_weighted_members_verdict():
    """Before its round's manifest a verdict may wait (handed in by backfill or a simulator;
    gossip ignores it, specs/committee.md §4 step 1): a flood of fresh keys' claims fills the
    buffer and is evicted first; once the manifest is held each is refused on the table lookup,
    and the member's verdict counts."""
    trainer, manifest, received = round_zero()
    key = next(k for k in VERIFIERS if seats(k, trainer, committee.Draw.COMMITTEE))
    member, _ = verifier(key, manifest, received, trainer)
    digest = sorted(seats(key, trainer, committee.Draw.COMMITTEE))[0]
    honest = checked(member, digest)
    view = node(VERIFIERS[-1] if key != VERIFIERS[-1] else VERIFIERS[0], "verifier")  # a node without the manifest
    ready(view)
    for event in received:
        view.handle(event)
    view.handle(P.VerdictReceived(honest))
    assert view.waiting_verdicts == 1
    reports = len(view.reputation.reports())
    stranger = NodeKey.from_seed(b"s" * 32)
    junk = dataclasses.replace(honest, verifier=stranger.node_id, signature=bytes(64), pi=bytes(80))
    for i in range(P.MAX_PENDING_VERDICTS + 100):
        view.handle(P.VerdictReceived(dataclasses.replace(junk, round=i)))
    assert view.waiting_verdicts == P.MAX_PENDING_VERDICTS and honest.id in view.waiting
    actions = view.handle(P.ManifestReceived(manifest, 3.0))
    assert P.Persist(honest) in actions and view.waiting_verdicts == 0
    assert set(view.verdicts[digest]) == {key.node_id}
    assert len(view.reputation.reports()) == reports + 1  # the flood left no report


def test_a_fresh_keys_claims_cost_no_signature_no_proof_and_no_state_once_the_manifest_is_held():
    """The per-key bound of specs/committee.md §7: each verdict is refused at step 2, so neither
    a bad signature nor a bad proof is ever reached (it would be named), nothing is stored."""
    trainer, manifest, received = round_zero()
    strangers = [NodeKey.from_seed(b"k%07d" % i + bytes(24)) for i in range(50)]
    template = checked_template(trainer, manifest, received)
    before = (len(trainer.reputation.reports()), sum(len(v) for v in trainer.verdicts.values()))
    for stranger in strangers:
        pi = vrf.prove(stranger.private_seed(), manifest.header.alpha(committee.Draw.COMMITTEE))
        for digest in lists(trainer).groups:
            for claim in ({"draw": "committee", "pi": pi}, {"draw": "recheck", "pi": bytes(80)}):
                verdict = dataclasses.replace(template, verifier=stranger.node_id,
                                              group=digest, signature=bytes(64), **claim)
                assert trainer.verdict_refusal(verdict) == "not_eligible"
                assert trainer.handle(P.VerdictReceived(verdict)) == []
    assert (len(trainer.reputation.reports()), sum(len(v) for v in trainer.verdicts.values())) == before
    assert trainer.waiting_verdicts == 0 and all(s.node_id not in ANCHORS for s in strangers)


def checked_template(trainer: P.NodeProtocol, manifest: RoundManifest, received: list):
    key = next(k for k in VERIFIERS if seats(k, trainer, committee.Draw.COMMITTEE))
    proto, _ = verifier(key, manifest, received, trainer)
    return checked(proto, sorted(seats(key, trainer, committee.Draw.COMMITTEE))[0])
