"""Cheating nodes, for tests, benchmarks and devnets that put verifiers to the test.

:func:`degraded` builds what a dishonest prover runs instead of the claimed model;
:class:`CheatingWork` is a node's work done dishonestly in one of the ways
:data:`vrl.node.config.ADVERSARIES` names, each what a cheating node would really run, not
a label. It sits at the top of the stack: the node never imports it, ``vrl node`` hands it
to a node whose config asks for a cheat (:func:`work_for`)."""

from __future__ import annotations

import copy
import functools

import torch

from vrl.node.config import ADVERSARIES
from vrl.node.messages import Group, recomputed_digest
from vrl.node.work import Work, WorkConfig, tampered
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
        if kind not in ADVERSARIES:
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


def work_for(adversary: str):
    """What does a node's model work: :class:`~vrl.node.work.Work`, or for a node configured
    to cheat (``adversary`` in node.toml), :class:`CheatingWork` doing that cheat."""
    if not adversary:
        return Work
    if adversary not in ADVERSARIES:
        raise ValueError(f"unknown adversary {adversary!r}; choose from {', '.join(ADVERSARIES)}")
    return functools.partial(CheatingWork, kind=adversary)
