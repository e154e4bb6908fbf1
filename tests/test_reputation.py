"""Reputation: Beta lower bounds, EigenTrust-weighted reports, quarantine, replay, admission."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.special import betaincinv

from vrl.node.admission import AdmissionConfig, Candidate, admit
from vrl.node.messages import Outcome
from vrl.node.reputation import (
    Report,
    Reputation,
    ReputationConfig,
    compute,
)

ME, TRUSTED = b"\x01" * 32, b"\x02" * 32
HONEST, CHEAT = b"\x10" * 32, b"\x11" * 32
SYBILS = [bytes([0x20 + i]) * 32 for i in range(5)]


def group(i: int) -> bytes:
    return i.to_bytes(32, "big")


def passes(reporter: bytes, subject: bytes, n: int, start: int = 0, round_index: int = 0) -> list[Report]:
    return [Report(round_index, reporter, subject, group(start + i), Outcome.PASS) for i in range(n)]


def view(*reports: Report, config: ReputationConfig = ReputationConfig(), anchors=(ME,)) -> Reputation:
    rep = Reputation(frozenset(anchors), config)
    for r in reports:
        rep.add(r)
    return rep


def test_score_is_the_beta_lower_bound_so_three_passes_are_not_three_thousand():
    few, many = view(*passes(ME, HONEST, 3)), view(*passes(ME, HONEST, 3000))
    config = ReputationConfig()
    assert few.standing(HONEST, 0).score == pytest.approx(betaincinv(1 + 3, 3, config.confidence))
    assert many.standing(HONEST, 0).score == pytest.approx(betaincinv(1 + 3000, 3, config.confidence))
    assert few.standing(HONEST, 0).score < 0.5 < 0.99 < many.standing(HONEST, 0).score


def test_one_hard_fail_outweighs_many_passes_and_soft_fails_weigh_little():
    base = passes(ME, HONEST, 60)
    hard = view(*base, Report(0, ME, HONEST, group(999), Outcome.HARD_FAIL)).standing(HONEST, 0).score
    soft = view(*base, Report(0, ME, HONEST, group(999), Outcome.SOFT_FAIL)).standing(HONEST, 0).score
    clean = view(*base).standing(HONEST, 0).score
    assert hard < 0.5 < soft < clean  # 60 passes then one hard fail: below even odds


def test_old_evidence_decays_with_the_configured_half_life():
    config = ReputationConfig(half_life_rounds=10)
    rep = view(*passes(ME, HONEST, 100), config=config)
    fresh, ten_later = rep.standing(HONEST, 0), rep.standing(HONEST, 10)
    assert ten_later.passes == pytest.approx(fresh.passes / 2)


def test_newcomers_are_checked_fully_and_the_rate_falls_toward_the_floor_with_trust():
    config = ReputationConfig(newcomer_checks=8, check_floor=0.1)
    assert view(*passes(ME, HONEST, 7), config=config).standing(HONEST, 0).check_rate == 1.0
    assert view().standing(HONEST, 0).check_rate == 1.0  # never seen
    trusted = view(*passes(ME, HONEST, 2000), config=config).standing(HONEST, 0).check_rate
    middling = view(*passes(ME, HONEST, 20), config=config).standing(HONEST, 0).check_rate
    assert 0.1 <= trusted < middling < 1.0
    assert trusted < 0.11


def test_low_trust_sybils_can_neither_smear_an_honest_node_nor_whitewash_a_cheat():
    honest_history = passes(ME, HONEST, 200)
    smears = [Report(0, s, HONEST, group(5000 + i), Outcome.HARD_FAIL) for i, s in enumerate(SYBILS)]
    whitewash = [r for s in SYBILS for r in passes(s, CHEAT, 100, start=9000)]
    cheat_history = [Report(0, ME, CHEAT, group(1), Outcome.HARD_FAIL)]
    clean = view(*honest_history).standing(HONEST, 0).score
    smeared = view(*honest_history, *smears).standing(HONEST, 0).score
    assert smeared == pytest.approx(clean)
    assert view(*cheat_history, *whitewash).standing(CHEAT, 0).score == pytest.approx(
        view(*cheat_history).standing(CHEAT, 0).score)


def test_a_verifier_earns_report_weight_only_through_trusted_nodes():
    # ME checked the verifier's own work and found it honest: its reports now count.
    verifier = SYBILS[0]
    endorsed = view(*passes(ME, verifier, 50), *passes(verifier, HONEST, 50, start=100))
    stranger = view(*passes(verifier, HONEST, 50, start=100))
    assert endorsed.standing(verifier, 0).trust > 0.5
    assert stranger.standing(verifier, 0).trust == 0.0
    assert endorsed.standing(HONEST, 0).score > stranger.standing(HONEST, 0).score


def test_quarantine_needs_a_re_check_by_a_second_reporter():
    one = Report(0, ME, CHEAT, group(7), Outcome.HARD_FAIL)
    again = Report(0, TRUSTED, CHEAT, group(7), Outcome.HARD_FAIL)
    assert not view(one).standing(CHEAT, 0).quarantined  # one check alone never evicts
    both = view(one, again, anchors=(ME, TRUSTED)).standing(CHEAT, 0)
    assert both.quarantined and both.score == 0.0
    # Two untrusted accusers cannot evict anyone.
    sybil_pair = [Report(0, s, HONEST, group(8), Outcome.HARD_FAIL) for s in SYBILS[:2]]
    assert not view(*sybil_pair).standing(HONEST, 0).quarantined


def test_lazy_verifiers_are_caught_by_planted_groups_and_by_digests():
    lazy = SYBILS[0]
    planted = Report(3, ME, SYBILS[4], group(50), Outcome.HARD_FAIL, planted=True)
    approved = Report(3, lazy, SYBILS[4], group(50), Outcome.PASS, digest=b"\x00" * 32, platform="p")
    rep = view(planted, approved)
    assert rep.standing(SYBILS[4], 3).quarantined  # the planter needs no second opinion
    assert rep.standing(lazy, 3).quarantined
    # A made-up digest disagrees with a pre-trusted re-check on the same platform.
    honest_digest, fake = b"\x05" * 32, b"\x06" * 32
    mine = Report(4, ME, HONEST, group(60), Outcome.PASS, digest=honest_digest, platform="p")
    theirs = Report(4, lazy, HONEST, group(60), Outcome.PASS, digest=fake, platform="p")
    assert view(mine, theirs).standing(lazy, 4).quarantined
    other_platform = Report(4, lazy, HONEST, group(60), Outcome.PASS, digest=fake, platform="q")
    assert not view(mine, other_platform).standing(lazy, 4).quarantined


def test_a_reject_contradicted_by_a_trusted_re_check_costs_its_reporter_a_soft_fail():
    accuser = SYBILS[1]
    rep = view(*passes(ME, accuser, 30), Report(0, accuser, HONEST, group(70), Outcome.HARD_FAIL),
               Report(0, ME, HONEST, group(70), Outcome.PASS))
    standing = rep.standing(accuser, 0)
    assert not standing.quarantined and not rep.standing(HONEST, 0).quarantined
    assert standing.failures == pytest.approx(ReputationConfig().soft_weight)


def test_state_is_a_function_of_the_report_set_not_of_arrival_order():
    reports = (passes(ME, HONEST, 20) + passes(ME, SYBILS[0], 10, start=50)
               + passes(SYBILS[0], CHEAT, 5, start=80) + [Report(2, ME, CHEAT, group(99), Outcome.HARD_FAIL),
                                                          Report(2, SYBILS[0], CHEAT, group(99), Outcome.HARD_FAIL)])
    expected = compute(sorted(reports, key=Report.sort_key), frozenset({ME}), 3, ReputationConfig())
    for seed in range(5):
        shuffled = reports[:]
        random.Random(seed).shuffle(shuffled)
        assert view(*shuffled).standings(3) == expected
    assert expected[CHEAT].quarantined


def test_reports_are_idempotent_and_self_reports_ignored():
    rep = view(*passes(ME, HONEST, 3))
    assert not rep.add(passes(ME, HONEST, 1)[0])
    assert not rep.add(Report(0, HONEST, HONEST, group(1), Outcome.PASS))


# -- admission ----------------------------------------------------------------------------------

def candidates(spec: dict[bytes, tuple[float, int]]) -> list[Candidate]:
    out, i = [], 0
    for node, (score, n) in spec.items():
        for _ in range(n):
            out.append(Candidate(group(i), node, score))
            i += 1
    return out


def test_admission_caps_each_node_and_keeps_a_trusted_share():
    config = AdmissionConfig(batch_groups=8, node_cap=0.25, trusted_share=0.5, trusted_score=0.5)
    pool = candidates({ME: (1.0, 10), TRUSTED: (0.9, 10), SYBILS[0]: (0.2, 10), SYBILS[1]: (0.2, 10)})
    batch = admit(pool, config, b"seed")
    per_node = {}
    for c, _ in batch:
        per_node[c.node] = per_node.get(c.node, 0) + 1
    assert len(batch) == 8 and max(per_node.values()) <= 2
    assert sum(c.score >= 0.5 for c, _ in batch) >= 4


def test_admission_shrinks_the_batch_rather_than_dilute_it():
    config = AdmissionConfig(batch_groups=8, node_cap=1.0, trusted_share=0.5)
    batch = admit(candidates({ME: (1.0, 1), SYBILS[0]: (0.2, 20)}), config, b"seed")
    assert len(batch) == 2 and sum(c.node == ME for c, _ in batch) == 1


def test_admission_weights_have_mean_one_never_flip_sign_and_zero_score_is_never_drawn():
    pool = candidates({ME: (1.0, 4), SYBILS[0]: (0.3, 4), CHEAT: (0.0, 4)})
    batch = admit(pool, AdmissionConfig(batch_groups=6, node_cap=1.0, trusted_share=0.0), b"s")
    assert all(c.node != CHEAT for c, _ in batch)
    weights = [w for _, w in batch]
    assert sum(weights) / len(weights) == pytest.approx(1.0) and min(weights) > 0
    by_node = {c.node: w for c, w in batch}
    assert by_node[ME] / by_node[SYBILS[0]] == pytest.approx(1.0 / 0.3)


def test_admission_probability_grows_with_reputation():
    config = AdmissionConfig(batch_groups=4, node_cap=1.0, trusted_share=0.0)
    pool = candidates({SYBILS[0]: (0.2, 8), SYBILS[1]: (0.8, 8)})
    counts = {SYBILS[0]: 0, SYBILS[1]: 0}
    for seed in range(200):
        for c, _ in admit(pool, config, seed.to_bytes(4, "big")):
            counts[c.node] += 1
    assert counts[SYBILS[1]] > 2 * counts[SYBILS[0]] > 0


def test_groups_a_trusted_node_checked_count_as_trusted_so_a_new_network_can_start():
    config = AdmissionConfig(batch_groups=4, node_cap=1.0, trusted_share=0.5)
    newcomers = [Candidate(group(i), SYBILS[0], 0.2, verified=i < 2) for i in range(6)]
    assert len(admit(newcomers, config, b"s")) == 4  # 2 verified, so 2 unverified may join
    assert admit([dataclasses.replace(c, verified=False) for c in newcomers], config, b"s") == []


# -- recomputed from a store's log (vrl reputation) -------------------------------------------------

def _store_log(tmp_path):
    """A store holding two workers' groups at version 0, a verifier's pass on one and hard
    fail on the other, a verdict whose subject is not its group's signer, and a skip."""
    from vrl.node.messages import SignedVerdict, Submission, audit_ticket
    from vrl.node.store import Store
    from vrl.rollouts.keys import NodeKey

    verifier, good, bad = (NodeKey.from_seed(bytes([b]) * 32) for b in b"VGB")
    store = Store(tmp_path / "node.sqlite")

    def verdict(sub, subject, outcome, reasons=()):
        return SignedVerdict(verifier.node_id, subject, sub.digest, 0, 0, audit_ticket(verifier, sub.digest), 1.0,
                             outcome, reasons, b"\x07" * 32, "test").signed(verifier)

    passed, failed, blamed = (Submission((bytes([t]) * 8,)) for t in (1, 2, 3))
    store.put_group(passed, good.node_id, 0, 1.0)
    store.put_group(failed, bad.node_id, 0, 1.0)
    store.put_group(blamed, good.node_id, 0, 1.0)
    store.put_verdict(verdict(passed, good.node_id, Outcome.PASS), 2.0)
    store.put_verdict(verdict(failed, bad.node_id, Outcome.HARD_FAIL, reasons=("reward_mismatch",)), 2.0)
    store.put_verdict(verdict(blamed, bad.node_id, Outcome.HARD_FAIL), 2.0)  # names bad; good signed it
    return store, verifier, good, bad


def test_a_store_recomputes_to_the_reputation_its_verdicts_give(tmp_path):
    from vrl.node.reputation import recompute

    store, verifier, good, bad = _store_log(tmp_path)
    found = recompute(store.replay(), frozenset({verifier.node_id}))
    store.close()
    assert (found.round, found.reports, found.invalid_verdicts) == (0, 2, 1)
    ranked = [node for node, _ in found.ranked()]
    assert ranked.index(good.node_id) < ranked.index(bad.node_id)
    assert found.standings[bad.node_id].score < found.standings[good.node_id].score


@given(st.lists(st.tuples(st.sampled_from(["group", "verdict", "policy", "step"]), st.binary(max_size=64)),
                max_size=20))
def test_recompute_counts_what_does_not_decode_as_invalid_and_never_raises(rows):
    from vrl.node.reputation import recompute

    found = recompute(((kind, data, (b"\x01" * 32, 0, 0.0, False)) for kind, data in rows), frozenset({b"\x02" * 32}))
    assert 0 <= found.invalid_verdicts <= sum(kind == "verdict" for kind, _ in rows)


def test_vrl_reputation_prints_what_the_library_recomputes(tmp_path):
    import json

    from typer.testing import CliRunner

    from vrl.cli import app

    store, verifier, good, bad = _store_log(tmp_path)
    store.close()
    result = CliRunner().invoke(app, ["reputation", str(tmp_path / "node.sqlite"), "--trust", verifier.node_id.hex(),
                                      "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["invalid_verdicts"] == 1
    assert [row["node"] for row in shown["nodes"]][-1] == bad.node_id.hex()
    text = CliRunner().invoke(app, ["reputation", str(tmp_path / "node.sqlite"), "--trust", verifier.node_id.hex()])
    assert text.exit_code == 0 and "from 2 reports (1 invalid verdicts skipped)" in text.output
