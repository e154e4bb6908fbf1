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
``rollouts/`` and, at the end, ``curves.png``; each step's metrics also go to the trackers of
``report_to`` (:mod:`vrl.rl.trackers`), after their line is on disk. ``resume=True`` continues from the newest
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
from dataclasses import asdict
from pathlib import Path
from typing import Any

import structlog
import torch

from proofs.sampling_params import SamplingParams
from vrl.errors import VrlError
from vrl.rl import checkpoint
from vrl.rl.config import TrainConfig
from vrl.rl.evaluate import accuracy, expected_accuracy, held_out
from vrl.rl.export import load_model
from vrl.rl.grpo import informative_groups
from vrl.rl.step import PolicyForward, StepConfig, grpo_step, optimizer_for, policy_forward
from vrl.rl.trackers import Trackers
from vrl.rollouts.files import write_rollouts
from vrl.rollouts.forward import HOST
from vrl.rollouts.generate import choose_max_new_tokens, iter_generate
from vrl.rollouts.keys import NodeKey
from vrl.rollouts.model import Model
from vrl.rollouts.record import Rollout, round_seed
from vrl.rollouts.verify import Expectations, verify
from vrl.tasks import HELD_OUT_SHARE, TaskSet, open_task_set

AUDIT_DOMAIN = b"vrl/audit-sample/v1\x00"


class RunError(VrlError, ValueError):
    """A run directory, or a run's task set or key, that a :class:`Trainer` cannot use."""


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
        set opened already (a node's trainer takes the set its node read, a private set's answers opened)."""
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
        latest = checkpoint.load_latest(checkpoints, self.network, self.optimizer, fall_back=fall_back) if (
            resume) else None
        self.resumed_state: dict[str, Any] = {}  # what advance() saved beside the checkpoint resumed from
        if latest is not None:
            path, state = latest
            self.step_index, self.resumed_state = state["step"], state
            self.log("resumed", checkpoint=str(path), step=self.step_index)
        # Steps after the checkpoint (or all, if a run died before its first one) are redone.
        self._truncate_metrics(self.step_index)
        (self.run_dir / "rollouts").mkdir(exist_ok=True)
        (self.run_dir / "config.toml").write_text(config.to_toml())
        # Last: a tracker that cannot start (TrackerError) stops the run before it begins.
        self.trackers = Trackers(config.report_to, self.run_dir, asdict(config), config.to_toml(), self.step_index,
                                 warn=structlog.get_logger("vrl").warning)
        for tracker in self.trackers.active:
            self.log("reporting metrics", tracker=tracker.name, to=tracker.where)

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
                return bool(json.loads(line).get("step", 0) < step)
            except json.JSONDecodeError:
                return False

        kept = [line for line in self.metrics_path.read_text().splitlines() if line.strip() and before(line)]
        staging = self.metrics_path.with_suffix(".jsonl.partial")
        staging.write_text("".join(line + "\n" for line in kept))
        os.replace(staging, self.metrics_path)

    def _append_metrics(self, record: dict[str, Any]) -> None:
        """The one place a step's metrics are recorded: its line in metrics.jsonl, on disk, then
        the same record to the trackers, which cannot change or lose that line."""
        with self.metrics_path.open("a") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.trackers.log(record)

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
    def step(self) -> dict[str, Any]:
        config, step = self.config, self.step_index
        record: dict[str, Any] = {"step": step, "policy_version": step}
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

    def advance(self, state: dict[str, Any] | None = None) -> Model:
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
               rewards: list[list[float]] | None = None) -> dict[str, Any]:
        """One GRPO step on whole groups (:func:`vrl.rl.step.grpo_step`); ``weights`` (one per
        group, >= 0; e.g. the node's admission weights from :func:`vrl.node.admission.admit`)
        scale each group's advantages. ``forward``, a :func:`policy_forward` of the current
        weights that covers every informative group, saves running the policy again;
        ``informative``, the groups' :func:`~vrl.rl.grpo.informative_groups` when the caller has
        it already; ``rewards``, what the step trains on where it is not the records' own
        (:func:`~vrl.rl.step.grpo_step`)."""
        weights = [1.0] * len(groups) if weights is None else list(weights)
        return grpo_step(self.network, self.optimizer, groups, weights, self.step_config, self.step_index,
                         self.tokenizer.pad_token_id, reference=self.reference, track_kl=self.config.track_kl,
                         forward=forward, informative=informative, rewards=rewards)

    def run(self, on_step: Callable[[dict[str, Any]], None] | None = None,
            deadline: float | None = None) -> dict[str, Any]:
        """Steps until ``config.steps`` (or ``time.perf_counter()`` passes ``deadline``), then
        evaluates the final policy and returns that record. The trackers are closed at the end,
        however it ends."""
        try:
            while self.step_index < self.config.steps and (deadline is None or time.perf_counter() < deadline):
                record = self.step()
                if on_step is not None:
                    on_step(record)
            final: dict[str, Any] = {"step": self.step_index, "policy_version": self.step_index, "final": True}
            model = self.policy()
            final["model_hash"] = model.model_hash.hex()
            final.update(self.evaluate(model))
            lines = self.metrics_path.read_text().splitlines() if self.metrics_path.exists() else []
            if not any(json.loads(line).get("final") for line in lines if line.strip()):
                self._append_metrics(final)
            return final
        finally:
            self.trackers.close()

