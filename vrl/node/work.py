"""The model-side work a node's protocol asks for: generate, check, plant, train.

Everything here is synchronous torch code, run by the daemon on one worker thread so the
network loop stays responsive. This is the honest work; the cheats devnets put verifiers to
the test with are :class:`vrl.harness.adversary.CheatingWork`, a subclass, chosen by the node's
``adversary`` setting at the top of the stack (``vrl node``), never here.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import hashlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple, TypeVar, TypeVarTuple

import torch

from proofs.sampling_params import SamplingParams
from proofs.zk import Srs
from vrl.node.messages import Batch, Group, PolicyAnnouncement, StepFault, Submission, recomputed_digest
from vrl.node.metrics import NodeMetrics
from vrl.node.weights import from_blob, to_blob
from vrl.rl.config import TrainConfig
from vrl.rl.export import load_model
from vrl.rl.grpo import informative_groups
from vrl.rl.step import (
    PolicyForward,
    StepConfig,
    StepError,
    StepReplay,
    compare,
    optimizer_bytes,
    policy_forward,
    replay,
)
from vrl.rl.train import Trainer
from vrl.rollouts.config import GenerationConfig
from vrl.rollouts.forward import decode
from vrl.rollouts.generate import Decoder, choose_max_new_tokens, iter_generate
from vrl.rollouts.keys import NodeKey
from vrl.rollouts.model import Model, bit_exact_platform, platform_tag
from vrl.rollouts.record import Rollout, round_seed
from vrl.rollouts.verify import Expectations, commit, verify
from vrl.tasks import RewardSpec, TaskSet
from vrl.zk import record_subject
from vrl.zk.sampling import (
    Check,
    SamplingProofError,
    check_openings,
    openings_from_bytes,
)

# The trainer's throw-away identity for a planted group is derived from its own signature over
# the round, so no one else can predict or claim it (specs/network.md §5.3).
CANARY_DOMAIN = b"vrl/canary/v1\x00"

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class ModelThread:
    """The one thread a node's model work runs on, off the event loop; each job's seconds
    are observed by kind (``metrics.step_seconds``, from submission to result, and
    ``metrics.work_seconds`` / ``work_cpu_seconds``, what it ran)."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self.metrics = metrics
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="vrl-model")

    async def run(self, kind: str, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        started = time.perf_counter()
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, self._timed, kind, fn, args)
        finally:
            self.metrics.step_seconds.labels(kind).observe(time.perf_counter() - started)

    def _timed(self, kind: str, fn: Callable[[*Ts], T], args: tuple[*Ts]) -> T:
        """On the model thread: ``fn(*args)``, its seconds counted without the queueing that
        ``step_seconds`` includes (what a job costs, not how long it waited): wall seconds, and
        this thread's CPU seconds, which torch's work is on (``torch_threads`` 1, the default)."""
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return fn(*args)
        finally:
            self.metrics.work_seconds.labels(kind).inc(time.perf_counter() - wall)
            self.metrics.work_cpu_seconds.labels(kind).inc(time.thread_time() - cpu)

    def shutdown(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)


class CheckResult(NamedTuple):
    """What checking a group found: the rejection codes of its failed records (empty when every
    record passed), the recomputed commitment digest, and the sequential test's evidence: the
    seeded races replayed and how many the claimed token lost (vrl.rollouts.sequential)."""

    reasons: tuple[str, ...]
    digest: bytes
    race_tokens: int = 0
    races_lost: int = 0


# What checks a group of a policy version: from a pass of that policy over it when one is given
# (Work.check), else by a prefill of its own; None where it leaves the group unchecked.
Screen = Callable[[Group, int, PolicyForward | None], CheckResult | None]


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkConfig(GenerationConfig):
    """What :class:`Work` is given: the node's ``[work]`` table (a :class:`GenerationConfig`,
    whose defaults are the ones), the task set it names, opened once by the node, and the
    network's ``groups_per_round`` (the ``[protocol]`` table's)."""

    tasks: TaskSet
    groups_per_round: int
    # Commit each sampled token's hidden state and keep the rows: the node's [zk] hidden_states
    # (its default is that table's), specs/zk.md §10; Work.rows holds them until written down.
    hidden_states: bool


class Work:
    """The models a node holds (one per policy version it needs) and what it does with them."""

    cheat = ""  # the vrl.node.config.ADVERSARIES entry this work carries out; honest work none

    def __init__(self, key: NodeKey, config: WorkConfig, expectations: Callable[[int], Expectations]) -> None:
        self.key, self.config = key, config
        self.skeleton = load_model(config.model, dtype="float32", device=config.device)
        # The canonical sampler with the model's own stop tokens (specs/sampler.md); no top-k/p.
        # max_new_tokens 0: the task set's default, chosen alike on every node (the same model
        # and tasks); what it was is said by the node (vrl.node.daemon).
        self.max_new_tokens, self.max_new_tokens_why = choose_max_new_tokens(self.skeleton, config.tasks,
                                                                             config.max_new_tokens)
        self.sampling = SamplingParams(config.temperature, 0, 1.0, self.max_new_tokens,
                                       self.skeleton.stop_token_ids)
        self.models: dict[int, Model] = {}
        self.expectations = expectations
        # With hidden_states: each new record's rows (record digest -> float32 rows), until the
        # node takes them (take_rows).
        self.rows: dict[bytes, tuple[Rollout, torch.Tensor]] = {}

    # -- policy versions ----------------------------------------------------------------------
    def load(self, announcement: PolicyAnnouncement, blob: bytes, keep: int) -> Model:
        model = from_blob(self.skeleton, blob, blob_hash=announcement.blob, model_hash=announcement.model_hash,
                          name=f"policy@{announcement.version}")
        self.install(announcement.version, model, keep)
        return model

    def install(self, version: int, model: Model, keep: int) -> None:
        self.models[version] = model
        for old in sorted(self.models)[:-keep]:
            del self.models[old]

    # -- worker -------------------------------------------------------------------------------
    def generate(self, version: int) -> list[Group]:
        """This round's groups, sampled from the policy of ``version`` and signed."""
        self.rows.clear()  # rows of a generation that failed halfway: their groups never went out
        return [Group.of(g) for g in self.sample(self.models[version], version)]

    def sample(self, model: Model, version: int, decoder: Decoder = decode) -> list[list[Rollout]]:
        """The round's groups as ``model`` samples them with ``decoder``, claiming the policy of
        ``version``."""
        return list(iter_generate(
            model, self.config.tasks, self.key, round_seed=round_seed(self.models[version].model_hash, version),
            sampling=self.sampling, groups=self.config.groups_per_round, group_size=self.config.group_size,
            policy_version=version, reward_spec=self._reward_spec(version),
            batch_size=self.config.generation_batch, decoder=decoder,
            witness=self._keep_rows if self.config.hidden_states else None))

    def _reward_spec(self, version: int) -> RewardSpec:
        """The reward spec ``version``'s records are scored by."""
        spec = self.expectations(version).reward_spec
        assert spec is not None  # a node's expectations pin the network's (Node._expectations)
        return spec

    def _keep_rows(self, rollout: Rollout, rows: torch.Tensor) -> None:
        self.rows[record_subject(rollout)] = (rollout, rows)

    def take_rows(self, group: Group) -> list[tuple[Rollout, torch.Tensor]]:
        """The rows of ``group``'s records, handed over once (the node writes them to disk)."""
        return [self.rows.pop(record_subject(r)) for r in group.rollouts if record_subject(r) in self.rows]

    # -- sampling proofs (specs/zk.md §10, specs/network.md §3.4) ------------------------------
    def check_sampling(self, group: Group, model: Model, answer: bytes, challenge: bytes, positions: int,
                       srs: Srs, workdir: Path) -> tuple[str, ...]:
        """The failure codes of a producer's answer to ``challenge`` (empty when every challenged
        position is proven); an answer that does not decode fails every position."""
        try:
            answered, openings = openings_from_bytes(answer)
        except SamplingProofError:
            return (Check.MISSING.value,)
        if answered != challenge:
            return (Check.MISSING.value,)
        checks = check_openings(group.rollouts, openings, model, [srs], workdir,
                                challenge=challenge, count=positions, allow_dev=srs.dev)
        return tuple(sorted({str(c.outcome) for c in checks if c.outcome != Check.OK}))

    # -- verifier -----------------------------------------------------------------------------
    def check(self, group: Group, version: int, forward: PolicyForward | None = None) -> CheckResult:
        """One whole group checked, whose signatures :func:`~vrl.node.messages.decode_group`
        checked when it arrived. ``forward``, a pass of the policy of ``version`` over the
        group's records (the trainer's GRPO forward pass, :meth:`PolicyTrainer.step`), stands
        in for the verifier's own prefill of them."""
        prefilled = {} if forward is None else {
            i: forward.recomputed[forward.rows[r.signature]] for i, r in enumerate(group.rollouts)
            if r.signature in forward.rows}
        verdicts = verify(group.rollouts, self.models[version], expect=self.expectations(version),
                          batch_size=len(group.rollouts), signatures_checked=True,
                          rebuild_commitments=True, prefilled=prefilled)
        tokens, lost = map(sum, zip(*(v.race_evidence for v in verdicts)))  # a group has records
        return CheckResult(tuple(v.reason for v in verdicts if not v.accepted),
                           recomputed_digest([v.recomputed for v in verdicts]), tokens, lost)

    # -- replaying the trainer's steps (specs/training.md §4) ----------------------------------
    def replay(self, announcement: PolicyAnnouncement, config_file: bytes, optimizer_before: bytes,
               optimizer_after: bytes, groups: list[Group], rewards: list[list[float]] | None = None, *,
               batch: Batch | None = None) -> tuple[tuple[str, ...], bytes, float]:
        """Replay the step that made ``announcement`` from the weights this node holds (its
        parent's and its own): ``(StepFault codes, replayed model hash, drift)``. ``batch``: the
        step's batch when the announcement names a batch file (:func:`judge_step`)."""
        judged = judge_step(announcement, self.models[announcement.version - 1], self.models[announcement.version],
                            config_file, optimizer_before, optimizer_after, groups, self.skeleton, rewards,
                            batch=batch)
        return judged.faults, judged.model_hash, judged.drift

    # -- trainer ------------------------------------------------------------------------------
    def plant(self, version: int) -> tuple[Submission, bytes]:
        """A known-bad group from a throw-away identity, to see which verifiers pass it."""
        canary = NodeKey.from_seed(hashlib.sha256(CANARY_DOMAIN + self.key.sign(
            version.to_bytes(8, "big"))).digest())
        model = self.models[version]
        (group,) = iter_generate(model, self.config.tasks, canary, round_seed=round_seed(model.model_hash, version),
                                 sampling=self.sampling, groups=[0], group_size=self.config.group_size,
                                 policy_version=version, reward_spec=self._reward_spec(version))
        return Submission.of([tampered(group[0], model, canary), *group[1:]]), canary.node_id


@dataclasses.dataclass(frozen=True)
class JudgedStep:
    """A step replayed against its announcement (specs/training.md §4, §5)."""

    faults: tuple[str, ...]  # StepFault codes; empty when the step is what was announced
    replay: StepReplay | None  # None when it could not run (a config or optimizer file at fault)
    same_platform: bool  # the replay ran on the announcement's platform, a bit-exact one: bit-exact required

    @property
    def model_hash(self) -> bytes:
        return self.replay.model_hash if self.replay is not None else b""

    @property
    def drift(self) -> float:
        return self.replay.drift if self.replay is not None else 0.0


def judge_step(announcement: PolicyAnnouncement, parent: Model, claimed: Model, config_file: bytes,
               optimizer_before: bytes, optimizer_after: bytes, groups: list[Group], base: Model,
               rewards: list[list[float]] | None = None, *,
               batch: Batch | None = None) -> JudgedStep:
    """Run the step that made ``announcement`` again from ``parent``'s weights,
    ``optimizer_before`` and the batch's ``groups`` (in batch order), and compare with the
    announced weights (``claimed``) and ``optimizer_after``. Bit-exact is required on the
    trainer's own platform, the tolerance elsewhere. ``base`` is the network's base model, the
    only reference policy a step config may name; ``rewards``, what the step trains on where
    the records' own is not all (private tasks: vrl.zk.training_rewards); ``batch``, the batch
    from the file the announcement names, if it names one (its admission weights scale the
    groups). What a verifier's replay and the audit's run."""
    if batch is None and (batch := announcement.inline) is None:
        raise ValueError(f"version {announcement.version} names a batch file: replaying it needs the batch")
    same_platform = announcement.platform == platform_tag(parent) and bit_exact_platform(announcement.platform)
    try:
        config = StepConfig.from_bytes(config_file)
    except StepError:
        return JudgedStep((StepFault.WRONG_CONFIG,), None, same_platform)
    if config.reference and config.reference != base.model_hash:
        return JudgedStep((StepFault.WRONG_CONFIG,), None, same_platform)  # pi_ref must be the base model
    try:
        network, optimizer, stats = replay(
            parent.network, optimizer_before, [list(g.rollouts) for g in groups], [w for _, w in batch],
            config, announcement.version - 1, base.tokenizer.pad_token_id,
            reference=base.network if config.reference else None, rewards=rewards)
    except StepError:  # the optimizer file the parent announced does not fit the model
        return JudgedStep((StepFault.WRONG_OPTIMIZER_BEFORE,), None, same_platform)
    result = compare(parent.network, optimizer_before, network, optimizer, claimed.network.state_dict(),
                     optimizer_after, stats, parent.dtype_name)
    faults = tuple(fault for fault, ok in ((StepFault.WEIGHTS_MISMATCH, result.weights_agree(same_platform)),
                                           (StepFault.OPTIMIZER_MISMATCH, result.optimizer_agrees(same_platform)))
                   if not ok)
    return JudgedStep(faults, result, same_platform)


@dataclasses.dataclass(frozen=True)
class TrainedStep:
    """What a training step hands the daemon to announce (specs/training.md §3)."""

    model: Model
    blob: bytes  # the weights file
    optimizer: bytes  # the optimizer state file after the step
    optimizer_before: bytes  # its hash before the step; empty for version 0
    batch: tuple[tuple[bytes, float], ...]  # (group digest, weight), in the order trained
    metrics: dict[str, float]
    proofs: tuple[bytes, int] = (b"", 0)  # the reward proofs file's hash and size; none for public tasks


class PolicyTrainer:
    """The trainer role: a :class:`vrl.rl.train.Trainer` stepped on admitted groups only, each
    step accountable: its inputs and outputs are what the announcement binds. The cheats that
    devnets put verifiers to the test with are :class:`vrl.harness.adversary.CheatingTrainer`."""

    cheat = ""  # the vrl.node.config.TRAINER_ADVERSARIES entry this trainer carries out

    def __init__(self, config: TrainConfig, run_dir: Path, key: NodeKey, tasks: TaskSet | None = None) -> None:
        self.trainer = Trainer(config, run_dir, resume=True, key=key, tasks=tasks)
        self.step_config = self.trainer.step_config
        self.config_file = self.step_config.to_bytes()

    @property
    def version(self) -> int:
        return self.trainer.step_index

    def policy(self) -> Model:
        return self.trainer.policy()

    def optimizer_file(self) -> bytes:
        return optimizer_bytes(self.trainer.network, self.trainer.optimizer)

    def current(self) -> TrainedStep:
        """The current version as the step that made it: for version 0 (or a checkpoint a
        crash left unannounced) rebuilt from what the checkpoint saved beside the weights."""
        model = self.policy()
        saved = self.trainer.resumed_state if self.version > 0 else {}
        batch = tuple((bytes.fromhex(d), float(w)) for d, w in saved.get("batch", ()))
        return TrainedStep(model, to_blob(model), self.optimizer_file(),
                           bytes.fromhex(saved.get("optimizer_before", "")), batch, {},
                           (bytes.fromhex(saved.get("proofs", "")), int(saved.get("proofs_size", 0))))

    def step(self, groups: list[Group], weights: list[float], screen: Screen | None = None,
             rewards: list[list[float]] | None = None,
             proofs: tuple[bytes, int] = (b"", 0)) -> tuple[TrainedStep | None, dict[bytes, CheckResult]]:
        """GRPO on the batch (:func:`vrl.rl.step.grpo_step`), then version + 1; the checkpoint,
        with the step's batch and starting optimizer hash, is on disk before this returns.

        With ``screen`` (a node's :meth:`Work.check`), every group of the batch that can learn
        is checked first (:meth:`screened`), and the groups that fail are refused: left out of
        the step and of the batch announced. Returns the step, None when every group was
        refused, and the refused groups' check results by digest. ``rewards`` (per group, per
        record) is what the step trains on where the records' own is not all (private tasks:
        vrl.zk.training_rewards), shown by the proofs file of hash and size ``proofs``, which the
        checkpoint saves with the batch."""
        rewards = [[r.reward for r in g.rollouts] for g in groups] if rewards is None else rewards
        forward, screened, refused = self.screened(groups, screen, rewards) if screen is not None else (None, 0, {})
        if refused:
            kept = [(g, w, r) for g, w, r in zip(groups, weights, rewards) if g.digest not in refused]
            groups, weights, rewards = [g for g, _, _ in kept], [w for _, w, _ in kept], [r for _, _, r in kept]
            # The batch changed: the step runs a fresh pass over exactly what it announces,
            # since a verifier's replay runs one over that (a pass over more rows is not the
            # same to the bit: a matrix product's blocking depends on the batch shape).
            forward = None
            if not groups:
                return None, refused
            # Weights average 1 over the batch trained (specs/reputation.md §6: the learning rate
            # and the token-mean denominator unchanged), so the ones kept are scaled back to it;
            # the audit holds every announced batch to that (vrl.audit.checks, "weights").
            mean = sum(weights) / len(weights)
            weights = [w / mean for w in weights]
        before = hashlib.sha256(self.optimizer_file()).digest()
        batch = tuple((g.digest, float(w)) for g, w in zip(groups, weights))
        metrics = self.update(groups, weights, forward=forward, rewards=rewards)
        model = self.trainer.advance({"batch": [[d.hex(), w] for d, w in batch], "optimizer_before": before.hex(),
                                      "proofs": proofs[0].hex(), "proofs_size": proofs[1]})  # checkpoint_every is 1
        if self.trainer.step_index % self.trainer.config.eval_every == 0:
            metrics.update(self.trainer.evaluate(model))
        flat = [reward for row in rewards for reward in row]
        metrics["rewards_mean"] = float(torch.tensor(flat).mean()) if flat else 0.0
        metrics["groups_screened"], metrics["groups_refused"] = screened, len(refused)
        return TrainedStep(model, to_blob(model), self.optimizer_file(), before, batch, metrics, proofs), refused

    def screened(self, groups: list[Group], screen: Screen,
                 rewards: list[list[float]]) -> tuple[PolicyForward | None, int, dict[bytes, CheckResult]]:
        """Every group of the batch that the step learns from, checked (specs/network.md §5.4).

        GRPO's forward pass is taken first, with hidden states: for a group the current policy
        sampled, a pass of the claimed model over the claimed tokens is the verifier's prefill,
        so it is checked at no further cost. A group of an older version was sampled by
        weights this pass does not run; ``screen`` checks it with a prefill of that version
        (or leaves it, returning None: one this node has checked already). Groups whose
        rewards are all equal carry no gradient, enter no pass, and change nothing training
        sees. Returns the pass (reusable by the step when nothing is refused), how many groups
        were checked, and the failed groups' results."""
        learnable = [g for g, keep in zip(groups, informative_groups(torch.tensor(rewards)).tolist()) if keep]
        if not learnable:
            return None, 0, {}
        forward = policy_forward(self.trainer.network, [r for g in learnable for r in g.rollouts],
                                 self.step_config.temperature, self.trainer.tokenizer.pad_token_id,
                                 capture_hidden=True)
        checked = {g.digest: screen(g, g.version, forward if g.version == self.version else None) for g in learnable}
        return (forward, sum(r is not None for r in checked.values()),
                {digest: result for digest, result in checked.items() if result is not None and result.reasons})

    def update(self, groups: list[Group], weights: list[float], *, forward: PolicyForward | None = None,
               rewards: list[list[float]] | None = None) -> dict[str, float]:
        """The GRPO step itself, on exactly the batch announced, with ``rewards``; ``forward``,
        a pass of the current weights over exactly its groups that can learn, saves running it
        again."""
        return self.trainer.update([list(g.rollouts) for g in groups], weights, forward=forward, rewards=rewards)

    def frozen_copy(self, model: Model) -> Model:
        """A snapshot of the live weights for verification (the live ones keep training)."""
        return Model(name=model.name, network=copy.deepcopy(model.network).eval(), tokenizer=model.tokenizer,
                     dtype_name=model.dtype_name)


def tampered(rollout: Rollout, model: Model, key: NodeKey, position: int = 0) -> Rollout:
    """One completion token changed, the commitment rebuilt by an honest prefill of the claimed
    model, re-signed: it passes TOPLOC's commitment check, not the sampling check. What the
    trainer plants to see which verifiers pass it, and what the ``tampered-tokens`` cheat sends."""
    tokens = list(rollout.completion_tokens)
    tokens[position] = (tokens[position] + 1) % model.vocab_size
    return rollout.signed(key, completion_tokens=tuple(tokens),
                          commitment=commit(model, list(rollout.prompt_tokens), tokens))
