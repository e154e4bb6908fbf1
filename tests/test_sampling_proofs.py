"""Sampling proofs at challenged positions, for real (specs/zk.md §8): the micro preset's
records commit their hidden states, a challenge picks positions, the producer proves the
LM head's logits there with ezkl, and a verifier checks the race, the logprob, the hash and
the activation commitment. Every way an opening can be wrong is its own outcome."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from conftest import ROUND, TASKS
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import vrl
from proofs import commitment, zk
from proofs.circuits import HIDDEN_SCALE, LM_LOGITS_MICRO, hidden_hash, quantize_hidden
from vrl.cli import app
from vrl.rollouts.record import RecordError, Rollout
from vrl.zk import record_subject
from vrl.zk.sampling import (
    CHALLENGE_BYTES,
    LOGIT_TOLERANCE,
    Check,
    Opening,
    SamplingProofError,
    challenged,
    check_openings,
    circuit_for,
    openings_from_bytes,
    openings_path,
    prove_sampling,
    read_witness,
    subject,
    witness_path,
    write_openings,
    write_witness,
)

CHALLENGE = bytes([0xAB]) * CHALLENGE_BYTES
runner = CliRunner()


@dataclasses.dataclass(frozen=True)
class Proven:
    model: object
    workdir: object
    srs: zk.Srs
    records: list
    rows: dict
    openings: list  # one position of each of the first two records


@pytest.fixture(scope="module")
def micro():
    return vrl.load_model("micro")


@pytest.fixture(scope="module")
def proven(micro, node, zk_workdir) -> Proven:
    kept = []
    records = vrl.generate(micro, TASKS, node, round_seed=ROUND, sampling=vrl.sampling_for(micro, max_new_tokens=12),
                           groups=1, group_size=3, witness=lambda r, rows: kept.append((r, rows)))
    rows = {record_subject(r): x.numpy() for r, x in kept}
    srs = zk.dev_srs(zk_workdir, LM_LOGITS_MICRO.logrows)
    openings = prove_sampling(micro, records[:2], rows, CHALLENGE, 1, srs, zk_workdir)
    return Proven(micro, zk_workdir, srs, records, rows, openings)


def checks(proven: Proven, openings=None, records=None, model=None, **options) -> list[str]:
    options = {"challenge": CHALLENGE, "count": 1, "allow_dev": True, **options}
    found = check_openings(records or proven.records[:2], proven.openings if openings is None else openings,
                           model or proven.model, [proven.srs], proven.workdir, **options)
    return [str(c.outcome) for c in found]


def resign(node, rollout: Rollout, **changes) -> Rollout:
    return rollout.signed(node, **changes)


def reproven(proven: Proven, record: Rollout, position: int) -> Opening:
    """What a cheater who proves honestly for the record it altered sends."""
    row = proven.rows[record_subject(proven.records[0])][position]
    attachment = zk.prove(LM_LOGITS_MICRO, [quantize_hidden(row[None])[0].tolist()], subject(record, position),
                          proven.srs, proven.workdir, params=vrl.zk.sampling.head_module(proven.model))
    return Opening(record_subject(record), position, np.ascontiguousarray(row, dtype="<f4").tobytes(), attachment)


# -- honest ---------------------------------------------------------------------------------------

def test_records_commit_one_hidden_hash_per_token_and_it_round_trips(proven):
    for record in proven.records:
        assert len(record.hidden_hashes) == 32 * len(record.completion_tokens)
        assert Rollout.from_bytes(record.to_bytes()) == record
        rows = proven.rows[record_subject(record)]
        assert [hidden_hash(q) for q in quantize_hidden(rows)] == [
            record.hidden_hashes[i:i + 32] for i in range(0, len(record.hidden_hashes), 32)]


def test_honest_openings_verify_and_their_tokens_win_on_the_proven_logits(proven):
    found = check_openings(proven.records[:2], proven.openings, proven.model, [proven.srs], proven.workdir,
                           challenge=CHALLENGE, count=1, allow_dev=True)
    assert [c.outcome for c in found] == [Check.OK, Check.OK]
    assert all(c.margin <= LOGIT_TOLERANCE and c.logprob_error <= 2 * LOGIT_TOLERANCE for c in found)


def test_the_proven_logits_are_the_models_within_the_fixed_point_error(proven):
    opening = proven.openings[0]
    hidden, logits = vrl.zk.sampling.lm_logits_split(LM_LOGITS_MICRO, opening.attachment.instances)
    row = torch.from_numpy(np.frombuffer(opening.row, dtype="<f4").copy())
    head = proven.model.network.get_output_embeddings().weight
    expected = (head @ row).double()
    assert (torch.tensor(logits, dtype=torch.float64) / (1 << HIDDEN_SCALE) - expected).abs().max() < LOGIT_TOLERANCE


def test_the_weights_commitment_is_one_value_per_policy_and_srs(proven):
    first = vrl.zk.sampling.head_commitment(proven.model, proven.srs, proven.workdir)
    assert first == vrl.zk.sampling.head_commitment(proven.model, proven.srs, proven.workdir)
    assert len(first) == zk.POINT_BYTES


# -- every way it can be wrong --------------------------------------------------------------------

def test_a_tampered_logit_is_an_invalid_proof(proven):
    opening = proven.openings[0]
    instances = list(opening.attachment.instances)
    instances[-1] = zk.felt(zk.felt_int(instances[-1]) + 1)
    tampered = dataclasses.replace(opening, attachment=dataclasses.replace(opening.attachment,
                                                                           instances=tuple(instances)))
    assert checks(proven, [tampered, proven.openings[1]]) == ["zk_invalid_proof", "ok"]


def test_a_row_other_than_the_committed_one_is_refused(proven):
    opening = proven.openings[0]
    row = np.frombuffer(opening.row, dtype="<f4").copy()
    row[0] += 1.0
    other = dataclasses.replace(opening, row=row.tobytes())
    assert checks(proven, [other, proven.openings[1]])[0] == "sampling_wrong_hidden"


def test_a_proof_made_with_other_weights_does_not_verify(proven):
    other = vrl.load_model("micro")
    with torch.no_grad():
        other.network.get_output_embeddings().weight[5, 7] += 1e-2
    assert checks(proven, model=other) == ["zk_invalid_proof", "zk_invalid_proof"]


def test_an_activation_commitment_of_other_rows_does_not_open_at_the_row(proven, node):
    record = proven.records[0]
    rows = torch.from_numpy(np.vstack([proven.rows[record_subject(record)], proven.rows[record_subject(record)][-1:]]))
    forged = resign(node, record, commitment=commitment.build(rows + 0.5))
    opening = dataclasses.replace(proven.openings[0], record=record_subject(forged))
    assert checks(proven, [opening], records=[forged], challenge=None) == ["sampling_uncommitted_row"]


def test_a_token_that_lost_its_race_is_caught_even_with_an_honest_proof(proven, node):
    record = proven.records[0]
    (position,) = challenged(record, CHALLENGE, 1)
    tokens = list(record.completion_tokens)
    tokens[position] = (tokens[position] + 1) % 254
    cheat = resign(node, record, completion_tokens=tuple(tokens))
    found = checks(proven, [reproven(proven, cheat, position)], records=[cheat], challenge=None)
    assert found == ["sampling_lost_race"]


def test_a_logprob_other_than_the_proven_one_is_caught(proven, node):
    record = proven.records[0]
    (position,) = challenged(record, CHALLENGE, 1)
    logprobs = list(record.behaviour_logprobs)
    logprobs[position] = logprobs[position] - 0.05
    cheat = resign(node, record, behaviour_logprobs=tuple(logprobs))
    found = checks(proven, [reproven(proven, cheat, position)], records=[cheat], challenge=None)
    assert found == ["sampling_wrong_logprob"]


def test_a_crafted_row_with_the_committed_top_values_is_caught_by_the_verifiers_own_prefill(proven, node):
    """The activation commitment holds three values of a row: a producer can commit the true
    rows there and hash another row that agrees on those three (shown: it opens), then prove
    from it. The verifier's own prefill catches the logits (specs/zk.md §10, step 8)."""
    record = proven.records[0]
    (position,) = challenged(record, CHALLENGE, 1)
    true_row = torch.from_numpy(proven.rows[record_subject(record)][position].copy())
    top = commitment.top_indices(commitment.bf16_bits(true_row[None]), commitment.VALUES_PER_ROW)[0]
    crafted = -true_row
    crafted[top] = true_row[top]  # same magnitudes everywhere: the top three stay the top three
    n = len(record.completion_tokens)
    assert commitment.opens(record.commitment, n + 1, position, crafted)
    hashes = bytearray(record.hidden_hashes)
    hashes[32 * position:32 * (position + 1)] = hidden_hash(quantize_hidden(crafted.numpy()[None])[0])
    cheat = resign(node, record, hidden_hashes=bytes(hashes))
    attachment = zk.prove(LM_LOGITS_MICRO, [quantize_hidden(crafted.numpy()[None])[0].tolist()],
                          subject(cheat, position), proven.srs, proven.workdir,
                          params=vrl.zk.sampling.head_module(proven.model))
    opening = Opening(record_subject(cheat), position, crafted.numpy().astype("<f4").tobytes(), attachment)
    assert checks(proven, [opening], records=[cheat], challenge=None) == ["sampling_wrong_logits"]


def test_records_sampled_with_a_mask_or_by_a_half_precision_model_are_not_covered(proven, node):
    masked = resign(node, proven.records[0], sampling=dataclasses.replace(proven.records[0].sampling, top_k=5))
    opening = dataclasses.replace(proven.openings[0], record=record_subject(masked))
    assert checks(proven, [opening], records=[masked], challenge=None) == ["sampling_unsupported"]
    with pytest.raises(SamplingProofError, match="top-k or top-p"):
        prove_sampling(proven.model, [masked], {record_subject(masked): proven.rows[record_subject(
            proven.records[0])]}, CHALLENGE, 1, proven.srs, proven.workdir)
    with pytest.raises(SamplingProofError, match="float32"):
        circuit_for(vrl.load_model("micro", dtype="bfloat16"))


def test_inspect_shows_a_hostile_circuit_id_as_text(proven, tmp_path):
    hostile = dataclasses.replace(proven.openings[0], attachment=dataclasses.replace(
        proven.openings[0].attachment, circuit="[/oops]"))
    write_openings(tmp_path / "r.sampling", CHALLENGE, [hostile])
    result = runner.invoke(app, ["inspect", str(tmp_path / "r.sampling")])
    assert result.exit_code == 0 and "[/oops]" in result.output, result.output


def test_positions_the_challenge_did_not_pick_and_unanswered_ones_are_named(proven):
    record = proven.records[0]
    (position,) = challenged(record, CHALLENGE, 1)
    other = dataclasses.replace(proven.openings[0], position=(position + 1) % len(record.completion_tokens))
    assert sorted(checks(proven, [other])) == ["sampling_missing", "sampling_missing", "sampling_not_challenged"]


def test_an_opening_for_another_position_is_about_another_subject(proven):
    record = proven.records[0]
    (position,) = challenged(record, CHALLENGE, 1)
    moved = dataclasses.replace(proven.openings[0], position=(position + 1) % len(record.completion_tokens))
    assert checks(proven, [moved], records=[record], challenge=None) != ["ok"]


def test_the_dev_srs_is_refused_unless_allowed(proven):
    assert checks(proven, allow_dev=False) == ["zk_dev_srs", "zk_dev_srs"]


def test_a_record_without_hidden_hashes_cannot_be_opened(proven, node):
    plain = resign(node, proven.records[0], hidden_hashes=b"")
    opening = dataclasses.replace(proven.openings[0], record=record_subject(plain))
    assert checks(proven, [opening], records=[plain], challenge=None) == ["sampling_not_committed"]
    with pytest.raises(SamplingProofError, match="commits no hidden states"):
        prove_sampling(proven.model, [plain], proven.rows, CHALLENGE, 1, proven.srs, proven.workdir)


def test_only_the_micro_shape_has_a_circuit(tiny):
    with pytest.raises(SamplingProofError, match="base-micro"):
        circuit_for(tiny)


# -- decoders and the record field ----------------------------------------------------------------

def test_the_record_decoder_bounds_hidden_hashes(proven):
    record = proven.records[0]
    for bad in (record.hidden_hashes[:-1], record.hidden_hashes + bytes(32), b"\xff" * len(record.hidden_hashes)):
        wire = dataclasses.replace(record, hidden_hashes=bad).to_bytes()
        with pytest.raises(RecordError, match="hidden_hashes"):
            Rollout.from_bytes(wire)


def test_files_round_trip(proven, tmp_path):
    write_openings(tmp_path / "r.sampling", CHALLENGE, proven.openings)
    assert openings_from_bytes((tmp_path / "r.sampling").read_bytes()) == (CHALLENGE, proven.openings)
    pairs = [(r, torch.from_numpy(proven.rows[record_subject(r)])) for r in proven.records]
    write_witness(tmp_path / "r.hidden", pairs)
    back = read_witness(tmp_path / "r.hidden")
    assert all(np.array_equal(back[k], v) for k, v in proven.rows.items())


_leaves = (st.none() | st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1) | st.binary(max_size=40)
           | st.text(max_size=20) | st.just(CHALLENGE) | st.just("vrl/sampling/v1"))
_values = st.recursive(_leaves, lambda c: st.lists(c, max_size=5), max_leaves=20)
_packed = st.builds(lambda x: __import__("msgpack").packb(x, use_bin_type=True), _values)
_near = st.builds(lambda entries: __import__("msgpack").packb(["vrl/sampling/v1", CHALLENGE, entries],
                                                              use_bin_type=True),
                  st.lists(st.lists(_leaves, max_size=5), max_size=3))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512) | _packed | _near)
def test_hostile_sampling_files_raise_only_their_error(data):
    try:
        openings_from_bytes(data)
    except SamplingProofError:
        pass


def test_a_directory_or_a_missing_file_is_a_clear_error(tmp_path):
    for path in (tmp_path, tmp_path / "missing.hidden"):
        with pytest.raises(SamplingProofError, match=str(path)):
            read_witness(path)
        with pytest.raises(SamplingProofError, match=str(path)):
            vrl.zk.sampling.read_openings(path)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=256))
def test_hostile_witness_files_raise_only_their_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("w") / "r.hidden"
    path.write_bytes(data)
    try:
        read_witness(path)
    except SamplingProofError:
        pass


@settings(max_examples=200, deadline=None)
@given(count=st.integers(min_value=1, max_value=64), challenge=st.binary(min_size=32, max_size=32))
def test_challenged_positions_are_distinct_sorted_and_in_range(proven_record_lengths, count, challenge):
    for record in proven_record_lengths:
        picked = challenged(record, challenge, count)
        assert list(picked) == sorted(set(picked))
        assert len(picked) == min(count, len(record.completion_tokens))
        assert all(0 <= p < len(record.completion_tokens) for p in picked)
        assert picked == challenged(record, challenge, count)


@pytest.fixture(scope="module")
def proven_record_lengths(proven):
    return proven.records


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=-(1 << 127), max_value=(1 << 127)))
def test_signed_field_elements_round_trip(value):
    assert zk.felt_int(zk.felt(value)) == value


def test_an_honest_row_opens_the_commitment_and_a_changed_one_does_not(proven):
    record = proven.records[0]
    rows = proven.rows[record_subject(record)]
    n = len(record.completion_tokens)
    for position in range(n):
        row = torch.from_numpy(rows[position].copy())
        assert commitment.opens(record.commitment, n + 1, position, row)
        assert not commitment.opens(record.commitment, n + 1, position, -row)


# -- the command line -----------------------------------------------------------------------------

def test_generate_prove_verify_from_the_command_line(tmp_path, monkeypatch, zk_workdir):
    monkeypatch.setenv("VRL_ZK_DIR", str(zk_workdir))
    key, rollouts = tmp_path / "node.pem", tmp_path / "r.vrl"
    assert runner.invoke(app, ["keygen", "--out", str(key)]).exit_code == 0
    base = ["--model", "micro"]
    result = runner.invoke(app, ["generate", *base, "--task", "arithmetic:digits=1", "--key", str(key), "--out",
                                 str(rollouts), "--groups", "1", "--group-size", "2", "--max-new-tokens", "6",
                                 "--hidden-states"])
    assert result.exit_code == 0, result.output
    assert witness_path(rollouts).exists()
    assert runner.invoke(app, ["prove", str(rollouts), *base, "--kind", "sampling", "--dev-srs"]).exit_code == 2
    result = runner.invoke(app, ["prove", str(rollouts), *base, "--kind", "sampling", "--positions", "1",
                                 "--challenge", CHALLENGE.hex(), "--dev-srs"])
    assert result.exit_code == 0, result.output
    verify = ["verify", str(rollouts), *base, "--challenge", CHALLENGE.hex(), "--positions", "1", "--json"]
    result = runner.invoke(app, [*verify, "--allow-dev-srs"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)["sampling_proofs"]
    assert (summary["positions"], summary["proven"]) == (2, 2)
    assert runner.invoke(app, verify).exit_code == 1  # the dev SRS not allowed: zk_dev_srs
    other = bytes([1]) * 32
    assert runner.invoke(app, [*verify[:5], other.hex(), *verify[6:], "--allow-dev-srs"]).exit_code == 2
    inspected = runner.invoke(app, ["inspect", str(openings_path(rollouts)), "--json"])
    assert inspected.exit_code == 0, inspected.output
    assert len(json.loads(inspected.output)["openings"]) == 2


def test_the_audit_checks_a_rollout_files_sampling_proofs_and_blames_no_one(proven, tmp_path, monkeypatch):
    import vrl.audit

    monkeypatch.setenv("VRL_ZK_DIR", str(proven.workdir))
    rollouts = tmp_path / "r.vrl"
    vrl.write_rollouts(rollouts, proven.records[:2])

    def audited(openings):
        write_openings(openings_path(rollouts), CHALLENGE, openings)
        with vrl.audit.open([rollouts]) as audit:
            report = audit.run(checks=["sampling"], srs=[proven.srs], allow_dev_srs=True)
        return report.stats["sampling"], [f for f in report.findings if f.check == "sampling"]

    stats, findings = audited(proven.openings)
    assert (stats["proven"], stats["not_proven"], findings) == (2, 0, [])
    opening = proven.openings[0]
    instances = list(opening.attachment.instances)
    instances[-1] = zk.felt(zk.felt_int(instances[-1]) + 1)
    tampered = dataclasses.replace(opening, attachment=dataclasses.replace(opening.attachment,
                                                                           instances=tuple(instances)))
    stats, findings = audited([tampered, proven.openings[1]])
    assert (stats["proven"], stats["not_proven"]) == (1, 1)
    assert [(f.code, f.severity.name, f.subject) for f in findings] == [("sampling_not_proven", "WARNING", "")]
