"""Incremental passes over a node's fresh groups (the trainer holds ~12,000 at N = 1,000): which
groups one rule must look at again since its last pass, for the committee design's checks and
decisions (vrl.node.rounds) and the ticket design's checks (vrl.node.tickets). The same answers
as a pass over every fresh group, at the cost of the groups touched since.

Pure like the protocol it serves: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from typing import Protocol

from vrl.node.manifests import Rounds
from vrl.node.messages import PolicyAnnouncement
from vrl.node.params import ProtocolParams


class _Held(Protocol):
    """What a pass reads of a held group (vrl.node.state.Group)."""

    @property
    def version(self) -> int: ...

    @property
    def arrived(self) -> float: ...


class Scanned(Protocol):
    """What the passes read of a node's state (vrl.node.state.NodeView, which imports this
    module, is a wider view of the same protocol)."""

    @property
    def config(self) -> ProtocolParams: ...

    @property
    def now(self) -> float: ...

    @property
    def version(self) -> int | None: ...

    @property
    def policies(self) -> Mapping[int, PolicyAnnouncement]: ...

    @property
    def loaded(self) -> Set[int]: ...

    @property
    def groups(self) -> Mapping[bytes, _Held]: ...

    @property
    def planted(self) -> Mapping[bytes, int]: ...

    @property
    def refused(self) -> Set[bytes]: ...

    @property
    def quarantined(self) -> Set[bytes]: ...

    @property
    def suspects(self) -> Mapping[bytes, int]: ...

    @property
    def evaluated(self) -> tuple[int, float, int] | None: ...

    @property
    def rounds(self) -> Rounds: ...

    def fresh(self, version: int) -> bool: ...

    def fresh_groups(self) -> list[bytes]: ...

    def decided(self, digest: bytes) -> bool | None: ...



def scan_key(node: Scanned) -> tuple[object, ...]:
    """Everything besides a group's own verdicts, arrival and check in flight that the rules over
    fresh groups read (committee_checks, ticket_checks, NodeProtocol.decided): while it is
    unchanged, only the groups touched since the last pass can come out differently."""
    deadlines = sum(1 for r, at in node.rounds.received_at.items()
                    if node.fresh(r) and node.now - at >= node.config.submission_window)
    return (node.version, len(node.loaded), node.rounds.added, len(node.quarantined), len(node.planted),
            len(node.refused), tuple(sorted(node.suspects.items())), node.evaluated, deadlines,
            tuple(sorted(v for v in node.policies if node.fresh(v))))


class Scan:
    """Which fresh groups one rule must look at again: all of them when the key moved, else those
    touched (a verdict, an arrival, a check begun or ended, a step trained on) since its last pass,
    and those it put off for want of room once there is room again. The same answers as a pass
    over every fresh group, at the cost of those."""

    def __init__(self) -> None:
        self.key: tuple[object, ...] | None = None
        self.dirty: set[bytes] = set()
        # Groups a pass put off for want of room (a batch's worth of checks under way): nothing
        # but room changes what a pass makes of them unless they are touched or the key moves,
        # so they come back once there is room, not at every pass. The trainer's ~4,000 fallback
        # checks of a bootstrap round were re-read at each tick: 60% of its passes' groups, and
        # most of committee_checks' time at N = 1,000 (bench/simulate.py).
        self.deferred: set[bytes] = set()

    def candidates(self, node: Scanned, key: tuple[object, ...], room: Callable[[], int] | None = None) -> list[bytes]:
        """The groups to look at; ``room`` tells how many more checks may start now (groups
        put off by :meth:`defer` are among them while it is above 0)."""
        if key != self.key:
            self.key, self.dirty, self.deferred = key, set(), set()
            return node.fresh_groups()
        touched, self.dirty = self.dirty, set()
        if self.deferred and room is not None and room() > 0:
            touched |= self.deferred
            self.deferred = set()
        fresh = [d for d in touched if d in node.groups and node.fresh(node.groups[d].version)]
        return sorted(fresh, key=lambda d: (node.groups[d].arrived, d))  # ties (one arrival time) by digest

    def defer(self, digest: bytes) -> None:
        """A group put off for want of room: looked at again once there is room."""
        self.deferred.add(digest)


class Scans:
    """Incremental passes: the checks a node asks for (both designs' rules, committee_checks and
    vrl.node.tickets.ticket_checks), and the committee design's decisions (the ticket design's
    depend on the clock, verdict_wait, so they are made over every fresh group)."""

    def __init__(self) -> None:
        self.checks, self.decisions = Scan(), Scan()
        self.decided: dict[bytes, bool | None] = {}

    def touch(self, digest: bytes) -> None:
        self.checks.dirty.add(digest)
        self.decisions.dirty.add(digest)

    def forget(self, digest: bytes) -> None:
        """A group no longer held (vrl.node.forgetting): nothing of it is looked at again."""
        self.checks.dirty.discard(digest)
        self.checks.deferred.discard(digest)
        self.decisions.dirty.discard(digest)
        self.decided.pop(digest, None)

    def decide(self, node: Scanned, fresh: list[bytes]) -> dict[bytes, bool | None]:
        """NodeProtocol.decided of each fresh group, recomputed for the touched ones only."""
        key = scan_key(node)
        if key != self.decisions.key:
            self.decided = {}
        for digest in self.decisions.candidates(node, key):
            self.decided[digest] = node.decided(digest)
        return {d: self.decided[d] if d in self.decided else self.decided.setdefault(d, node.decided(d))
                for d in fresh}
