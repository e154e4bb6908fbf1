"""The verifier never raises, and its work is bounded (issue 13 §3).

Any record, however hostile its sampling parameters, ends as a verdict with a reason code of
specs/verification.md §1; the sampler itself returns a replay or raises its own error type,
never NaN margins that would pass a tolerance. Records longer than the model's context or the
verifier's ``max_tokens`` are refused before the prefill.
"""

from __future__ import annotations

import inspect
import json
import math
from dataclasses import replace
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch
from conftest import ROUND, TASKS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import vrl
import vrl.cli
from proofs import sampler
from proofs.errors import InvalidParameters, ProofsError
from vrl.cli import app
from vrl.rollouts.model import context_length
from vrl.rollouts.record import RecordError, Rollout, canonical_bytes
from vrl.rollouts.verify import DEFAULT_MAX_TOKENS, Expectations, Reason, Stage

SPECS = Path(__file__).resolve().parent.parent / "specs"
# Every reason code there is (tests/test_specs.py keeps it equal to specs/verification.md §1).
SPEC_REASONS = frozenset(Reason)
# Hypothesis budget: about half the verifier examples reach a signature check and a prefill of
# ~20 tokens on the tiny preset (~8 ms each on an idle core here, 10x that on a loaded one);
# CI's fuzz share is about 60 s in all (issue 13 §5).
EXAMPLES = 100


# -- the crash: T = 1e-4 with top_p < 1 --------------------------------------------------------------

def test_honest_rollouts_at_tiny_temperature_with_top_p_are_accepted(tiny, node):
    """Unpinned ``vrl verify`` computed ``exp(2 * slack / T)`` = ``e^1000`` and raised
    OverflowError (issue 13); the loosened top-p bound now saturates instead."""
    params = vrl.sampling_for(tiny, temperature=1e-4, top_p=0.9, max_new_tokens=12)
    rollouts = vrl.generate(tiny, TASKS, node, round_seed=ROUND, sampling=params, groups=1, group_size=2)
    verdicts = vrl.verify(rollouts, tiny)
    assert [(v.accepted, v.reason) for v in verdicts] == [(True, "ok")] * 2


def test_an_absurd_temperature_is_refused_not_accepted(tiny, node, honest):
    """At T = 5e-324, z / T overflows, margins and logprobs were NaN, and NaN passed every
    tolerance: the record was accepted whatever its tokens."""
    group = [r for r in honest if r.group_index == 0]
    forged = [r.signed(node, sampling=replace(r.sampling, temperature=5e-324),
                       completion_tokens=tuple(reversed(r.completion_tokens))) for r in group]
    verdicts = vrl.verify(forged, tiny)
    assert not any(v.accepted for v in verdicts)
    assert {v.reason for v in verdicts} <= {"sampling_undefined", "commitment_mismatch"}
    honest_tokens = [r.signed(node, sampling=replace(r.sampling, temperature=5e-324)) for r in group]
    verdicts = vrl.verify(honest_tokens, tiny)
    assert [(v.stage, v.reason) for v in verdicts] == [(Stage.SAMPLING, "sampling_undefined")] * len(group)
    assert "cannot be replayed" in verdicts[0].message


def test_one_refused_record_does_not_take_its_batch_with_it(tiny, node, honest):
    """Records sharing sampling parameters are replayed together; the sampler's refusal is
    kept per record, so the others of the batch keep their verdicts."""
    group = [r for r in honest if r.group_index == 0]
    other = [r for r in honest if r.group_index == 1]
    absurd = [r.signed(node, sampling=replace(r.sampling, temperature=5e-324)) for r in group]
    verdicts = vrl.verify(absurd + other, tiny, batch_size=len(absurd) + len(other))
    assert [v.reason for v in verdicts] == ["sampling_undefined"] * len(group) + ["ok"] * len(other)


# -- property tests: every sampling parameter, hostile ---------------------------------------------

HOSTILE = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 2**70),
                    st.integers(min_value=2**63, max_value=2**64 + 1), st.booleans(), st.none(), st.text(max_size=2),
                    st.lists(st.integers(-1, 2**33), max_size=3))
# Each field in its range, extremes included (what SamplingParams accepts)...
FIELDS = {
    "temperature": st.one_of(st.floats(0.0, 100.0), st.sampled_from(
        [0.0, -0.0, 5e-324, 1e-300, 2.0**-896, 1e-6, 1e-4, 0.5, 1.0, 100.0])),
    "top_k": st.one_of(st.integers(0, 2**24), st.sampled_from([0, 1, 2, 511, 512, 513, 2**24])),
    "top_p": st.one_of(st.floats(5e-324, 1.0), st.sampled_from([1.0, 0.999, 0.9, 0.5, 1e-300, 5e-324])),
    "max_new_tokens": st.one_of(st.integers(8, 2**20), st.sampled_from([8, 9, 40, 2**20])),
    # "model": the verifier's own stop tokens, without which a record stops at stage 3.
    "stop_token_ids": st.one_of(st.just("model"), st.just("model"), st.just("model"),
                                st.lists(st.integers(0, 2**32 - 1), max_size=3).map(tuple)),
}
# ... and just outside it.
OUT_OF_RANGE = {
    "temperature": st.sampled_from([-1e-300, -1.0, math.nextafter(100.0, 200.0), 1e300]),
    "top_k": st.sampled_from([-1, 2**24 + 1, 2**63]),
    "top_p": st.sampled_from([0.0, -0.0, -1.0, math.nextafter(1.0, 2.0), 2.0]),
    "max_new_tokens": st.sampled_from([0, -1, 7, 2**20 + 1]),  # 7: fewer than the 8 tokens of the record
    "stop_token_ids": st.lists(st.integers(-1, 2**33), min_size=1, max_size=70).map(tuple),
}


@st.composite
def sampling_fields(draw) -> dict:
    """All five sampling fields in their range (extremes included), then, half the time, one
    of them replaced by a value out of its range or a hostile one: NaN, an infinity, a huge
    or negative integer, a wrong type."""
    fields = {name: draw(strategy) for name, strategy in FIELDS.items()}
    hostile = draw(st.sampled_from([None] * len(FIELDS) + list(FIELDS)))
    if hostile is not None:
        fields[hostile] = draw(st.one_of(OUT_OF_RANGE[hostile], HOSTILE))
    return fields


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(fields=sampling_fields(), slack=st.sampled_from([0.0, 0.05, 1.0]), seed=st.integers(0, 2**32 - 1),
       shape=st.tuples(st.integers(1, 4), st.integers(2, 24)),
       scale=st.sampled_from([1e-30, 1.0, 30.0, 1e6, 3e38]),
       nonfinite=st.sampled_from([None, None, None, math.nan, math.inf]))
def test_sampler_returns_a_replay_or_its_own_error(fields, slack, seed, shape, scale, nonfinite):
    """Over every sampling parameter (extreme, NaN, infinite, mistyped) and float32-range
    logits: constructing the parameters raises only InvalidParameters, and sampling then
    replaying raises only ProofsError; when a replay comes back, every margin is >= 0 or +inf,
    never NaN, and the sampler's own tokens win their races on the same logits."""
    if fields["stop_token_ids"] == "model":
        fields["stop_token_ids"] = (0,)
    try:
        params = sampler.SamplingParams(**fields)
    except InvalidParameters:
        return
    rng = np.random.default_rng(seed)
    rows, vocab = shape
    logits = np.clip(rng.standard_normal((rows, vocab)) * scale, -3e38, 3e38).astype(np.float32)
    if nonfinite is not None:
        logits[rng.integers(rows), rng.integers(vocab)] = nonfinite
    logits = torch.from_numpy(logits)
    seeds = [bytes([i]) * 32 for i in range(rows)]
    positions = list(range(rows))
    try:
        tokens, logprobs = sampler.sample(logits, seeds, positions, params)
    except ProofsError:
        tokens, logprobs = torch.from_numpy(rng.integers(0, vocab, rows)), None
    if logprobs is not None:
        assert not torch.isnan(logprobs).any()
    try:
        replayed = sampler.replay(logits, tokens, seeds, positions, params, slack)
    except ProofsError:
        return
    assert not np.isnan(replayed.margins).any() and (replayed.margins >= 0).all()
    assert not np.isnan(replayed.logprobs).any()
    if logprobs is not None:
        assert (replayed.margins == 0).all()


@pytest.fixture(scope="module")
def base(tiny, node):
    """One honest group of one: what the verifier property mutates."""
    params = vrl.sampling_for(tiny, max_new_tokens=8)
    (rollout,) = vrl.generate(tiny, TASKS, node, round_seed=ROUND, sampling=params, groups=1, group_size=1)
    return rollout


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=sampling_fields())
def test_any_sampling_parameters_end_as_a_verdict(tiny, node, base, fields):
    """The verifier's side of the property: a record signed with any sampling parameters, or
    one carrying values the decoder refuses (NaN, infinities, wrong types), ends as exactly one
    verdict whose reason is a code of specs/verification.md §1, never an exception."""
    if fields["stop_token_ids"] == "model":
        fields["stop_token_ids"] = tiny.stop_token_ids
    try:
        params = sampler.SamplingParams(**fields)
    except InvalidParameters:
        wire = msgpack.unpackb(base.to_bytes(), raw=False)
        stops = fields["stop_token_ids"]
        wire["sampling"] = {**fields, "stop_token_ids": list(stops) if isinstance(stops, tuple) else stops}
        try:
            data = canonical_bytes(wire)
        except (TypeError, ValueError, OverflowError):  # msgpack cannot even write it (ints >= 2^64)
            return
    else:
        data = base.signed(node, sampling=params).to_bytes()
    try:
        item: Rollout | RecordError = Rollout.from_bytes(data)
    except RecordError as error:
        item = error
    (verdict,) = vrl.verify([item], tiny)
    assert verdict.reason in SPEC_REASONS
    assert verdict.accepted == (verdict.reason == "ok")


# -- unbounded prefill ----------------------------------------------------------------------------

def _long(rollout: Rollout, node, tokens: int) -> Rollout:
    digit = rollout.completion_tokens[0] if rollout.completion_tokens[0] not in rollout.sampling.stop_token_ids else 55
    return rollout.signed(node, completion_tokens=(digit,) * tokens, behaviour_logprobs=(-1.0,) * tokens,
                          finish_reason="length", sampling=replace(rollout.sampling, max_new_tokens=tokens))


def test_records_longer_than_the_context_are_refused_before_the_prefill(tiny, node, base):
    """An unpinned 32k-token record ran the whole prefill (6.2 GB on the tiny preset); now the
    model's context (4096 positions for the presets) refuses it at stage 3."""
    context = context_length(tiny)
    assert context == 4096
    fits = _long(base, node, context - len(base.prompt_tokens))
    too_long = _long(base, node, context - len(base.prompt_tokens) + 1)
    verdicts = vrl.verify([too_long], tiny)
    assert (verdicts[0].stage, verdicts[0].reason) == (Stage.BINDING, "too_many_tokens")
    assert f"context of {context} positions" in verdicts[0].message
    assert verdicts[0].recomputed == b"" and dict(verdicts[0].scores) == {}  # the model never ran
    assert vrl.verify([fits], tiny, expect=Expectations(max_tokens=16))[0].reason == "too_many_tokens"


def test_max_tokens_counts_prompt_and_completion(tiny, node, base):
    total = len(base.prompt_tokens) + len(base.completion_tokens)
    at_limit = vrl.verify([base], tiny, expect=Expectations(max_tokens=total))[0]
    over = vrl.verify([base], tiny, expect=Expectations(max_tokens=total - 1))[0]
    assert at_limit.accepted
    assert (over.stage, over.reason) == (Stage.BINDING, "too_many_tokens")
    assert f"limit of {total - 1}" in over.message
    for bad in (0, -1, True, 2.5, "8"):
        with pytest.raises(ValueError):
            Expectations(max_tokens=bad)


def test_cli_verify_max_tokens(tmp_path, base):
    assert inspect.signature(vrl.cli.verify).parameters["max_tokens"].default == DEFAULT_MAX_TOKENS
    path = tmp_path / "r.msgpack"
    vrl.write_rollouts(path, [base])
    total = len(base.prompt_tokens) + len(base.completion_tokens)
    runner = CliRunner()
    refused = runner.invoke(app, ["verify", str(path), "--model", "tiny", "--json", "--max-tokens", str(total - 1)])
    assert refused.exit_code == 1, refused.output
    assert json.loads(refused.stdout)["reasons"] == {"too_many_tokens": 1}
    accepted = runner.invoke(app, ["verify", str(path), "--model", "tiny", "--json", "--max-tokens", str(total)])
    assert accepted.exit_code == 0, accepted.output


def test_the_verifiers_own_commitment_is_rebuilt_only_when_asked(tiny, base):
    """Rebuilding costs about 7% of verification; only a node's signed verdict needs it."""
    (plain,) = vrl.verify([base], tiny)
    (rebuilt,) = vrl.verify([base], tiny, rebuild_commitments=True)
    assert plain.accepted and rebuilt.accepted and plain.recomputed == b""
    assert rebuilt.recomputed == vrl.commit(tiny, list(base.prompt_tokens), list(base.completion_tokens))
