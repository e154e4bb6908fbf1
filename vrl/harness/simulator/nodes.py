"""What the simulation holds of each node, and what it hands them: a simulated node (its
protocol, its inbox, its model thread's and event loop's busy times), the trainer's protocol
(which remembers what the metrics read), and a gossiped message, decoded once. The driver (the
clock), the actions, the stores' model and the metrics all take these; none of them is imported
by this module, so none imports another through it."""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

from vrl.node import forgetting
from vrl.node.messages import Group, PolicyAnnouncement, RoundManifest, SignedVerdict, StepVerdict
from vrl.node.protocol import NodeProtocol, ProtocolConfig
from vrl.rollouts.keys import NodeKey

#: What a gossiped message decodes to (driver.Simulation.decode): a topic's message class of
#: vrl.node.messages.GOSSIP_MESSAGES, a group's submission decoded as its records' Group.
Gossiped = Group | SignedVerdict | PolicyAnnouncement | StepVerdict | RoundManifest


@dataclass(eq=False)
class Msg:
    """One gossiped message, decoded once and shared by every receiver."""

    topic: str
    data: bytes
    obj: Gossiped
    origin: int
    round: int  # the version it belongs to: what a backfill pass (rounds >= version - 1) still brings
    valid: bool
    direct: bool = False  # sent to one node (a Send or a fetch's answer): not forwarded, not in backfill

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def kind(self) -> str:
        """What carried it, as Metrics.bytes_by_kind names it."""
        return f"direct {self.topic}" if self.direct else self.topic


@dataclass(eq=False)
class SimNode:
    index: int
    key: NodeKey
    kind: str  # adversary kind, "" for honest
    protocol: NodeProtocol | None  # None for a sybil slot (it runs no protocol)
    busy_until: float = 0.0
    slots: dict[float, list[Msg]] = field(default_factory=dict)
    missed: list[Msg] = field(default_factory=list)
    seen: deque[Group] = field(default_factory=lambda: deque(maxlen=16))  # the replay cheat's loot
    prepaid: set[Msg] = field(default_factory=set)  # deliveries whose bytes a backfill page counted
    # Gossip this node missed since its last backfill pass, bytes and messages: what the
    # "gossip" model's pass pages it when it names what it holds (stores.gossip_pass).
    lacked: list[int] = field(default_factory=lambda: [0, 0])
    cpu_until: float = 0.0  # when its event loop is free again (with SimConfig.cores)
    known_quarantined: int = 0
    convicted_at: float | None = None



class TrainerProtocol(NodeProtocol):
    """The trainer's protocol, unchanged, that remembers for the run's metrics (groups lost,
    honest verdicts not counted) who had verdicts counted on each group it forgets
    (vrl.node.forgetting): the metrics read the whole run, the protocol keeps a few rounds."""

    def __init__(self, key: NodeKey, config: ProtocolConfig, platform: str, race_loss_rate: float) -> None:
        super().__init__(key, config, platform, race_loss_rate)
        self.counted_on_forgotten: dict[bytes, frozenset[bytes]] = {}

    def forget(self, version: int) -> None:
        floor = forgetting.group_floor(version, self.config.max_staleness)
        if floor <= self.group_floor:
            return
        before = {d: frozenset(self.verdicts.get(d, ())) for v in self.versions_below(floor)
                  for d in self.groups_of_version(v)}
        super().forget(version)
        self.counted_on_forgotten.update((d, who) for d, who in before.items() if d not in self.groups)

    def counted(self, digest: bytes) -> Collection[bytes] | None:
        """The verifiers whose verdicts on a group were counted (None: never held)."""
        if digest in self.groups:
            return self.verdicts.get(digest, {})
        return self.counted_on_forgotten.get(digest)
