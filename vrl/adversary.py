"""Cheating nodes, for tests, benchmarks and planting known-bad rollouts to test verifiers.

Each function builds what a dishonest prover would run instead of the claimed model."""

from __future__ import annotations

import copy

import torch

from vrl.rollouts.keys import NodeKey
from vrl.rollouts.model import Model
from vrl.rollouts.record import Rollout
from vrl.rollouts.verify import commit


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


def tampered(rollout: Rollout, model: Model, key: NodeKey, position: int = 0) -> Rollout:
    """One completion token changed, the commitment rebuilt by an honest prefill of the claimed
    model, re-signed: it passes TOPLOC's commitment check, not our sampling check."""
    tokens = list(rollout.completion_tokens)
    tokens[position] = (tokens[position] + 1) % model.vocab_size
    return rollout.signed(key, completion_tokens=tuple(tokens),
                          commitment=commit(model, list(rollout.prompt_tokens), tokens))
