"""The simulation: N real :class:`vrl.node.protocol.NodeProtocol` state machines on one
discrete-event clock (a heap), doing what their actions say as the daemon would
(vrl.node.daemon.Node._do), with the work charged in time instead of done.

* Every action is dispatched by its type's name (``_do_<Name>``); an action of a type this
  driver does not know that carries ``topic`` and ``data`` is gossiped as a Publish is, so a
  design that adds messages (the committee's) runs unchanged; any other unknown action is
  counted in ``unhandled`` and reported.
* A gossiped message is decoded once and the decoded, immutable object is handed to every
  receiver (the protocol is fed decoded messages); its size is the real encoding's length.
  Which event a message becomes is found from vrl.node.events: the event whose one field holds
  that message class (a group becomes GroupReceived, as the daemon makes it).
* Each receiver runs the gossip validator's checks (vrl.node.validation.Validator's, against
  its own protocol state; signature validity computed once per message, since it depends on
  the bytes alone) before the message is handled and forwarded.
* A node handles its inbox once per ``window_s`` (the daemon's own tick): groups and verdicts
  that arrived in the window are fed in arrival order with ``replaying=True`` (state changes,
  no actions: the protocol's documented way to absorb events whose actions are asked for
  later), then a Tick is fed, whose ``pending()`` returns every action the state calls for.
  Other events (policies, step verdicts, a job's result) are fed as they come.
* A node's model work (generate, check, plant, train, replay) runs on one model thread, one
  job at a time (vrl.node.work.ModelThread), each taking the time spec.CostModel charges.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import math
import random
import time
import typing
from collections.abc import Callable
from typing import Any, TypeVarTuple

from vrl.node import events as E
from vrl.node.admission import AdmissionConfig
from vrl.node.config import NODE_OVERRIDES
from vrl.node.daemon import BACKFILL_EVERY_SECONDS, TICK_SECONDS
from vrl.node.messages import (
    GOSSIP_MESSAGES,
    TOPIC_GROUPS,
    TOPIC_VERDICTS,
    Group,
    MessageError,
    PolicyAnnouncement,
    SignedVerdict,
    StepVerdict,
    Submission,
    decode_group,
)
from vrl.node.protocol import NodeProtocol, ProtocolConfig
from vrl.node.wire import schema_of
from vrl.rollouts.keys import NodeKey

from .actions import Actions
from .making import Maker
from .metrics import Metrics
from .network import Network
from .nodes import Gossiped, Msg, SimNode, TrainerProtocol
from .payloads import Records, Truth, sybil_verdict
from .spec import PLATFORM, CostModel, SimConfig, assign, honest_race_loss, sybil_slots
from .stores import GossipMark, StoreLedger, daemon_pass, gossip_pass, keep

Ts = TypeVarTuple("Ts")
#: The clock's queue: (when, order of scheduling, what runs then, its arguments), a heap.
Scheduled = tuple[float, int, Callable[..., object], tuple[object, ...]]

# The seed of a simulated node's key (specs/README.md lists it among the local tags).
NODE_KEY_DOMAIN = b"vrl/sim/node\x00"
TOPIC_CLASS = {schema_of(cls).topic: cls for cls in GOSSIP_MESSAGES}
# How often a node but the trainer is ticked while nothing reaches it: what it reacts to (a
# message, a finished job) is followed by a Tick of its own, so an idle tick serves only its
# timers: step_wait (30 s) and the reputation evaluation's REPUTATION_EVERY_SECONDS (5 s). At
# N = 1,000 one-second ticks were a quarter of the run (cProfile), nearly all of them idle.
IDLE_TICK_SECONDS = 5.0
# The kinds of event the inbox absorbs with replaying=True (their only direct actions are Persist).
_ABSORBED = (E.GroupReceived, E.VerdictReceived)


def _event_for() -> dict[type, tuple[Callable[..., E.Event], bool]]:
    """Message class -> the event (vrl.node.events.Event) that holds such a message in its one
    field, or in its first beside ``now`` and fields with defaults (as GroupReceived holds a group), and
    whether it takes ``now``."""
    hints: dict[str, tuple[Callable[..., E.Event], bool]] = {}
    for cls in typing.get_args(E.Event):
        event: Callable[..., E.Event] = cls  # an event's class, made from its fields
        if dataclasses.is_dataclass(cls):
            fields = dataclasses.fields(cls)
            names = [f.name for f in fields]
            rest_default = all(f.default is not dataclasses.MISSING for f in fields[2:])
            if len(fields) == 1 or (names[1:2] == ["now"] and rest_default):
                kind = fields[0].type if isinstance(fields[0].type, str) else fields[0].type.__name__
                hints.setdefault(kind, (event, len(fields) >= 2))
    return {message: hints[message.__name__] for message in GOSSIP_MESSAGES if message.__name__ in hints}


EVENT_FOR = _event_for()


class Simulation(Actions):
    """Build with a :class:`SimConfig`; :meth:`run` returns the :class:`Metrics`."""

    def __init__(self, config: SimConfig) -> None:
        self.config = c = config
        self.rng = random.Random(c.seed)
        self.cost = CostModel.from_results(c.cost_file, c.step_seconds)
        self.q0 = honest_race_loss()
        self.records = Records(c)
        self.maker = Maker(self.records, c.makers)
        self.queue: list[Scheduled] = []
        self._seq = 0
        self._asked = 0  # over_limit's calls
        self.now = 0.0
        # (wall-clock and CPU seconds when the run started, its limits on them)
        self._limits: tuple[float, float, float | None, float | None] = (time.perf_counter(), time.process_time(),
                                                                         None, None)
        overrides = {**c.protocol, "verification": c.design}
        self.last_version = c.warmup + c.rounds
        # A node's [admission] table as node.toml gives it (vrl.node.config.NODE_OVERRIDES: batches
        # of 12, node_cap 0.34), as the calibration's devnet runs; config.admission overrides it.
        self.admission = AdmissionConfig(**{**NODE_OVERRIDES["admission"], **c.admission})
        self.round_bytes: dict[int, int] = {}  # gossip bytes published per round: what peers' stores hold
        self.round_messages: dict[int, int] = {}  # and messages
        self.params: dict[str, Any] = {**overrides, "last_version": self.last_version}  # ProtocolConfig's
        kinds = assign(c.adversaries, c.nodes)
        self.sybils = sybil_slots(c.adversaries, c.nodes)
        self.net = Network(c.nodes + self.sybils, c.topology, random.Random(c.seed + 2), c.latency_s,
                           c.bandwidth_bps, c.loss)
        self.trainer_key = self._key(0)
        self.nodes: list[SimNode] = []
        for i in range(c.nodes + self.sybils):
            key = self._key(i)
            if i >= c.nodes:
                self.nodes.append(SimNode(i, key, "sybil", None))
                continue
            self.nodes.append(self._node(i, key, kinds.get(i, "")))
        trainer = self.nodes[0].protocol
        assert isinstance(trainer, TrainerProtocol)
        self.trainer_protocol = trainer  # what the metrics read of the whole run
        self.metrics = Metrics(c, self.nodes, self.cost)
        # Processor sharing, crudely: with `cores` set, every node's compute runs nodes / cores
        # times slower (all busy at once: an upper bound), as on the devnet's one machine.
        self.contention = max(1.0, c.nodes / c.cores) if c.cores else 1.0
        self.truth: dict[bytes, Truth] = {}
        self._own: dict[bytes, Group] = {}  # groups this driver made, by their bytes: decoded already
        self.version_groups: dict[int, list[Group]] = {}  # honest groups published, for the sybils' smears
        self.trainer_version = -1
        self.group_msgs: dict[bytes, Msg] = {}  # every group made, for fetches by digest (pruned as rounds age)
        self.batch_files: dict[bytes, bytes] = {}  # the trainer's batch files by hash (vrl.node.training)
        self.ledger = StoreLedger() if c.backfill.startswith("daemon") else None  # what each store holds (stores.py)
        # Per node, what its last backfill pass left for the next: the "gossip" models' (stores.gossip_pass), the
        # "daemon" models' (the since of its last pass, stores.daemon_pass).
        self.gossip_marks: dict[int, GossipMark] = {}
        self.daemon_marks: dict[int, int] = {}

    # -- set-up ------------------------------------------------------------------------------------
    def _key(self, i: int) -> NodeKey:
        return NodeKey.from_seed(hashlib.sha256(NODE_KEY_DOMAIN + self.config.seed.to_bytes(8, "big")
                                                + i.to_bytes(8, "big")).digest())

    def _node(self, i: int, key: NodeKey, kind: str) -> SimNode:
        # As vrl.harness.devnet.plan: node 0 trains and verifies, the others work and verify.
        roles = frozenset({"trainer", "verifier"} if i == 0 else {"worker", "verifier"})
        config = ProtocolConfig(**self.params, roles=roles, trainer=self.trainer_key.node_id,
                                admission=self.admission)
        return SimNode(i, key, kind, (TrainerProtocol if i == 0 else NodeProtocol)(key, config, PLATFORM, self.q0))

    @property
    def trainer(self) -> SimNode:
        return self.nodes[0]

    # -- the clock -------------------------------------------------------------------------------
    def at(self, when: float, fn: Callable[[*Ts], object], *args: *Ts) -> None:
        self._seq += 1
        heapq.heappush(self.queue, (when, self._seq, fn, args))

    def run(self, wall_limit_s: float | None = None, cpu_limit_s: float | None = None) -> Metrics:
        """Run until the trainer's last version, the simulated deadline, or a limit on this
        process's wall-clock or CPU seconds (on a shared machine CPU is the fair measure)."""
        started, cpu_started = time.perf_counter(), time.process_time()
        self._limits = (started, cpu_started, wall_limit_s, cpu_limit_s)
        self.feed(self.trainer, E.Trained(self._announcement(self.trainer_key, 0, ()), ()))
        for node in self.nodes:
            if node.protocol is not None:
                if node.index:
                    self.at(1.0, self.tick, node)
                self.at(self.net.backfill_at(0.0), self.backfill_pass, node)
        self.at(TICK_SECONDS, self.tick, self.trainer)
        try:
            while self.queue and self.trainer_version < self.last_version:
                when, _, fn, args = heapq.heappop(self.queue)
                if when > self.config.deadline_s:
                    self.metrics.stopped = f"simulated deadline {self.config.deadline_s:.0f} s"
                    break
                if self.over_limit():
                    break
                self.now = when
                fn(*args)
        finally:
            self.metrics.maker_cpu_seconds = self.maker.close()
        self.metrics.cpu_seconds = time.process_time() - cpu_started
        self.metrics.finish(self, time.perf_counter() - started)
        return self.metrics

    def over_limit(self) -> bool:
        """Whether a wall-clock or CPU limit of the run has passed (asked between events, and
        between the messages of one inbox, which at scale can hold thousands)."""
        started, cpu_started, wall, cpu = self._limits
        self._asked += 1
        # process_time is a ~7 us system call on this VM (time.perf_counter 0.4 us): asked once in
        # 256 times, it was 3% of the run at N = 1,000 instead of ~10%.
        if cpu is not None and self._asked % 256 == 0 and time.process_time() - cpu_started > cpu:
            self.metrics.stopped = f"CPU limit {cpu:.0f} s"
        elif wall is not None and time.perf_counter() - started > wall:
            self.metrics.stopped = f"wall-clock limit {wall:.0f} s"
        return bool(self.metrics.stopped)

    def tick(self, node: SimNode) -> None:
        """The daemon's tick: the clock moves, what is due is done (the trainer every
        TICK_SECONDS as the daemon; others every IDLE_TICK_SECONDS, enough for their timers)."""
        # Skipped while the node's event loop is busy, or when an inbox is due now (its handling
        # ends with a Tick of its own).
        if (node.index not in self.net.offline and node.cpu_until <= self.now
                and not any(slot <= self.now for slot in node.slots)):
            self.feed(node, E.Tick(self.now))
        self.at(self.now + (TICK_SECONDS if node.index == 0 else IDLE_TICK_SECONDS), self.tick, node)

    # -- feeding the protocol --------------------------------------------------------------------
    def handle(self, node: SimNode, event: E.Event, absorb: bool = False) -> list[E.Action]:
        """The node's protocol fed one event; the wall time it took is the protocol's own CPU
        cost, counted per node (what a real node's event loop spends on it)."""
        # perf_counter, not process_time: the latter is a ~7 us system call on this VM, twice per
        # event 43% of the run at N = 1,000 (py-spy). The wall time of one short call is its CPU
        # time unless the process is preempted inside it, which the shared machine makes rare.
        assert node.protocol is not None  # (a sybil slot runs no protocol: nothing is fed to it)
        started = time.perf_counter()
        actions = node.protocol.handle(event, replaying=absorb)
        cpu = time.perf_counter() - started
        self.metrics.protocol_cpu(node.index, cpu)
        if self.config.cores:
            # Nodes sharing `cores` processors (a devnet on one machine): the node's event loop is
            # busy for its protocol's CPU time, stretched by the processes that share the cores.
            node.cpu_until = max(node.cpu_until, self.now) + cpu * self.contention
        return actions

    def feed(self, node: SimNode, event: E.Event, absorb: bool = False) -> None:
        actions = self.handle(node, event, absorb)
        self._observe(node)
        for action in actions:
            self.do(node, action)

    def _observe(self, node: SimNode) -> None:
        p = node.protocol
        assert p is not None
        if len(p.quarantined) != node.known_quarantined:
            node.known_quarantined = len(p.quarantined)
            self.metrics.quarantines(self, node, p.quarantined)
        if p.convicted is not None and node.convicted_at is None:
            node.convicted_at = self.now

    # -- gossip ----------------------------------------------------------------------------------
    def decode(self, origin: int, topic: str, data: bytes) -> Msg | None:
        """A message decoded once (what every receiver is handed), or None if it does not decode."""
        cls = TOPIC_CLASS.get(topic)
        obj: Gossiped
        try:
            if topic == TOPIC_GROUPS:
                obj = self._own.pop(data, None) or decode_group(data)
                version, valid = obj.version, True
            elif cls is not None:
                decoded = cls.from_bytes(data)
                assert not isinstance(decoded, Submission)  # (TOPIC_GROUPS': decoded as a Group above)
                obj = decoded
                version = next((getattr(obj, a) for a in ("policy_version", "version", "round") if hasattr(obj, a)), 0)
                valid = obj.valid() if hasattr(obj, "valid") else True
            else:
                self.metrics.unhandled[f"topic {topic}"] += 1
                return None
        except MessageError:
            self.metrics.unhandled[f"undecodable {topic}"] += 1
            return None
        msg = Msg(topic, data, obj, origin, version, valid)
        if isinstance(obj, Group):
            self.group_msgs[obj.digest] = msg
        return msg

    def publish(self, origin: int, topic: str, data: bytes) -> Msg | None:
        msg = self.decode(origin, topic, data)
        if msg is None:
            return None
        self.round_bytes[msg.round] = self.round_bytes.get(msg.round, 0) + msg.size
        self.round_messages[msg.round] = self.round_messages.get(msg.round, 0) + 1
        keep(self, origin, msg)
        copies = self.net.forwards(origin, origin=True)
        self.metrics.sent(origin, msg.size * copies, copies, msg.topic)
        arrivals = self.net.arrivals(origin, msg.size, self.now)
        for j, node in enumerate(self.nodes):
            if node.protocol is None:
                continue
            if j == origin:
                # Its own message comes back to the publisher (vrl.node.daemon.Node._publish): no
                # delivery, no bytes, but its protocol holds its own groups as any other's.
                node.prepaid.add(msg)
                arrivals[j] = self.now
            if not self.net.reachable(origin, j):
                node.missed.append(msg)
                _lacks(node, msg)
                continue
            when = float(arrivals[j])
            if self.net.missed():
                when = self.net.backfill_at(when)
                node.prepaid.add(msg)  # its bytes are in the backfill page that brings it
                _lacks(node, msg)
            self.deliver(node, msg, when)
        return msg

    def deliver(self, node: SimNode, msg: Msg, when: float) -> None:
        """Into the inbox window of ``when``."""
        window = self.config.window_s
        slot = math.ceil(when / window) * window
        bucket = node.slots.get(slot)
        if bucket is None:
            node.slots[slot] = [msg]
            self.at(slot, self.drain, node, slot)
        else:
            bucket.append(msg)

    def send(self, origin: int, peer: int, msg: Msg) -> None:
        """One message to one node (a Send, a fetch's answer): one hop, counted once each side."""
        self.metrics.sent(origin, msg.size, 1, msg.kind)
        node = self.nodes[peer]
        if node.protocol is None:
            return
        if not self.net.reachable(origin, peer):
            node.missed.append(msg)  # resent when they meet again (backfill's time)
            return
        self.deliver(node, msg, self.now + self.config.latency_s + msg.size / self.config.bandwidth_bps)

    def drain(self, node: SimNode, slot: float) -> None:
        """Handle what reached ``node`` in one window: validate each message, feed it, then tick."""
        if node.cpu_until > self.now + 1e-9:
            # The node's event loop is still busy: what arrived waits for it.
            later = math.ceil(node.cpu_until / self.config.window_s) * self.config.window_s
            waiting = node.slots.pop(slot, [])
            if later in node.slots:
                node.slots[later].extend(waiting)
            else:
                node.slots[later] = waiting
                self.at(later, self.drain, node, later)
            return
        msgs = node.slots.pop(slot, ())
        if node.index in self.net.offline:
            node.missed.extend(msgs)
            for msg in msgs:
                _lacks(node, msg)
            return
        fed = False
        for count, msg in enumerate(msgs):
            if count % 64 == 63 and self.over_limit():
                return
            if msg in node.prepaid:
                node.prepaid.discard(msg)
            else:
                self.metrics.received(node.index, msg.size, msg.kind)
            if self.nodes[msg.origin].kind == "sybil" and not self.sybil_delivered(node, msg):
                continue
            if not self.validate(node, msg):
                continue
            copies = 0 if msg.direct else self.net.forwards(node.index, origin=False)
            if msg.origin != node.index and copies:
                self.metrics.sent(node.index, msg.size * copies, copies, msg.topic)
            event = self.event_of(msg)
            if event is None:
                continue
            if isinstance(event, _ABSORBED):
                if (node.kind == "replay" and isinstance(event, E.GroupReceived)
                        and event.group.subject != node.key.node_id):
                    node.seen.append(event.group)
                self.handle(node, event, absorb=True)
                fed = True
            else:
                self.feed(node, event)
            keep(self, node.index, msg)
        if fed:
            self.feed(node, E.Tick(self.now))

    def event_of(self, msg: Msg) -> E.Event | None:
        if isinstance(msg.obj, Group):
            return E.GroupReceived(msg.obj, self.now)
        found = EVENT_FOR.get(type(msg.obj))
        if found is None:
            self.metrics.unhandled[f"message {type(msg.obj).__name__}"] += 1
            return None
        event, timed = found
        return event(msg.obj, self.now) if timed else event(msg.obj)

    def validate(self, node: SimNode, msg: Msg) -> bool:
        """vrl.node.validation.Validator's accept, against this receiver's state."""
        p, obj = node.protocol, msg.obj  # (obj of the topic's class: decode)
        assert p is not None
        if not msg.valid:
            return False
        if isinstance(obj, Group):
            return not (obj.subject in p.quarantined or obj.index >= p.config.groups_per_round
                        or len(obj.rollouts) != self.config.group_size
                        or not p.takes_group(obj.version, obj.digest)
                        or p.slot_taken(obj.subject, obj.version, obj.index, obj.digest))
        if isinstance(obj, SignedVerdict):
            return p.matches_group(obj) is not False and p.room_for(obj)
        if isinstance(obj, PolicyAnnouncement):
            return obj.trainer == p.config.trainer
        if isinstance(obj, StepVerdict):
            return obj.trainer == p.config.trainer and p.may_hold(obj.version)
        # A message kind a newer design added (a round manifest): what the validator asks of any
        # signed message, and that a trainer's message is the configured trainer's.
        return getattr(obj, "trainer", p.config.trainer) == p.config.trainer

    def sybil_delivered(self, node: SimNode, msg: Msg) -> bool:
        """Account what a flood's message costs an honest receiver (specs/committee.md §7), and
        whether it goes on past the design's claim check: in the committee design a verdict is
        refused (REJECT) or ignored (no manifest yet) by vrl.node.validation.Validator before its
        signature, as here; a group's records are signature-checked as it is decoded."""
        assert node.protocol is not None
        refusal = node.protocol.verdict_refusal(msg.obj) if isinstance(msg.obj, SignedVerdict) else None
        self.metrics.sybil_delivery(node, msg, refusal, self.config.group_size)
        return refusal is None

    def backfill(self, node: SimNode) -> None:
        """What a node missed (offline, across a partition) comes by backfill, if still in its
        window (vrl.node.daemon: rounds >= version - 1); the rest is lost to it."""
        assert node.protocol is not None
        missed, node.missed = node.missed, []
        since = max((node.protocol.version or 0) - 1, 0)
        when = self.net.backfill_at(self.now)
        slot = math.ceil(when / self.config.window_s) * self.config.window_s
        kept = [m for m in missed if m.round >= since]
        node.prepaid.update(kept)
        self.metrics.lost_to_backfill += len(missed) - len(kept)
        if kept:
            node.slots.setdefault(slot, [])
            if len(node.slots[slot]) == 0:
                self.at(slot, self.drain, node, slot)
            node.slots[slot].extend(kept)

    def backfill_pass(self, node: SimNode) -> None:
        """vrl.node.daemon: every BACKFILL_EVERY_SECONDS a node pages through each connected
        peer's log of rounds >= its version - 1 from its cursor on that peer, kept across rounds (vrl.node.catchup.
        Backfill.pull, specs/network.md §6), keeping what it lacks, in pages of at most
        BACKFILL_PAGE_BYTES, BACKFILL_MAX_PAGES of them (stores.py: a peer's log is its store, or
        everything gossiped in those rounds; SimConfig.backfill)."""
        assert node.protocol is not None
        if node.index not in self.net.offline and node.protocol.version is not None:
            model = self.config.backfill
            full, per_round = model.endswith("-full"), model.endswith("-round")
            have = "-" not in model  # "gossip", "daemon": the asker names what it holds
            if self.ledger is not None:
                daemon_pass(self, node, full, per_round, have)
            else:
                gossip_pass(self, node, full, per_round, have)
        self.at(self.now + BACKFILL_EVERY_SECONDS, self.backfill_pass, node)

    # -- rounds ----------------------------------------------------------------------------------
    def new_version(self, a: PolicyAnnouncement) -> None:
        """The trainer announced a version: a round ends. Churn, joins, partitions and sybils act here."""
        self.trainer_version = a.version
        self.metrics.round_ended(self, a.version)
        oldest = a.version - self.trainer_protocol.config.max_staleness - 2  # no fetch names an older group
        for digest in [d for d, m in self.group_msgs.items() if m.round < oldest]:
            del self.group_msgs[digest]
        if self.ledger is not None:
            self.ledger.prune(oldest)
        for version in sorted(self.version_groups)[:-2]:  # the flood smears the two newest rounds held only
            del self.version_groups[version]
        c, v = self.config, a.version
        if c.partition is not None:
            start, end, share = c.partition
            if v == start:
                others = list(range(1, c.nodes))
                self.net.cut = set(self.rng.sample(others, max(1, round(share * len(others)))))
            elif v == end and self.net.cut:
                healed, self.net.cut = self.net.cut, set()
                for node in self.nodes:
                    if node.protocol is not None and node.missed:
                        self.backfill(node)
                self.metrics.partitioned = len(healed)
        if c.churn:
            back = list(self.net.offline)
            self.net.offline.clear()
            for i in back:
                self.backfill(self.nodes[i])
            for node in self.nodes[1:]:
                if node.protocol is not None and self.rng.random() < c.churn:
                    self.net.offline.add(node.index)
                    self.metrics.left += 1
        for _ in range(c.joins):
            self.join(a)
        if self.sybils and v < self.last_version:
            gen = self.records.tokens * 4 * self.cost.generate_ms_per_token / 1000
            self.at(self.now + gen + 1.0, self.flood, v)

    def join(self, a: PolicyAnnouncement) -> None:
        i = self.net.add_node(self.config.topology)
        node = self._node(i, self._key(i), "")
        self.nodes.append(node)
        self.metrics.grow(node)
        self.metrics.joined += 1
        for version in sorted(self.trainer_protocol.policies):
            if version >= a.version - 1:  # what its first backfill brings (rounds >= version - 1)
                self.feed(node, E.PolicyAnnounced(self.trainer_protocol.policies[version]))
        self.at(self.now + 1.0, self.tick, node)

    def flood(self, version: int) -> None:
        """Each sybil slot mints a fresh key: it submits a round's groups (bad) and hard-fails up
        to sybil_verdicts honest groups of the round."""
        # The honest groups of the two newest rounds that have any (fresh, max_staleness 2; the older
        # one's manifest held, so both of §4's refusals are exercised): a version may have none (N = 8).
        targets = [g for v in sorted(self.version_groups)[-2:] for g in self.version_groups[v]]
        committee = self.trainer_protocol.design.manifests
        for node in self.nodes:
            if node.kind != "sybil":
                continue
            key = NodeKey.from_seed(self.rng.randbytes(32))
            self.metrics.sybil_keys += 1
            for index in range(self.trainer_protocol.config.groups_per_round):
                group = self.records.group(key, version, index, reward=1.0)
                self.truth[group.digest] = Truth(-1, "sybil")
                self._own[group.to_bytes()] = group
                msg = self.publish(node.index, TOPIC_GROUPS, group.to_bytes())
                if msg is not None:
                    self.metrics.sybil_message(msg)
            for group in self.rng.sample(targets, min(len(targets), self.config.sybil_verdicts)):
                msg = self.publish(node.index, TOPIC_VERDICTS, sybil_verdict(key, group, version, committee).to_bytes())
                if msg is not None:
                    self.metrics.sybil_message(msg)


def _lacks(node: SimNode, msg: Msg) -> None:
    """``node`` missed a gossip delivery: its next pass cannot name it as held (stores.gossip_pass)."""
    node.lacked[0] += msg.size
    node.lacked[1] += 1
