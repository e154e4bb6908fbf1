"""The committee design's routing at scale (specs/network.md §3.5, specs/committee.md §8): members
fetch exactly their seats by digest, a worker's groups and a member's passes go to the trainer
alone, failures are gossiped, and the incremental passes over fresh groups (vrl.node.scans.Scans)
answer as a pass over every fresh group would."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_protocol import settle
from tests.test_protocol_committee import (
    TRAINER,
    VERIFIERS,
    WORKER,
    checked,
    groups,
    lists,
    node,
    ready,
    round_zero,
    seats,
    served,
    verifier,
)
from vrl.node import committee
from vrl.node import protocol as P
from vrl.node.events import FetchGroup, Send
from vrl.node.messages import TOPIC_GROUPS, TOPIC_VERDICTS, Outcome, SignedVerdict
from vrl.rollouts.keys import NodeKey


def test_a_member_fetches_exactly_its_seats_by_digest_and_checks_them_once_they_arrive():
    trainer, manifest, received = round_zero()
    by_digest = {e.group.digest: e for e in received}
    for key in VERIFIERS:
        proto = node(key, "verifier")
        ready(proto)
        # it holds no group: it asks for its entries, then its seats
        actions = served(proto, trainer, proto.handle(P.ManifestReceived(manifest, 2.0)))
        mine = seats(key, trainer, committee.Draw.COMMITTEE)
        assert {a.digest for a in actions if isinstance(a, FetchGroup)} == mine
        assert all(a.version == 0 for a in actions if isinstance(a, FetchGroup))
        assert not [a for a in proto.handle(P.Tick(2.5)) if isinstance(a, FetchGroup)]  # asked once, in flight
        for digest in mine:
            checks = [a for a in proto.handle(by_digest[digest]) if isinstance(a, P.Check)]
            assert [c.group for c in checks] == [digest]
        # a fetch that failed is asked for again
        if mine:
            missing = sorted(mine)[0]
            other = node(key, "verifier")
            ready(other)
            served(other, trainer, other.handle(P.ManifestReceived(manifest, 2.0)))
            again = other.handle(P.Abandoned(FetchGroup(missing, 0)))
            assert FetchGroup(missing, 0) in again


def test_a_worker_sends_its_groups_to_the_trainer_alone_and_holds_them():
    worker = node(WORKER, "worker", "verifier")
    ready(worker)
    made = tuple(e.group for e in groups())
    actions = worker.handle(P.Generated(0, made))
    sent = [a for a in actions if isinstance(a, Send)]
    assert [a.peer for a in sent] == [TRAINER.node_id] * 4 and {a.topic for a in sent} == {TOPIC_GROUPS}
    assert not [a for a in actions if isinstance(a, P.Publish) and a.topic == TOPIC_GROUPS]
    assert all(g.digest in worker.groups for g in made)


def test_passes_go_to_the_trainer_and_failures_are_gossiped():
    trainer, manifest, received = round_zero()
    for key in VERIFIERS:
        proto, _ = verifier(key, manifest, received, trainer)
        for i, digest in enumerate(sorted(seats(key, trainer, committee.Draw.COMMITTEE))):
            reasons = ("reward_mismatch",) if i % 2 else ()
            out = [a for a in proto.handle(P.Checked(digest, reasons, b"\x09" * 32)) if hasattr(a, "topic")]
            (message,) = out
            verdict = SignedVerdict.from_bytes(message.data)
            assert message.topic == TOPIC_VERDICTS
            if verdict.outcome == Outcome.PASS:
                assert isinstance(message, Send) and message.peer == TRAINER.node_id
            else:
                assert isinstance(message, P.Publish)


events = st.lists(st.tuples(st.sampled_from(["pass", "fail", "tick", "checked", "abandon"]), st.integers(0, 5),
                            st.integers(0, 3)), max_size=30)


@settings(max_examples=60, deadline=None)
@given(events)
def test_incremental_decisions_and_checks_equal_a_pass_over_every_fresh_group(script):
    """After any sequence of verdicts, checks, abandoned checks and ticks, the trainer's
    incremental decisions equal NodeProtocol.decided over every fresh group, and the checks it
    asks for are those a pass over every fresh group asks for."""
    trainer, manifest, received = round_zero()
    digests = sorted(lists(trainer).groups)
    verdicts: dict[tuple[int, int, str], SignedVerdict] = {}
    for key in VERIFIERS:
        proto, _ = verifier(key, manifest, received, trainer)
        v = VERIFIERS.index(key)
        for digest in seats(key, trainer, committee.Draw.COMMITTEE):
            g = digests.index(digest)
            for outcome, reasons in (("pass", ()), ("fail", ("reward_mismatch",))):
                fresh, _ = verifier(key, manifest, received, trainer)
                out = [a for a in fresh.handle(P.Checked(digest, reasons, b"\x09" * 32)) if hasattr(a, "data")]
                verdicts[v, g, outcome] = SignedVerdict.from_bytes(out[0].data)
    now = 6.0
    for kind, v, g in script:
        digest = digests[g]
        if kind in ("pass", "fail") and (v, g, kind) in verdicts:
            trainer.handle(P.VerdictReceived(verdicts[v, g, kind]))
        elif kind == "tick":
            now += 7.0 * (v + 1)
            trainer.handle(P.Tick(now))
        elif kind == "checked":
            trainer.handle(P.Checked(digest, (), b"\x09" * 32))
        elif kind == "abandon":
            trainer.handle(P.Abandoned(P.Check(digest, 0)))
        fresh = trainer.fresh_groups()
        assert trainer.scans.decide(trainer, fresh) == {d: trainer.decided(d) for d in fresh}
    # the checks asked for now: the incremental pass against a full one (same state, scans reset).
    # A full pass skips the checks under way, the incremental pass's among them, and has room for
    # every other (batch_groups 4, round_zero's 4 groups): it must ask for none.
    incremental = {a.group for a in trainer.pending() if isinstance(a, P.Check)}
    assert all(trainer.checking(d) for d in incremental)
    trainer.scans.checks.key = None  # a full pass
    assert {a.group for a in trainer.pending() if isinstance(a, P.Check)} == set()


def test_a_view_fetches_the_group_a_pre_trusted_failure_names_and_counts_it():
    """A verdict counts only on a group its node holds; a node that sat on none of a cheat's
    groups fetches the one the trainer's re-check failed, so its view counts the failure too
    (specs/network.md §3.5). A stranger's failure makes it fetch nothing, and nor does a
    pre-trusted failure of a producer its view has quarantined."""
    trainer, manifest, received = round_zero()
    digest = received[0].group.digest
    late = trainer.handle(P.Tick(trainer.now + trainer.config.submission_window + 1))  # no member's verdict came
    assert P.Check(digest, 0) in late
    trainers = checked(trainer, digest, ("reward_mismatch",))
    assert trainers.outcome == "hard_fail"
    stranger = P.NodeProtocol(NodeKey.from_seed(b"S" * 32), trainer.config, platform="test", race_loss_rate=1e-3)
    for key in VERIFIERS:
        proto = node(key, "verifier")
        ready(proto)
        served(proto, trainer, proto.handle(P.ManifestReceived(manifest, 2.0)))
        if digest in seats(key, trainer, committee.Draw.COMMITTEE) | seats(key, trainer, committee.Draw.RECHECK):
            continue  # a member fetches it anyway
        lie = SignedVerdict(**{**trainers.__dict__, "verifier": stranger.me, "signature": b""}).signed(stranger.key)
        assert not [a for a in proto.handle(P.VerdictReceived(lie)) if isinstance(a, FetchGroup)]
        actions = proto.handle(P.VerdictReceived(trainers))
        assert FetchGroup(digest, 0) in actions
        proto.handle(received[0])
        settle(proto)
        assert proto.standing(WORKER.node_id).failures > 0
        # A member's failure confirmed by the trainer's quarantines the producer in this view;
        # then a further failure of it teaches nothing: no fetch.
        member_key = next(k for k in VERIFIERS if digest in seats(k, trainer, committee.Draw.COMMITTEE))
        member = node(member_key, "verifier")
        ready(member)
        served(member, trainer, member.handle(P.ManifestReceived(manifest, 2.0)))
        member.handle(received[0])
        proto.handle(P.VerdictReceived(checked(member, digest, ("reward_mismatch",))))
        settle(proto)
        assert WORKER.node_id in proto.quarantined
        second = checked(trainer, received[1].group.digest, ("reward_mismatch",))
        assert not [a for a in proto.handle(P.VerdictReceived(second)) if isinstance(a, FetchGroup)]
        return
    raise AssertionError("every verifier sat on the group: no view to test (change the keys)")
