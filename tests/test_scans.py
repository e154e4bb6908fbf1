"""vrl.node.scans.Scan: a rule that starts checks while there is room, run on the incremental
candidates (touched groups, and groups put off for want of room once there is room again),
starts exactly the checks the same rule run over every fresh group starts."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from vrl.node.scans import Scan


@dataclass
class Held:
    version: int
    arrived: float


@dataclass
class View:
    """What Scan reads of a node: its groups, which are fresh, and (for the rule) its checks."""

    groups: dict[bytes, Held] = field(default_factory=dict)
    version: int = 0
    under_way: set[bytes] = field(default_factory=set)
    done: set[bytes] = field(default_factory=set)
    capacity: int = 2

    def fresh(self, version: int) -> bool:
        return 0 <= self.version - version <= 1

    def fresh_groups(self) -> list[bytes]:
        return sorted((d for d, g in self.groups.items() if self.fresh(g.version)),
                      key=lambda d: (self.groups[d].arrived, d))

    def room(self) -> int:
        return self.capacity - len(self.under_way)


def run_pass(view: View, candidates: list[bytes], scan: Scan | None) -> list[bytes]:
    """The rule: an unchecked group not under way starts a check if there is room, else waits."""
    started, room = [], view.room()
    for digest in candidates:
        if digest in view.done or digest in view.under_way:
            continue
        if room <= 0:
            if scan is not None:
                scan.defer(digest)
            continue
        view.under_way.add(digest)
        started.append(digest)
        room -= 1
    return started


steps = st.lists(st.one_of(st.tuples(st.just("arrive"), st.integers(0, 11)),
                           st.tuples(st.just("end"), st.integers(0, 11)),
                           st.tuples(st.just("version"), st.just(0)),
                           st.tuples(st.just("pass"), st.just(0))), max_size=60)


@settings(max_examples=300, deadline=None)
@given(steps, st.integers(1, 3))
def test_incremental_candidates_start_the_checks_a_pass_over_every_fresh_group_starts(script, capacity):
    incremental, full, scan = View(capacity=capacity), View(capacity=capacity), Scan()
    clock = 0.0
    for kind, i in script:
        digest = bytes([i]) * 32
        for view in (incremental, full):
            if kind == "arrive" and digest not in view.groups:
                view.groups[digest] = Held(view.version, clock)
            elif kind == "end" and digest in view.under_way:
                view.under_way.discard(digest)
                view.done.add(digest)
            elif kind == "version":
                view.version += 1
        if kind in ("arrive", "end"):
            scan.dirty.add(digest)  # the protocol touches a group that arrives or whose check ends
        clock += 1.0
        key = (incremental.version,)
        assert (run_pass(incremental, scan.candidates(incremental, key, incremental.room), scan)
                == run_pass(full, full.fresh_groups(), None))
        assert incremental.under_way == full.under_way
