"""Private-answer rewards end to end (specs/zk.md §7, §8): a task set published with its
references as commitments, rollouts rewarded from the private key, their correctness proven,
and a verifier that never sees the answers accepting exactly the honest rewards."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

import vrl
from proofs import zk
from proofs.circuits import ANSWER_MATCH
from vrl.cli import app
from vrl.rollouts.verify import Expectations, verify
from vrl.tasks import RewardSpec, Task, TaskList, is_held_out
from vrl.zk import (
    AnswerKey, ZkFileError, commit_answers, companion_path, proven_correctness, prove_rewards, read_attachments,
    record_subject, write_attachments,
)

from tests.conftest import ROUND, TASKS

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
    refused = runner.invoke(app, ["generate", *base, "--key", str(keyfile), "--out", str(rollouts)])
    assert refused.exit_code == 2 and "--answers" in refused.output
    result = runner.invoke(app, ["generate", *base, "--key", str(keyfile), "--out", str(rollouts), "--groups", "1",
                                 "--group-size", "2", "--max-new-tokens", "12", "--answers",
                                 str(tmp_path / "answers.jsonl"), "--json"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["prove", str(rollouts), "--model", "tiny", "--answers", str(tmp_path / "answers.jsonl"),
                                 "--dev-srs", "--json"])
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
