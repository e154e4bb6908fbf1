"""Reputation at scale (issue 30): the sparse and dense EigenTrust equal the per-dict loop they replaced,
and the sorted report list kept as reports arrive equals a sort of them all."""

from __future__ import annotations

import math
from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from vrl.node.messages import Outcome
from vrl.node.reputation import DENSE_NODES, Report, Reputation, ReputationConfig, Withheld, _eigentrust, compute

NODES = [bytes([i]) * 32 for i in range(1, 9)]
OUTCOMES = [Outcome.PASS, Outcome.PASS, Outcome.PASS, Outcome.SOFT_FAIL, Outcome.HARD_FAIL]


def loop_eigentrust(reports, pretrusted, decay, config):
    """The reference: EigenTrust as the module computed it before issue 30, loops over dicts."""
    local = defaultdict(lambda: defaultdict(float))
    nodes = set(pretrusted)
    for r in reports:
        if not r.reporter or r.node_level:
            continue
        nodes.update((r.reporter, r.subject))
        penalty = {Outcome.PASS: -1.0, Outcome.SOFT_FAIL: config.soft_weight,
                   Outcome.HARD_FAIL: config.hard_weight}[r.outcome]
        local[r.reporter][r.subject] -= penalty * decay(r.round)
    order = sorted(nodes)
    anchors = sorted(pretrusted)
    teleport = {n: (1.0 / len(anchors) if n in pretrusted else 0.0) for n in order}
    rows = {}
    for i in order:
        positive = {j: max(s, 0.0) for j, s in local.get(i, {}).items() if s > 0}
        total = sum(positive.values())
        rows[i] = {j: s / total for j, s in positive.items()} if total > 0 else teleport
    trust = dict(teleport)
    for _ in range(config.iterations):
        spread = defaultdict(float)
        for i in order:
            if trust[i]:
                for j, c in rows[i].items():
                    spread[j] += c * trust[i]
        trust = {n: (1 - config.damping) * spread[n] + config.damping * teleport[n] for n in order}
    anchor_mean = sum(trust[a] for a in anchors) / len(anchors)
    weights = {n: 1.0 if n in pretrusted else min(1.0, trust[n] / anchor_mean) if anchor_mean > 0 else 0.0
               for n in order}
    weights[b""] = 1.0
    return weights


reports_strategy = st.lists(st.builds(
    Report, st.integers(0, 6), st.sampled_from(NODES), st.sampled_from(NODES),
    st.integers(0, 20).map(lambda i: i.to_bytes(32, "big")), st.sampled_from(OUTCOMES),
    node_level=st.booleans()), max_size=80)


@settings(max_examples=200, deadline=None)
@given(reports_strategy, st.sets(st.sampled_from(NODES[:3]), min_size=1), st.integers(0, 8),
       st.sampled_from([0, DENSE_NODES]))
def test_sparse_and_dense_eigentrust_equal_the_dict_loop(reports, pretrusted, round_index, dense_nodes):
    """Both matrix forms (dense_nodes 0: always sparse; DENSE_NODES: dense for these views of at
    most 8 nodes) give the reference's weights, and a view without opinions its anchors alone."""
    config = ReputationConfig()
    rate = math.log(2) / config.half_life_rounds

    def decay(at):
        return math.exp(-rate * max(round_index - at, 0))

    found = _eigentrust(reports, frozenset(pretrusted), decay, config, dense_nodes=dense_nodes)
    expected = loop_eigentrust(reports, frozenset(pretrusted), decay, config)
    assert found.keys() == expected.keys()
    for node, weight in expected.items():
        assert abs(found[node] - weight) < 1e-9, node
        assert (found[node] > 0) == (weight > 0), node  # who is a stranger (weight 0) never changes


@settings(max_examples=100, deadline=None)
@given(st.lists(reports_strategy, min_size=1, max_size=4), st.integers(0, 8))
def test_reports_kept_sorted_as_they_arrive_equal_a_sort_of_all(batches, round_index):
    """A view fed in batches, read between them, holds the sorted report set, and its standings
    equal those computed from scratch over that set."""
    view = Reputation(frozenset({NODES[0]}))
    held = set()
    for batch in batches:
        for r in batch:
            view.add(r)
            if r.reporter != r.subject:
                held.add(r)
        assert view.reports() == sorted(held, key=Report.sort_key)
        assert view.standings(round_index) == compute(sorted(held, key=Report.sort_key), frozenset({NODES[0]}),
                                                      round_index, ReputationConfig())


withheld_strategy = st.lists(st.builds(Withheld, st.integers(0, 6), st.sampled_from(NODES), st.integers(1, 3),
                                       st.integers(1, 3)), max_size=4)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(reports_strategy, withheld_strategy), min_size=1, max_size=4), st.integers(0, 8))
def test_withheld_records_between_reports_reach_the_standings(batches, round_index):
    """A view that keeps the reports' evidence while only withheld records come (they move no
    weight) still equals a computation from scratch after each batch of either, and a change
    of either is new evidence for an evaluation at batch boundaries (``held``)."""
    view = Reputation(frozenset({NODES[0]}))
    held, records = set(), {}
    for batch, withheld in batches:
        for r in batch:
            view.add(r)
            if r.reporter != r.subject:
                held.add(r)
        before = view.held()
        view.standings(round_index)  # the reports' evidence kept, then the records come
        for w in withheld:
            added = view.add_withheld(w)
            assert added == ((w.round, w.worker) not in records)
            records.setdefault((w.round, w.worker), w)
        assert view.held() == len(held) + len(records) >= before
        expected = compute(sorted(held, key=Report.sort_key), frozenset({NODES[0]}), round_index, ReputationConfig(),
                           [records[k] for k in sorted(records)])
        assert view.standings(round_index) == expected
        assert view.last(round_index) == expected
