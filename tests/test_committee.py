"""VRF committees (specs/committee.md): the draw, the claim, the manifest, the bound."""

from __future__ import annotations

import hashlib
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proofs import vrf
from vrl.node import committee
from vrl.node.committee import (
    COMMITTEE_SIZE,
    CommitteeError,
    Draw,
    ManifestContent,
    WeightsTable,
    escape_bound,
    exact_escape,
    seat_value,
    smallest_k,
)
from vrl.rollouts.keys import NodeKey

KEYS = [NodeKey.from_seed(hashlib.sha256(b"committee test key %d" % i).digest()) for i in range(4)]
GROUPS = tuple(sorted(hashlib.sha256(b"committee test group %d" % i).digest() for i in range(40)))


def _manifest(k: int = 2, weights: tuple[float, ...] = (1.0, 0.5, 0.75)) -> ManifestContent:
    table = WeightsTable.of(k, {key.node_id: w for key, w in zip(KEYS, weights, strict=False)})
    return ManifestContent(3, table, GROUPS, ((KEYS[3].node_id, len(GROUPS)),))


# -- the bound and k -----------------------------------------------------------------------------


def test_the_default_committee_size_is_the_smallest_k_of_the_design_point():
    """specs/committee.md §5: k = ceil(ln(1/eps) / (1 - f*)) = ceil(10.89) = 11."""
    assert COMMITTEE_SIZE == 11 == math.ceil(math.log(1 / committee.EPSILON) / (1 - committee.F_STAR))
    assert escape_bound(11, 0.45) <= 2.5e-3 < escape_bound(10, 0.45)


@given(st.floats(0, 0.95), st.floats(1e-12, 0.5))
def test_smallest_k_is_the_smallest_that_meets_eps(f_star, eps):
    k = smallest_k(f_star, eps)
    assert escape_bound(k, f_star) <= eps
    assert k == 1 or escape_bound(k - 1, f_star) > eps


@pytest.mark.parametrize(("f_star", "eps"), [(1.0, 1e-3), (-0.1, 1e-3), (0.5, 0.0), (0.5, 1.0), (math.nan, 0.1)])
def test_smallest_k_refuses_bounds_that_mean_nothing(f_star, eps):
    with pytest.raises(CommitteeError):
        smallest_k(f_star, eps)


@settings(max_examples=200)
@given(st.lists(st.integers(1, committee.WEIGHT_SCALE), min_size=1, max_size=60),
       st.lists(st.integers(1, committee.WEIGHT_SCALE), max_size=60), st.integers(1, 40))
def test_the_exact_escape_never_exceeds_the_bound(honest, adversary, k):
    """prod (1 - p_v) over the honest <= exp(-k (1 - f)), for any split of the weight (§5)."""
    weights = honest + adversary
    total = sum(weights)
    p = [min(1.0, k * w / total) for w in honest]
    f = sum(adversary) / total
    assert exact_escape(p) <= escape_bound(k, f) * (1 + 1e-12)


@pytest.mark.parametrize("rule", committee.SEAT_RULES)
def test_committee_sizes_have_mean_k_and_variance_at_most_k(rule):
    """E|C| = sum p_v = k (no p_v capped), Var|C| = sum p(1-p) <= k: checked on the 2,000
    positions of a 200-verifier table drawn with fixed outputs (deterministic, not timing), under
    either seat rule (rule 2's 8 values a hash are as independent as rule 1's one)."""
    rng = random.Random(30)
    table = WeightsTable(13, tuple(sorted((rng.randbytes(32), rng.randint(32768, 65536)) for _ in range(200))))
    assert sum(table.probability(node) for node, _ in table.entries) == pytest.approx(13, abs=1e-9)
    assert table.variance() <= 13
    betas = {node: rng.randbytes(64) for node, _ in table.entries}
    seats = {node: set(committee.seats(betas[node], 2000, table.threshold(node), rule)) for node, _ in table.entries}
    sizes = [sum(i in seats[node] for node, _ in table.entries) for i in range(2000)]
    mean = sum(sizes) / len(sizes)
    variance = sum((s - mean) ** 2 for s in sizes) / len(sizes)
    assert abs(mean - 13) < 0.5 and variance < 13 * 1.2


@pytest.mark.parametrize("nodes", [10, 100, 1000])
def test_a_verifiers_expected_checks_are_flat_in_n(nodes):
    """§6: with every node a worker and a verifier of equal weight, E[checks] = G p_v =
    min(G, k x groups_per_round): 36 at N = 10 (every other group), 52 from N = 14 on."""
    table = WeightsTable(COMMITTEE_SIZE, tuple(sorted((hashlib.sha256(b"%d" % i).digest(), 65536)
                                                      for i in range(nodes))))
    node = table.entries[0][0]
    groups = 4 * (nodes - 1)  # its own are not checked by it
    checks = table.expected_checks(node, groups)
    assert checks == pytest.approx(min(groups, COMMITTEE_SIZE * 4 * (nodes - 1) / nodes), rel=1e-12)
    assert checks <= COMMITTEE_SIZE * 4


# -- the weights table ----------------------------------------------------------------------------


def test_thresholds_are_exact_integers_and_strangers_have_none():
    table = _manifest().weights
    total = table.total
    for node, w in table.entries:
        assert table.threshold(node) == min(1 << 64, (2 * w << 64) // total)
    assert table.threshold(KEYS[3].node_id) == 0 and table.weight(KEYS[3].node_id) == 0
    assert WeightsTable(1, ((KEYS[0].node_id, 5),)).threshold(KEYS[0].node_id) == 1 << 64


def test_weights_quantize_down_and_zero_is_left_out():
    table = WeightsTable.of(3, {KEYS[0].node_id: 1.0, KEYS[1].node_id: 0.5, KEYS[2].node_id: 0.0})
    assert dict(table.entries) == {KEYS[0].node_id: 65536, KEYS[1].node_id: 32768}
    assert committee.quantize_weight(1 / 3) == 21845


def test_a_seat_weighs_trust_times_score_and_the_table_keeps_the_heaviest():
    """specs/committee.md §3.1: a verifier's draw weight is its reporter weight times its score,
    so a node whose accusations were contradicted (a low score) loses seats though trusted;
    never the trainer, a quarantined node or one of weight 0; the heaviest MAX_PAGED_ENTRIES."""
    from types import SimpleNamespace as S

    trainer, honest, accuser, jailed = (k.node_id for k in KEYS[:4])
    stranger = b"\x05" * 32
    standings = {trainer: S(trust=1.0, score=1.0, quarantined=False),
                 honest: S(trust=0.2, score=0.9, quarantined=False),
                 accuser: S(trust=0.2, score=0.15, quarantined=False),
                 jailed: S(trust=0.2, score=0.0, quarantined=True),
                 stranger: S(trust=0.0, score=0.017, quarantined=False)}
    weights = committee.seat_weights(standings, trainer)
    assert weights == pytest.approx({honest: 0.18, accuser: 0.03})
    table = WeightsTable.heaviest(11, weights)
    assert table.weight(honest) == math.floor(0.18 * 65536) and table.weight(accuser) < table.weight(honest) / 5
    cap = committee.MAX_PAGED_ENTRIES
    many = {i.to_bytes(32, "big"): (i + 1) / (cap + 10) for i in range(cap + 10)}
    kept = WeightsTable.heaviest(11, many)
    assert len(kept.entries) == cap and min(w for _, w in kept.entries) == math.floor(11 / (cap + 10) * 65536)


@pytest.mark.parametrize("entries", [
    ((b"\x01" * 32, 0),), ((b"\x01" * 32, 65537),), ((b"\x01" * 31, 1),), ((b"\x02" * 32, 1), (b"\x01" * 32, 1)),
    ((b"\x01" * 32, 1), (b"\x01" * 32, 2)), ((b"\x01" * 32, True),), [(b"\x01" * 32, 1)], ((b"\x01" * 32,),),
])
def test_a_malformed_table_is_refused(entries):
    with pytest.raises(CommitteeError):
        WeightsTable(2, entries)


@given(st.one_of(st.none(), st.integers(), st.floats(), st.binary(), st.text(),
                 st.lists(st.tuples(st.binary(max_size=40), st.integers(-2, 70000)), max_size=4).map(tuple)),
       st.one_of(st.integers(-5, 2000), st.none(), st.floats()))
def test_hostile_tables_raise_only_committee_error(entries, k):
    try:
        WeightsTable(k, entries)
    except CommitteeError:
        pass


# -- the manifest ---------------------------------------------------------------------------------


def test_the_root_binds_every_part_of_the_manifest():
    base = _manifest()
    changed = [
        ManifestContent(4, base.weights, base.groups, base.workers),
        ManifestContent(3, WeightsTable(3, base.weights.entries), base.groups, base.workers),
        ManifestContent(3, WeightsTable(2, ((base.weights.entries[0][0], 1), *base.weights.entries[1:])),
                        base.groups, base.workers),
        ManifestContent(3, base.weights, base.groups[1:], ((KEYS[3].node_id, len(GROUPS) - 1),)),
        ManifestContent(3, base.weights, base.groups, ((KEYS[2].node_id, len(GROUPS)),)),
    ]
    roots = {committee.PagedManifest(m).header.root for m in changed} | {committee.PagedManifest(base).header.root}
    assert len(roots) == len(changed) + 1
    header = committee.PagedManifest(base).header
    assert header.alpha(Draw.COMMITTEE) == b"vrl/committee/v1\x00" + (3).to_bytes(8, "big") + header.root
    assert header.alpha(Draw.RECHECK) == b"vrl/recheck/v1\x00" + (3).to_bytes(8, "big") + header.root


def test_withheld_slots_are_counted_per_worker():
    table = _manifest().weights
    manifest = ManifestContent(1, table, GROUPS[:6], ((KEYS[0].node_id, 4), (KEYS[1].node_id, 2)))
    assert manifest.withheld(4) == {KEYS[1].node_id: 2}
    with pytest.raises(CommitteeError, match="more than 3"):
        manifest.withheld(3)


@pytest.mark.parametrize(("groups", "workers"), [
    (GROUPS[:2][::-1], ((KEYS[0].node_id, 2),)),  # unsorted
    ((GROUPS[0], GROUPS[0]), ((KEYS[0].node_id, 2),)),  # repeated
    (GROUPS[:2], ((KEYS[0].node_id, 3),)),  # counts do not sum to the groups
    (GROUPS[:2], ((KEYS[0].node_id, 1), (KEYS[0].node_id, 1))),  # a worker twice
    (GROUPS[:2], ((KEYS[0].node_id, 0), (KEYS[1].node_id, 2))),  # a zero count
])
def test_a_malformed_manifest_is_refused(groups, workers):
    with pytest.raises(CommitteeError):
        ManifestContent(1, _manifest().weights, groups, tuple(sorted(workers)))


@given(st.integers(-3, 2**65), st.lists(st.binary(min_size=0, max_size=33), max_size=5).map(tuple),
       st.lists(st.tuples(st.binary(max_size=33), st.integers(-1, 5)), max_size=3).map(tuple))
def test_hostile_manifests_raise_only_committee_error(round_, groups, workers):
    try:
        ManifestContent(round_, _manifest().weights, groups, workers)
    except CommitteeError:
        pass


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.binary(min_size=64, max_size=64), st.binary(max_size=80), st.none(), st.integers()),
       st.one_of(st.integers(-3, 2**33), st.text()),
       st.one_of(st.sampled_from(committee.SEAT_RULES), st.integers(-2, 4), st.none(), st.booleans()),
       st.one_of(st.integers(-3, 600), st.none()),
       st.one_of(st.integers(-3, 2**65), st.text(max_size=2), st.floats(allow_nan=True), st.none()))
def test_hostile_seat_inputs_raise_only_committee_error(beta, position, rule, groups, threshold):
    try:
        seat_value(beta, position, rule)
    except CommitteeError:
        pass
    try:
        committee.seats(beta, groups, threshold, rule)
    except CommitteeError:
        pass


# -- the draw ---------------------------------------------------------------------------------------


def _draw(key: NodeKey, manifest: ManifestContent, draw: Draw = Draw.COMMITTEE) -> tuple[bytes, bytes]:
    pi = vrf.prove(key.private_seed(), committee.PagedManifest(manifest).header.alpha(draw))
    return pi, vrf.proof_to_hash(pi)


def test_the_recheck_committee_is_fresh():
    """The same verifier's re-check output is another beta: its seats differ from its first."""
    manifest = _manifest()
    _, first = _draw(KEYS[0], manifest)
    _, again = _draw(KEYS[0], manifest, Draw.RECHECK)
    threshold = manifest.weights.threshold(KEYS[0].node_id)
    assert first != again
    rule = manifest.seat_rule
    assert committee.seats(first, len(GROUPS), threshold, rule) != committee.seats(again, len(GROUPS), threshold, rule)


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=64, max_size=64), st.integers(1, 300), st.integers(0, 2**64 + 5), st.integers(0, 299),
       st.sampled_from(committee.SEAT_RULES))
def test_seats_are_exactly_the_positions_whose_seat_value_is_under_the_threshold(beta, groups, threshold, at, rule):
    """specs/committee.md §2, position by position, at the edges too: a threshold equal to a seat
    value leaves that seat out, one above it takes it in, and 2^64 or more takes every position.
    Rule 2's draw compares whole blocks at once; each value is still read alone here."""
    value = committee.seat_value(beta, at % groups, rule)
    for t in (threshold, value, value + 1):
        assert committee.seats(beta, groups, t, rule) == tuple(i for i in range(groups)
                                                               if committee.seat_value(beta, i, rule) < t)


# -- the paged manifest (specs/committee.md §3, §4) ----------------------------------------------


def _paged() -> committee.PagedManifest:
    return committee.PagedManifest(_manifest())


def test_the_header_root_binds_every_field():
    header = _paged().header
    fields = [f for f in header.__dataclass_fields__]
    changed = {"round": 4, "committee_size": 3, "groups": header.groups + 1, "weights": header.weights + 1,
               "total_weight": header.total_weight + 1, "workers": header.workers + 1,
               "seat_rule": 3 - header.seat_rule}
    roots = {header.root}
    for name in fields:
        value = changed.get(name, hashlib.sha256(name.encode()).digest())
        roots.add(committee.ManifestHeader(**{**{f: getattr(header, f) for f in fields}, name: value}).root)
    assert len(roots) == len(fields) + 1


def test_a_member_learns_its_seats_from_the_header_one_entry_and_their_multiproof():
    paged = _paged()
    header = paged.header
    for key in KEYS[:3]:
        weight_answer = committee.check_entries(header, paged.answer(committee.List.WEIGHTS, keys=[key.node_id]),
                                                committee.List.WEIGHTS,
                                                keys=[key.node_id])
        j, leaf = weight_answer.found()[key.node_id]
        w = int.from_bytes(leaf[32:], "big")
        assert w == paged.content.weights.weight(key.node_id)
        beta = vrf.proof_to_hash(vrf.prove(key.private_seed(), header.alpha(Draw.COMMITTEE)))
        positions = header.seats(beta, w)
        assert header.threshold(w) == paged.content.weights.threshold(key.node_id)
        assert positions == tuple(i for i in range(len(GROUPS))
                                  if committee.seat_value(beta, i, header.seat_rule) < header.threshold(w))
        answer = committee.check_entries(header, paged.answer(committee.List.GROUPS, positions=positions), "groups",
                                         positions=positions)
        assert answer.leaves == tuple(GROUPS[i] for i in positions)
        for i in positions:  # and each seat's claim stands alone
            path = paged.trees[committee.List.GROUPS].prove([i])
            weight_path = paged.trees[committee.List.WEIGHTS].prove([j])
            assert committee.check_seat(header, key.node_id, (j, w), weight_path, i, GROUPS[i], path) == \
                header.threshold(w)


def test_a_stranger_a_wrong_weight_and_a_wrong_seat_are_refused_before_any_signature():
    paged = _paged()
    header, trees = paged.header, paged.trees
    j = 0
    node, w = paged.content.weights.entries[j]
    weight_path, path = trees[committee.List.WEIGHTS].prove([j]), trees[committee.List.GROUPS].prove([5])
    assert committee.check_seat(header, node, (j, w), weight_path, 5, GROUPS[5], path)
    for verifier, weight in [(KEYS[3].node_id, (j, w)), (node, (j, w + 1)), (node, (j + 1, w)), (node, (j, 0))]:
        with pytest.raises(CommitteeError) as caught:
            committee.check_seat(header, verifier, weight, weight_path, 5, GROUPS[5], path)
        assert caught.value.reason == "not_eligible"
    for seat, group in [(6, GROUPS[5]), (5, GROUPS[6]), (len(GROUPS), GROUPS[5])]:
        with pytest.raises(CommitteeError) as caught:
            committee.check_seat(header, node, (j, w), weight_path, seat, group, path)
        assert caught.value.reason == "not_in_manifest"


def test_a_key_is_found_or_shown_absent_and_an_answer_hiding_a_listed_key_is_refused():
    paged = _paged()
    header = paged.header
    low, high = b"\x00" * 32, b"\xff" * 32
    middle = bytes(a ^ b for a, b in zip(GROUPS[10], b"\x00" * 31 + b"\x01", strict=True))
    for key in (low, high, middle, GROUPS[0], GROUPS[-1], GROUPS[17]):
        answer = paged.answer(committee.List.GROUPS, keys=[key])
        committee.check_entries(header, answer, "groups", keys=[key])
        assert (key in GROUPS) == (key in answer.found())
    # A server hiding GROUPS[17]: its neighbours 16 and 18 are not adjacent, so they prove nothing.
    tree = paged.trees[committee.List.GROUPS]
    hiding = committee.Entries(header.round, committee.List.GROUPS, (16, 18), (GROUPS[16], GROUPS[18]),
                               tree.prove([16, 18]))
    with pytest.raises(CommitteeError, match="neither found nor shown absent"):
        committee.check_entries(header, hiding, "groups", keys=[GROUPS[17]])
    # Nor may it answer other positions than those asked, or another round's.
    with pytest.raises(CommitteeError, match="not the positions asked"):
        committee.check_entries(header, hiding, "groups", positions=[16, 17])
    other = committee.Entries(header.round + 1, committee.List.GROUPS, (16,), (GROUPS[16],), tree.prove([16]))
    with pytest.raises(CommitteeError, match="round"):
        committee.check_entries(header, other, "groups", positions=[16])
    # Nor another list's entries, proven as they are, for the one asked (a replay of what the
    # trainer served someone else).
    weights = paged.answer(committee.List.WEIGHTS, positions=[0, 1])
    with pytest.raises(CommitteeError, match="to a request of"):
        committee.check_entries(header, weights, "groups", positions=[0, 1])


@settings(max_examples=300, deadline=None)
@given(st.integers(-2, 2**33), st.one_of(st.sampled_from(list(committee.List)), st.text(max_size=8), st.none()),
       st.lists(st.integers(-1, 45), max_size=4).map(tuple),
       st.lists(st.binary(max_size=40), max_size=4).map(tuple), st.lists(st.binary(max_size=33), max_size=8).map(tuple))
def test_hostile_entries_raise_only_committee_error(round_, which, positions, leaves, proof):
    header = _paged().header
    answer = committee.Entries(round_, which, positions, leaves, proof)
    with pytest.raises(CommitteeError):
        committee.check_entries(header, answer, which, positions=positions)
    with pytest.raises(CommitteeError):
        committee.check_entries(header, answer, "groups", keys=[GROUPS[3]])


ANY = st.one_of(st.none(), st.integers(-2, 2**70), st.binary(max_size=40), st.text(max_size=3),
                st.tuples(st.integers(-2, 2**33), st.integers(-2, 2**17)),
                st.lists(st.binary(max_size=33), max_size=8).map(tuple))


@settings(max_examples=300, deadline=None)
@given(ANY, ANY, ANY, ANY, ANY, ANY)
def test_hostile_seat_claims_raise_only_committee_error(verifier, weight, weight_path, seat, group, path):
    with pytest.raises(CommitteeError):
        committee.check_seat(_paged().header, verifier, weight, weight_path, seat, group, path)


@settings(max_examples=300, deadline=None)
@given(st.lists(ANY, min_size=10, max_size=10))
def test_hostile_headers_raise_only_committee_error(fields):
    try:
        header = committee.ManifestHeader(*fields)
    except CommitteeError:
        return
    assert header.root and header.threshold(1) >= 0  # whatever it accepted is well formed
