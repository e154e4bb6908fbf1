"""Cheating nodes, for tests, benchmarks and devnets that put verifiers to the test.

:func:`degraded` builds what a dishonest prover runs instead of the claimed model;
:class:`CheatingWork` is a node's work done dishonestly in one of the ways
:data:`vrl.node.config.ADVERSARIES` names, each what a cheating node would really run, not
a label. It sits at the top of the stack: the node never imports it, ``vrl node`` hands it
to a node whose config asks for a cheat (:func:`work_for`)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib

import structlog
import torch

from vrl.node.config import ADVERSARIES, TRAINER_ADVERSARIES
from vrl.node.messages import Group, Outcome, recomputed_digest
from vrl.node.work import PolicyTrainer, Work, WorkConfig, tampered
from vrl.rollouts.generate import iter_generate
from vrl.rollouts.keys import NodeKey
from vrl.rollouts.model import Model
from vrl.rollouts.record import Rollout


def _int4(weight: torch.Tensor, _generator: torch.Generator) -> torch.Tensor:
    """Symmetric int4 weight-only quantization in groups of 32 inputs (GPTQ/AWQ-style layout)."""
    rows, cols = weight.shape
    grouped = weight.reshape(rows, cols // 32, 32)
    scale = grouped.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / 7
    return (torch.clamp(torch.round(grouped / scale), -8, 7) * scale).reshape(rows, cols)


def _int8(weight: torch.Tensor, _generator: torch.Generator) -> torch.Tensor:
    """Symmetric int8 weight-only quantization per output channel."""
    scale = weight.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127
    return torch.round(weight / scale).clamp(-127, 127) * scale


def _perturb(weight: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Multiplicative 1% noise: a stand-in for a fine-tune or a stale checkpoint."""
    return weight * (1 + 0.01 * torch.randn(weight.shape, generator=generator).to(weight))


def _reinit(weight: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A different model of the same shape."""
    return torch.randn(weight.shape, generator=generator).to(weight) * weight.std()


DEGRADATIONS = {"int4": _int4, "int8": _int8, "perturb-1pct": _perturb, "other-model": _reinit}


def degraded(model: Model, kind: str, seed: int = 1234) -> Model:
    """A copy of ``model`` with every weight matrix degraded as ``kind`` says."""
    transform = DEGRADATIONS[kind]
    network = copy.deepcopy(model.network)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, tensor in sorted(network.state_dict().items()):
            if tensor.ndim == 2:
                tensor.copy_(transform(tensor, generator))
    return Model(name=f"{model.name}+{kind}", network=network, tokenizer=model.tokenizer, dtype_name=model.dtype_name)


class CheatingWork(Work):
    """A node that cheats as ``kind`` says (one of :data:`~vrl.node.config.ADVERSARIES`) and
    otherwise works as an honest node does."""

    def __init__(self, key: NodeKey, config: WorkConfig, expectations, *, kind: str) -> None:
        if kind not in ADVERSARIES or kind in TRAINER_ADVERSARIES:
            raise ValueError(f"unknown adversary {kind!r}; choose from {', '.join(ADVERSARIES)}")
        super().__init__(key, config, expectations)
        self.cheat = kind
        self.seen_groups: list[tuple[Rollout, ...]] = []  # the replay cheat's loot: others' groups

    def generate(self, version: int) -> list[Group]:
        model = self.models[version]
        if self.cheat in ("quantized-model", "other-model"):
            # Sample with a cheaper or different model, then claim the real policy's hash:
            # what the cheat is about.
            cheap = degraded(model, "int8" if self.cheat == "quantized-model" else "other-model")
            groups = [[r.signed(self.key, model_hash=model.model_hash) for r in g] for g in self.sample(cheap, version)]
        else:
            groups = self.sample(model, version)
        if self.cheat == "fabricated-reward":
            groups = [[r.signed(self.key, reward=1.0) for r in g] for g in groups]
        elif self.cheat == "tampered-tokens":
            groups = [[tampered(g[0], model, self.key), *g[1:]] for g in groups]
        elif self.cheat == "replay":
            groups = [[r.signed(self.key) for r in self.seen_groups.pop()] if self.seen_groups else g for g in groups]
        return [Group.of(g) for g in groups]

    def observe(self, group: Group) -> None:
        if self.cheat == "replay":
            self.seen_groups = [*self.seen_groups[-15:], group.rollouts]

    def check(self, group: Group, version: int) -> tuple[tuple[str, ...], bytes]:
        if self.cheat == "lazy-verifier":
            # Approves unseen; the digest it must attach is made up (copying the prover's own
            # commitments is the best it can do without a prefill).
            return (), recomputed_digest([r.commitment for r in group.rollouts])
        return super().check(group, version)


# A dishonest trainer trains honestly up to this version, so that a devnet first shows the
# network working (and honest steps replaying clean) before the first bad version, CHEAT_FROM + 1.
CHEAT_FROM = 3
# The fake-weights cheat's noise: 0.1% of each weight, far below what changes the model's
# behaviour visibly, far above the replay tolerance (vrl.rl.step.DRIFT_TOLERANCE).
FAKE_WEIGHTS_NOISE = 1e-3
# The foreign-data cheat's throw-away identity, derived from the trainer's id: a node no one knows.
FOREIGN_DOMAIN = b"vrl/foreign-data/v1\x00"


class CheatingTrainer(PolicyTrainer):
    """A trainer that cheats as ``kind`` says (one of
    :data:`~vrl.node.config.TRAINER_ADVERSARIES`) from step CHEAT_FROM on, each the way a real
    dishonest trainer would, and announces the step as an honest one would."""

    def __init__(self, config, run_dir, key: NodeKey, *, kind: str) -> None:
        if kind not in TRAINER_ADVERSARIES:
            raise ValueError(f"unknown trainer adversary {kind!r}; choose from {', '.join(sorted(TRAINER_ADVERSARIES))}")
        super().__init__(config, run_dir, key)
        self.cheat = kind
        self.log = structlog.get_logger("vrl.adversary")
        self._stranger = NodeKey.from_seed(hashlib.sha256(FOREIGN_DOMAIN + key.node_id).digest())

    def _cheating(self) -> bool:
        return self.version >= CHEAT_FROM

    def choose(self, batch, protocol):
        """trainer-rejected-group: add the fresh groups it failed itself, a round or more ago."""
        if self.cheat != "trainer-rejected-group" or not self._cheating():
            return batch
        listed, current = {d for d, _ in batch}, protocol.version
        failed = sorted(d for d, verdicts in protocol.verdicts.items()
                        if (own := verdicts.get(protocol.me)) is not None and own.outcome == Outcome.HARD_FAIL
                        and own.round < current and d in protocol.groups and d not in listed
                        and 0 <= current - protocol.groups[d].version <= protocol.config.max_staleness)
        if failed:
            self.log.warning("cheating", kind=self.cheat, version=self.version + 1, groups=len(failed[:2]))
        return (*batch, *((d, 1.0) for d in failed[:2]))

    def update(self, groups: list[Group], weights: list[float]) -> dict:
        if not self._cheating() or self.cheat == "trainer-rejected-group":
            return super().update(groups, weights)
        self.log.warning("cheating", kind=self.cheat, version=self.version + 1)
        if self.cheat == "trainer-foreign-data":
            # A group it sampled itself under an identity no one knows, never gossiped.
            policy = self.policy()
            (extra,) = iter_generate(policy, self.trainer.tasks, self._stranger, round_seed=policy.model_hash,
                                     sampling=self.trainer.sampling, groups=1, group_size=len(groups[0].rollouts)
                                     if groups else self.trainer.config.group_size, policy_version=self.version)
            return super().update([*groups, Group.of(extra)], [*weights, 1.0])
        if self.cheat == "trainer-drops-node":
            victim = next((g.subject for g in groups), None)  # the first admitted node's groups go
            kept = [(g, w) for g, w in zip(groups, weights) if g.subject != victim]
            return super().update([g for g, _ in kept], [w for _, w in kept])
        if self.cheat == "trainer-learning-rate":
            honest = self.trainer.config
            self.trainer.config = dataclasses.replace(honest, learning_rate=2 * honest.learning_rate)
            try:
                return super().update(groups, weights)
            finally:
                self.trainer.config = honest
        metrics = super().update(groups, weights)  # trainer-fake-weights: the step, then a nudge
        generator = torch.Generator().manual_seed(self.version)
        with torch.no_grad():
            for tensor in self.trainer.network.parameters():
                tensor.mul_(1 + FAKE_WEIGHTS_NOISE * torch.randn(tensor.shape, generator=generator).to(tensor))
        return metrics


def trainer_for(adversary: str):
    """What does a node's trainer role: :class:`~vrl.node.work.PolicyTrainer`, or for a node
    configured as a dishonest trainer, :class:`CheatingTrainer` doing that cheat."""
    if adversary not in TRAINER_ADVERSARIES:
        return PolicyTrainer
    return functools.partial(CheatingTrainer, kind=adversary)


def work_for(adversary: str):
    """What does a node's model work: :class:`~vrl.node.work.Work`, or for a node configured
    to cheat (``adversary`` in node.toml), :class:`CheatingWork` doing that cheat."""
    if not adversary or adversary in TRAINER_ADVERSARIES:
        return Work
    if adversary not in ADVERSARIES:
        raise ValueError(f"unknown adversary {adversary!r}; choose from {', '.join(ADVERSARIES)}")
    return functools.partial(CheatingWork, kind=adversary)
