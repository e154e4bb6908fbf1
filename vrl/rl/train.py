"""The RL loop on one machine: take tasks, generate committed groups, verify, GRPO, publish.

Each step ``s`` is one round and one policy version:

1. the round seed is ``H(model_hash of version s, s)`` (:func:`vrl.rollouts.record.round_seed`);
2. the node generates ``groups_per_step`` whole groups of its *assigned* tasks, committed and
   signed; they are written to ``rollouts/step-s.vrl`` for later audit;
3. every rollout is verified (or a ``verify_fraction`` of the groups, drawn by hash of the
   round seed), and a group with any rejected member is dropped whole;
4. GRPO updates the policy on the informative groups (:mod:`vrl.rl.grpo`);
5. version ``s + 1`` is published: its model hash goes into ``metrics.jsonl``, and every
   ``checkpoint_every`` steps a checkpoint is written (:mod:`vrl.rl.checkpoint`).

A run directory holds ``config.toml``, ``node.pem``, ``metrics.jsonl``, ``checkpoints/``,
``rollouts/`` and, at the end, ``curves.png``. ``resume=True`` continues from the newest
checkpoint and drops any metrics written after it, so a killed run loses nothing and its
curve has no duplicate steps.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import structlog
import torch

from proofs.sampler import SamplingParams
from vrl.config import U63, bounded, build, check_fields, read_toml, reading, to_toml
from vrl.errors import VrlError
from vrl.rl import checkpoint
from vrl.rl.evaluate import accuracy, expected_accuracy, held_out
from vrl.rollouts.forward import HOST
from vrl.rollouts.generate import GenerationConfig, choose_max_new_tokens, iter_generate
from vrl.rl.grpo import GRPOConfig, informative_groups
from vrl.rl.step import PolicyForward, StepConfig, grpo_step, optimizer_for, policy_forward
from vrl.rollouts.files import write_rollouts
from vrl.rollouts.keys import NodeKey
from vrl.rollouts.model import Model, load_model
from vrl.rollouts.record import Rollout, round_seed
from vrl.tasks import HELD_OUT_SHARE, RewardSpec, TaskSet, open_task_set
from vrl.rollouts.verify import Expectations, verify

AUDIT_DOMAIN = b"vrl/audit-sample/v1\x00"


#: Keys an earlier vrl wrote into a run's config.toml that this one no longer has, with why:
#: resuming such a run drops them (TrainConfig.from_saved).
RETIRED_KEYS = {
    ("grpo", "max_staleness"): "a network's bound, now [protocol] max_staleness of node.toml; vrl train samples "
                               "every batch from its current policy, so it never applied here",
}


class RunError(VrlError, ValueError):
    """A run directory, or a run's task set or key, that a :class:`Trainer` cannot use."""


@dataclass(frozen=True)
class LearnerConfig:
    """How the policy learns and how it is measured: keys of ``vrl train``'s TOML, and a node's
    ``[train]`` table (its trainer role). Each value is checked where it is made."""

    # Measured here (bench/learning.py): 1e-4 and above wreck the base model within a few steps;
    # 2e-5 with warmup learns steadily. Adam moves each weight by about the learning rate per
    # step, so 1 is no learning rate at all.
    learning_rate: float = field(default=2e-5, metadata=bounded(0, 1, open_low=True))
    # A fresh Adam's first steps move every weight by about the full learning rate whatever
    # the gradient's size; measured here, that alone costs the base model 0.2-0.5 nats of
    # held-out likelihood at 1e-4. A linear warmup lets the moment estimates settle first:
    # 20 steps, a tenth of a default run.
    warmup_steps: int = field(default=20, metadata=bounded(1, U63))
    # The gradient norm is clipped to this: TRL's max_grad_norm (transformers' TrainingArguments) default.
    grad_clip: float = field(default=1.0, metadata=bounded(0, open_low=True))
    track_kl: bool = True  # keep the initial policy to report KL even when kl_beta is 0
    # Held-out problems evaluated (twice) every eval_every steps: at the base model's ~30%
    # sampled accuracy, 256 give a standard error of about 3 points (sqrt(0.3 x 0.7 / 256)).
    # 2^16 is 50 times GSM8K's test split, and keeps one evaluation's time bounded.
    held_out: int = field(default=256, metadata=bounded(1, 2**16))
    eval_every: int = field(default=10, metadata=bounded(1, U63))  # steps: 20 points on a default run's curve
    # The newest checkpoint and the one before: if the newest is damaged, resume falls back to
    # the other (vrl.rl.checkpoint.load_latest).
    keep_checkpoints: int = field(default=2, metadata=bounded(1, 2**16))

    def __post_init__(self) -> None:
        check_fields(self, LearnerConfig)  # a subclass's further fields are its own to check


_REWARD = RewardSpec()  # the reward's defaults are the spec's (specs/tasks.md §3)


@dataclass(frozen=True)
class TrainConfig(LearnerConfig, GenerationConfig):
    """One machine's run (``vrl train``): what its rollouts are (:class:`GenerationConfig`),
    how it learns (:class:`LearnerConfig`), and the run's own settings below. Its TOML is flat,
    with the GRPO keys under ``[grpo]``; ``RUN/config.toml`` records the effective one."""

    # a third of the README's 600-step run (bench/learning.py)
    steps: int = field(default=200, metadata=bounded(1, U63))
    # 16 groups x 8: the batch the README's learning runs and bench/vs_trl.py use. A step
    # holds its batch in memory; 2^16 groups is far past any measured here.
    groups_per_step: int = field(default=16, metadata=bounded(1, 2**16))
    reward_correct: float = _REWARD.correct  # RewardSpec checks the three (reward_spec)
    reward_format: float = _REWARD.format
    answer_tag: str = _REWARD.tag
    verify_fraction: float = field(default=1.0, metadata=bounded(0, 1))  # every group, as the README's runs
    # steps, as eval_every: a killed run redoes at most 9
    checkpoint_every: int = field(default=10, metadata=bounded(1, U63))
    grpo: GRPOConfig = field(default_factory=GRPOConfig)

    def __post_init__(self) -> None:
        check_fields(self)
        self.reward_spec  # validates the reward fields

    @property
    def reward_spec(self) -> RewardSpec:
        return RewardSpec(self.reward_correct, self.reward_format, self.answer_tag)

    @classmethod
    def from_toml(cls, path: Path, **overrides) -> TrainConfig:
        """Read a TOML file (top-level keys as here, GRPO keys under ``[grpo]``), then apply
        overrides (the flags; see :meth:`from_dict`). A mistake in the file is a
        :class:`~vrl.config.ConfigError` naming the file, the table and the key."""
        with reading(path):
            config = cls.from_dict(read_toml(path))
        return cls.from_dict(asdict(config), **overrides) if overrides else config

    @classmethod
    def from_saved(cls, path: Path, **overrides) -> TrainConfig:
        """A run's own ``config.toml``, as this or an earlier vrl wrote it, for ``--resume``:
        keys an earlier version wrote that this one retired (:data:`RETIRED_KEYS`) are dropped
        with a warning, so an upgrade alone does not strand a run. A file a user gives
        (:meth:`from_toml`) is refused on them instead, naming where the setting went. Values
        that this version checks more strictly than the one that wrote them (a ``group_size``
        of 1, a learning rate above 1) are refused, naming the key, as from any file."""
        with reading(path):
            data = read_toml(path)
        for (table, key), why in RETIRED_KEYS.items():
            if isinstance(data.get(table), dict) and key in data[table]:
                del data[table][key]
                structlog.get_logger().warning("retired setting in the run's config ignored", file=str(path),
                                               key=f"[{table}] {key}", why=why)
        with reading(path):
            config = cls.from_dict(data)
        return cls.from_dict(asdict(config), **overrides) if overrides else config

    @classmethod
    def from_dict(cls, data: dict, **overrides) -> TrainConfig:
        """A config from a table (what tomllib reads) and overrides (flags, ``grpo`` a dict of
        its own; None is a flag not given). Unknown keys, wrong types and values out of range
        are a :class:`~vrl.config.ConfigError` naming the table and the key."""
        data = {**data, **{k: v for k, v in overrides.items() if v is not None and k != "grpo"}}
        grpo = {k: v for k, v in overrides.get("grpo", {}).items() if v is not None}
        if grpo:
            table = data.get("grpo", {})
            data["grpo"] = {**table, **grpo} if isinstance(table, dict) else table  # not a table: build says so
        return build(cls, data)

    def to_toml(self) -> str:
        return to_toml(self)  # the [grpo] table last, as tomli-w writes tables


def _audited(round_seed_: bytes, group_index: int, fraction: float) -> bool:
    """Whether a group is verified when only ``fraction`` are: a hash of the round, not a choice."""
    digest = hashlib.sha256(AUDIT_DOMAIN + round_seed_ + group_index.to_bytes(4, "big")).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


class Trainer:
    """One run: a policy, its optimizer and run directory. :meth:`step` runs one round."""

    def __init__(self, config: TrainConfig, run_dir: Path, *, resume: bool = False, key: NodeKey | None = None,
                 log: Callable[..., None] | None = None, fall_back: bool = False, tasks: TaskSet | None = None) -> None:
        """``resume`` continues from the newest checkpoint; with ``fall_back`` a damaged one is
        skipped (and logged) for the newest that verifies. Off by default: a caller that has
        already published the newer versions (a node's trainer) would fork them by training
        from an older one, and is better stopped with the error. ``tasks`` is ``config.task``'s
        set opened already (a node's trainer of private tasks opens them with its answer key)."""
        self.config, self.run_dir, self.log = config, Path(run_dir), log or (lambda *a, **k: None)
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:  # a file in its place, no permission: say which, not a traceback
            raise RunError(f"{self.run_dir}: cannot be a run directory: {error.strerror or error}") from None
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.tasks: TaskSet
        if tasks is not None:
            self.tasks = tasks
        else:
            self.tasks, problems = open_task_set(config.task, config.columns)
            for problem in problems:
                self.log("skipped task", problem=str(problem))
        self.evaluation = held_out(self.tasks, config.held_out)
        if not self.evaluation:
            raise RunError(f"task set {self.tasks.name!r} has no held-out problem to measure accuracy on "
                             f"(1 prompt in {HELD_OUT_SHARE} is held out, by hash); it needs more tasks")
        loaded = load_model(config.model, dtype="float32", device=config.device)
        self.network, self.tokenizer = loaded.network, loaded.tokenizer
        try:
            max_new_tokens, why = choose_max_new_tokens(loaded, self.tasks, config.max_new_tokens)
        except ValueError as error:  # a chat task this model cannot render, a prompt past its context
            raise RunError(str(error)) from None
        if not config.max_new_tokens:  # chosen from the task set: said once, and recorded in config.toml
            self.log("max_new_tokens chosen from the task set", max_new_tokens=max_new_tokens, why=why)
            self.config = config = dataclasses.replace(config, max_new_tokens=max_new_tokens)
        self.sampling = SamplingParams(config.temperature, 0, 1.0, config.max_new_tokens, loaded.stop_token_ids)
        # The network stays in eval mode while it trains: dropout would make the GRPO forward
        # disagree with the behaviour policy (the ratio must be exactly 1 on a fresh batch) and
        # with the verifier, which checks rollouts against that same forward pass.
        self.network.eval().requires_grad_(True)
        self.reference = copy.deepcopy(self.network).requires_grad_(False) if (
            config.track_kl or config.grpo.kl_beta > 0) else None
        # pi_ref is the model the run started from; a step config names it when the KL is in the loss.
        self.reference_hash = loaded.model_hash if config.grpo.kl_beta > 0 else b""
        self.optimizer = optimizer_for(self.network, self.step_config)
        key_path = self.run_dir / "node.pem"
        if not key_path.exists():
            (key or NodeKey.generate()).save(key_path)
        self.key = NodeKey.load(key_path)
        if key is not None and key.node_id != self.key.node_id:
            raise RunError(f"{key_path} holds another node's key than the one given")
        self.step_index = 0
        checkpoints = self.run_dir / "checkpoints"
        checkpoint.remove_stale_partials(checkpoints)  # a writer killed mid-save left them; logged
        if not resume and (checkpoint.latest(checkpoints) is not None or self.metrics_path.exists()):
            raise RunError(f"{self.run_dir} already holds a run; continue it with --resume (Trainer(resume=True)), "
                           "or choose another directory")
        # The newest checkpoint (that verifies, with fall_back: each damaged newer one is logged
        # with the reason, and if none verifies the CheckpointError names them all).
        loaded = checkpoint.load_latest(checkpoints, self.network, self.optimizer, fall_back=fall_back) if (
            resume) else None
        self.resumed_state: dict = {}  # what advance() saved beside the checkpoint resumed from
        if loaded is not None:
            path, state = loaded
            self.step_index, self.resumed_state = state["step"], state
            self.log("resumed", checkpoint=str(path), step=self.step_index)
        # Steps after the checkpoint (or all, if a run died before its first one) are redone.
        self._truncate_metrics(self.step_index)
        (self.run_dir / "rollouts").mkdir(exist_ok=True)
        (self.run_dir / "config.toml").write_text(config.to_toml())

    # -- the policy as the protocol sees it ------------------------------------------------
    def policy(self) -> Model:
        """The current weights as a :class:`Model`, with a fresh hash (a new policy version)."""
        return Model(name=f"{self.config.model}@{self.step_index}", network=self.network,
                     tokenizer=self.tokenizer, dtype_name="float32")

    def _truncate_metrics(self, step: int) -> None:
        """Keep only the metrics of steps the checkpoint contains (and no line a crash cut
        short); atomic rewrite."""
        if not self.metrics_path.exists():
            return

        def before(line: str) -> bool:
            try:
                return json.loads(line).get("step", 0) < step
            except json.JSONDecodeError:
                return False

        kept = [line for line in self.metrics_path.read_text().splitlines() if line.strip() and before(line)]
        staging = self.metrics_path.with_suffix(".jsonl.partial")
        staging.write_text("".join(line + "\n" for line in kept))
        os.replace(staging, self.metrics_path)

    def _append_metrics(self, record: dict) -> None:
        with self.metrics_path.open("a") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def evaluate(self, model: Model) -> dict[str, float]:
        """Held-out accuracy of the policy as it samples (the run's temperature, one fixed-seed
        sample per task: what the reward measures and GRPO optimizes), and of its greedy answers."""
        spec, limit = self.config.reward_spec, self.config.max_new_tokens
        return {
            "held_out_accuracy": accuracy(model, self.evaluation, spec, temperature=self.config.temperature,
                                          max_new_tokens=limit),
            "held_out_accuracy_greedy": accuracy(model, self.evaluation, spec, temperature=0.0, max_new_tokens=limit),
            "held_out_expected_accuracy": expected_accuracy(model, self.evaluation,
                                                            temperature=self.config.temperature),
        }

    # -- one round -------------------------------------------------------------------------
    def step(self) -> dict:
        config, step = self.config, self.step_index
        record: dict = {"step": step, "policy_version": step}
        model = self.policy()
        record["model_hash"] = model.model_hash.hex()
        seed = round_seed(model.model_hash, step)
        started = time.perf_counter()
        if step % config.eval_every == 0:
            record.update(self.evaluate(model))
        record["seconds_eval"] = time.perf_counter() - started

        # 1. Generate the assigned groups, committed and signed.
        started = time.perf_counter()
        groups = list(iter_generate(
            model, self.tasks, self.key, round_seed=seed, sampling=self.sampling, groups=config.groups_per_step,
            reward_spec=config.reward_spec, group_size=config.group_size, policy_version=step,
            batch_size=config.generation_batch))
        record["seconds_generate"] = time.perf_counter() - started
        write_rollouts(self.run_dir / "rollouts" / f"step-{step:08d}.vrl", [r for g in groups for r in g])

        # 2. Verify; a group is used only if every member passed (groups are submitted whole).
        #    The cache: GRPO's forward pass, made here once over the groups it can learn from
        #    (rewards that differ), hidden states captured. It is a pass of the claimed model
        #    over the claimed tokens, so the verifier reads those rollouts' prefill from it, and
        #    the update (3) its logprobs.
        started = time.perf_counter()
        informative = informative_groups(torch.tensor([[r.reward for r in g] for g in groups], device=HOST)).tolist()
        learnable = [r for g, keep in zip(groups, informative) if keep for r in g]
        forward = policy_forward(self.network, learnable, config.temperature, self.tokenizer.pad_token_id,
                                 capture_hidden=True) if learnable else None
        seconds_forward = time.perf_counter() - started
        started = time.perf_counter()
        audited = [r for g in groups if _audited(seed, g[0].group_index, config.verify_fraction) for r in g]
        expect = Expectations(tasks=self.tasks, round_seed=seed, sampling=self.sampling, reward_spec=config.reward_spec)
        cached = {} if forward is None else {
            index: forward.recomputed[forward.rows[r.signature]]
            for index, r in enumerate(audited) if r.signature in forward.rows}
        verdicts = verify(audited, model, expect=expect, batch_size=config.generation_batch, prefilled=cached)
        record["seconds_verify"] = time.perf_counter() - started
        rejected = Counter(v.reason for v in verdicts if not v.accepted)
        bad_groups = {audited[v.index].group_index for v in verdicts if not v.accepted}
        # (Fresh by construction: generated just now, from this step's policy.)
        usable = [(g, keep) for g, keep in zip(groups, informative) if g[0].group_index not in bad_groups]
        rollouts = [r for g in groups for r in g]
        record.update({
            "rollouts": len(rollouts), "verified": len(verdicts), "rejected": sum(rejected.values()),
            "rejected_reasons": dict(rejected),
            "reward_mean": sum(r.reward for r in rollouts) / len(rollouts),
            "accuracy_batch": sum(r.reward_spec.is_correct(r.task, model.decode(list(r.completion_tokens)))
                                  for r in rollouts) / len(rollouts),
            "completion_length_mean": sum(len(r.completion_tokens) for r in rollouts) / len(rollouts),
            "truncated_fraction": sum(r.finish_reason == "length" for r in rollouts) / len(rollouts),
        })

        # 3. GRPO on the informative groups, from the cached forward pass.
        started = time.perf_counter()
        record.update(self.update([g for g, _ in usable], forward=forward, informative=[k for _, k in usable]))
        record["seconds_update"] = seconds_forward + time.perf_counter() - started
        record["seconds_step"] = record["seconds_generate"] + record["seconds_verify"] + record["seconds_update"]

        # 4. Publish version step + 1.
        self.advance()
        self._append_metrics(record)
        return record

    def advance(self, state: dict | None = None) -> Model:
        """Make the current weights policy version ``step + 1``; the checkpoint, when one is
        due, is on disk before this returns, with ``state`` (JSON-able) beside the model hash,
        read back as :attr:`resumed_state`. Returns the new policy."""
        self.step_index += 1
        model = self.policy()
        if self.step_index % self.config.checkpoint_every == 0 or self.step_index == self.config.steps:
            checkpoint.save(self.run_dir / "checkpoints", self.step_index, self.network, self.optimizer,
                            {**(state or {}), "model_hash": model.model_hash.hex()})
            checkpoint.prune(self.run_dir / "checkpoints", self.config.keep_checkpoints)
        return model

    @property
    def step_config(self) -> StepConfig:
        """What, besides its data, decides each of this run's steps (specs/training.md §1)."""
        config = self.config
        return StepConfig(learning_rate=config.learning_rate, warmup_steps=config.warmup_steps,
                          grad_clip=config.grad_clip, temperature=config.temperature,
                          max_new_tokens=config.max_new_tokens, grpo=config.grpo, reference=self.reference_hash)

    def update(self, groups: list[list[Rollout]], weights: list[float] | None = None, *,
               forward: PolicyForward | None = None, informative: list[bool] | None = None,
               rewards: list[list[float]] | None = None) -> dict:
        """One GRPO step on whole groups (:func:`vrl.rl.step.grpo_step`); ``weights`` (one per
        group, >= 0; e.g. the node's admission weights from :func:`vrl.node.reputation.admit`)
        scale each group's advantages. ``forward``, a :func:`policy_forward` of the current
        weights that covers every informative group, saves running the policy again;
        ``informative``, the groups' :func:`~vrl.rl.grpo.informative_groups` when the caller has
        it already; ``rewards``, what the step trains on where it is not the records' own
        (:func:`~vrl.rl.step.grpo_step`)."""
        weights = [1.0] * len(groups) if weights is None else list(weights)
        return grpo_step(self.network, self.optimizer, groups, weights, self.step_config, self.step_index,
                         self.tokenizer.pad_token_id, reference=self.reference, track_kl=self.config.track_kl,
                         forward=forward, informative=informative, rewards=rewards)

    def run(self, on_step: Callable[[dict], None] | None = None, deadline: float | None = None) -> dict:
        """Steps until ``config.steps`` (or ``time.perf_counter()`` passes ``deadline``), then
        evaluates the final policy and returns that record."""
        while self.step_index < self.config.steps and (deadline is None or time.perf_counter() < deadline):
            record = self.step()
            if on_step is not None:
                on_step(record)
        final = {"step": self.step_index, "policy_version": self.step_index, "final": True}
        model = self.policy()
        final["model_hash"] = model.model_hash.hex()
        final.update(self.evaluate(model))
        lines = self.metrics_path.read_text().splitlines() if self.metrics_path.exists() else []
        if not any(json.loads(line).get("final") for line in lines if line.strip()):
            self._append_metrics(final)
        return final

