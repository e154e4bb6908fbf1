"""Training steps replayed for real (specs/training.md §4): a node's trainer takes a GRPO step
on real groups, its own forward pass checking them first (specs/network.md §5.4), and a
verifier's replay of it agrees bit for bit; each way a trainer can lie about a step (another
learning rate, a dropped or a foreign group, weights no step made, an optimizer state it did not
reach) is a fault."""

from __future__ import annotations

import copy
import dataclasses
import hashlib

import pytest
import torch
from support import QUICK, ROUND, STRANGER, TRAINER, WORKER

from vrl.node.messages import Group, PolicyAnnouncement, StepFault
from vrl.node.work import PolicyTrainer, Work, WorkConfig, judge_step, tampered
from vrl.rl.step import StepConfig, optimizer_bytes, replay
from vrl.rl.train import TrainConfig
from vrl.rollouts.generate import iter_generate
from vrl.rollouts.keys import NodeKey
from vrl.rollouts.model import Model, platform_tag
from vrl.rollouts.verify import Expectations
from vrl.tasks import open_task_set


@dataclasses.dataclass
class Step:
    trainer: PolicyTrainer
    work: Work
    groups: list[Group]
    foreign: Group
    announcement: PolicyAnnouncement
    before: bytes  # the optimizer file the step started from
    after: bytes
    parent: PolicyAnnouncement
    blobs: dict[bytes, bytes]  # every file either announcement names, by SHA-256


def announce(trainer: PolicyTrainer, step, parent: PolicyAnnouncement | None) -> PolicyAnnouncement:
    return PolicyAnnouncement(
        TRAINER.node_id, trainer.version, step.model.model_hash, hashlib.sha256(step.blob).digest(), len(step.blob),
        parent=parent.model_hash if parent else b"", batch=step.batch, config=trainer.step_config.hash,
        optimizer_before=step.optimizer_before, optimizer=hashlib.sha256(step.optimizer).digest(),
        optimizer_size=len(step.optimizer), platform=platform_tag(step.model)).signed(TRAINER)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The trainer's and the verifiers' platform: a CPU at one thread, the one held to the bits
    (vrl.rollouts.model.bit_exact_platform), as a node runs by default (torch_threads = 1)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def step(tmp_path_factory, one_thread, quick_base) -> Step:
    root = tmp_path_factory.mktemp("replay")
    base = quick_base
    config = TrainConfig(model=str(base), task=QUICK.tasks, group_size=4, groups_per_step=8, max_new_tokens=4,
                         learning_rate=1e-3, warmup_steps=1, held_out=8, eval_every=1000, steps=10,
                         checkpoint_every=1)
    trainer = PolicyTrainer(config, root / "trainer", TRAINER)
    tasks, _ = open_task_set(QUICK.tasks)
    work = Work(WORKER, WorkConfig(hidden_states=False, model=str(base), task=QUICK.tasks, group_size=4,
                                   max_new_tokens=4, tasks=tasks, groups_per_round=8),
                expectations=lambda version: Expectations(tasks=tasks, round_seed=ROUND, sampling=work.sampling))
    v0 = trainer.current()
    a0 = announce(trainer, v0, None)
    work.install(0, trainer.frozen_copy(v0.model), keep=4)

    def sample(key: NodeKey, seed: bytes, count: int) -> list[Group]:
        return [Group.of(g) for g in iter_generate(v0.model, tasks, key, round_seed=seed, sampling=work.sampling,
                                                   groups=count, group_size=4, policy_version=0)]

    groups = sample(WORKER, ROUND, 8)
    assert any(informative(g) for g in groups), "no informative group to learn from"
    # A foreign group of equal rewards has no gradient and changes nothing: one with a gradient.
    foreign = next(g for g in sample(STRANGER, b"\x01" * 32, 8) if informative(g))
    before = v0.optimizer
    v1, refused = trainer.step(groups, [1.0] * len(groups), screen=work.check)  # its pass, reused by the step
    assert refused == {}, "the trainer's own pass failed an honest group"
    work.install(1, trainer.frozen_copy(v1.model), keep=4)
    files = (v0.blob, v1.blob, v0.optimizer, v1.optimizer, trainer.config_file)
    return Step(trainer, work, groups, foreign, announce(trainer, v1, a0), before, v1.optimizer, a0,
                {hashlib.sha256(f).digest(): f for f in files})


def informative(group: Group) -> bool:
    return len({r.reward for r in group.rollouts}) > 1


def claim(step: Step, network: torch.nn.Module) -> None:
    """What the trainer published as version 1: these weights."""
    step.work.install(1, Model("claimed", copy.deepcopy(network).eval(), step.work.skeleton.tokenizer, "float32"), 4)


def replayed_by_a_verifier(step: Step, *, after: bytes | None = None, groups: list[Group] | None = None):
    return step.work.replay(step.announcement, step.trainer.config_file, step.before,
                            step.after if after is None else after, step.groups if groups is None else groups)


def dishonest(step: Step, *, config: StepConfig | None = None, groups: list[Group] | None = None) -> torch.nn.Module:
    """Weights from a step other than the announced one, from the same parent and state."""
    groups = step.groups if groups is None else groups
    network, _, _ = replay(step.work.models[0].network, step.before, [list(g.rollouts) for g in groups],
                           [1.0] * len(groups), config or step.trainer.step_config, 0,
                           step.work.skeleton.tokenizer.pad_token_id)
    return network


def test_an_honest_step_replays_bit_for_bit_on_the_same_platform(step):
    assert step.announcement.platform == platform_tag(step.work.models[0])
    faults, replayed, drift = replayed_by_a_verifier(step)
    assert (faults, replayed, drift) == ((), step.announcement.model_hash, 0.0)


def test_every_dishonest_step_is_a_weights_fault(step):
    learned_from = [g for g in step.groups if informative(g)]
    honest = step.work.models[1]
    lies = {
        "learning rate 2x": dishonest(step, config=dataclasses.replace(step.trainer.step_config, learning_rate=2e-3)),
        "an admitted group dropped": dishonest(step, groups=[g for g in step.groups if g is not learned_from[0]]),
        "a foreign group added": dishonest(step, groups=[*step.groups, step.foreign]),
        "weights no step made": _perturbed(honest.network, 1e-4),
        "no step at all": step.work.models[0].network,
    }
    try:
        for name, network in lies.items():
            claim(step, network)
            faults, replayed, _ = replayed_by_a_verifier(step)
            assert StepFault.WEIGHTS_MISMATCH in faults, name
            assert replayed == step.announcement.model_hash, name  # the replay itself is the honest step
    finally:
        step.work.install(1, honest, 4)


def test_an_optimizer_state_the_step_did_not_reach_is_an_optimizer_fault(step):
    network = copy.deepcopy(step.work.models[1].network).requires_grad_(True)
    optimizer = torch.optim.AdamW(network.parameters())
    network(torch.tensor([[1, 2]])).logits.sum().backward()
    optimizer.step()
    faults, _, _ = replayed_by_a_verifier(step, after=optimizer_bytes(network, optimizer))
    assert faults == (StepFault.OPTIMIZER_MISMATCH,)


def test_a_config_file_that_does_not_decode_is_a_config_fault(step):
    faults, _, _ = step.work.replay(step.announcement, b"\x80not a config", step.before, step.after, step.groups)
    assert faults == (StepFault.WRONG_CONFIG,)


def test_a_trainer_restarted_between_checkpoint_and_announcement_announces_the_same_step(step, tmp_path):
    restarted = PolicyTrainer(step.trainer.trainer.config, step.trainer.trainer.run_dir, TRAINER)
    again = restarted.current()
    assert restarted.version == 1 and again.model.model_hash == step.announcement.model_hash
    assert again.batch == step.announcement.batch and again.optimizer == step.after
    assert again.optimizer_before == step.announcement.optimizer_before


def _perturbed(network: torch.nn.Module, scale: float) -> torch.nn.Module:
    copied = copy.deepcopy(network)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for tensor in copied.parameters():
            tensor.mul_(1 + scale * torch.randn(tensor.shape, generator=generator))
    return copied


def test_the_audit_replays_a_step_from_its_files_alone(step):
    """vrl.audit.replay_step: the files by hash, the groups by digest, nothing else held."""
    from vrl.audit.replay import replay_step

    groups = {g.digest: g for g in step.groups}
    check = replay_step(step.announcement, step.parent, blob=step.blobs.get, group=groups.get,
                        base=step.work.skeleton)
    assert check.ok and check.exact and check.same_platform and check.drift == 0.0, check
    assert "bit for bit" in check.sentence()
    lost = {k: v for k, v in step.blobs.items() if k != step.announcement.optimizer}
    check = replay_step(step.announcement, step.parent, blob=lost.get, group=groups.get, base=step.work.skeleton)
    assert not check.replayed and check.missing == (
        f"optimizer state of version 1 {step.announcement.optimizer.hex()[:16]}",)
    forged = dataclasses.replace(step.announcement, parent=b"\x00" * 32)
    check = replay_step(forged, step.parent, blob=step.blobs.get, group=groups.get, base=step.work.skeleton)
    assert check.faults == (StepFault.WRONG_PARENT,)


def test_the_audit_finds_weights_no_step_made(step):
    from vrl.audit.replay import replay_step
    from vrl.node.weights import to_blob

    fake = Model("fake", _perturbed(step.work.models[1].network, 1e-4), step.work.skeleton.tokenizer, "float32")
    blob = to_blob(fake)
    announcement = dataclasses.replace(step.announcement, model_hash=fake.model_hash,
                                       blob=hashlib.sha256(blob).digest(), size=len(blob))
    blobs = {**step.blobs, announcement.blob: blob}
    check = replay_step(announcement, step.parent, blob=blobs.get, group={g.digest: g for g in step.groups}.get,
                        base=step.work.skeleton)
    assert (check.faults == (StepFault.WEIGHTS_MISMATCH,) and check.drift > 0
            and "not what its step makes" in check.sentence())


def test_only_a_cpu_at_one_thread_is_held_to_the_bits(step):
    """specs/training.md §4: at two threads one step computed twice differed (bench/replay.py),
    so an equal platform at two threads is judged by the tolerance, and a mismatch there is not
    self-evident."""
    from vrl.rollouts.model import bit_exact_platform

    tag = step.announcement.platform
    assert bit_exact_platform(tag) == tag.endswith("/threads-1")
    assert bit_exact_platform("torch-2.13.0+cpu/cpu-AVX2/float32/sdpa/threads-1")
    assert not bit_exact_platform("torch-2.13.0+cpu/cpu-AVX2/float32/sdpa/threads-2")
    assert not bit_exact_platform("torch-2.13.0+cpu/cuda-12.4/NVIDIA H100/float32/sdpa/threads-1")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        two = dataclasses.replace(step.announcement, platform=platform_tag(step.work.models[0]))
        honest = step.work.models[1]
        claim(step, _perturbed(honest.network, 1e-7))  # an honest run's few ulps of difference
        faults, _, drift = step.work.replay(two, step.trainer.config_file, step.before, step.after, step.groups)
        assert 0 < drift < 1e-3 and faults == (), (faults, drift)
    finally:
        torch.set_num_threads(before)
        step.work.install(1, honest, 4)


def test_the_trainers_own_pass_refuses_a_changed_group_and_the_rest_replays_bit_for_bit(step, tmp_path):
    """specs/network.md §5.4: a group with one token changed (its commitment rebuilt honestly,
    so only its seeded race shows it) is refused by the pass GRPO runs anyway; the step then
    runs on the rest, which a verifier's replay reproduces to the bit."""
    trainer = PolicyTrainer(step.trainer.trainer.config, tmp_path / "trainer", TRAINER)
    parent = trainer.current()
    victim = next(i for i, g in enumerate(step.groups) if informative(g))
    changed = Group.of([tampered(step.groups[victim].rollouts[0], parent.model, WORKER),
                        *step.groups[victim].rollouts[1:]])
    batch = [*step.groups[:victim], changed, *step.groups[victim + 1:]]
    # Admission's weights, mean 1 over the batch (specs/reputation.md §6), the changed group's the largest
    raw = [2.0 if g is changed else 1.0 + 0.25 * (i % 3) for i, g in enumerate(batch)]
    weights = [w * len(raw) / sum(raw) for w in raw]
    made, refused = trainer.step(batch, weights, screen=step.work.check)
    assert list(refused) == [changed.digest]
    assert "sampling_mismatch" in refused[changed.digest].reasons
    assert refused[changed.digest].race_tokens > 0 and refused[changed.digest].races_lost >= 1
    kept = [g for g in batch if g is not changed]
    assert [d for d, _ in made.batch] == [g.digest for g in kept] and made.metrics["groups_refused"] == 1
    # The weights kept are scaled back to mean 1 (the audit's "weights" rule), their ratios unchanged.
    trained = [w for _, w in made.batch]
    assert abs(sum(trained) / len(trained) - 1) < 1e-12
    assert trained == pytest.approx([w * trained[0] / weights[0] for g, w in zip(batch, weights) if g is not changed])
    judged = judge_step(announce(trainer, made, step.parent), step.work.models[0], made.model, trainer.config_file,
                        parent.optimizer, made.optimizer, kept, step.work.skeleton)
    assert judged.same_platform and judged.faults == () and judged.replay.exact


def test_a_batch_the_trainers_pass_refuses_entirely_is_no_step(step, tmp_path):
    trainer = PolicyTrainer(step.trainer.trainer.config, tmp_path / "trainer", TRAINER)
    group = next(g for g in step.groups if informative(g))
    changed = Group.of([tampered(group.rollouts[0], trainer.current().model, WORKER), *group.rollouts[1:]])
    made, refused = trainer.step([changed], [1.0], screen=step.work.check)
    assert made is None and list(refused) == [changed.digest] and trainer.version == 0


def test_a_changed_group_of_an_older_version_is_refused_by_a_prefill_of_that_version(step, tmp_path):
    """The step's own pass runs the current weights; a group sampled by the version before is
    checked by a prefill of that version's weights, which the node holds (max_staleness)."""
    trainer = PolicyTrainer(step.trainer.trainer.config, tmp_path / "trainer", TRAINER)
    trainer.step(step.groups, [1.0] * len(step.groups), screen=step.work.check)
    assert trainer.version == 1
    old = next(g for g in step.groups if informative(g))
    changed = Group.of([tampered(old.rollouts[0], step.work.models[0], WORKER), *old.rollouts[1:]])
    made, refused = trainer.step([changed, *(g for g in step.groups if g is not old)], [1.0] * len(step.groups),
                                 screen=step.work.check)
    assert list(refused) == [changed.digest] and changed.digest not in {d for d, _ in made.batch}
    assert made.metrics["groups_screened"] == sum(informative(g) for g in step.groups)
