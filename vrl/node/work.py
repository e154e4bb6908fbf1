"""The model-side work a node's protocol asks for: generate, check, plant, train.

Everything here is synchronous torch code, run by the daemon on one worker thread so the
network loop stays responsive. A node may be configured to cheat (``adversary``); that is
how devnets and benchmarks put the verifiers to the test, and each cheat is what a dishonest
node would really run, not a label.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from pathlib import Path

import torch

from proofs.sampler import SamplingParams
from vrl import adversary as degradations
from vrl.adversary import tampered
from vrl.rollouts.generate import iter_generate
from vrl.rollouts.keys import NodeKey
from vrl.rollouts.model import Model, load_model
from vrl.node.messages import PolicyAnnouncement, Submission, recomputed_digest
from vrl.node.weights import from_blob, to_blob
from vrl.rollouts.record import Rollout, round_seed
from vrl.tasks import TaskSet
from vrl.rl.train import TrainConfig, Trainer
from vrl.rollouts.verify import verify

# What a cheating node can be told to do (``vrl devnet --adversaries``).
ADVERSARIES = {
    "fabricated-reward": "claims reward 1 for every sample",
    "quantized-model": "generates with an int8-quantized copy of the policy, claims the real one",
    "other-model": "generates with a different model of the same shape, claims the policy",
    "tampered-tokens": "edits a completion token and re-commits it by one honest prefill (TOPLOC's gap)",
    "replay": "re-signs another node's submitted groups as its own",
    "lazy-verifier": "approves what it is asked to check without running the model",
}


@dataclasses.dataclass
class WorkConfig:
    model: str
    tasks: TaskSet
    group_size: int
    groups_per_round: int
    temperature: float = 1.0
    max_new_tokens: int = 8
    adversary: str = ""
    generation_batch: int = 32
    device: str = "cpu"


class Work:
    """The models a node holds (one per policy version it needs) and what it does with them."""

    def __init__(self, key: NodeKey, config: WorkConfig, expectations) -> None:
        self.key, self.config = key, config
        self.skeleton = load_model(config.model, dtype="float32", device=config.device)
        # The canonical sampler with the model's own stop tokens (specs/sampler.md); no top-k/p.
        self.sampling = SamplingParams(config.temperature, 0, 1.0, config.max_new_tokens,
                                       self.skeleton.stop_token_ids)
        self.models: dict[int, Model] = {}
        self.expectations = expectations  # callable(version) -> Expectations
        self.seen_groups: list[list[Rollout]] = []  # for the replay cheat: others' groups
        if config.adversary and config.adversary not in ADVERSARIES:
            raise ValueError(f"unknown adversary {config.adversary!r}; choose from {', '.join(ADVERSARIES)}")

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
    def generate(self, version: int) -> list[Submission]:
        model = self.models[version]
        seed = round_seed(model.model_hash, version)
        generator_model = model
        if self.config.adversary == "quantized-model":
            generator_model = degradations.degraded(model, "int8")
        elif self.config.adversary == "other-model":
            generator_model = degradations.degraded(model, "other-model")
        groups = list(iter_generate(
            generator_model, self.config.tasks, self.key, round_seed=seed, sampling=self.sampling,
            groups=self.config.groups_per_round, group_size=self.config.group_size, policy_version=version,
            reward_spec=self.expectations(version).reward_spec, batch_size=self.config.generation_batch))
        if generator_model is not model:  # claim the real policy: what the cheat is about
            groups = [[r.signed(self.key, model_hash=model.model_hash) for r in g] for g in groups]
        groups = [self._cheat(g, model) for g in groups]
        return [Submission.of(g) for g in groups]

    def _cheat(self, group: list[Rollout], model: Model) -> list[Rollout]:
        kind = self.config.adversary
        if kind == "fabricated-reward":
            return [r.signed(self.key, reward=1.0) for r in group]
        if kind == "tampered-tokens":
            return [tampered(group[0], model, self.key)] + group[1:]
        if kind == "replay" and self.seen_groups:
            return [r.signed(self.key) for r in self.seen_groups.pop()]
        return group

    def observe(self, rollouts: list[Rollout]) -> None:
        """Another node's group went by (kept only by the replay cheat)."""
        if self.config.adversary == "replay":
            self.seen_groups = [*self.seen_groups[-15:], rollouts]

    # -- verifier -----------------------------------------------------------------------------
    def check(self, rollouts: list[Rollout], version: int) -> tuple[tuple[str, ...], bytes]:
        """``(rejection codes, recomputed commitment digest)`` for one whole group."""
        if self.config.adversary == "lazy-verifier":
            # Approves unseen; the digest it must attach is made up (copying the prover's own
            # commitments is the best it can do without a prefill).
            return (), recomputed_digest([r.commitment for r in rollouts])
        recomputed: dict[int, bytes] = {}
        verdicts = verify(rollouts, self.models[version], expect=self.expectations(version),
                          batch_size=len(rollouts), recomputed=recomputed)
        reasons = tuple(v.reason for v in verdicts if not v.accepted)
        return reasons, recomputed_digest([recomputed.get(i, b"") for i in range(len(rollouts))])

    # -- trainer ------------------------------------------------------------------------------
    def plant(self, version: int) -> tuple[Submission, bytes]:
        """A known-bad group from a throw-away identity, to see which verifiers pass it."""
        canary = NodeKey.from_seed(hashlib.sha256(b"vrl/canary/v1\x00" + self.key.sign(
            version.to_bytes(8, "big"))).digest())
        model = self.models[version]
        (group,) = iter_generate(model, self.config.tasks, canary, round_seed=round_seed(model.model_hash, version),
                                 sampling=self.sampling, groups=[0], group_size=self.config.group_size,
                                 policy_version=version, reward_spec=self.expectations(version).reward_spec)
        bad = [tampered(group[0], model, canary)] + [r for r in group[1:]]
        return Submission.of(bad), canary.node_id


class PolicyTrainer:
    """The trainer role: a :class:`vrl.rl.train.Trainer` stepped on admitted groups only."""

    def __init__(self, config: TrainConfig, run_dir: Path, key: NodeKey) -> None:
        self.trainer = Trainer(config, run_dir, resume=True, key=key)

    @property
    def version(self) -> int:
        return self.trainer.step_index

    def policy(self) -> Model:
        return self.trainer.policy()

    def step(self, groups: list[list[Rollout]], weights: list[float]) -> tuple[Model, bytes, dict]:
        """GRPO on the batch, then version + 1: ``(model, weights blob, metrics)``; the
        checkpoint is on disk before this returns."""
        metrics = self.trainer.update(groups, weights)
        model = self.trainer.advance()  # checkpoint_every is 1 for the node's trainer
        if self.trainer.step_index % self.trainer.config.eval_every == 0:
            metrics.update(self.trainer.evaluate(model))
        metrics["rewards_mean"] = float(torch.tensor([r.reward for g in groups for r in g]).mean()) if groups else 0.0
        return model, to_blob(model), metrics

    def frozen_copy(self, model: Model) -> Model:
        """A snapshot of the live weights for verification (the live ones keep training)."""
        return Model(name=model.name, network=copy.deepcopy(model.network).eval(), tokenizer=model.tokenizer,
                     dtype_name=model.dtype_name)

