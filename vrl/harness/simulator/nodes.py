"""What the simulation holds of each node, and what it hands them: a simulated node (its
protocol, its inbox, its model thread's and event loop's busy times) and a gossiped message,
decoded once. The driver (the clock), the actions and the stores' model all take these; none
of them is imported by this module, so none imports another through it."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from vrl.node.protocol import NodeProtocol
from vrl.rollouts.keys import NodeKey


@dataclass(eq=False)
class Msg:
    """One gossiped message, decoded once and shared by every receiver."""

    topic: str
    data: bytes
    obj: object
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
    seen: deque = field(default_factory=lambda: deque(maxlen=16))  # the replay cheat's loot
    prepaid: set = field(default_factory=set)  # deliveries whose bytes a backfill page counted
    # Gossip this node missed since its last backfill pass, bytes and messages: what the
    # "gossip" model's pass pages it when it names what it holds (stores.gossip_pass).
    lacked: list[int] = field(default_factory=lambda: [0, 0])
    cpu_until: float = 0.0  # when its event loop is free again (with SimConfig.cores)
    known_quarantined: int = 0
    convicted_at: float | None = None

