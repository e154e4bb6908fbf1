"""What a simulated node's actions do (as vrl.node.daemon.Node._do carries them out), with the
model's work charged in time by spec.CostModel instead of done: a mixin of
:class:`vrl.harness.simulator.driver.Simulation`, whose state (the clock, the nodes, the
network, the metrics) it acts on."""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVarTuple

from vrl.harness.adversary import CHEAT_FROM, take_freshest
from vrl.node import committee
from vrl.node import events as E
from vrl.node.messages import (
    TOPIC_VERDICTS,
    Batch,
    BatchFile,
    Group,
    Outcome,
    PolicyAnnouncement,
    RoundManifest,
    SignedVerdict,
    StepFault,
)
from vrl.node.requests import EntriesAnswer, EntriesRequest
from vrl.rollouts.keys import NodeKey

from .making import Maker
from .metrics import Metrics
from .network import Network
from .nodes import Msg, SimNode, TrainerProtocol
from .payloads import Records, Truth, announcement, check_result, liar_claim
from .spec import CostModel, SimConfig
from .stores import StoreLedger, keep, keep_action

Ts = TypeVarTuple("Ts")

# The seed of a planted group's throw-away producer (specs/README.md lists it among the local tags).
CANARY_DOMAIN = b"vrl/sim/canary\x00"
# Trainer cheats a verifier's replay finds, and what it reports (vrl.harness.adversary.CheatingTrainer):
# weights no step made, or made by another step than announced; an inflated reward its proofs do not show.
REPLAY_FAULTS = {
    "trainer-fake-weights": (StepFault.WEIGHTS_MISMATCH,),
    "trainer-learning-rate": (StepFault.WEIGHTS_MISMATCH, StepFault.OPTIMIZER_MISMATCH),
    "trainer-drops-node": (StepFault.WEIGHTS_MISMATCH, StepFault.OPTIMIZER_MISMATCH),
    "trainer-foreign-data": (StepFault.WEIGHTS_MISMATCH, StepFault.OPTIMIZER_MISMATCH),
    "trainer-inflated-rewards": (StepFault.REWARD_UNPROVEN,),
}
# A group fetch's request: a digest (32 bytes) and a version (u64), msgpack-framed (specs/network.md §3.5).
FETCH_REQUEST_BYTES = 48


class Actions:
    """``do(node, action)``: each action dispatched by its type's name to ``_do_<Name>``."""

    # The simulation's state that the actions act on, as driver.Simulation sets it.
    config: SimConfig
    rng: random.Random
    cost: CostModel
    q0: float  # the honest race-loss rate a check's sequential test is against
    records: Records
    maker: Maker
    now: float
    nodes: list[SimNode]
    trainer_protocol: TrainerProtocol
    net: Network
    metrics: Metrics
    contention: float
    truth: dict[bytes, Truth]
    _own: dict[bytes, Group]
    version_groups: dict[int, list[Group]]
    trainer_version: int
    group_msgs: dict[bytes, Msg]
    batch_files: dict[bytes, bytes]
    ledger: StoreLedger | None

    if TYPE_CHECKING:  # the clock and the gossip, driver.Simulation's
        @property
        def trainer(self) -> SimNode: ...
        def at(self, when: float, fn: Callable[[*Ts], object], *args: *Ts) -> None: ...
        def feed(self, node: SimNode, event: E.Event, absorb: bool = False) -> None: ...
        def decode(self, origin: int, topic: str, data: bytes) -> Msg | None: ...
        def publish(self, origin: int, topic: str, data: bytes) -> Msg | None: ...
        def send(self, origin: int, peer: int, msg: Msg) -> None: ...
        def new_version(self, a: PolicyAnnouncement) -> None: ...

    def do(self, node: SimNode, action: E.Action) -> None:
        self.metrics.actions[type(action).__name__] += 1
        handler = getattr(self, f"_do_{type(action).__name__}", None)
        if handler is not None:
            handler(node, action)
        elif type(action).__name__.startswith("Persist"):
            pass  # the store: nothing to simulate
        elif hasattr(action, "topic") and hasattr(action, "data"):
            self.publish_from(node, action.topic, action.data)
        else:
            self.metrics.unhandled[type(action).__name__] += 1

    def _do_Publish(self, node: SimNode, action: E.Publish) -> None:
        self.publish_from(node, action.topic, action.data)

    def _do_Send(self, node: SimNode, action: E.Send) -> None:
        """The committee design's direct message (specs/network.md §3.5): to the trainer."""
        peer = self.metrics.index_of.get(action.peer)
        data = action.data
        if node.kind == "liar" and action.topic == TOPIC_VERDICTS:
            data = liar_claim(data, node.key)  # passes go to the trainer alone: where the lie is told
        msg = self.decode(node.index, action.topic, data)
        if msg is None or peer is None:
            self.metrics.unhandled["Send to an unknown peer" if msg else "Send undecodable"] += 1
            return
        msg.direct = True
        keep(self, node.index, msg)
        self.send(node.index, peer, msg)
        # /vrl/send/1's answer is empty: a message each way, no bytes (p2p.traffic counts it).
        self.metrics.sent(peer, 0, 1, "direct answer")
        self.metrics.received(node.index, 0, "direct answer")
        if isinstance(msg.obj, Group):
            self.metrics.published_group(node, msg.obj, self.truth.get(msg.obj.digest), self.now)
            if node.kind == "" and node.index:
                self.version_groups.setdefault(msg.obj.version, []).append(msg.obj)
        elif isinstance(msg.obj, SignedVerdict):
            self.metrics.published_verdict(self, node, msg.obj)

    def _do_FetchGroup(self, node: SimNode, action: E.FetchGroup) -> None:
        """A group by digest (specs/network.md §3.5): the trainer answers if it holds it, else a
        peer in reach that does (its producer does); the request is a digest and a version."""
        self.metrics.sent(node.index, FETCH_REQUEST_BYTES, 1, "fetch")
        held = self.group_msgs.get(action.digest)
        server = None if held is None else next(
            (i for i in (0, held.origin)
             if (p := self.nodes[i].protocol) is not None
             and p.group_version(action.digest) is not None  # held, or stored
             and self.net.reachable(node.index, i)),
            None)
        if held is None or server is None:
            self.at(self.now + 1.0, self.feed, node, E.Abandoned(action))
            return
        self.metrics.received(server, FETCH_REQUEST_BYTES, "fetch")
        answer = dataclasses.replace(held, origin=server, direct=True)
        self.send(server, node.index, answer)

    def _do_FetchEntries(self, node: SimNode, action: E.FetchEntries) -> None:
        """Entries of a paged manifest's list (specs/committee.md §3.5): the trainer answers (it
        holds every list it signed); request and answer are the daemon's bytes."""
        request = EntriesRequest(action.round, committee.List(action.list), action.positions, action.keys).to_bytes()
        self.metrics.sent(node.index, len(request), 1, "entries")
        trainer = self.nodes[0].protocol
        try:
            if trainer is None or not self.net.reachable(node.index, 0):
                raise committee.CommitteeError("unreachable", "the trainer is out of reach")
            answer = EntriesAnswer.of(trainer.rounds.answer(EntriesRequest.from_bytes(request)))
        except committee.CommitteeError:
            self.at(self.now + 1.0, self.feed, node, E.Abandoned(action))
            return
        self.metrics.received(0, len(request), "entries")
        size = len(answer.to_bytes())
        self.metrics.sent(0, size, 1, "entries")
        self.metrics.received(node.index, size, "entries")
        when = self.now + 2 * self.config.latency_s + (len(request) + size) / self.config.bandwidth_bps
        self.at(when, self.feed, node, E.EntriesReceived(action, answer))

    def publish_from(self, node: SimNode, topic: str, data: bytes) -> None:
        msg = self.publish(node.index, topic, data)
        if msg is None:
            return
        obj = msg.obj  # (of the topic's class: Simulation.decode)
        if isinstance(obj, Group):
            self.metrics.published_group(node, obj, self.truth.get(obj.digest), self.now)
            if node.kind == "" and node.index:
                self.version_groups.setdefault(obj.version, []).append(obj)
        elif isinstance(obj, SignedVerdict):
            self.metrics.published_verdict(self, node, obj)
        elif isinstance(obj, PolicyAnnouncement) and node.index == 0:
            self.new_version(obj)
        elif isinstance(obj, RoundManifest) and node.index == 0:
            # The workers list behind the header, as the trainer holds it (nodes forget old rounds).
            self.metrics.manifests.append(tuple(self.trainer_protocol.rounds.lists[obj.round].content.workers))
            self.metrics.closed_rounds.add(obj.round)

    def job(self, node: SimNode, seconds: float, fn: Callable[[*Ts], object], *args: *Ts) -> None:
        """One job on the node's model thread: it starts when the thread is free."""
        start = max(self.now, node.busy_until)
        node.busy_until = start + seconds * self.contention
        self.at(node.busy_until, fn, *args)

    def _do_FetchPolicy(self, node: SimNode, action: E.FetchPolicy) -> None:
        a = action.announcement
        # The trainer is asked first (vrl.node.blobs.Blobs.get); while it is out of reach, any peer
        # in reach that holds the version.
        server = 0 if self.net.reachable(node.index, 0) else next(
            (n.index for n in self.nodes if n.protocol is not None and a.version in n.protocol.loaded
             and self.net.reachable(node.index, n.index)), None)
        if server is None:
            self.at(self.now + 5.0, self.feed, node, E.Abandoned(action))
            return
        # vrl.node.deltas.fetch_weights: the delta when the node holds the parent's file (it loaded
        # the version before: a node keeps max_staleness + 1 versions' files), else the whole file.
        assert node.protocol is not None  # (a sybil slot runs no protocol: it has no actions)
        size = a.delta_size if a.delta and a.version - 1 in node.protocol.loaded else a.size
        self.metrics.blob(node.index, server, size)
        seconds = self.config.latency_s + size / self.config.bandwidth_bps
        self.at(self.now + seconds, self.feed, node, E.PolicyLoaded(a.version))

    def _do_Generate(self, node: SimNode, action: E.Generate) -> None:
        assert node.protocol is not None
        per_round = node.protocol.config.groups_per_round
        seconds = self.records.tokens * per_round * self.cost.generate_ms_per_token / 1000
        if node.kind != "replay":  # a replayer's groups depend on its loot when it ends
            self.maker.ask(node.key, action.version, per_round, _reward(node))
        self.job(node, seconds, self._generated, node, action.version, per_round)

    def _generated(self, node: SimNode, version: int, count: int) -> None:
        if node.kind != "replay":
            groups = list(self.maker.take(node.key, version, count, _reward(node)))
            for group in groups:
                self.truth[group.digest] = Truth(node.index, node.kind)
        else:
            groups = []
            for index in range(count):
                loot = self._loot(node)
                group = (self.records.resigned(loot, node.key, index) if loot is not None
                         else self.records.group(node.key, version, index))
                # A replayer with no loot the network would take makes an honest group (as the
                # devnet's does, vrl.harness.adversary.CheatingWork.replayed).
                self.truth[group.digest] = Truth(node.index, "replay" if loot is not None else "")
                groups.append(group)
        if node.kind == "withhold":
            # Submits the half it likes best (the rewarded ones first), holds the rest back.
            groups = sorted(groups, key=lambda g: -sum(r.reward for r in g.rollouts))[:max(1, count // 2)]
            self.metrics.withheld += count - len(groups)
        for group in groups:
            self._own[group.to_bytes()] = group
        self.feed(node, E.Generated(version, tuple(groups)))

    @staticmethod
    def _loot(node: SimNode) -> Group | None:
        """The replay cheat's freshest loot that the network would still take, taken out of its
        loot (as vrl.harness.adversary.CheatingWork.replayed)."""
        p = node.protocol
        assert p is not None
        return take_freshest(node.seen, lambda group: p.takes_new_groups(group.version))

    def _do_Check(self, node: SimNode, action: E.Check) -> None:
        truth = self.truth.get(action.group)
        subject = self.nodes[truth.maker].kind if truth is not None and truth.maker >= 0 else ""
        held = self.group_msgs.get(action.group)
        # The group's own completion tokens: a check replays each of them (specs/verification.md §7),
        # and a receiver refuses a verdict stating more than the group has.
        tokens = (sum(len(r.completion_tokens) for r in held.obj.rollouts)
                  if held is not None and isinstance(held.obj, Group) else self.records.tokens)
        checked, share = check_result(truth, action.group, node.kind, subject, tokens, self.q0,
                                      self.config.honest_reject, self.rng, node.key.node_id)
        seconds = share * self.records.tokens * self.cost.verify_ms_per_token / 1000
        self.job(node, seconds, self._checked, node, checked, seconds, truth is not None and truth.cheat == "sybil")

    def _checked(self, node: SimNode, checked: E.Checked, seconds: float, sybil: bool = False) -> None:
        self.metrics.checked(node.index, seconds, sybil)
        self.feed(node, checked)

    def _do_Plant(self, node: SimNode, action: E.Plant) -> None:
        canary = NodeKey.from_seed(hashlib.sha256(CANARY_DOMAIN + node.key.sign(
            action.version.to_bytes(8, "big"))).digest())
        group = self.records.group(canary, action.version, 0)
        self.truth[group.digest] = Truth(-1, "planted")
        seconds = self.records.tokens * self.cost.generate_ms_per_token / 1000
        self._own[group.to_bytes()] = group
        self.job(node, seconds, self.feed, node, E.Planted(group.submission, canary.node_id, action.version))

    def _do_Train(self, node: SimNode, action: E.Train) -> None:
        batch = action.batch
        if node.kind == "trainer-rejected-group" and action.version >= CHEAT_FROM:
            batch = (*batch, *self._failed_by_trainer(node, batch))
        self.job(node, self.cost.step_seconds, self._trained, node, action.version, batch)

    def _failed_by_trainer(self, node: SimNode, batch: Batch) -> Batch:
        """vrl.harness.adversary.CheatingTrainer.with_failed_groups: fresh groups it failed itself
        a round or more ago, two at most, listed in the batch."""
        p, listed = node.protocol, {d for d, _ in batch}
        assert p is not None
        version = p.version
        assert version is not None, "a Train comes to a trainer that follows a version"
        failed = sorted(d for d, verdicts in p.verdicts.items()
                        if (own := verdicts.get(p.me)) is not None and own.outcome == Outcome.HARD_FAIL
                        and own.round < version and d in p.groups and d not in listed
                        and 0 <= version - p.groups[d].version <= p.config.max_staleness)
        return tuple((d, 1.0) for d in failed[:2])

    def _trained(self, node: SimNode, version: int, batch: Batch) -> None:
        self.metrics.trained(self, batch)
        assert node.protocol is not None
        a = self._announcement(node.key, version + 1, tuple(batch), node.protocol.design.manifests)
        self.feed(node, E.Trained(a, tuple(d for d, _ in batch)))

    def _announcement(self, key: NodeKey, version: int, batch: Batch, in_file: bool = False) -> PolicyAnnouncement:
        """As vrl.node.training announces: a committee network's batch in a file it serves."""
        c = self.config
        file = BatchFile(key.node_id, version, batch).to_bytes() if in_file and batch else b""
        a = announcement(key, version, batch, c.weights_bytes, c.optimizer_bytes, c.delta_bytes, batch_file=file)
        if file:
            self.batch_files[a.batch_file] = file
        return a

    def _do_FetchBatch(self, node: SimNode, action: E.FetchBatch) -> None:
        """A step's batch file (specs/network.md §3.3.1), from the trainer, which keeps it."""
        a = action.announcement
        file = self.batch_files.get(a.batch_file)
        if file is None or not self.net.reachable(node.index, 0):
            self.at(self.now + 5.0, self.feed, node, E.Abandoned(action))
            return
        self.metrics.blob(node.index, 0, len(file))
        seconds = self.config.latency_s + len(file) / self.config.bandwidth_bps
        self.at(self.now + seconds, self.feed, node, E.BatchFetched(a, BatchFile.of(a, file)))

    def _do_ReplayStep(self, node: SimNode, action: E.ReplayStep) -> None:
        a = action.announcement
        # The step's config, and the optimizer states before and after, fetched from the trainer.
        parent = self.trainer_protocol.policies.get(a.version - 1)
        self.metrics.counters["step_replays"][node.index] += 1
        self.metrics.blob(node.index, 0, a.optimizer_size + (parent.optimizer_size if parent else 0) + 1024)
        self.job(node, self.cost.step_seconds, self._replayed, node, a)

    def _replayed(self, node: SimNode, a: PolicyAnnouncement) -> None:
        cheat = self.trainer.kind
        faults = REPLAY_FAULTS.get(cheat, ()) if a.version > CHEAT_FROM else ()
        replayed = a.model_hash if not faults else hashlib.sha256(b"replayed" + a.model_hash).digest()
        self.feed(node, E.StepReplayed(a.version, tuple(str(f) for f in faults), replayed, 1.0 if faults else 0.0))

    def _do_StepVerdict(self, node: SimNode, action: object) -> None:  # (not an action today; kept generic)
        self.metrics.unhandled["StepVerdict"] += 1

    def _do_Quarantine(self, node: SimNode, action: E.Quarantine) -> None:
        pass  # observed from the protocol's state (_observe)

    def _do_Persist(self, node: SimNode, action: E.Persist) -> None:
        keep_action(self, node.index, action)  # the store: what backfill pages (stores.py)

    def _do_PersistStep(self, node: SimNode, action: E.PersistStep) -> None:
        keep_action(self, node.index, action)

    def _do_PersistManifest(self, node: SimNode, action: E.PersistManifest) -> None:
        keep_action(self, node.index, action)

    def _do_ConvictTrainer(self, node: SimNode, action: E.ConvictTrainer) -> None:
        pass  # observed from the protocol's state (_observe)


def _reward(node: SimNode) -> float | None:
    """The reward a worker's records state: 1 for the fabricated-reward cheat, else drawn."""
    return 1.0 if node.kind == "fabricated-reward" else None
