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
    claim,
    escape_bound,
    exact_escape,
    is_member,
    member_value,
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


def test_committee_sizes_have_mean_k_and_variance_at_most_k():
    """E|C| = sum p_v = k (no p_v capped), Var|C| = sum p(1-p) <= k: checked on 2,000 groups
    of a 200-verifier table drawn with fixed outputs (deterministic, not timing)."""
    rng = random.Random(30)
    table = WeightsTable(13, tuple(sorted((rng.randbytes(32), rng.randint(32768, 65536)) for _ in range(200))))
    assert sum(table.probability(node) for node, _ in table.entries) == pytest.approx(13, abs=1e-9)
    assert table.variance() <= 13
    betas = {node: rng.randbytes(64) for node, _ in table.entries}
    sizes = [sum(is_member(betas[node], d, table.threshold(node)) for node, _ in table.entries)
             for d in (rng.randbytes(32) for _ in range(2000))]
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
    never the trainer, a quarantined node or one of weight 0; the heaviest MAX_WEIGHT_ENTRIES."""
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
    many = {bytes([i // 256, i % 256]) * 16: (i + 1) / 4096 for i in range(committee.MAX_WEIGHT_ENTRIES + 10)}
    kept = WeightsTable.heaviest(11, many)
    assert len(kept.entries) == committee.MAX_WEIGHT_ENTRIES and min(w for _, w in kept.entries) == math.floor(
        11 / 4096 * 65536)


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
    roots = {m.root for m in changed} | {base.root}
    assert len(roots) == len(changed) + 1
    assert base.alpha(Draw.COMMITTEE) == b"vrl/committee/v1\x00" + (3).to_bytes(8, "big") + base.root
    assert base.alpha(Draw.RECHECK) == b"vrl/recheck/v1\x00" + (3).to_bytes(8, "big") + base.root


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


@given(st.one_of(st.binary(max_size=80), st.none(), st.integers()), st.one_of(st.binary(max_size=40), st.text()))
def test_hostile_membership_inputs_raise_only_committee_error(beta, group):
    try:
        member_value(beta, group)
    except CommitteeError:
        pass


# -- the claim a verdict carries ------------------------------------------------------------------


def _draw(key: NodeKey, manifest: ManifestContent, draw: Draw = Draw.COMMITTEE) -> tuple[bytes, bytes]:
    pi = vrf.prove(key.private_seed(), manifest.alpha(draw))
    return pi, vrf.proof_to_hash(pi)


def test_a_members_claim_verifies_and_a_non_members_is_not_drawn():
    manifest = _manifest()
    key = KEYS[1]
    pi, beta = _draw(key, manifest)
    threshold = manifest.weights.threshold(key.node_id)
    drawn = [d for d in GROUPS if is_member(beta, d, threshold)]
    missed = [d for d in GROUPS if not is_member(beta, d, threshold)]
    assert drawn and missed  # p_v = 2 x 0.5 / 2.25: some of 40 groups each way
    for d in drawn:
        assert claim(manifest.weights, key.node_id, pi, manifest.alpha(Draw.COMMITTEE), d) == beta
        assert claim(manifest.weights, key.node_id, pi, manifest.alpha(Draw.COMMITTEE), d, beta=beta) == beta
    for d in missed:
        with pytest.raises(CommitteeError, match="not drawn") as caught:
            claim(manifest.weights, key.node_id, pi, manifest.alpha(Draw.COMMITTEE), d)
        assert caught.value.reason == "not_drawn"


def test_a_forged_proof_is_refused_as_bad_proof():
    manifest = _manifest()
    key = KEYS[0]
    pi, _ = _draw(key, manifest)
    alpha = manifest.alpha(Draw.COMMITTEE)
    forgeries = [pi[:i] + bytes([pi[i] ^ 1]) + pi[i + 1:] for i in (0, 40, 79)]
    forgeries += [vrf.prove(KEYS[1].private_seed(), alpha),  # another key's proof
                  _draw(key, manifest, Draw.RECHECK)[0],  # its own proof over the other input
                  pi[:79], b""]
    for forged in forgeries:
        with pytest.raises(CommitteeError) as caught:
            claim(manifest.weights, key.node_id, forged, alpha, GROUPS[0])
        assert caught.value.reason == "bad_proof"


def test_a_key_outside_the_table_is_refused_before_any_proof_is_checked():
    manifest = _manifest()
    stranger = KEYS[3]
    pi, _ = _draw(stranger, manifest)
    for proof in (pi, b"garbage"):  # not even parsed
        with pytest.raises(CommitteeError) as caught:
            claim(manifest.weights, stranger.node_id, proof, manifest.alpha(Draw.COMMITTEE), GROUPS[0])
        assert caught.value.reason == "not_eligible"


def test_the_recheck_committee_is_fresh():
    """The same verifier's re-check output is another beta: its memberships differ from its first."""
    manifest = _manifest()
    _, first = _draw(KEYS[0], manifest)
    _, again = _draw(KEYS[0], manifest, Draw.RECHECK)
    threshold = manifest.weights.threshold(KEYS[0].node_id)
    assert first != again
    assert [is_member(first, d, threshold) for d in GROUPS] != [is_member(again, d, threshold) for d in GROUPS]


@settings(max_examples=30, deadline=None)
@given(st.binary(min_size=0, max_size=100), st.sampled_from(GROUPS))
def test_hostile_proofs_raise_only_committee_error(pi, group):
    manifest = _manifest()
    with pytest.raises(CommitteeError):
        claim(manifest.weights, KEYS[0].node_id, pi, manifest.alpha(Draw.COMMITTEE), group)
