"""Private training tasks in a network (specs/zk.md §11): workers and verifiers hold only the
public task file, whose references are commitments; a worker claims the public reward, a
verifier accepts it before any proof exists, the trainer proves each trained record's
correctness (one proof per distinct answer to a task), trains on what its proofs show and
binds them in its announcement; a verifier's replay on the proven rewards agrees bit for bit,
and a step whose proofs are missing, broken or renamed, or which trained on other rewards, is
a fault. The network of nodes doing all of this: tests/test_private_network.py."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import hashlib

import pytest
import torch
from support import QUICK, ROUND, TRAINER, WORKER

from p2p.loopback import LoopbackNetwork
from proofs import zk
from proofs.circuits import ANSWER_MATCH
from vrl.audit.replay import replay_step
from vrl.node.config import ConfigError, NodeConfig
from vrl.node.daemon import Node
from vrl.node.messages import Group, PolicyAnnouncement, StepFault
from vrl.node.work import PolicyTrainer, Work, WorkConfig
from vrl.rl.step import replay
from vrl.rl.train import TrainConfig
from vrl.rollouts.generate import iter_generate
from vrl.rollouts.model import Model, platform_tag
from vrl.rollouts.verify import Expectations, Reason, verify
from vrl.tasks import RewardSpec, TaskList, open_task_set
from vrl.tasks.answers import committed_reference
from vrl.zk import (
    AnswerKey,
    attachments_bytes,
    commit_answers,
    named_proofs,
    proof_plan,
    prove_statements,
    record_subject,
    step_rewards,
    training_rewards,
    write_key,
    write_task_file,
)

SPEC = RewardSpec()


@dataclasses.dataclass
class PrivateStep:
    key: AnswerKey
    public: TaskList
    trainer: PolicyTrainer
    work: Work
    groups: list[Group]
    statements: int  # distinct statements proven
    attachments: list[zk.Attachment]
    proofs: bytes  # the proofs file the announcement binds
    rewards: list[list[float]]  # what the step trained on
    announcement: PolicyAnnouncement
    parent: PolicyAnnouncement
    before: bytes
    after: bytes
    srs: zk.Srs
    workdir: object
    blobs: dict[bytes, bytes]
    base: object  # the quickly taught base model's directory


def announce(trainer: PolicyTrainer, step, parent: PolicyAnnouncement | None, proofs: bytes = b""):
    return PolicyAnnouncement(
        TRAINER.node_id, trainer.version, step.model.model_hash, hashlib.sha256(step.blob).digest(), len(step.blob),
        parent=parent.model_hash if parent else b"", batch=step.batch, config=trainer.step_config.hash,
        optimizer_before=step.optimizer_before, optimizer=hashlib.sha256(step.optimizer).digest(),
        optimizer_size=len(step.optimizer), platform=platform_tag(step.model),
        proofs=hashlib.sha256(proofs).digest() if proofs else b"", proofs_size=len(proofs)).signed(TRAINER)


@pytest.fixture(scope="module")
def one_thread():
    """A CPU at one thread: the platform held to the bits, as a node runs by default."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def private(tmp_path_factory, zk_workdir, one_thread, quick_base) -> PrivateStep:
    root = tmp_path_factory.mktemp("private")
    base = quick_base
    arithmetic, _ = open_task_set(QUICK.tasks)
    public_tasks, key = commit_answers(arithmetic.task(i) for i in range(96))
    public = TaskList("private", tuple(public_tasks))
    config = TrainConfig(model=str(base), task=QUICK.tasks, group_size=4, groups_per_step=4, max_new_tokens=4,
                         learning_rate=1e-3, warmup_steps=1, held_out=8, eval_every=1000, steps=10,
                         checkpoint_every=1)
    # The trainer scores its own held-out evaluation with the answers its key opens.
    trainer = PolicyTrainer(config, root / "trainer", TRAINER, TaskList("opened", tuple(key.opened(public_tasks))))
    work = Work(WORKER, WorkConfig(hidden_states=False, model=str(base), task="private.jsonl", group_size=4,
                                   max_new_tokens=4, tasks=public, groups_per_round=4),
                expectations=lambda version: Expectations(tasks=public, round_seed=ROUND, sampling=work.sampling,
                                                          correctness_later=True))
    v0 = trainer.current()
    a0 = announce(trainer, v0, None)
    work.install(0, trainer.frozen_copy(v0.model), keep=4)
    # Two groups of four: enough for what the tests assert (an answer given twice, so one proof
    # serves two records; a group whose rewards differ; a right answer), and each distinct answer
    # is an answer-match proof of 22 CPU-seconds here.
    groups = [Group.of(g) for g in iter_generate(v0.model, public, WORKER, round_seed=ROUND, sampling=work.sampling,
                                                 groups=2, group_size=4, policy_version=0)]
    decode = work.skeleton.decode
    srs = zk.dev_srs(zk_workdir, ANSWER_MATCH.logrows)
    records = [list(g.rollouts) for g in groups]
    statements, named = proof_plan([r for g in records for r in g], key, decode)
    attachments = named_proofs(prove_statements(statements, srs, zk_workdir), named)
    rewards, failures = training_rewards(records, attachments, decode, [srs], zk_workdir, allow_dev=True)
    assert failures == {}
    proofs = attachments_bytes(attachments)
    before = v0.optimizer
    v1, refused = trainer.step(groups, [1.0] * len(groups), screen=work.check, rewards=rewards,
                               proofs=(hashlib.sha256(proofs).digest(), len(proofs)))
    assert refused == {}, "the trainer's own pass failed an honest group"
    work.install(1, trainer.frozen_copy(v1.model), keep=4)
    files = (v0.blob, v1.blob, v0.optimizer, v1.optimizer, trainer.config_file, proofs)
    return PrivateStep(key, public, trainer, work, groups, len(statements), attachments, proofs, rewards,
                       announce(trainer, v1, a0, proofs), a0, before, v1.optimizer, srs, zk_workdir,
                       {hashlib.sha256(f).digest(): f for f in files}, base)


def checked_rewards(private: PrivateStep, proofs: bytes, groups: list[Group] | None = None):
    groups = private.groups if groups is None else groups
    return step_rewards([list(g.rollouts) for g in groups], proofs, private.work.skeleton.decode, [private.srs],
                        private.workdir, allow_dev=True)


def test_a_worker_claims_the_public_reward_and_a_verifier_accepts_it_before_any_proof(private):
    records = [r for g in private.groups for r in g.rollouts]
    assert all(committed_reference(r.reference) for r in records)
    assert all(r.reward == SPEC.reward_given(False, private.work.skeleton.decode(list(r.completion_tokens)))
               for r in records)
    later = Expectations(tasks=private.public, round_seed=ROUND, sampling=private.work.sampling, correctness_later=True)
    assert all(v.accepted for v in verify(records, private.work.models[0], expect=later))
    # A worker that claims correctness it cannot know is caught at once; a verifier outside
    # a private network, with no proof, takes no reward of a committed reference on trust.
    group = list(private.groups[0].rollouts)
    inflated = [group[0].signed(WORKER, reward=1.0), *group[1:]]
    assert verify(inflated, private.work.models[0], expect=later)[0].reason == Reason.REWARD_MISMATCH
    now = dataclasses.replace(later, correctness_later=False)
    assert verify(inflated, private.work.models[0], expect=now)[0].reason == Reason.REWARD_UNPROVEN


def test_one_proof_serves_every_record_that_gives_its_answer_to_its_task(private):
    records = [r for g in private.groups for r in g.rollouts]
    decode = private.work.skeleton.decode
    answered = [r for r in records if SPEC.given_form(decode(list(r.completion_tokens)))]
    assert len(private.attachments) == len(answered) > 0
    assert [a.subject for a in private.attachments] == [record_subject(r) for r in answered]
    distinct = {(r.task_id, SPEC.given_form(decode(list(r.completion_tokens)))) for r in answered}
    assert private.statements == len(distinct) < len(answered), "no answer repeated: nothing shared a proof"


def test_the_proofs_show_what_the_answer_key_scores(private):
    """The trainer's rewards from its proofs are its key's, and the tasks it opens for its own
    evaluation score each completion alike."""
    decode = private.work.skeleton.decode
    opened = {t.id: t for t in private.key.opened(private.public.tasks)}
    by_key = private.key.scorer(SPEC)
    for group, row in zip(private.groups, private.rewards):
        for record, reward in zip(group.rollouts, row):
            text = decode(list(record.completion_tokens))
            assert reward == by_key(record.task, text) == SPEC.reward(opened[record.task_id], text)
    assert any(len(set(row)) > 1 for row in private.rewards), "no group to learn from: the step changed nothing"
    assert any(r == 1.0 for row in private.rewards for r in row)


def test_a_verifier_replays_the_private_step_bit_for_bit_on_the_proven_rewards(private):
    rewards, fault = checked_rewards(private, private.proofs)
    assert (rewards, fault) == (private.rewards, None)
    faults, replayed, drift = private.work.replay(private.announcement, private.trainer.config_file, private.before,
                                                  private.after, private.groups, rewards)
    assert (faults, replayed, drift) == ((), private.announcement.model_hash, 0.0)
    # On the records' own (public) rewards, the same step is not what was trained.
    faults, _, _ = private.work.replay(private.announcement, private.trainer.config_file, private.before,
                                       private.after, private.groups)
    assert StepFault.WEIGHTS_MISMATCH in faults


def test_missing_broken_or_renamed_proofs_are_a_fault(private):
    _, fault = checked_rewards(private, b"")
    assert fault == "zk_missing"
    _, fault = checked_rewards(private, private.proofs[:-7])
    assert fault == "proofs_malformed"
    # A proof named to a record that gives another answer does not show that record's statement.
    first, other = private.attachments[0], next(
        a for a in private.attachments if a.instances[0] != private.attachments[0].instances[0])
    swapped = [dataclasses.replace(first, subject=other.subject), *private.attachments]
    _, fault = checked_rewards(private, attachments_bytes(swapped))
    assert fault == zk.Reason.WRONG_INSTANCES.value
    # Dev proofs are refused where the network's SRS is a public one.
    rewards, failures = training_rewards([list(g.rollouts) for g in private.groups], private.attachments,
                                         private.work.skeleton.decode, [private.srs], private.workdir)
    assert set(failures.values()) == {zk.Reason.DEV_SRS.value}
    assert all(r == 0.0 for row in rewards for r in row)  # unproven: scored not correct


def test_a_proofs_file_of_any_bytes_is_a_verdict_never_an_exception(private):
    """The file comes from the network (bounded by max_proofs_bytes before it is fetched)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from vrl.zk import max_proofs_bytes

    records = sum(len(g.rollouts) for g in private.groups)
    assert len(private.proofs) <= max_proofs_bytes(records)  # an honest file always fits

    @settings(max_examples=200, deadline=None)
    @given(st.binary(max_size=2048) | st.builds(lambda cut: private.proofs[:cut], st.integers(0, len(private.proofs))))
    def any_bytes(data):
        rewards, fault = checked_rewards(private, data)
        assert [len(row) for row in rewards] == [len(g.rollouts) for g in private.groups]
        assert fault is not None or data == private.proofs

    any_bytes()


def test_training_on_rewards_the_proofs_do_not_show_is_a_weights_fault(private):
    """The trainer-inflated-rewards cheat: honest proofs, every answer trained as correct."""
    decode = private.work.skeleton.decode
    inflated = [[SPEC.reward_given(bool(SPEC.given_form(decode(list(r.completion_tokens)))), "")
                 for r in g.rollouts] for g in private.groups]
    assert inflated != private.rewards
    network, _, _ = replay(private.work.models[0].network, private.before, [list(g.rollouts) for g in private.groups],
                           [1.0] * len(private.groups), private.trainer.step_config, 0,
                           private.work.skeleton.tokenizer.pad_token_id, rewards=inflated)
    honest = private.work.models[1]
    private.work.install(1, Model("claimed", copy.deepcopy(network).eval(), honest.tokenizer, "float32"), 4)
    try:
        rewards, fault = checked_rewards(private, private.proofs)
        assert fault is None  # its proofs are honest ...
        faults, _, _ = private.work.replay(private.announcement, private.trainer.config_file, private.before,
                                           private.after, private.groups, rewards)
        assert StepFault.WEIGHTS_MISMATCH in faults  # ... its step is not
    finally:
        private.work.install(1, honest, 4)


def test_the_audit_replays_a_private_step_from_its_files_and_proofs(private):
    def rewards(groups, proofs):
        return checked_rewards(private, proofs, groups)

    by_digest = {g.digest: g for g in private.groups}
    check = replay_step(private.announcement, private.parent, blob=private.blobs.get, group=by_digest.get,
                        base=private.work.skeleton, rewards=rewards)
    assert check.ok and check.exact, check.sentence()
    unproven = dataclasses.replace(private.announcement, proofs=b"", proofs_size=0).signed(TRAINER)
    check = replay_step(unproven, private.parent, blob=private.blobs.get, group=by_digest.get,
                        base=private.work.skeleton, rewards=rewards)
    assert StepFault.REWARD_UNPROVEN in check.faults

    # An auditor without the SRS the network used cannot judge the step: that is its own gap.
    def without_the_dev_srs(groups, proofs):
        return step_rewards([list(g.rollouts) for g in groups], proofs, private.work.skeleton.decode,
                            [private.srs], private.workdir, allow_dev=False)

    check = replay_step(private.announcement, private.parent, blob=private.blobs.get, group=by_digest.get,
                        base=private.work.skeleton, rewards=without_the_dev_srs)
    assert check.faults == () and "zk_dev_srs" in check.missing[0]


def test_a_restarted_trainer_announces_the_same_proofs(private, tmp_path):
    restored = PolicyTrainer(private.trainer.trainer.config, private.trainer.trainer.run_dir, TRAINER,
                             TaskList("opened", tuple(private.key.opened(private.public.tasks))))
    step = restored.current()
    assert step.proofs == (hashlib.sha256(private.proofs).digest(), len(private.proofs))


# -- a node's settings ------------------------------------------------------------------------------

def _node(tmp_path, roles, task, **zk_table):
    config = NodeConfig(data_dir=str(tmp_path / "-".join(roles)), trainer=TRAINER.node_id.hex(), transport="loopback",
                        roles=roles, work={"model": "tiny", "task": str(task), "group_size": 2},
                        train={"held_out": 1}, zk=zk_table)
    return Node(config, LoopbackNetwork(seed=1).transport(TRAINER.private_seed()), TRAINER)


def test_a_private_task_sets_settings_are_checked_at_the_boundary(tmp_path, zk_workdir, monkeypatch):
    monkeypatch.setenv("VRL_ZK_DIR", str(zk_workdir))
    arithmetic, _ = open_task_set("arithmetic:digits=1")
    public, key = commit_answers(arithmetic.task(i) for i in range(40))
    write_task_file(tmp_path / "public.jsonl", public)
    write_key(tmp_path / "key.jsonl", key)
    with pytest.raises(ConfigError, match="srs"):
        _node(tmp_path, ("verifier",), tmp_path / "public.jsonl")
    with pytest.raises(ConfigError, match="answers"):
        _node(tmp_path, ("trainer",), tmp_path / "public.jsonl", dev_srs=True)
    with pytest.raises(ConfigError, match="only the trainer holds the answer key"):
        _node(tmp_path, ("verifier",), tmp_path / "public.jsonl", dev_srs=True, answers=str(tmp_path / "key.jsonl"))
    with pytest.raises(ConfigError, match="no committed reference"):
        _node(tmp_path, ("trainer",), "arithmetic:digits=1", dev_srs=True, answers=str(tmp_path / "key.jsonl"))
    other_public, other_key = commit_answers(arithmetic.task(i) for i in range(40))
    write_key(tmp_path / "other.jsonl", other_key)
    with pytest.raises(ConfigError, match="does not open"):
        _node(tmp_path, ("trainer",), tmp_path / "public.jsonl", dev_srs=True, answers=str(tmp_path / "other.jsonl"))
    trainer = _node(tmp_path, ("trainer",), tmp_path / "public.jsonl", dev_srs=True,
                    answers=str(tmp_path / "key.jsonl"))
    assert trainer.private and trainer.answer_key is not None
    asyncio.run(trainer.transport.close())


def test_vrl_devnet_takes_a_private_task_set_only_with_the_networks_srs(tmp_path):
    from typer.testing import CliRunner

    from vrl.cli import app

    runner = CliRunner()
    base = ["devnet", "--model", "tiny", "--task", str(tmp_path / "public.jsonl"), "--dir", str(tmp_path / "d")]
    result = runner.invoke(app, [*base, "--answers", str(tmp_path / "key.jsonl")])
    assert result.exit_code == 2 and "--dev-srs" in result.output
    result = runner.invoke(app, [*base, "--dev-srs"])
    assert result.exit_code == 2 and "--answers" in result.output
    assert not (tmp_path / "d").exists()  # refused before any node was planned
