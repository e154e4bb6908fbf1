"""Twelve NodeProtocols of the committee design on an in-process bus (specs/committee.md): over
rounds the committees form from the trainer's reputation, a cheat's bad groups are caught and
it is quarantined, no honest node is, no bad group is trained, and a verifier checks about
k x groups_per_round groups a round. The machines are the real ones; only the models are not
(a check's outcome is the group's ground truth), as in tests/test_protocol.py."""

from __future__ import annotations

from collections import defaultdict

from tests.test_protocol import announcement
from vrl.node import committee
from vrl.node import messages as M
from vrl.node import protocol as P
from vrl.node.admission import AdmissionConfig
from vrl.node.events import FetchGroup, Send
from vrl.node.messages import (
    Group,
    PolicyAnnouncement,
    RoundManifest,
    SignedVerdict,
    Submission,
)
from vrl.node.requests import EntriesAnswer, EntriesRequest
from vrl.rollouts.keys import NodeKey

TRAINER = NodeKey.from_seed(b"T" * 32)
GROUPS_PER_ROUND = 4


class Bus:
    """Every Publish reaches every other node at once; every job is done at once, its outcome
    the ground truth (a cheat's groups fail). Bounded: ``rounds`` versions, 20,000 steps each."""

    def __init__(self, honest: int, cheats: int, k: int) -> None:
        options = {"verification": "committee", "committee_size": k, "groups_per_round": GROUPS_PER_ROUND,
                   "step_audit_rate": 0.0, "verdict_wait": 1.0}
        self.keys = [NodeKey.from_seed(b"h%03d" % i + bytes(28)) for i in range(honest)]
        self.cheats = [NodeKey.from_seed(b"c%03d" % i + bytes(28)) for i in range(cheats)]
        roles = frozenset({"worker", "verifier"})
        self.nodes = {key.node_id: P.NodeProtocol(key, P.ProtocolConfig(roles=roles, trainer=TRAINER.node_id,
                                                                            **options), "test", 1e-3)
                      for key in self.keys + self.cheats}
        self.trainer = P.NodeProtocol(TRAINER, P.ProtocolConfig(
            roles=frozenset({"trainer"}), trainer=TRAINER.node_id,
            admission=AdmissionConfig(batch_groups=64, trusted_share=0.0, node_cap=1.0), **options), "test", 1e-3)
        self.nodes[TRAINER.node_id] = self.trainer
        self.bad = {c.node_id for c in self.cheats}
        self.groups: dict[bytes, Group] = {}
        self.checks: dict[tuple[bytes, int], int] = defaultdict(int)  # (node, version) -> checks
        self.trained: set[bytes] = set()
        self.now = 0.0

    def deliver(self, sender: bytes, action: P.Action, queue: list) -> None:
        node = self.nodes[sender]
        match action:
            case P.Publish(M.TOPIC_GROUPS, data):
                group = self.groups[data]
                queue += [(n, P.GroupReceived(group, self.now)) for n in self.nodes if n != sender]
            case P.Publish(M.TOPIC_VERDICTS, data):
                verdict = SignedVerdict.from_bytes(data)
                queue += [(n, P.VerdictReceived(verdict)) for n in self.nodes if n != sender]
            case P.Publish(M.TOPIC_MANIFESTS, data):
                manifest = RoundManifest.from_bytes(data)
                queue += [(n, P.ManifestReceived(manifest, self.now)) for n in self.nodes if n != sender]
            case P.Publish(M.TOPIC_POLICIES, data):
                a = PolicyAnnouncement.from_bytes(data)
                queue += [(n, P.PolicyAnnounced(a)) for n in self.nodes if n != sender]
            case Send(peer, M.TOPIC_GROUPS, data):  # the committee design's routing (specs/network.md §3.5)
                queue.append((peer, P.GroupReceived(self.groups[data], self.now)))
            case Send(peer, M.TOPIC_VERDICTS, data):
                queue.append((peer, P.VerdictReceived(SignedVerdict.from_bytes(data))))
            case P.FetchEntries(round_, which, positions, keys):  # specs/committee.md §3.5: the trainer answers
                request = EntriesRequest(round_, committee.List(which), positions, keys)
                answer = EntriesAnswer.of(self.trainer.rounds.answer(request))
                queue.append((sender, P.EntriesReceived(action, answer)))
            case FetchGroup(digest, _):
                found = [g for g in self.groups.values() if g.digest == digest]
                queue += [(sender, P.GroupReceived(g, self.now)) for g in found]
            case P.FetchPolicy(a):
                queue.append((sender, P.PolicyLoaded(a.version)))
            case P.Generate(version):
                made = []
                for index in range(GROUPS_PER_ROUND):
                    sub = Submission((b"v%d i%d " % (version, index) + sender,))
                    group = Group(sub, (), sender, version, index)
                    self.groups[sub.to_bytes()] = group
                    made.append(group)
                    queue.append((sender, P.GroupReceived(group, self.now)))  # its own, as gossip returns it
                queue.append((sender, P.Generated(version, tuple(made))))
            case P.Check(digest, version):
                self.checks[sender, node.version] += 1
                subject = node.groups[digest].subject
                reasons = ("reward_mismatch",) if subject in self.bad else ()
                queue.append((sender, P.Checked(digest, reasons, b"\x09" * 32)))
            case P.Train(version, batch):
                used = tuple(d for d, _ in batch)
                self.trained |= set(used)
                queue.append((sender, P.Trained(announcement(version + 1), used)))

    def run(self, rounds: int) -> None:
        queue: list = [(TRAINER.node_id, P.PolicyAnnounced(announcement(0))), (TRAINER.node_id, P.PolicyLoaded(0))]
        queue += [(n, P.PolicyAnnounced(announcement(0))) for n in self.nodes if n != TRAINER.node_id]
        for _ in range(rounds * 20_000):
            if self.trainer.version is not None and self.trainer.version >= rounds:
                return
            if not queue:
                self.now += 0.5
                queue = [(n, P.Tick(self.now)) for n in self.nodes]
            sender, event = queue.pop(0)
            for action in self.nodes[sender].handle(event):
                self.deliver(sender, action, queue)
        raise AssertionError(f"{rounds} rounds did not finish in {rounds * 20_000} steps")


def test_a_committee_network_quarantines_its_cheat_and_trains_no_bad_group():
    bus = Bus(honest=5, cheats=1, k=3)
    bus.run(rounds=4)
    trainer = bus.trainer
    assert trainer.version == 4
    assert {c.node_id for c in bus.cheats} <= trainer.quarantined
    assert not trainer.quarantined - bus.bad  # no honest node quarantined
    for key in bus.keys:  # nor in any honest node's own view
        assert not bus.nodes[key.node_id].quarantined - bus.bad
    trained_subjects = {trainer.groups[d].subject for d in bus.trained}
    assert not trained_subjects & bus.bad
    # once reputation has made the workers eligible, the manifests draw committees of them
    late = [trainer.rounds.manifests[v] for v in range(2, 4) if v in trainer.rounds.manifests]
    assert late and all(m.weights >= len(bus.keys) - 1 for m in late)


def test_a_verifiers_checks_per_round_are_about_k_times_groups_per_round():
    """E[checks] = G x k w_v / W (specs/committee.md §6): with 6 workers and verifiers of about
    equal weight and k = 2, about 2 x 4 x 5/6 ~ 6.7 of the round's 20 other groups a round,
    not all of them (a small network: the machines' reputation work is what takes time here)."""
    bus = Bus(honest=6, cheats=0, k=2)
    bus.run(rounds=4)
    per_round = [bus.checks[key.node_id, v] for key in bus.keys for v in range(2, 4)]
    mean = sum(per_round) / len(per_round)
    assert 3 < mean < 12, mean  # about 6.7; every group would be 20
