"""The buffer of verdicts waiting for their group or round (vrl.node.waiting): its index by
group hands back exactly what a pass over the whole buffer would, in the same order, whatever
was added, dropped at the cap or taken before."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzzing import verdict
from vrl.node.waiting import WaitingVerdicts
from vrl.rollouts.keys import NodeKey

GROUPS = [bytes([i]) * 32 for i in range(1, 4)]
KEYS = [NodeKey.from_seed(bytes([i]) * 32) for i in range(1, 3)]
# 3 groups x 2 versions x 2 verifiers x 2 outcomes: 24 distinct verdicts
POOL = [verdict(outcome, group=g, policy_version=v).signed(k) for g in GROUPS for v in (0, 1) for k in KEYS
        for outcome in ("hard_fail", "pass")]


class Reference:
    """WaitingVerdicts as a list scanned whole at every take: the behaviour the index must keep."""

    def __init__(self, cap: int) -> None:
        self.cap, self.held = cap, []

    def add(self, v, usable, stranger) -> None:
        if any(h.id == v.id for h in self.held):
            return
        self.held.append(v)
        if len(self.held) <= self.cap:
            return
        self.held = [h for h in self.held if usable(h.policy_version)]
        excess = max(0, len(self.held) - self.cap)
        strangers = [h.id for h in self.held if stranger(h.verifier)][:excess]
        self.held = [h for h in self.held if h.id not in strangers]
        self.held = self.held[len(self.held) - self.cap:] if len(self.held) > self.cap else self.held

    def take(self, which) -> list:
        taken = [h for h in self.held if which(h)]
        self.held = [h for h in self.held if not which(h)]
        return taken


ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, len(POOL) - 1)),
    st.tuples(st.just("take"), st.integers(0, len(GROUPS) - 1)),
    st.tuples(st.just("round"), st.integers(0, 1))), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(1, 8), st.integers(0, 1))
def test_waiting_verdicts_taken_by_group_equal_a_scan_of_the_whole_buffer(steps, cap, old):
    buffer, reference = WaitingVerdicts(cap), Reference(cap)
    usable = lambda version: version != old  # noqa: E731 - a version past may_hold
    stranger = lambda verifier: verifier == KEYS[1].node_id  # noqa: E731
    for op, i in steps:
        if op == "add":
            buffer.add(POOL[i], usable, stranger)
            reference.add(POOL[i], usable, stranger)
        elif op == "take":
            assert buffer.take(GROUPS[i]) == reference.take(lambda v, g=GROUPS[i]: v.group == g)
        else:
            assert buffer.take_round(i) == reference.take(lambda v, r=i: v.policy_version == r)
        assert list(buffer) == reference.held
        assert len(buffer) == len(reference.held)
        assert all(v.id in buffer for v in reference.held)
