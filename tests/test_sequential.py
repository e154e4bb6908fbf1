"""The per-producer sequential test (specs/verification.md §7): its e-value, its anytime
guarantee for honest producers, and how fast it catches a sampler that loses more races."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vrl.rollouts import profiles
from vrl.rollouts.sequential import ALPHA, MAX_ALTERNATIVE, RaceTest, alternatives, log_e_value, threshold

rates = st.floats(min_value=1e-6, max_value=0.2)


def test_no_evidence_is_no_evidence():
    assert log_e_value(0, 0, 1e-3) == 0.0
    assert not RaceTest(1e-3).rejected
    assert threshold() == pytest.approx(math.log(1 / ALPHA))


@given(rates)
def test_the_grid_doubles_from_q0_up_to_one_half(q0):
    grid = alternatives(q0)
    assert grid[-1] == MAX_ALTERNATIVE and grid[0] == pytest.approx(min(2 * q0, MAX_ALTERNATIVE))
    assert all(b == pytest.approx(2 * a) for a, b in zip(grid[:-2], grid[1:-1]))
    assert all(q0 < q <= MAX_ALTERNATIVE for q in grid)


@given(rates, st.integers(0, 10**6), st.integers(0, 10**6))
def test_more_losses_are_more_evidence_and_more_wins_are_less(q0, tokens, lost):
    lost = min(lost, tokens)
    here = log_e_value(tokens, lost, q0)
    assert math.isfinite(here)
    if lost < tokens:
        assert log_e_value(tokens, lost + 1, q0) > here  # one win turned into a loss
    assert log_e_value(tokens + 1, lost, q0) < here  # one more race won


@given(st.integers(-3, 3), st.integers(-3, 3), st.floats(allow_nan=True))
def test_impossible_evidence_and_rates_are_refused(tokens, lost, q0):
    if 0 <= lost <= tokens and 0 < q0 < MAX_ALTERNATIVE:
        RaceTest(q0).add(tokens, lost)
        return
    with pytest.raises(ValueError):
        RaceTest(q0).add(tokens, lost).log_e  # noqa: B018 (read too: each step that may refuse is taken)


def test_the_state_is_the_totals_so_evidence_adds_up_in_any_order():
    one = RaceTest(1e-3).add(300, 2).add(500, 0).add(200, 4)
    other = RaceTest(1e-3).add(200, 4).add(800, 2)
    assert (one.tokens, one.lost) == (other.tokens, other.lost) == (1000, 6)
    assert one.log_e == other.log_e


def _first_rejection(losses: np.ndarray, q0: float, alpha: float, step: int) -> int | None:
    """Tokens until the test rejects, checked every ``step`` tokens (a rollout's worth)."""
    totals = np.cumsum(losses)
    for end in range(step, len(losses) + 1, step):
        if RaceTest(q0, end, int(totals[end - 1]), alpha).rejected:
            return end
    return None


def test_an_honest_producer_is_flagged_no_more_often_than_alpha_over_any_horizon():
    """Ville's inequality, at a size a test can see: 400 honest producers, each losing races at
    exactly q0 for 20,000 tokens (the worst an honest profile allows), at alpha = 5%."""
    rng = np.random.default_rng(16)
    q0, alpha = 2e-3, 0.05
    flagged = sum(_first_rejection(rng.random(20_000) < q0, q0, alpha, 64) is not None for _ in range(400))
    assert flagged / 400 <= alpha


def test_a_producer_losing_four_times_as_many_races_is_caught_within_a_few_thousand_tokens():
    rng = np.random.default_rng(17)
    q0 = 1e-3
    tokens = [_first_rejection(rng.random(40_000) < 4 * q0, q0, ALPHA, 64) for _ in range(40)]
    assert all(t is not None for t in tokens)
    assert np.median(tokens) < 6_000


@settings(max_examples=50)
@given(st.floats(min_value=1e-5, max_value=0.05), st.integers(1, 40))
def test_losing_every_race_is_caught_at_once(q0, tokens):
    """A sampler whose every token loses needs only ln(1/alpha) / ln(1/(2 q0)) or so of them."""
    needed = math.ceil((threshold() + math.log(len(alternatives(q0)))) / math.log(MAX_ALTERNATIVE / q0)) + 1
    assert RaceTest(q0, max(tokens, needed), max(tokens, needed)).rejected


# -- the tolerance table the verifier loads (specs/verification.md §5.2) -------------------------


@pytest.fixture
def table_file(tmp_path, monkeypatch):
    """TABLE_FILE pointed at a scratch file, with the loader's caches cleared around the test."""
    path = tmp_path / "tolerances.json"
    monkeypatch.setattr(profiles, "TABLE_FILE", path)
    profiles.table.cache_clear()
    profiles._fallback.cache_clear()
    yield path
    profiles.table.cache_clear()
    profiles._fallback.cache_clear()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=200), st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12).map(lambda value: json.dumps(value).encode())))
def test_a_damaged_table_is_a_profile_error_naming_the_file(table_file, data):
    table_file.write_bytes(data)
    profiles.table.cache_clear()
    try:
        loaded = profiles.table()
    except profiles.ProfileError as error:
        assert str(table_file) in str(error)
    else:
        assert isinstance(loaded, dict)


def test_a_row_out_of_range_is_a_profile_error_naming_the_row(table_file):
    row = {"tolerances": {name: 1 for name in profiles.Tolerances.__slots__}, "race_loss_rate": 0.9,
           "race_exact": False, "calibration": {"run": "here"}}
    table_file.write_text(json.dumps({"format": profiles.TABLE_FORMAT, "profiles": {"cpu/x/y/same": row}}))
    with pytest.raises(profiles.ProfileError, match="cpu/x/y/same"):
        profiles.table()


def test_a_missing_table_says_how_to_write_one(table_file):
    with pytest.raises(profiles.ProfileError, match="bench/calibrate.py --write-table"):
        profiles.table()


def test_the_shipped_table_has_every_cpu_profile_and_an_unknown_one_falls_back_to_its_dtype():
    names = set(profiles.table())
    assert {f"cpu/{d}/{a}/same" for d in ("float32", "bfloat16", "float16") for a in ("sdpa", "eager")} <= names
    fallback = profiles.profile("cuda/bfloat16/sdpa/same")
    assert not fallback.race_exact and fallback.calibration.startswith("fallback to cpu/bfloat16/")
