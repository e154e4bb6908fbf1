"""The node's collaborators on their own, without a Node: the decoded-group caches
(vrl.node.groups), a worker's bookkeeping of its sampling answers (vrl.node.proving) and the
gossip validator's decisions (vrl.node.validation)."""

from __future__ import annotations

import dataclasses
import hashlib
import random

import msgpack
import pytest
import structlog

from p2p.transport import Message, Validation, message_id
from vrl.node import protocol as P
from vrl.node.designs import TicketDesign
from vrl.node.groups import GroupCache
from vrl.node.messages import (
    TOPIC_GROUPS,
    TOPIC_POLICIES,
    TOPIC_STEPS,
    TOPIC_VERDICTS,
    Group,
    MessageError,
    PolicyAnnouncement,
)
from vrl.node.metrics import NodeMetrics
from vrl.node.proving import Answers
from vrl.node.requests import SamplingRequest
from vrl.node.store import Store
from vrl.node.validation import Validator
from vrl.rollouts.codec import canonical_bytes
from vrl.rollouts.keys import NodeKey

TRAINER = NodeKey.from_seed(b"T" * 32)
VERIFIER = NodeKey.from_seed(b"V" * 32)
STRANGER = NodeKey.from_seed(b"S" * 32)
PEER, OTHER_PEER = b"p" * 32, b"q" * 32


def groups_of(honest) -> list[Group]:
    """The conftest's 3 groups of 4 signed records, as gossip brings them."""
    return [Group.of(honest[i:i + 4]) for i in range(0, len(honest), 4)]


def size(group: Group) -> int:
    return sum(map(len, group.submission.records))


def gossip(topic: str, data: bytes) -> Message:
    return Message(topic, data, PEER, message_id(topic, data))


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path / "node.sqlite")
    yield store
    store.close()


def test_groups_the_validator_decoded_wait_for_their_handler_within_a_bound(store, honest):
    a, b, c = groups_of(honest)
    cache = GroupCache(store, structlog.get_logger(), max_decoded=2)
    for tag, group in enumerate((a, b, c)):
        cache.remember(bytes([tag]) * 32, group)
    assert list(cache.decoded) == [b"\x01" * 32, b"\x02" * 32]  # the oldest went first
    assert cache.group_of(b"\x02" * 32, c.to_bytes()) is c  # held: not decoded again
    assert b"\x02" * 32 not in cache.decoded  # handed over once
    again = cache.group_of(b"\x00" * 32, a.to_bytes())  # let go: decoded from the message
    assert again is not a and again.digest == a.digest and again.rollouts == a.rollouts


def test_kept_groups_are_bounded_by_their_bytes_least_recently_used_first_out(store, honest):
    a, b, c = groups_of(honest)
    cache = GroupCache(store, structlog.get_logger(), max_bytes=size(a) + size(b) + size(c) - 1)
    cache.keep(a)
    cache.keep(b)
    cache.keep(a)  # used again: b is now the least recently used
    cache.keep(c)
    assert list(cache.bodies) == [a.digest, c.digest] and cache.body_bytes == size(a) + size(c)
    assert cache.body(a.digest) is a
    assert cache.body(b.digest) is None  # gone, and never stored
    store.put_group(b.submission, b.subject, b.version, 1.0)
    back = cache.body(b.digest)  # read back from the store and decoded, signatures checked
    assert back is not None and back is not b and back.rollouts == b.rollouts
    assert cache.body(b.digest) is back  # and kept again


def test_a_worker_answers_a_peer_once_a_group_and_sends_a_kept_answer_again():
    asked = SamplingRequest(b"g" * 32, b"c" * 32, 2)
    answers = Answers(max_served=2, max_kept=1)
    assert answers.kept_answer(asked, PEER) is None
    answers.admit(asked, PEER)
    answers.keep(asked, PEER, b"the answer")
    assert answers.kept_answer(asked, PEER) == b"the answer"  # the same question: the same answer
    assert answers.kept_answer(dataclasses.replace(asked, positions=3), PEER) is None
    assert answers.kept_answer(asked, OTHER_PEER) is None
    with pytest.raises(MessageError, match="answered to this peer already"):
        answers.admit(dataclasses.replace(asked, challenge=b"d" * 32), PEER)  # another challenge, one group
    answers.admit(asked, OTHER_PEER)  # another peer is answered on its own
    # Both bounds forget the oldest first.
    later = SamplingRequest(b"h" * 32, b"c" * 32, 2)
    answers.keep(later, PEER, b"another answer")
    assert answers.kept_answer(asked, PEER) is None and answers.kept_answer(later, PEER) == b"another answer"
    answers.admit(later, PEER)
    assert list(answers.served) == [(OTHER_PEER, asked.group), (PEER, later.group)]
    answers.admit(dataclasses.replace(asked, challenge=b"d" * 32), PEER)  # forgotten: answered anew


def test_the_validator_accepts_ignores_and_rejects_by_what_the_protocol_knows(store, honest):
    a, _, _ = groups_of(honest)
    protocol = P.NodeProtocol(VERIFIER, P.ProtocolConfig(roles=frozenset({"verifier"}), trainer=TRAINER.node_id),
                              platform="test", race_loss_rate=1e-3)
    announcement = PolicyAnnouncement(TRAINER.node_id, a.version, b"\x01" * 32, b"\x02" * 32, 10).signed(TRAINER)
    protocol.handle(P.PolicyAnnounced(announcement))
    cache, metrics = GroupCache(store, structlog.get_logger()), NodeMetrics()
    validate = Validator(protocol, len(a.rollouts), cache, metrics)

    message = gossip(TOPIC_GROUPS, a.to_bytes())
    assert validate(message) is Validation.ACCEPT
    assert cache.decoded[message.msg_id].digest == a.digest  # held for the handler
    # Another network's parameters: ignored, not the forwarder's fault.
    assert Validator(protocol, len(a.rollouts) + 1, cache, metrics)(message) is Validation.IGNORE
    # Bytes that do not decode: rejected, and counted.
    assert validate(gossip(TOPIC_GROUPS, b"\x93not a group")) is Validation.REJECT
    assert metrics.registry.get_sample_value("vrl_messages_invalid_total", {"topic": TOPIC_GROUPS}) == 1
    assert validate(gossip("/vrl/unknown/1", b"")) is Validation.IGNORE
    # A later release's version of a known kind: ignored and not counted (specs/network.md §7),
    # where a version no release wrote is rejected.
    newer = msgpack.unpackb(announcement.to_bytes())
    for v, judged in ((99, Validation.IGNORE), (0, Validation.REJECT), ("5", Validation.REJECT)):
        assert validate(gossip(TOPIC_POLICIES, canonical_bytes({**newer, "v": v}))) is judged
    assert metrics.registry.get_sample_value("vrl_messages_invalid_total", {"topic": TOPIC_POLICIES}) == 2
    # A policy: another trainer's is ignored, a forged signature rejected.
    stranger = PolicyAnnouncement(STRANGER.node_id, 1, b"\x01" * 32, b"\x02" * 32, 10).signed(STRANGER)
    assert validate(gossip(TOPIC_POLICIES, stranger.to_bytes())) is Validation.IGNORE
    forged = dataclasses.replace(announcement, size=11)
    assert validate(gossip(TOPIC_POLICIES, forged.to_bytes())) is Validation.REJECT
    assert validate(gossip(TOPIC_POLICIES, announcement.to_bytes())) is Validation.ACCEPT
    # A quarantined producer's groups are ignored.
    protocol.quarantined.add(a.subject)
    assert validate(message) is Validation.IGNORE


def test_the_validator_says_which_refusals_wait_and_in_what_version(store, honest):
    """Validator.waits (specs/network.md §6: backfill offers such a message again): a group of
    a version not announced here yet waits in its version; in the ticket design, a verdict whose
    group is not here waits; a step verdict of a version ahead waits; once what they waited for is here, or for a
    refusal that holds for good, nothing waits."""
    from tests.test_store_cursor import verdict
    from vrl.node.messages import StepVerdict

    a, b, _ = groups_of(honest)
    protocol = P.NodeProtocol(VERIFIER, P.ProtocolConfig(roles=frozenset({"verifier"}), trainer=TRAINER.node_id,
                                                         verification="tickets"),  # a verdict waits for its group
                              platform="test", race_loss_rate=1e-3)
    validate = Validator(protocol, len(a.rollouts), GroupCache(store, structlog.get_logger()), NodeMetrics())
    group = gossip(TOPIC_GROUPS, a.to_bytes())
    assert validate(group) is Validation.IGNORE and validate.waits(group) == a.version  # no policy yet
    announcement = PolicyAnnouncement(TRAINER.node_id, a.version, b"\x01" * 32, b"\x02" * 32, 10).signed(TRAINER)
    step = StepVerdict(verifier=STRANGER.node_id, trainer=TRAINER.node_id, version=a.version + 1,
                       announcement=b"\x03" * 32, outcome="pass", reasons=(), replayed=b"", drift=0.0,
                       platform="p").signed(STRANGER)
    steps = gossip(TOPIC_STEPS, step.to_bytes())
    assert validate.waits(steps) == a.version + 1  # its announcement is not here
    protocol.handle(P.PolicyAnnounced(announcement))
    assert validate(group) is Validation.ACCEPT and validate.waits(group) is None
    assert validate.waits(steps) == a.version + 1  # still ahead of the node
    following = PolicyAnnouncement(TRAINER.node_id, a.version + 1, b"\x04" * 32, b"\x05" * 32, 10).signed(TRAINER)
    protocol.handle(P.PolicyAnnounced(following))
    assert validate.waits(steps) is None  # its version is here: the step judge's refusal holds for good
    # A verdict whose group is not here waits (the protocol parks it) until the group is.
    on_b = gossip(TOPIC_VERDICTS, verdict(b.submission, b.version).to_bytes())
    assert validate.waits(on_b) == b.version
    protocol.handle(P.GroupReceived(b, 1.0))
    assert validate.waits(on_b) is None
    assert validate.waits(gossip(TOPIC_POLICIES, announcement.to_bytes())) is None
    assert validate.waits(gossip(TOPIC_VERDICTS, b"\x93not a verdict")) is None
    from vrl.node.messages import Submission

    undecodable = Submission((b"\x01\x02",))  # a record that does not decode
    assert validate.waits(gossip(TOPIC_GROUPS, undecodable.to_bytes())) is None


@dataclasses.dataclass
class Ledger:
    """The protocol state a StepJudge reads (vrl.node.steps.Ledger), as plain data."""

    policies: dict
    now: float = 0.0
    loaded: set = dataclasses.field(default_factory=set)
    verdicts: dict = dataclasses.field(default_factory=dict)
    round_started: dict = dataclasses.field(default_factory=dict)
    counting: frozenset = frozenset()
    eligible: int = 0
    design: TicketDesign = dataclasses.field(default_factory=TicketDesign)  # groups by gossip, not by digest

    def group_version(self, digest: bytes) -> int | None:
        return None

    def trainer_fail(self, digest: bytes, trainer: bytes) -> int | None:
        return None

    def trust(self, node: bytes) -> float:
        return 1.0 if node in self.counting else 0.0

    def counts(self, verifier: bytes) -> bool:
        return verifier in self.counting

    def pretrusted(self, node: bytes) -> bool:
        return False

    def eligible_verifiers(self) -> int:
        return self.eligible


def test_the_step_judge_calls_missing_state_fraud_step_wait_after_its_first_failed_fetch_and_wants_a_second_word():
    from vrl.node.messages import StepFault, StepOutcome, StepVerdict
    from vrl.node.steps import StepJudge

    policies = {v: PolicyAnnouncement(TRAINER.node_id, v, bytes([v + 1]) * 32, b"\x02" * 32, 10,
                                      parent=bytes([v]) * 32 if v else b"").signed(TRAINER) for v in (0, 1)}
    ledger = Ledger(policies, now=10.0, round_started={1: 0.0}, counting=frozenset({STRANGER.node_id}))
    judge = StepJudge(VERIFIER, "test", max_staleness=2, step_audit_rate=1.0, step_wait=30.0, stranger_cap=16)
    assert judge.handle(P.StepStateMissing(1), ledger) == []  # the trainer still has time to serve them
    ledger.now = 30.0  # step_wait after the announcement, but 20 s after this node first asked in vain
    assert judge.handle(P.StepStateMissing(1), ledger) == []
    ledger.now = 40.0
    (published,) = judge.handle(P.StepStateMissing(1), ledger)
    mine = StepVerdict.from_bytes(published.data)
    assert mine.outcome == StepOutcome.FRAUD and mine.reasons == (StepFault.UNAVAILABLE_STATE,)
    assert judge.convictions(ledger) == []  # what the network did not deliver needs a second reporter
    theirs = StepVerdict(verifier=STRANGER.node_id, trainer=TRAINER.node_id, version=1, announcement=policies[1].id,
                         outcome=StepOutcome.FRAUD, reasons=(StepFault.UNAVAILABLE_STATE,), replayed=b"", drift=0.0,
                         platform="test").signed(STRANGER)
    assert [type(a).__name__ for a in judge.handle(P.StepVerdictReceived(theirs), ledger)] == ["PersistStep"]
    (conviction,) = judge.convictions(ledger)
    assert conviction.version == 1 and conviction.reporters == (VERIFIER.node_id, STRANGER.node_id)
    assert not judge.follows(1) and judge.follows(0)


def test_with_committees_a_step_is_replayed_by_about_k_verifiers_whatever_the_network_size():
    """specs/training.md §5: rate = min(step_audit_rate, k / m), m the eligible verifiers."""
    from vrl.node.steps import StepJudge

    announcements = [PolicyAnnouncement(TRAINER.node_id, v, hashlib.sha256(b"%d" % v).digest(), b"\x02" * 32,
                                        10).signed(TRAINER) for v in range(600)]
    verifiers = [NodeKey.from_seed(hashlib.sha256(b"replayer %d" % i).digest()) for i in range(4)]

    def drawn(step_committee: int, eligible: int) -> float:
        ledger = Ledger({}, eligible=eligible)
        judges = [StepJudge(key, "test", max_staleness=2, step_audit_rate=0.25, step_wait=30.0, stranger_cap=16,
                            step_committee=step_committee) for key in verifiers]
        return sum(judge._drawn(a, ledger) for judge in judges for a in announcements) / (600 * len(judges))

    # 2,400 draws each: a binomial's standard deviation is under 0.009 at these rates.
    assert abs(drawn(0, 110) - 0.25) < 0.03  # tickets: a quarter of the network replays each step
    assert abs(drawn(11, 110) - 0.10) < 0.03  # committees: 11 of 110, ~k a step
    assert abs(drawn(11, 1000) - 0.011) < 0.008
    assert abs(drawn(11, 20) - 0.25) < 0.03  # a small network keeps step_audit_rate
    assert abs(drawn(11, 0) - 0.25) < 0.03  # no manifest yet


def test_a_failed_policy_fetch_waits_longer_each_time_up_to_a_bound():
    """vrl.node.daemon.retry_delay: full jitter below 0.5 s doubled per failure in a row, at most
    30 s (AWS, "Exponential Backoff And Jitter"), for any count, however large."""
    from vrl.node.daemon import FETCH_RETRY_FIRST_SECONDS, FETCH_RETRY_MAX_SECONDS, retry_delay

    def ceiling(low: float, high: float) -> float:  # the draw at its top: the bound itself
        assert low == 0.0
        return high

    bounds = [retry_delay(n, ceiling) for n in range(1, 12)]
    assert bounds[0] == FETCH_RETRY_FIRST_SECONDS and bounds == sorted(bounds)
    assert bounds[-1] == FETCH_RETRY_MAX_SECONDS == retry_delay(10**9, ceiling)
    assert all(0.0 <= retry_delay(n, random.uniform) <= FETCH_RETRY_MAX_SECONDS for n in (1, 5, 60, 10**6))
