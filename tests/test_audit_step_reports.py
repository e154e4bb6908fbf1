"""The audit weighs a step fraud report by its reporter's trust (specs/audit.md §3, `steps`):
reports whose every reporter most stored views quarantine are info, not a warning against the
trainer. The views are the stores' own reputation snapshots, each node's own view left out."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from vrl.audit.checks import quarantined_by_most


def run_of(views: dict[bytes, set[bytes]], without_snapshot: int = 0) -> SimpleNamespace:
    """A run whose stores are these views: owner -> the nodes its snapshot quarantines."""
    def store(owner: bytes | None, quarantined: set[bytes]) -> SimpleNamespace:
        rows = [(node, 3, 0.0, True) for node in sorted(quarantined)] + [(b"honest", 3, 0.9, False)]
        return SimpleNamespace(node=SimpleNamespace(owner=owner, store=SimpleNamespace(snapshot=lambda: rows)))

    empty = [SimpleNamespace(node=SimpleNamespace(owner=None, store=SimpleNamespace(snapshot=list)))
             for _ in range(without_snapshot)]
    return SimpleNamespace(stores=[store(owner, q) for owner, q in views.items()] + empty)


def test_a_node_most_views_quarantine_is_distrusted_and_one_view_short_changes_nothing():
    views = {b"a": {b"x", b"y"}, b"b": {b"x"}, b"c": {b"x"}, b"d": set(), b"x": {b"y"}}
    # x: 3 of the 4 views other than its own; y: 2 of 5, not a majority
    assert quarantined_by_most(run_of(views, without_snapshot=2)) == {b"x"}
    assert quarantined_by_most(run_of({})) == set()
    # Two cheats that quarantine each other, every honest view but one quarantining both
    honest = {bytes([i]): {b"c1", b"c2"} for i in range(9)} | {b"\x09": {b"c1"}}
    assert quarantined_by_most(run_of(honest | {b"c1": {b"c2"}, b"c2": {b"c1"}})) == {b"c1", b"c2"}


@given(st.dictionaries(st.sampled_from([b"a", b"b", b"c", b"d", b"e"]),
                       st.sets(st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"z"])), max_size=5))
def test_only_a_strict_majority_of_the_other_views_distrusts_a_node(views):
    distrusted = quarantined_by_most(run_of(views))
    for node in {b"a", b"b", b"c", b"d", b"e", b"z"}:
        others = [q for owner, q in views.items() if owner != node]
        assert (node in distrusted) == (2 * sum(node in q for q in others) > len(others))
