"""Withheld slots (specs/committee.md §7, specs/reputation.md §4 rule 5, §5): what a round
manifest says a worker did not submit lowers its score, and with it its share of batches, by
what a listed group earns; it never quarantines anyone and never moves a reporter weight."""

from __future__ import annotations

import hashlib
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vrl.node.admission import AdmissionConfig, Candidate, admit
from vrl.node.committee import ManifestContent, PagedManifest, WeightsTable
from vrl.node.messages import ManifestLists, Outcome, RoundManifest
from vrl.node.reputation import (
    Report,
    Reputation,
    ReputationConfig,
    ReputationError,
    Withheld,
    compute,
    recompute,
    withheld_of,
)
from vrl.rollouts.keys import NodeKey

ME = b"\x01" * 32
VERIFIERS = [bytes([0x30 + i]) * 32 for i in range(3)]  # pre-trusted: weight 1 each
FULL, HALF = b"\x10" * 32, b"\x11" * 32
G = 4  # groups_per_round
ROUNDS = 20


def digest(worker: bytes, round_: int, index: int) -> bytes:
    return hashlib.sha256(worker + bytes([round_, index])).digest()


def round_reports(worker: bytes, round_: int, listed: int) -> list[Report]:
    """Each listed group passed by each of the three verifiers (a committee of 3)."""
    return [Report(round_, v, worker, digest(worker, round_, i), Outcome.PASS)
            for i in range(listed) for v in VERIFIERS]


def network(withhold: bool = True) -> Reputation:
    view = Reputation(frozenset({ME, *VERIFIERS}))
    for r in range(ROUNDS):
        for worker, listed in ((FULL, G), (HALF, G // 2)):
            for report in round_reports(worker, r, listed):
                view.add(report)
            if withhold and listed < G:
                assert view.add_withheld(Withheld(r, worker, listed, G - listed))
    return view


def test_a_withheld_slot_weighs_what_a_listed_group_earned_so_the_score_follows_the_share_submitted():
    view = network()
    full, half = view.standing(FULL, ROUNDS), view.standing(HALF, ROUNDS)
    assert full.failures == 0 and not full.quarantined and not half.quarantined
    # Each listed group earned 3 passes of weight 1, so each missing slot adds 3 to b: a / (a + b)
    # is the share of slots submitted, 1/2, to within the priors (a0 = 1, b0 = 3).
    assert half.failures == pytest.approx(half.passes)
    assert (1 + half.passes) / (4 + half.passes + half.failures) == pytest.approx(0.5, abs=0.01)
    assert half.score < 0.5 <= AdmissionConfig().trusted_score < full.score
    # Without the manifests' records it would pass as trusted: the penalty is the withholding.
    plain = network(withhold=False)
    assert plain.standing(HALF, ROUNDS).score > 0.9 and plain.standing(HALF, ROUNDS).failures == 0
    # No reporter weight moves: withheld evidence is no report (specs/reputation.md §5).
    assert {n: s.trust for n, s in view.standings(ROUNDS).items()} == {
        n: s.trust for n, s in plain.standings(ROUNDS).items()}


def test_a_withholders_share_of_batches_falls_with_what_it_withholds():
    view = network()
    scores = {w: view.standing(w, ROUNDS).score for w in (FULL, HALF)}
    config = AdmissionConfig(batch_groups=4, node_cap=1.0, trusted_share=0.0)
    shares = []
    for seed in range(200):  # one round's candidates: both workers' groups, two of HALF's per four of FULL's
        candidates = [Candidate(digest(w, 200 + seed % 50, i), w, scores[w]) for w in (FULL, HALF)
                      for i in range(G if w == FULL else G // 2)]
        batch = admit(candidates, config, seed.to_bytes(4, "big"))
        shares.append(sum(c.node == HALF for c, _ in batch) / len(batch))
    # Its groups are a third of the candidates; with its lower score it gets less than that.
    assert statistics.fmean(shares) < 1 / 3 - 0.05


def test_an_absent_worker_pays_nothing_and_a_worker_with_no_passes_pays_the_floor():
    alone = Reputation(frozenset({ME}))
    assert alone.add_withheld(Withheld(3, HALF, 1, 3))
    assert not alone.add_withheld(Withheld(3, HALF, 2, 2))  # one record per round and worker: the first
    assert alone.standing(HALF, 3).failures == pytest.approx(3 * ReputationConfig().withheld_weight)
    assert not alone.standing(HALF, 3).quarantined
    # Decay applies as to any evidence (half-life 200 rounds).
    assert alone.standing(HALF, 203).failures == pytest.approx(1.5 * ReputationConfig().withheld_weight)
    # compute() with and without records of other workers: an absent one's standing is unchanged.
    reports = round_reports(FULL, 0, G)
    pretrusted = frozenset({ME, *VERIFIERS})
    assert compute(reports, pretrusted, 1, ReputationConfig(), [Withheld(0, HALF, 1, 3)])[FULL] == \
        compute(reports, pretrusted, 1, ReputationConfig())[FULL]


def lists(round_: int, workers: list[tuple[bytes, int]]) -> ManifestContent:
    """A round's lists (specs/committee.md §3.1): the workers' groups, one verifier's weight."""
    groups = tuple(sorted(digest(w, round_, i) for w, count in workers for i in range(count)))
    return ManifestContent(round_, WeightsTable(3, ((VERIFIERS[0], 65536),)), groups, tuple(sorted(workers)))


def manifest(trainer: NodeKey, round_: int, workers: list[tuple[bytes, int]]) -> tuple[bytes, bytes]:
    """The signed header's bytes and the lists behind it, as the trainer's store holds them."""
    content = lists(round_, workers)
    header = RoundManifest.of(trainer.node_id, PagedManifest(content).header).signed(trainer)
    return header.to_bytes(), ManifestLists.of(content).to_bytes()


def test_a_manifest_implies_one_record_per_worker_cut_short_and_refuses_an_overfull_one():
    m = lists(7, [(FULL, 4), (HALF, 1)])
    assert withheld_of(m, 4) == [Withheld(7, HALF, 1, 3)]
    assert withheld_of(m, 5) == [Withheld(7, FULL, 4, 1), Withheld(7, HALF, 1, 4)]
    with pytest.raises(ReputationError, match="more than 3 groups"):
        withheld_of(m, 3)


def test_the_audit_recomputes_withheld_slots_from_the_manifests_in_the_log():
    trainer, stranger = NodeKey.from_seed(b"T" * 32), NodeKey.from_seed(b"S" * 32)
    def row(key: NodeKey, round_: int, workers: list, at: float, lists_of: list | None = None) -> tuple:
        header, behind = manifest(key, round_, workers)
        if lists_of is not None:  # lists that are not those the header commits
            behind = manifest(key, round_, lists_of)[1]
        return ("manifest", header, (at, behind))

    log = [row(trainer, 0, [(HALF, 2)], 1.0),
           row(trainer, 0, [(HALF, 1)], 2.0),  # a second one of round 0: unused
           row(stranger, 1, [(HALF, 1)], 3.0),  # not an anchor's
           row(trainer, 2, [(HALF, 1)], 3.5, lists_of=[(HALF, 3)]),  # lists its header does not commit
           ("manifest", manifest(trainer, 3, [(HALF, 1)])[0], (3.7, None)),  # no lists: nothing to derive
           ("manifest", b"\x81\xa1x\x01", (4.0, None))]  # undecodable: skipped, as a bad verdict is
    found = recompute(log, frozenset({trainer.node_id}), at_version=0)
    assert found.standings[HALF].failures == pytest.approx(2 * ReputationConfig().withheld_weight)
    assert not found.standings[HALF].quarantined


ids = st.binary(min_size=0, max_size=40)
ints = st.one_of(st.integers(min_value=-2, max_value=2**65), st.booleans(), st.floats(allow_nan=True),
                 st.text(max_size=3), st.none())


@given(round_=ints, worker=st.one_of(ids, st.text(max_size=3), st.none()), listed=ints, missing=ints)
def test_a_withheld_record_is_made_from_any_values_or_refused_with_reputation_error(round_, worker, listed, missing):
    try:
        record = Withheld(round_, worker, listed, missing)
    except ReputationError:
        return
    assert type(record.round) is int and 0 <= record.round < 2**64 and len(record.worker) == 32
    assert 1 <= record.listed < 2**32 and 1 <= record.missing < 2**32
    view = Reputation(frozenset({ME}))
    assert view.add_withheld(record) and not view.add_withheld(record)
    assert view.standing(record.worker, record.round).failures >= 0


@settings(max_examples=60)
@given(counts=st.lists(st.integers(min_value=1, max_value=9), min_size=0, max_size=8),
       groups_per_round=st.one_of(st.integers(min_value=-1, max_value=9), st.floats(), st.none()))
def test_withheld_of_any_manifest_counts_every_missing_slot_or_raises_reputation_error(counts, groups_per_round):
    m = lists(1, [(bytes([0x40 + i]) * 32, c) for i, c in enumerate(counts)])
    try:
        records = withheld_of(m, groups_per_round)
    except ReputationError:
        assert type(groups_per_round) is not int or groups_per_round < 1 or max(counts) > groups_per_round
        return
    assert sum(r.missing for r in records) == sum(groups_per_round - c for c in counts if c < groups_per_round)
    with pytest.raises(ReputationError):
        Reputation(frozenset({ME})).add_withheld((1, FULL, 1, 1))
