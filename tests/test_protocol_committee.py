"""The committee design in the node protocol (specs/committee.md): the trainer's manifest, the
members' checks and claims, re-checks by a fresh committee, the trainer's fallback, and hostile
claims (a forged proof, a seat one was not drawn for, a flood of fresh keys)."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from proofs import vrf
from tests.test_protocol import announcement, endorse, submission, verdict_from
from tests.test_protocol import node as ticket_node
from vrl.node import committee
from vrl.node import protocol as P
from vrl.node import rounds as routing
from vrl.node.admission import AdmissionConfig, Candidate, admit
from vrl.node.events import Send
from vrl.node.messages import (
    TOPIC_MANIFESTS,
    TOPIC_VERDICTS,
    Group,
    RoundManifest,
    SignedVerdict,
    Submission,
    audit_ticket,
)
from vrl.node.requests import EntriesAnswer, EntriesRequest
from vrl.rollouts.keys import NodeKey

TRAINER = NodeKey.from_seed(b"T" * 32)
WORKER = NodeKey.from_seed(b"W" * 32)
VERIFIERS = [NodeKey.from_seed(bytes([65 + i]) * 32) for i in range(6)]
ANCHORS = frozenset(k.node_id for k in VERIFIERS)  # weight 1 each in every view: all eligible
RACE_LOSS_RATE = 1e-3
K = 3  # half the verifiers per group: some groups each way for every verifier


def node(key: NodeKey, *roles: str, **options) -> P.NodeProtocol:
    options = {"verification": "committee", "committee_size": K, "pretrusted": ANCHORS, **options}
    config = P.ProtocolConfig(roles=frozenset(roles), trainer=TRAINER.node_id, **options)
    return P.NodeProtocol(key, config, platform="test", race_loss_rate=RACE_LOSS_RATE)


def ready(proto: P.NodeProtocol, version: int = 0) -> None:
    proto.handle(P.PolicyAnnounced(announcement(version)))
    proto.handle(P.PolicyLoaded(version))


def groups(count: int = 4, subject: NodeKey = WORKER, version: int = 0) -> list[P.GroupReceived]:
    return [P.GroupReceived(Group(Submission((b"group %d of " % i + subject.node_id,)), (), subject.node_id, version,
                                  i), 1.0) for i in range(count)]


def round_zero(seat_rule: int = committee.SEAT_RULE,
               **trainer_options) -> tuple[P.NodeProtocol, RoundManifest, list[P.GroupReceived]]:
    """The trainer, its round-0 groups, and the manifest it signs once all four are in, under
    ``seat_rule`` (1: an older trainer's)."""
    trainer = node(TRAINER, "trainer", admission=AdmissionConfig(batch_groups=4, trusted_share=0.0, node_cap=1.0),
                   **trainer_options)
    trainer.rounds.seat_rule = seat_rule
    ready(trainer)
    received = groups()
    def manifests(actions: list) -> list:
        return [a for a in actions if isinstance(a, P.Publish) and a.topic == TOPIC_MANIFESTS]

    for event in received:
        assert manifests(trainer.handle(event)) == []  # open until every expected group is in
    assert manifests(trainer.handle(P.Tick(4.0))) == []  # ... and none came for verdict_wait
    (announce,) = manifests(trainer.handle(P.Tick(6.0)))
    return trainer, RoundManifest.from_bytes(announce.data), received


def lists(trainer: P.NodeProtocol, round_: int = 0) -> committee.ManifestContent:
    """The lists behind the trainer's manifest of ``round_`` (specs/committee.md §3.1)."""
    return trainer.rounds.lists[round_].content


def served(proto: P.NodeProtocol, trainer: P.NodeProtocol, actions: list) -> list:
    """``actions`` with each entries request answered by the trainer (specs/committee.md §3.5) and
    fed back, as the daemon does, until none is left: what the answers led to, besides."""
    out: list = []
    for _ in range(100):  # bounded: each answer proves entries, asked once
        fetches = [a for a in actions if isinstance(a, P.FetchEntries)]
        out += [a for a in actions if not isinstance(a, P.FetchEntries)]
        if not fetches:
            return out
        actions = []
        for fetch in fetches:
            request = EntriesRequest(fetch.round, committee.List(fetch.list), fetch.positions, fetch.keys)
            answer = EntriesAnswer.of(trainer.rounds.answer(request))
            actions += proto.handle(P.EntriesReceived(fetch, answer))
    raise AssertionError("entries asked without end")


def verifier(key: NodeKey, manifest: RoundManifest, received: list,
             trainer: P.NodeProtocol) -> tuple[P.NodeProtocol, list]:
    proto = node(key, "verifier")
    ready(proto)
    for event in received:
        assert [a for a in proto.handle(event) if isinstance(a, P.Check)] == []  # no draw before the manifest
    actions = served(proto, trainer, proto.handle(P.ManifestReceived(manifest, 2.0)))
    return proto, actions


def seats(key: NodeKey, trainer: P.NodeProtocol, draw: committee.Draw, round_: int = 0) -> set[bytes]:
    """The groups ``key`` sits on, from the spec's formulas alone (specs/committee.md §2)."""
    content = lists(trainer, round_)
    header = committee.PagedManifest(content).header
    beta = vrf.proof_to_hash(vrf.prove(key.private_seed(), header.alpha(draw)))
    threshold = header.threshold(content.weights.weight(key.node_id))
    return {content.groups[i] for i in range(header.groups)
            if committee.seat_value(beta, i, content.seat_rule) < threshold}


def checked(proto: P.NodeProtocol, digest: bytes, reasons: tuple[str, ...] = ()) -> SignedVerdict:
    """The verdict a check makes: a pass sent to the trainer alone, a failure gossiped
    (specs/network.md §3.5)."""
    actions = proto.handle(P.Checked(digest, reasons, b"\x09" * 32))
    if proto.has("trainer") and not reasons:  # the trainer's own pass is stored, sent to no one
        (persist,) = [a for a in actions if isinstance(a, P.Persist)]
        return persist.verdict
    (out,) = [a for a in actions if isinstance(a, P.Publish | Send)]
    assert out.topic == TOPIC_VERDICTS
    verdict = SignedVerdict.from_bytes(out.data)
    assert isinstance(out, Send) == (verdict.outcome == "pass")
    assert not isinstance(out, Send) or out.peer == proto.config.trainer
    return verdict


def test_the_trainer_closes_the_round_with_a_manifest_of_its_groups_and_the_eligible_weights():
    trainer, manifest, received = round_zero()
    assert manifest.valid() and manifest.trainer == TRAINER.node_id and manifest.round == 0
    assert lists(trainer).groups == tuple(sorted(e.group.digest for e in received))
    assert lists(trainer).workers == ((WORKER.node_id, 4),)
    assert dict(lists(trainer).weights.entries) == {k: committee.WEIGHT_SCALE for k in ANCHORS}  # never the trainer
    assert manifest.header == committee.PagedManifest(lists(trainer)).header  # the header commits the lists
    assert manifest.committee_size == K and trainer.rounds.manifests[0] == manifest
    # a group of the round that arrives after its manifest is never held, checked or trained
    late = groups(5)[4]
    trainer.handle(late)
    assert late.group.digest not in trainer.groups


def test_a_round_without_a_workers_group_stays_open_past_its_window_until_one_arrives():
    """An empty manifest would leave the round's groups untrainable when they come, and with
    no batch no version follows: the network would stall (vrl/node/rounds.py close_rounds)."""
    trainer = node(TRAINER, "trainer", submission_window=5.0)
    ready(trainer)

    def closed(actions: list) -> bool:
        return any(isinstance(a, P.Publish) and a.topic == TOPIC_MANIFESTS for a in actions)

    assert not closed(trainer.handle(P.Tick(60.0))) and 0 not in trainer.rounds.manifests
    late = groups(1)[0]
    assert closed(trainer.handle(P.GroupReceived(late.group, 61.0)))  # past the window: at once
    assert lists(trainer).groups == (late.group.digest,)


def test_the_window_closes_after_submission_window_without_every_group():
    trainer = node(TRAINER, "trainer", submission_window=5.0)
    ready(trainer)
    for event in groups(2):
        trainer.handle(event)
    trainer.handle(P.Tick(4.0))
    assert 0 not in trainer.rounds.manifests
    manifests = [a for a in trainer.handle(P.Tick(6.0)) if isinstance(a, P.Publish) and a.topic == TOPIC_MANIFESTS]
    assert len(manifests) == 1 and lists(trainer).workers == ((WORKER.node_id, 2),)
    assert lists(trainer).withheld(4) == {WORKER.node_id: 2}


def test_the_window_stays_open_past_submission_window_while_groups_arrive_but_not_past_the_grace():
    """A worker slow to get the version's weights is not counted as withholding while its groups
    still come (specs/committee.md §3.4); a trickle of groups cannot hold the window open past
    submission_window + submission_grace."""
    def closes(trainer: P.NodeProtocol, event) -> list:
        return [lists(trainer, RoundManifest.from_bytes(a.data).round) for a in trainer.handle(event)
                if isinstance(a, P.Publish) and a.topic == TOPIC_MANIFESTS]

    slow = groups(4, subject=VERIFIERS[0])
    trainer = node(TRAINER, "trainer", submission_window=5.0, submission_grace=10.0)
    ready(trainer)
    for event in groups(4):
        trainer.handle(event)  # at 1 s
    assert not closes(trainer, P.Tick(4.0)) + closes(trainer, P.GroupReceived(slow[0].group, 4.0))
    for at, late in ((5.5, slow[1]), (9.0, slow[2])):  # past the window (5 s), but groups still come
        assert not closes(trainer, P.Tick(at)) + closes(trainer, P.GroupReceived(late.group, at))
    (manifest,) = closes(trainer, P.Tick(13.1))  # none for verdict_wait (4 s): closed, the late ones listed
    assert dict(manifest.workers) == {WORKER.node_id: 4, VERIFIERS[0].node_id: 3}

    trainer = node(TRAINER, "trainer", submission_window=5.0, submission_grace=10.0)
    ready(trainer)
    trickle = groups(4) + groups(4, subject=VERIFIERS[0]) + groups(4, subject=VERIFIERS[1])
    for i, event in enumerate(trickle):  # one group every 1.5 s from 1 s: never quiet for 4 s
        at = 1.0 + 1.5 * i
        found = closes(trainer, P.Tick(at)) + closes(trainer, P.GroupReceived(event.group, at))
        if at < 15.0:
            assert not found, at
        else:
            assert found and len(found[0].groups) == i  # closed at 5 + 10 s, the trickle or not
            break
    else:
        raise AssertionError("the trickle ran out before the grace did")


@pytest.mark.parametrize("seat_rule", committee.SEAT_RULES)
def test_members_check_exactly_their_seats_and_their_claims_are_accepted(seat_rule):
    """Under either seat rule (specs/committee.md §2): rule 1's manifest is version 2 on the wire,
    as an older trainer signs it, and members follow the rule their manifest names."""
    trainer, manifest, received = round_zero(seat_rule)
    assert manifest.seat_rule == seat_rule and manifest.header.seat_rule == seat_rule
    assert msgpack.unpackb(manifest.to_bytes())["v"] == {1: 2, 2: 3}[seat_rule]
    for key in VERIFIERS:
        proto, actions = verifier(key, manifest, received, trainer)
        mine = seats(key, trainer, committee.Draw.COMMITTEE)
        assert {a.group for a in actions if isinstance(a, P.Check)} == mine
        assert isinstance(actions[0], P.PersistManifest)
        for digest in mine:
            verdict = checked(proto, digest)
            assert verdict.draw == "committee" and len(verdict.pi) == 80 and verdict.ticket == b"" and verdict.valid()
            assert P.drawn(verdict)
            assert trainer.verdict_refusal(verdict) is None
            assert P.Persist(verdict) in trainer.handle(P.VerdictReceived(verdict))
            assert trainer.decided(digest) is True  # a counting member's pass decides
    assert sum(len(seats(k, trainer, committee.Draw.COMMITTEE)) for k in VERIFIERS) > 0


def test_a_member_keeps_a_batch_of_checks_under_way_so_its_generation_is_not_queued_behind_its_seats():
    """In the bootstrap rounds of N = 1,000 the first eligible nodes each sat on 1,200-2,000
    groups; all asked at once, they queued ~85 s of checks ahead of the node's next generation on
    its one model thread, and its groups came after their round had closed (specs/committee.md
    §9). A member now asks for at most ``batch_groups`` checks at a time, the rest as those end."""
    producers = [WORKER] + [NodeKey.from_seed(bytes([90 + i]) * 32) for i in range(2)]
    received = [e for p in producers for e in groups(4, subject=p)]
    trainer = node(TRAINER, "trainer", committee_size=len(VERIFIERS))  # p_v = 1: every member on every group
    ready(trainer)
    for event in received:
        trainer.handle(event)
    trainer.handle(P.Tick(30.0))
    manifest = trainer.rounds.manifests[0]
    assert len(lists(trainer).groups) == 12

    member = node(VERIFIERS[0], "verifier", "worker", admission=AdmissionConfig(batch_groups=3))
    ready(member)
    for event in received:
        member.handle(event)
    asked = [a.group for a in served(member, trainer, member.handle(P.ManifestReceived(manifest, 31.0)))
             if isinstance(a, P.Check)]
    assert len(asked) == 3
    # A new version is due while three checks are under way: its generation waits behind three.
    member.handle(P.PolicyAnnounced(announcement(1)))
    assert any(isinstance(a, P.Generate) for a in member.handle(P.PolicyLoaded(1)))
    # A check that could not run (its producer out of reach) goes behind the nine seats waiting,
    # so a few such seats never hold every slot.
    stuck = asked.pop(0)
    again = [a.group for a in member.handle(P.Abandoned(P.Check(stuck, 0))) if isinstance(a, P.Check)]
    assert len(again) == 1 and again[0] != stuck
    asked += again
    done: list[bytes] = []
    while asked:  # bounded: each pass ends one check and asks for at most one more
        digest = asked.pop(0)
        done.append(digest)
        actions = member.handle(P.Checked(digest, (), b"\x09" * 32))
        asked += [a.group for a in actions if isinstance(a, P.Check)]
        assert len(asked) <= 3
    assert sorted(done) == sorted(lists(trainer).groups) and done[-1] == stuck  # every seat in the end, each once


def _member_and_verdict(trainer: P.NodeProtocol, manifest: RoundManifest,
                        received: list) -> tuple[NodeKey, bytes, SignedVerdict, bytes]:
    """A verifier, a group it sits on, its verdict on it, and a group it does not sit on."""
    for key in VERIFIERS:
        mine = seats(key, trainer, committee.Draw.COMMITTEE)
        others = set(lists(trainer).groups) - mine
        if mine and others:
            proto, _ = verifier(key, manifest, received, trainer)
            digest = sorted(mine)[0]
            return key, digest, checked(proto, digest), sorted(others)[0]
    raise AssertionError("no verifier with seats each way")


def test_the_trainer_re_checks_a_failure_that_comes_after_its_group_went_stale():
    """Where batches are smaller than a round, members' checks end after their round has gone
    stale. A failure then is still re-checked by the trainer while it holds the group and its
    version's weights: only its pass clears the group and charges the accuser (vrl.node.rounds
    late_rechecks); unchecked, a false accuser's late failures lowered honest scores for good."""
    trainer, manifest, received = round_zero()
    for key in VERIFIERS:
        mine = sorted(seats(key, trainer, committee.Draw.COMMITTEE))
        if mine:
            member, _ = verifier(key, manifest, received, trainer)
            accusation = checked(member, mine[0], ("reward_mismatch",))
            break
    for version in range(1, trainer.config.max_staleness + 2):
        ready(trainer, version)
    assert not trainer.fresh(0) and 0 in trainer.loaded
    asked = [a for a in trainer.handle(P.VerdictReceived(accusation)) if isinstance(a, P.Check)]
    assert asked == [P.Check(accusation.group, 0)]
    assert trainer.rounds.late_failures == {accusation.group}
    checked(trainer, accusation.group)  # its pass clears the group
    assert not [a for a in trainer.handle(P.Tick(100.0)) if isinstance(a, P.Check)]
    assert trainer.rounds.late_failures == set()


def test_a_forged_proof_and_a_claim_for_a_group_one_was_not_drawn_for_are_refused_with_their_reason():
    trainer, manifest, received = round_zero()
    key, digest, honest, not_mine = _member_and_verdict(trainer, manifest, received)
    forged = dataclasses.replace(honest, pi=honest.pi[:-1] + bytes([honest.pi[-1] ^ 1])).signed(key)
    stolen = dataclasses.replace(honest, pi=vrf.prove(VERIFIERS[0 if key != VERIFIERS[0] else 1].private_seed(),
                                                        manifest.header.alpha(committee.Draw.COMMITTEE))).signed(key)
    other_round = dataclasses.replace(honest, pi=vrf.prove(key.private_seed(), manifest.header.alpha(
        committee.Draw.RECHECK))).signed(key)
    # its true place and path, but a seat its output does not give it
    place = lists(trainer).groups.index(not_mine)
    undrawn = dataclasses.replace(honest, group=not_mine, seat=place, seat_path=trainer.rounds.lists[0].trees[
        committee.List.GROUPS].prove([place])).signed(key)
    moved = dataclasses.replace(honest, seat=place).signed(key)  # its own group, at another's place
    junk_path = dataclasses.replace(honest, seat_path=(b"\x00" * 32,)).signed(key)  # the trainer holds the lists too
    own_group = dataclasses.replace(honest, subject=key.node_id).signed(key)  # never a seat on its own group
    outsider = NodeKey.from_seed(b"x" * 32)
    fresh = dataclasses.replace(honest, verifier=outsider.node_id, pi=vrf.prove(
        outsider.private_seed(), manifest.header.alpha(committee.Draw.COMMITTEE))).signed(outsider)
    no_claim = dataclasses.replace(honest, draw="none", pi=b"", weight_at=0, weight=0, weight_path=()).signed(key)
    unlisted = dataclasses.replace(honest, group=b"\x00" * 32).signed(key)
    for verdict, reason in [(forged, "bad_proof"), (stolen, "bad_proof"), (other_round, "bad_proof"),
                            (undrawn, "not_drawn"), (fresh, "not_eligible"), (no_claim, None),
                            (unlisted, "not_in_manifest"), (moved, "not_in_manifest"),
                            (junk_path, "not_in_manifest"), (own_group, "not_drawn")]:
        assert trainer.verdict_refusal(verdict) == reason, reason
    # a verifier that is not a pre-trusted anchor of the receiver may not claim a check without a draw
    outside_view = node(WORKER, "verifier", pretrusted=frozenset())
    ready(outside_view)
    outside_view.handle(P.ManifestReceived(manifest, 2.0))
    assert outside_view.verdict_refusal(no_claim) == "no_claim"
    for verdict in (forged, stolen, other_round, undrawn, fresh, unlisted, moved, junk_path, own_group):
        assert not any(isinstance(a, P.Persist) for a in trainer.handle(P.VerdictReceived(verdict)))
        assert trainer.verdicts[verdict.group].get(verdict.verifier) is None  # nothing stored
    assert trainer.waiting_verdicts == 0
    # the honest one still counts after all of that
    assert P.Persist(honest) in trainer.handle(P.VerdictReceived(honest))


def test_a_verdict_of_the_other_design_is_refused():
    trainer, manifest, received = round_zero()
    _, _, honest, _ = _member_and_verdict(trainer, manifest, received)
    ticket_trainer = ticket_node(TRAINER, "trainer")
    assert ticket_trainer.verdict_refusal(honest) == "wrong_design"
    ticket = dataclasses.replace(honest, draw="ticket", pi=b"", ticket=audit_ticket(VERIFIERS[0], honest.group),
                                 verifier=VERIFIERS[0].node_id).signed(VERIFIERS[0])
    assert trainer.verdict_refusal(ticket) == "not_eligible"


def test_a_flood_of_fresh_keys_is_refused_before_its_signatures_and_loses_nothing_accepted():
    trainer, manifest, received = round_zero()
    key, digest, honest, _ = _member_and_verdict(trainer, manifest, received)
    assert P.Persist(honest) in trainer.handle(P.VerdictReceived(honest))
    flood = [NodeKey.from_seed(b"f%07d" % i + bytes(24)) for i in range(300)]
    for i, stranger in enumerate(flood):
        for d in lists(trainer).groups:
            # unsigned even: refused on the table lookup, before any signature is checked
            junk = dataclasses.replace(honest, verifier=stranger.node_id, group=d, signature=bytes(64), round=i)
            assert trainer.verdict_refusal(junk) == "not_eligible"
            assert trainer.handle(P.VerdictReceived(junk)) == []
    assert trainer.waiting_verdicts == 0
    assert set(trainer.verdicts[digest]) == {key.node_id}  # the accepted verdict is still there
    assert trainer.decided(digest) is True


def test_strangers_waiting_verdicts_never_push_out_a_verifier_with_weight():
    """Ticket design's buffer (specs/committee.md §7): a flood of fresh keys' verdicts on unseen
    groups evicts only strangers' verdicts."""
    trainer = ticket_node(TRAINER, "trainer")
    ready(trainer)
    endorse(trainer, VERIFIERS[0])
    weighty = [verdict_from(VERIFIERS[0], submission(10_000 + i), WORKER.node_id, "pass") for i in range(20)]
    for v in weighty:
        trainer.handle(P.VerdictReceived(v))
    stranger = NodeKey.from_seed(b"s" * 32)
    for i in range(P.MAX_PENDING_VERDICTS + 200):
        trainer.handle(P.VerdictReceived(verdict_from(stranger, submission(i), WORKER.node_id, "pass")))
    assert trainer.waiting_verdicts == P.MAX_PENDING_VERDICTS
    assert all(v.id in trainer.waiting for v in weighty)


def test_a_counting_failure_goes_to_the_fresh_recheck_committee_and_the_trainer():
    trainer, manifest, received = round_zero()
    # a member and one of its seats that some other verifier's fresh committee holds
    fresh_only = {o: seats(o, trainer, committee.Draw.RECHECK) - seats(o, trainer, committee.Draw.COMMITTEE)
                  for o in VERIFIERS}
    key, digest = next((k, d) for k in VERIFIERS for d in sorted(seats(k, trainer, committee.Draw.COMMITTEE))
                       if any(d in fresh_only[o] for o in VERIFIERS if o != k))
    proto, _ = verifier(key, manifest, received, trainer)
    accusation = checked(proto, digest, ("reward_mismatch",))
    assert accusation.outcome == "hard_fail" and accusation.draw == "committee"
    trainer_actions = trainer.handle(P.VerdictReceived(accusation))
    assert P.Check(digest, 0) in trainer_actions  # the trainer re-checks whatever its draw
    trainers = checked(trainer, digest, ("reward_mismatch",))
    assert trainers.draw == "none" and trainers.pi == b""
    rechecked, expected = 0, 0
    for other in VERIFIERS:
        if other == key:
            continue
        proto, _ = verifier(other, manifest, received, trainer)
        first = seats(other, trainer, committee.Draw.COMMITTEE)
        fresh = seats(other, trainer, committee.Draw.RECHECK)
        actions = proto.handle(P.VerdictReceived(accusation))
        checks = {a.group for a in actions if isinstance(a, P.Check)}
        if digest in first:
            continue  # already checking it as a first-committee member
        assert (digest in checks) == (digest in fresh)
        expected += digest in fresh
        if digest in fresh:
            verdict = checked(proto, digest)
            assert verdict.draw == "recheck" and not P.drawn(verdict)  # prompted: no sequential evidence
            assert trainer.verdict_refusal(verdict) is None
            rechecked += 1
    assert rechecked == expected >= 1  # these keys seat at least one fresh member


def test_a_group_no_member_checked_falls_back_to_the_trainer_after_submission_window():
    """specs/committee.md §8: submission_window after the manifest (at 6.0 s here), not
    verdict_wait: members need ~k x groups_per_round checks' time."""
    trainer, manifest, _ = round_zero(verdict_wait=4.0, submission_window=20.0)
    assert [a for a in trainer.handle(P.Tick(10.0)) if isinstance(a, P.Check)] == []
    assert [a for a in trainer.handle(P.Tick(25.9)) if isinstance(a, P.Check)] == []
    checks = {a.group for a in trainer.handle(P.Tick(26.0)) if isinstance(a, P.Check)}
    assert checks == set(lists(trainer).groups)  # nobody reported: every group is the trainer's
    for digest in lists(trainer).groups:
        assert trainer.decided(digest) is None
        checked(trainer, digest)
        assert trainer.decided(digest) is True


def test_no_group_is_decided_before_its_manifest():
    trainer = node(TRAINER, "trainer", submission_window=50.0)
    ready(trainer)
    event = groups(1)[0]
    trainer.handle(event)
    trainer.handle(P.Tick(30.0))
    assert trainer.decided(event.group.digest) is None and not trainer.rounds.manifests


@pytest.mark.parametrize("design", ["tickets", "committee"])
def test_replay_rebuilds_the_committee_state(design):
    trainer, manifest, received = round_zero()
    fresh = node(TRAINER, "trainer", verification=design)
    fresh.handle(P.PolicyAnnounced(announcement(0)), replaying=True)
    for event in received:
        fresh.handle(event, replaying=True)
    fresh.handle(P.ManifestReceived(manifest, 2.0), replaying=True)
    assert fresh.rounds.manifests[0] == manifest


def test_the_gossip_validator_rejects_hostile_claims_and_ignores_what_it_cannot_judge_yet(tmp_path):
    """A forged proof, a seat not drawn, a fresh key: rejected (the signed manifest makes every
    honest node refuse them alike, so the forwarder is at fault); a verdict before its manifest
    and a claim without a draw from a key this node does not pre-trust: ignored."""
    import structlog

    from p2p.transport import Message, Validation, message_id
    from vrl.node.groups import GroupCache
    from vrl.node.metrics import NodeMetrics
    from vrl.node.store import Store
    from vrl.node.validation import Validator

    trainer, manifest, received = round_zero()
    key, _, honest, not_mine = _member_and_verdict(trainer, manifest, received)
    outsider = NodeKey.from_seed(b"y" * 32)
    listener = node(outsider, "verifier", pretrusted=frozenset())
    validate = Validator(listener, 1, GroupCache(Store(tmp_path / "s.sqlite"), structlog.get_logger()), NodeMetrics())

    def judged(topic: str, data: bytes) -> Validation:
        return validate(Message(topic, data, b"p" * 32, message_id(topic, data)))

    def waits(topic: str, data: bytes) -> int | None:
        return validate.waits(Message(topic, data, b"p" * 32, message_id(topic, data)))

    assert judged(TOPIC_VERDICTS, honest.to_bytes()) is Validation.IGNORE  # no manifest here yet
    assert waits(TOPIC_VERDICTS, honest.to_bytes()) == honest.policy_version  # backfill offers it again
    assert judged(TOPIC_MANIFESTS, manifest.to_bytes()) is Validation.ACCEPT
    listener.handle(P.ManifestReceived(manifest, 2.0))
    assert waits(TOPIC_MANIFESTS, manifest.to_bytes()) is None
    assert judged(TOPIC_VERDICTS, honest.to_bytes()) is Validation.ACCEPT
    assert waits(TOPIC_VERDICTS, honest.to_bytes()) == honest.policy_version  # its group is not here yet
    for event in received:
        listener.handle(event)
    assert waits(TOPIC_VERDICTS, honest.to_bytes()) is None
    forged = dataclasses.replace(honest, pi=bytes(80)).signed(key)
    # its true place and path, but a seat its output does not give it
    place = lists(trainer).groups.index(not_mine)
    undrawn = dataclasses.replace(honest, group=not_mine, seat=place, seat_path=trainer.rounds.lists[0].trees[
        committee.List.GROUPS].prove([place])).signed(key)
    moved = dataclasses.replace(honest, seat=place).signed(key)  # its own group, at another's place
    fresh = dataclasses.replace(honest, verifier=outsider.node_id).signed(outsider)
    for hostile in (forged, undrawn, fresh, moved):
        assert judged(TOPIC_VERDICTS, hostile.to_bytes()) is Validation.REJECT
    no_claim = dataclasses.replace(honest, draw="none", pi=b"", weight_at=0, weight=0, weight_path=()).signed(key)
    assert judged(TOPIC_VERDICTS, no_claim.to_bytes()) is Validation.IGNORE
    impostor = dataclasses.replace(manifest, trainer=outsider.node_id).signed(outsider)
    assert judged(TOPIC_MANIFESTS, impostor.to_bytes()) is Validation.IGNORE
    tampered = dataclasses.replace(manifest, committee_size=manifest.committee_size + 1)
    assert judged(TOPIC_MANIFESTS, tampered.to_bytes()) is Validation.REJECT


def test_a_members_pass_makes_a_group_verified_for_the_trusted_share_where_no_anchor_checked_it():
    """specs/committee.md §8: in the committee design the anchors no longer check most groups,
    the committee does; a node whose only anchor is the trainer counts a member's pass as the
    check that makes a group trusted, so a worker below trusted_score still fills a batch at the
    default trusted_share (with the old reading the batch was empty and training stopped)."""
    trainer, manifest, received = round_zero()
    key = next(k for k in VERIFIERS if seats(k, trainer, committee.Draw.COMMITTEE))
    member, _ = verifier(key, manifest, received, trainer)
    digest = sorted(seats(key, trainer, committee.Draw.COMMITTEE))[0]
    verdict = checked(member, digest)
    view = node(VERIFIERS[-1] if key != VERIFIERS[-1] else VERIFIERS[0], "verifier",
                pretrusted=frozenset({TRAINER.node_id}))
    ready(view)
    for event in received:
        view.handle(event)
    view.handle(P.ManifestReceived(manifest, 2.0))
    view.handle(P.VerdictReceived(verdict))
    assert verdict.verifier not in view.reputation.pretrusted and verdict.draw == committee.Draw.COMMITTEE
    assert view.verdicts[digest][verdict.verifier] == verdict
    assert routing.verified(view, digest)
    assert not any(routing.verified(view, d) for d in lists(trainer).groups if d != digest)  # no pass, no check
    score = view.standing(WORKER.node_id).score
    config = AdmissionConfig(batch_groups=4, node_cap=1.0)  # the default trusted_share, 0.5
    assert score < config.trusted_score
    batch = admit([Candidate(d, WORKER.node_id, score, verified=routing.verified(view, d))
                   for d in lists(trainer).groups], config, b"seed")
    assert [c.group for c, _ in batch].count(digest) == 1  # the verified group is in; alone, the rest untrusted
    assert admit([Candidate(d, WORKER.node_id, score) for d in lists(trainer).groups], config, b"seed") == []


def test_a_node_forgets_rounds_no_fresh_group_is_of_and_never_takes_their_manifests_again():
    """vrl.node.rounds.Rounds.forget: a member held every manifest's digests forever; rounds below
    version - max_staleness - 1 are dropped, and their manifests coming again (backfill) are not
    held again, so their withheld records never count twice."""
    trainer, manifest, received = round_zero()
    member, _ = verifier(VERIFIERS[0], manifest, received, trainer)
    assert 0 in member.rounds.manifests and member.rounds.round_of
    withheld = len(member.reputation.withheld())
    staleness = member.config.max_staleness
    for version in range(1, staleness + 3):
        ready(member, version)
    assert member.rounds.manifests == {} and member.rounds.round_of == {} and member.rounds.floor == 1
    assert member.rounds._positions == {} and member.rounds.places == {} and member.rounds.received_at == {}
    assert member.handle(P.ManifestReceived(manifest, 99.0)) == [] and 0 not in member.rounds.manifests
    assert len(member.reputation.withheld()) == withheld


def test_an_entries_answer_its_header_does_not_prove_teaches_a_member_nothing_and_it_asks_again():
    """specs/committee.md §3.5: a member takes its weights entry and its seats only from answers
    the round's header proves; a forged one changes nothing, and the request is asked again."""
    trainer, manifest, received = round_zero()
    member = node(VERIFIERS[0], "verifier")
    ready(member)
    for event in received:
        member.handle(event)
    (ask,) = [a for a in member.handle(P.ManifestReceived(manifest, 2.0)) if isinstance(a, P.FetchEntries)]
    assert (ask.list, ask.keys) == ("weights", (VERIFIERS[0].node_id,))
    honest = trainer.rounds.answer(EntriesRequest(0, committee.List.WEIGHTS, (), ask.keys))
    j = honest.positions[0]
    other = dataclasses.replace(honest, leaves=(VERIFIERS[0].node_id + (1).to_bytes(4, "big"),))  # not its weight
    # another list's entries, proven as they are (what the trainer served someone else, replayed)
    elsewhere = trainer.rounds.answer(EntriesRequest(0, committee.List.GROUPS, (), ask.keys))
    for forged in (other, dataclasses.replace(honest, proof=()), dataclasses.replace(honest, round=1), elsewhere):
        actions = member.handle(P.EntriesReceived(ask, EntriesAnswer.of(forged)))
        assert [a for a in actions if isinstance(a, P.Check)] == [] and 0 not in member.rounds.weight
        assert member.rounds.omitted == {}  # its key is no group shown absent
        assert [a for a in actions if isinstance(a, P.FetchEntries)] == [ask]  # asked again
    actions = served(member, trainer, member.handle(P.EntriesReceived(ask, EntriesAnswer.of(honest))))
    assert member.rounds.weight[0][:2] == (j, lists(trainer).weights.weight(VERIFIERS[0].node_id))
    mine = seats(VERIFIERS[0], trainer, committee.Draw.COMMITTEE)
    assert {a.group for a in actions if isinstance(a, P.Check)} == mine
