"""Private-answer rewards end to end (specs/zk.md §7, §8): a task set published with its
references as commitments, rollouts rewarded from the private key, their correctness proven,
and a verifier that never sees the answers accepting exactly the honest rewards."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import vrl
from proofs import zk
from proofs.circuits import ANSWER_MATCH
from tests.conftest import ROUND, TASKS
from vrl.cli import app
from vrl.rollouts.verify import Expectations, verify
from vrl.tasks import RewardSpec, Task, TaskList, is_held_out
from vrl.zk import (
    AnswerKey,
    ZkFileError,
    commit_answers,
    companion_path,
    prove_rewards,
    proven_correctness,
    read_attachments,
    record_subject,
    write_attachments,
)

SPEC = RewardSpec()
runner = CliRunner()


@dataclasses.dataclass(frozen=True)
class Private:
    public: TaskList
    key: AnswerKey
    records: list[vrl.Rollout]
    attachments: list[zk.Attachment]
    srs: zk.Srs


def _tasks(count: int) -> list[Task]:
    return [t for t in (TASKS.task(i) for i in range(64)) if not is_held_out(t)][:count]


@pytest.fixture(scope="module")
def private(tiny, node, zk_workdir) -> Private:
    """References chosen so that some samples are right: a first run shows what each task's
    first sample answers; the same prompts, ids and seeds sample the same completions again."""
    sampling = vrl.sampling_for(tiny, max_new_tokens=12)
    options = dict(round_seed=ROUND, sampling=sampling, groups=3, group_size=2, batch_size=6)
    first = vrl.generate(tiny, TaskList("probe", tuple(_tasks(3))), node, **options)
    given = {r.task_id: SPEC.given_form(tiny.decode(list(r.completion_tokens))) for r in first if r.sample_index == 0}
    references = {tid: form.decode()[2:] if form else "7" for tid, form in given.items()}
    public, key = commit_answers(Task(t.id, t.prompt, references.get(t.id, "7")) for t in _tasks(3))
    records = vrl.generate(tiny, TaskList("private", tuple(public)), node, score=key.scorer(SPEC), **options)
    srs = zk.dev_srs(zk_workdir, ANSWER_MATCH.logrows)
    attachments = prove_rewards(records, key, tiny.decode, srs, zk_workdir)
    return Private(TaskList("private", tuple(public)), key, records, attachments, srs)


def checked(private: Private, tiny, zk_workdir, records=None, attachments=None, allow_dev=True):
    records = private.records if records is None else records
    proven = proven_correctness(records, private.attachments if attachments is None else attachments, tiny.decode,
                                [private.srs], zk_workdir, allow_dev=allow_dev)
    return verify(records, tiny, expect=Expectations(tasks=private.public, round_seed=ROUND), proven=proven)


def test_the_published_tasks_hold_commitments_only(private):
    for task in private.public.tasks:
        assert task.answer.startswith("zk:") and len(task.answer) == 67
        assert private.key.commitment(task.id).hex() == task.answer[3:]
    assert all(r.reference.startswith("zk:") for r in private.records)


def test_a_verifier_without_the_answers_accepts_the_proven_rewards(private, tiny, zk_workdir):
    verdicts = checked(private, tiny, zk_workdir)
    assert all(v.accepted for v in verdicts), [(v.reason, v.message) for v in verdicts if not v.accepted]
    assert any(r.reward == 1.0 for r in private.records), "no sample was right: the test proves only zeros"
    assert any(r.reward == 0.0 for r in private.records)
    answered = [r for r in private.records if SPEC.given_form(tiny.decode(list(r.completion_tokens)))]
    assert len(private.attachments) == len(answered)  # one proof per record that gives an answer


def test_without_proofs_a_committed_reward_is_unproven(private, tiny, zk_workdir):
    verdicts = checked(private, tiny, zk_workdir, attachments=[])
    answered = {i for i, r in enumerate(private.records) if SPEC.given_form(tiny.decode(list(r.completion_tokens)))}
    assert {v.index for v in verdicts if v.reason == "reward_unproven"} == answered
    assert all(v.accepted for v in verdicts if v.index not in answered)  # no answer: nothing to prove


def test_an_inflated_reward_fails_even_with_the_honest_proof(private, tiny, zk_workdir, node):
    index = next(i for i, r in enumerate(private.records) if r.reward == 0.0
                 and SPEC.given_form(tiny.decode(list(r.completion_tokens))))
    records = list(private.records)
    records[index] = records[index].signed(node, reward=1.0)
    # The proof names the record's old bytes: the re-signed record has none, ...
    verdict = checked(private, tiny, zk_workdir, records=records)[index]
    assert (verdict.reason, "zk_missing" in verdict.message) == ("reward_unproven", True)
    # ... and renamed to the new record, it still proves what it proved, correct = 0: the
    # statement binds the answer and the commitment, which the new record shares.
    moved = [dataclasses.replace(a, subject=record_subject(records[index]))
             if a.subject == record_subject(private.records[index]) else a for a in private.attachments]
    verdict = checked(private, tiny, zk_workdir, records=records, attachments=moved)[index]
    assert verdict.reason == "reward_mismatch"


def test_proofs_against_a_dev_srs_are_refused_unless_allowed(private, tiny, zk_workdir):
    verdicts = checked(private, tiny, zk_workdir, allow_dev=False)
    failed = [v for v in verdicts if not v.accepted]
    assert failed and all(v.reason == "reward_unproven" and "zk_dev_srs" in v.message for v in failed)


def test_a_reward_spec_never_compares_a_committed_reference_as_text(private):
    task = private.public.tasks[0]
    with pytest.raises(ValueError, match="committed reference"):
        SPEC.reward(task, f"the answer is {task.answer}")


def test_companion_files_round_trip_and_bad_ones_name_the_file(private, tmp_path):
    path = tmp_path / "r.vrl.zk"
    write_attachments(path, private.attachments)
    assert read_attachments(path) == private.attachments
    path.write_bytes(b"\x92\xa9vrl/zk/v1\x91\xc4\x03abc")
    with pytest.raises(ZkFileError, match="r.vrl.zk: attachment 0"):
        read_attachments(path)
    path.write_bytes(b"not msgpack at all")
    with pytest.raises(ZkFileError, match="r.vrl.zk"):
        read_attachments(path)


def test_answer_key_errors_name_the_file_and_line(tmp_path):
    path = tmp_path / "key.jsonl"
    path.write_text('{"id": "a", "form": "n:1", "salt": "' + "00" * 18 + '"}\n{"id": "b", "form": "n:2"}\n')
    with pytest.raises(ZkFileError, match="key.jsonl:2: not an answer key line"):
        AnswerKey.read(path)


def test_the_cli_commits_generates_proves_and_verifies(tmp_path, zk_workdir, monkeypatch):
    """The README's steps (specs/zk.md §8), with the tiny preset and the dev SRS."""
    monkeypatch.setenv("VRL_ZK_DIR", str(zk_workdir))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": t.id, "prompt": t.prompt, "answer": t.answer}) + "\n"
                             for t in _tasks(4)))
    keyfile = tmp_path / "node.pem"
    assert runner.invoke(app, ["keygen", "--out", str(keyfile)]).exit_code == 0
    result = runner.invoke(app, ["commit-answers", str(tasks), "--out", str(tmp_path / "public.jsonl"),
                                 "--key", str(tmp_path / "answers.jsonl")])
    assert result.exit_code == 0, result.output
    assert "zk:" in (tmp_path / "public.jsonl").read_text() and '"answer": "' + _tasks(1)[0].answer not in (
        tmp_path / "public.jsonl").read_text()
    rollouts = tmp_path / "r.vrl"
    base = ["--model", "tiny", "--task", str(tmp_path / "public.jsonl")]
    # Without the key, records claim only their public reward (specs/zk.md §11).
    keyless = tmp_path / "keyless.vrl"
    result = runner.invoke(app, ["generate", *base, "--key", str(keyfile), "--out", str(keyless), "--groups", "1",
                                 "--group-size", "2", "--max-new-tokens", "12", "--json"])
    assert result.exit_code == 0, result.output
    assert [r.reward for r in vrl.read_rollouts(keyless)] == [0.0, 0.0]
    assert runner.invoke(app, ["prove", str(keyless), "--model", "tiny", "--answers", str(tmp_path / "answers.jsonl"),
                               "--dev-srs", "--json"]).exit_code == 0
    result = runner.invoke(app, ["verify", str(keyless), *base, "--allow-dev-srs", "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["accepted"] == 2, result.output
    result = runner.invoke(app, ["generate", *base, "--key", str(keyfile), "--out", str(rollouts), "--groups", "1",
                                 "--group-size", "2", "--max-new-tokens", "12", "--answers",
                                 str(tmp_path / "answers.jsonl"), "--json"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["prove", str(rollouts), "--model", "tiny", "--answers",
                                 str(tmp_path / "answers.jsonl"), "--dev-srs", "--json"])
    assert result.exit_code == 0, result.output
    assert companion_path(rollouts).exists()
    result = runner.invoke(app, ["verify", str(rollouts), *base, "--allow-dev-srs", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["accepted"] == 2 and summary["zk"]["failed"] == {}
    result = runner.invoke(app, ["verify", str(rollouts), *base, "--json"])  # the dev SRS not allowed
    assert json.loads(result.output)["zk"]["failed"] in ({}, {"zk_dev_srs": 1}, {"zk_dev_srs": 2})
    result = runner.invoke(app, ["inspect", str(companion_path(rollouts)), "--json"])
    assert result.exit_code == 0 and all(row["circuit"] == "answer-match/v1" for row in json.loads(result.output))
    assert runner.invoke(app, ["prove", str(rollouts), "--model", "tiny", "--answers",
                               str(tmp_path / "answers.jsonl")]).exit_code == 2  # no SRS named


def test_an_evaluation_claim_is_upheld_and_every_way_of_inflating_it_is_not(tiny, node, zk_workdir, tmp_path):
    """specs/zk.md §9: every task once, greedily, at the seed the model and task set fix,
    rewards proven; what the evaluator signed and what the proofs show must agree."""
    from vrl.zk import Claim, check_claim, evaluate_private, evaluation_sampling

    public, key = commit_answers(_tasks(3))
    srs = zk.dev_srs(zk_workdir, ANSWER_MATCH.logrows)
    records, attachments, claim = evaluate_private(tiny, public, key, node, max_new_tokens=12, srs=srs,
                                                   workdir=zk_workdir, records_name="claim.vrl")
    assert [r.task_id for r in records] == [t.id for t in public]  # in order, every task once
    assert all(r.sampling.temperature == 0 for r in records)  # greedy: no draw to try again
    assert Claim.read(_written(tmp_path, claim)) == claim

    def checked(claim=claim, records=records, public=public):
        return check_claim(claim, records, attachments, tiny, public, [srs], zk_workdir, allow_dev=True)

    assert checked().ok
    inflated = dataclasses.replace(claim, correct=claim.correct + 1)
    assert any("the proofs show" in p for p in checked(claim=inflated.signed(node)).problems)
    assert checked(claim=inflated).unchecked == ("the claim's signature does not verify under its evaluator",)
    dropped = [r for r in records if r.task_id != public[1].id]  # a task left out
    assert any("not answered exactly once" in p for p in checked(records=dropped).problems)
    other = [*public[:2], Task(public[2].id, public[2].prompt, public[0].answer)]  # another task set
    assert any("task set" in u for u in checked(public=other).unchecked)
    reseeded = vrl.generate(tiny, TaskList("evaluation", tuple(public)), node, round_seed=bytes(32),
                            sampling=evaluation_sampling(tiny, 12), groups=3, group_size=1, score=key.scorer(SPEC),
                            ordered=True)
    assert any("round_seed_mismatch" in p for p in checked(records=reseeded).problems)
    sampled = vrl.generate(tiny, TaskList("evaluation", tuple(public)), node, round_seed=records[0].round_seed,
                           sampling=vrl.sampling_for(tiny, max_new_tokens=12), groups=3, group_size=1,
                           score=key.scorer(SPEC), ordered=True)  # drawn at temperature 1: a draw to re-roll
    assert any("sampling_params_mismatch" in p for p in checked(records=sampled).problems)


def _written(folder, claim) -> object:
    path = folder / "claim.vrl.claim.json"
    path.write_text(claim.to_json())
    return path


def test_the_cli_makes_and_checks_an_evaluation_claim(tmp_path, zk_workdir, monkeypatch):
    from vrl.rollouts.keys import NodeKey
    from vrl.zk import Claim

    monkeypatch.setenv("VRL_ZK_DIR", str(zk_workdir))
    public, key = commit_answers(_tasks(2))
    (tmp_path / "public.jsonl").write_text("".join(json.dumps({"id": t.id, "prompt": t.prompt, "answer": t.answer})
                                                   + "\n" for t in public))
    (tmp_path / "answers.jsonl").write_text(key.to_lines())
    assert runner.invoke(app, ["keygen", "--out", str(tmp_path / "node.pem")]).exit_code == 0
    base = ["evaluate", "--model", "tiny", "--task", str(tmp_path / "public.jsonl")]
    make = [*base, "--answers", str(tmp_path / "answers.jsonl"), "--key", str(tmp_path / "node.pem"),
            "--max-new-tokens", "12", "--dev-srs", "--out"]
    clobber = runner.invoke(app, [*make, str(tmp_path / "answers.jsonl")])  # would overwrite the key
    assert clobber.exit_code == 2 and "a claim's files are new files" in " ".join(clobber.output.split())
    result = runner.invoke(app, [*make, str(tmp_path / "claim.vrl")])
    assert result.exit_code == 0, result.output
    path = tmp_path / "claim.vrl.claim.json"
    result = runner.invoke(app, [*base, "--check", str(path), "--allow-dev-srs", "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["upheld"], result.output
    claim = Claim.read(path)
    more = dataclasses.replace(claim, correct=(claim.correct + 1) % (claim.total + 1))
    path.write_text(more.signed(NodeKey.load(tmp_path / "node.pem")).to_json())  # its evaluator says more
    result = runner.invoke(app, [*base, "--check", str(path), "--allow-dev-srs", "--json"])
    assert result.exit_code == 1 and not json.loads(result.output)["upheld"]
    path.write_text(more.to_json())  # someone else edits its number: the signature fails, no one is judged
    result = runner.invoke(app, [*base, "--check", str(path), "--allow-dev-srs"])
    assert result.exit_code == 2 and "cannot be judged" in " ".join(result.output.split())
    path.write_text("{}")
    result = runner.invoke(app, [*base, "--check", str(path)])
    assert result.exit_code == 2 and "not a vrl/evaluation-claim/v1 claim" in " ".join(result.output.split())


def test_the_audit_upholds_a_claim_and_convicts_only_the_signer_of_files_that_say_less(tiny, node, other_node,
                                                                                      zk_workdir, tmp_path):
    """specs/audit.md §3 `evaluation`: a claim file among the audit's inputs, checked without
    the answers; a claim whose files are not the ones it signs is judged against no one."""
    import vrl.audit
    from vrl.zk import evaluate_private, write_claim

    public, key = commit_answers(_tasks(2))
    task_file = tmp_path / "public.jsonl"
    task_file.write_text("".join(json.dumps({"id": t.id, "prompt": t.prompt, "answer": t.answer}) + "\n"
                                 for t in public))
    srs = zk.dev_srs(zk_workdir, ANSWER_MATCH.logrows)
    records, attachments, claim = evaluate_private(tiny, public, key, node, max_new_tokens=12, srs=srs,
                                                   workdir=zk_workdir, records_name="claim.vrl", model_locator="tiny",
                                                   task_file=str(task_file))
    path = write_claim(tmp_path / "claim.vrl", records, attachments, claim)

    def audited(claim) -> list:
        path.write_text(claim.to_json())
        with vrl.audit.open([path]) as audit:
            report = audit.run(checks=["evaluation"], srs=[srs], allow_dev_srs=True)
        return [f for f in report.findings if f.check == "evaluation"]

    assert audited(claim) == []
    inflated = dataclasses.replace(claim, correct=claim.correct + 1)
    (by_signer,) = audited(inflated.signed(node))  # its evaluator's word against its own proofs
    assert (by_signer.code, by_signer.severity.name, by_signer.subject) == ("claim_not_upheld", "ERROR",
                                                                           node.node_id.hex())
    (unsigned,) = audited(inflated)  # the evaluator's name on a claim it never signed: no one
    assert (unsigned.code, unsigned.subject) == ("claim_unchecked", "")
    companion_path(tmp_path / "claim.vrl").write_bytes(b"")  # someone empties the proofs beside it
    (swapped,) = audited(claim)
    assert ((swapped.code, swapped.subject) == ("claim_unchecked", "")
            and "not the file the claim signs" in swapped.sentence)
    (missing,) = audited(dataclasses.replace(claim, model="no-such-model").signed(node))
    assert missing.code == "claim_unchecked"


def test_answers_no_proof_can_hold_count_as_wrong_and_never_crash():
    from vrl.rollouts.verify import proven_answer
    from vrl.tasks.answers import answer_form, committed_reference

    assert proven_answer(SPEC, "counting 1,2,3,4,5,6,7,8,9,10,11,12,13,14") is None  # a form over 32 bytes
    assert proven_answer(SPEC, "no number here") is None
    assert proven_answer(SPEC, "so 42") == b"n:42"
    huge = "9" * 2200 + "." + "7" * 2200  # past Python's int-to-text digit limit
    assert answer_form(huge) == answer_form(huge) and answer_form(huge).startswith(b"n:x")
    for reference in ("ZK:" + "a" * 64, " zk:" + "a" * 64, "zk:" + "A" * 64, "zk:abc"):
        with pytest.raises(ValueError, match="committed reference"):
            committed_reference(reference)


def test_a_companion_file_that_is_not_a_regular_file_is_refused(tmp_path):
    import os

    fifo = tmp_path / "r.vrl.zk"
    os.mkfifo(fifo)
    with pytest.raises(ZkFileError, match="not a regular file"):
        read_attachments(fifo)


def test_commit_answers_never_writes_the_key_where_the_public_file_goes(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": t.id, "prompt": t.prompt, "answer": t.answer}) + "\n"
                             for t in _tasks(2)))
    same = tmp_path / "both.jsonl"
    result = runner.invoke(app, ["commit-answers", str(tasks), "--out", str(same), "--key", str(same)])
    assert result.exit_code == 2 and not same.exists()
    result = runner.invoke(app, ["commit-answers", str(tasks), "--out", str(tmp_path / "p.jsonl"), "--key",
                                 str(tmp_path / "k.jsonl")])
    assert result.exit_code == 0 and (tmp_path / "k.jsonl").stat().st_mode & 0o077 == 0


# -- hostile files: each reader raises only its own error, whatever the bytes --------------------------

_json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=80),
                            lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                        max_size=6), max_leaves=20)
_claim_like = st.fixed_dictionaries({"format": st.sampled_from(["vrl/evaluation-claim/v1", "x"])},
                                    optional={k: _json_values | st.text(alphabet="0123456789abcdef", max_size=130)
                                              for k in ("model_hash", "task_set", "tasks", "max_new_tokens", "correct",
                                                        "total", "evaluator", "records", "records_sha256",
                                                        "proofs_sha256", "model", "task_file", "signature")})


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=300), _claim_like.map(lambda d: json.dumps(d).encode()),
                 _json_values.map(lambda v: json.dumps(v).encode())))
def test_a_claim_file_of_any_bytes_loads_or_is_a_zk_file_error(tmp_path, data):
    from vrl.zk import Claim

    path = tmp_path / "c.claim.json"
    path.write_bytes(data)
    try:
        claim = Claim.read(path)
    except ZkFileError as error:
        assert "c.claim.json" in str(error)
        return
    assert Claim.read(_written(tmp_path, claim)) == claim


_key_line = st.one_of(st.text(max_size=120), st.fixed_dictionaries(
    {"id": _json_values, "form": _json_values, "salt": st.one_of(_json_values, st.text("0123456789abcdefABCDEF ",
                                                                                     max_size=40))}).map(json.dumps))


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_key_line, max_size=5))
def test_an_answer_key_of_any_lines_loads_or_is_a_zk_file_error_naming_the_file(tmp_path, lines):
    path = tmp_path / "key.jsonl"
    path.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass"))  # lone surrogates: not UTF-8
    try:
        key = AnswerKey.read(path)
    except ZkFileError as error:
        assert "key.jsonl" in str(error)
        return
    assert AnswerKey.read(_written_key(tmp_path, key)) == key


def _written_key(folder, key) -> object:
    path = folder / "again.jsonl"
    path.write_text(key.to_lines())
    return path


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=400))
def test_a_companion_file_of_any_bytes_loads_or_is_a_zk_file_error(tmp_path, data):
    path = tmp_path / "r.vrl.zk"
    path.write_bytes(data)
    try:
        read_attachments(path)
    except ZkFileError as error:
        assert "r.vrl.zk" in str(error)


@given(st.text(max_size=80))
def test_a_reference_is_ordinary_committed_or_a_value_error(reference):
    from vrl.tasks.answers import committed_reference

    try:
        committed = committed_reference(reference)
    except ValueError:
        return
    assert committed is None or len(committed) == 32


def test_an_answer_key_is_never_written_over_another(tmp_path):
    from vrl.zk import write_key

    _, key = commit_answers(_tasks(1))
    write_key(tmp_path / "k.jsonl", key)
    assert AnswerKey.read(tmp_path / "k.jsonl") == key and (tmp_path / "k.jsonl").stat().st_mode & 0o077 == 0
    with pytest.raises(ZkFileError, match="never overwritten"):
        write_key(tmp_path / "k.jsonl", commit_answers(_tasks(1))[1])
    assert AnswerKey.read(tmp_path / "k.jsonl") == key and [p.name for p in tmp_path.iterdir()] == ["k.jsonl"]
