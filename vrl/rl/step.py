"""One GRPO training step as a pure function of what a policy announcement binds, so that
anyone holding those inputs can run it again and compare (``specs/training.md``).

A step is decided by exactly:

* the parent weights (``parent`` model hash) and the optimizer state before the step
  (:func:`optimizer_bytes`, its hash ``optimizer_before``);
* the admitted groups, in batch order, with their admission weights (``batch``);
* the step config (:class:`StepConfig`, its hash ``config``): the loss's and the optimizer's
  hyperparameters;
* the step index (the parent's policy version), which sets the warmup's learning rate.

:func:`grpo_step` is that step; :class:`vrl.rl.train.Trainer` trains with it and
:func:`vrl.audit.replay.replay_step` replays with it, so the two cannot drift apart.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import msgpack
import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from vrl.config import U63, bounded, check_fields
from vrl.errors import VrlError
from vrl.rl.config import GRPOConfig
from vrl.rl.grpo import (
    group_advantages,
    informative_groups,
    k3_estimate,
    mean_k3,
    policy_loss,
    weight_advantages,
)
from vrl.rollouts.codec import FieldError, canonical_bytes, integer, real, take, text
from vrl.rollouts.forward import HOST, Prefilled, continue_prompts, prefilled, token_logprobs
from vrl.rollouts.model import weights_hash
from vrl.rollouts.record import Rollout

STEP_CONFIG_KIND = "step-config"
STEP_CONFIG_VERSION = 1
# The optimizer every vrl trainer runs (specs/training.md §2): AdamW with torch's default
# moments (Loshchilov & Hutter 2019; torch.optim.AdamW betas=(0.9, 0.999), eps=1e-8) and no
# weight decay (GRPO references train LLMs with 0 or 0.1; the tiny models here gain nothing
# from it). Part of every step config, so a trainer that changed them would name another.
ADAM_BETA1, ADAM_BETA2 = 0.9, 0.999
ADAM_BETAS = (ADAM_BETA1, ADAM_BETA2)
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.0
# A step config is a few hundred bytes (specs/training.md §1); a file far larger is not one.
MAX_STEP_CONFIG_BYTES = 1 << 12
# The optimizer's per-parameter state as stored (specs/training.md §2): AdamW's two moments
# and its step count, each a float32 tensor, named "<parameter name>.<slot>".
OPTIMIZER_SLOTS = ("exp_avg", "exp_avg_sq", "step")


class StepError(VrlError, ValueError):
    """A step config or optimizer file that does not decode or does not fit the model."""


@dataclass(frozen=True)
class StepConfig:
    """What decides a step besides its data: the loss (``grpo``), the optimizer, the warmup,
    the clip, the sampling temperature the logprobs are taken at, the completion budget (the
    ``constant`` aggregation's normaliser) and, when the KL term is on, the reference model."""

    learning_rate: float = field(metadata=bounded(0, 1, open_low=True))
    warmup_steps: int = field(metadata=bounded(1, U63))
    grad_clip: float = field(metadata=bounded(0, open_low=True))
    temperature: float = field(metadata=bounded(0, open_low=True))
    max_new_tokens: int = field(metadata=bounded(1, 2**20))
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    reference: bytes = b""  # model hash of pi_ref when grpo.kl_beta > 0, else empty
    betas: tuple[float, float] = field(default=ADAM_BETAS, metadata=bounded(0, 1, open_high=True))
    eps: float = field(default=ADAM_EPS, metadata=bounded(0, open_low=True))
    weight_decay: float = field(default=WEIGHT_DECAY, metadata=bounded(0))

    def __post_init__(self) -> None:
        check_fields(self)
        if (self.grpo.kl_beta > 0) != (len(self.reference) == 32):
            raise StepError("reference: a 32-byte model hash exactly when grpo.kl_beta > 0")

    def learning_rate_at(self, step_index: int) -> float:
        """The linear warmup from the step count: resume-safe, and a function of the version."""
        return self.learning_rate * min(1.0, (step_index + 1) / self.warmup_steps)

    # -- the file (specs/training.md §1) --------------------------------------------------------
    def to_bytes(self) -> bytes:
        grpo = {k: float(v) if isinstance(v, float) else v for k, v in asdict(self.grpo).items()}
        return canonical_bytes({
            "kind": STEP_CONFIG_KIND, "v": STEP_CONFIG_VERSION, "algorithm": "grpo", "optimizer": "adamw",
            "learning_rate": float(self.learning_rate), "warmup_steps": self.warmup_steps,
            "grad_clip": float(self.grad_clip), "temperature": float(self.temperature),
            "max_new_tokens": self.max_new_tokens, "grpo": grpo, "reference": self.reference,
            "betas": [float(b) for b in self.betas], "eps": float(self.eps),
            "weight_decay": float(self.weight_decay)})

    @property
    def hash(self) -> bytes:
        return hashlib.sha256(self.to_bytes()).digest()

    @classmethod
    def from_bytes(cls, data: bytes) -> StepConfig:
        """Strict: exactly the fields of ``to_bytes``, canonical bytes, values in range."""
        if not isinstance(data, bytes) or len(data) > MAX_STEP_CONFIG_BYTES:
            raise StepError(f"step config: not a byte string of at most {MAX_STEP_CONFIG_BYTES} bytes")
        try:
            wire = msgpack.unpackb(data, raw=False, strict_map_key=True)
        except Exception as error:  # msgpack raises several unrelated types for bad bytes
            raise StepError(f"step config: not valid msgpack: {error}") from None
        fields = {"kind", "v", "algorithm", "optimizer", "learning_rate", "warmup_steps", "grad_clip", "temperature",
                  "max_new_tokens", "grpo", "reference", "betas", "eps", "weight_decay"}
        if not isinstance(wire, dict) or set(wire) != fields:
            raise StepError(f"step config: expected a map of exactly {sorted(fields)}")
        if (wire["kind"], wire["v"], wire["algorithm"], wire["optimizer"]) != (
                STEP_CONFIG_KIND, STEP_CONFIG_VERSION, "grpo", "adamw"):
            raise StepError("step config: unknown kind, version, algorithm or optimizer")
        try:
            grpo_wire = take(wire, "grpo", dict)
            grpo_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
            if set(grpo_wire) != grpo_fields:
                raise FieldError("grpo", f"expected exactly {sorted(grpo_fields)}")
            grpo = GRPOConfig(
                advantage=text(grpo_wire, "advantage", 16), aggregation=text(grpo_wire, "aggregation", 16),
                eps_low=real(grpo_wire, "eps_low", "grpo."), eps_high=real(grpo_wire, "eps_high", "grpo."),
                kl_beta=real(grpo_wire, "kl_beta", "grpo."), is_cap=real(grpo_wire, "is_cap", "grpo."),
                std_eps=real(grpo_wire, "std_eps", "grpo."),
                iterations=integer(grpo_wire, "iterations", 1, 64, "grpo."))
            betas = take(wire, "betas", list)
            if len(betas) != 2 or not all(isinstance(b, float) for b in betas):
                raise FieldError("betas", "expected two floats")
            config = cls(
                learning_rate=real(wire, "learning_rate"), warmup_steps=integer(wire, "warmup_steps", 1, U63),
                grad_clip=real(wire, "grad_clip"), temperature=real(wire, "temperature"),
                max_new_tokens=integer(wire, "max_new_tokens", 1, 2**20), grpo=grpo,
                reference=take(wire, "reference", bytes), betas=(betas[0], betas[1]), eps=real(wire, "eps"),
                weight_decay=real(wire, "weight_decay"))
        except (FieldError, ValueError) as error:  # ConfigError is a ValueError
            raise StepError(f"step config: {error}") from None
        if config.to_bytes() != data:
            raise StepError("step config: not in canonical encoding")
        return config


# -- the optimizer and its state file (specs/training.md §2) ---------------------------------------

def optimizer_for(network: torch.nn.Module, config: StepConfig) -> torch.optim.AdamW:
    # The fused kernel (CPU and CUDA): 2.8 ms a step here against 8.7 ms for the default
    # per-tensor loop and 13.0 ms for foreach, on the 3.3M-parameter base model.
    return torch.optim.AdamW(network.parameters(), lr=config.learning_rate, betas=config.betas, eps=config.eps,
                             weight_decay=config.weight_decay, fused=True)


def optimizer_tensors(network: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The optimizer's state by ``parameter.slot``, float32 on the host: the live tensors
    themselves where they are that already (no copy: at 0.5B parameters a copy is 4 GB)."""
    tensors = {}
    for name, parameter in network.named_parameters():
        for slot, value in optimizer.state.get(parameter, {}).items():
            if slot not in OPTIMIZER_SLOTS:
                raise StepError(f"optimizer state has slot {slot!r}; a step's file holds only {OPTIMIZER_SLOTS}")
            tensors[f"{name}.{slot}"] = value.detach().to(HOST, torch.float32).contiguous()
    return tensors


def optimizer_bytes(network: torch.nn.Module, optimizer: torch.optim.Optimizer) -> bytes:
    """The optimizer's state as one safetensors file, each tensor named by its parameter and
    slot: the same state gives the same bytes (safetensors sorts the names). Serialized from
    the live tensors: the file is the one optimizer-sized copy made (bench/results/qwen0.5b.json
    ``optimizer_bytes``: peak RSS before and after)."""
    return save_tensors(optimizer_tensors(network, optimizer))


def load_optimizer_bytes(network: torch.nn.Module, optimizer: torch.optim.Optimizer, data: bytes) -> None:
    """Set ``optimizer``'s state from a file of :func:`optimizer_bytes`, checked whole first:
    every name a parameter and slot of ``network``, every shape the parameter's, all of a
    parameter's slots or none."""
    try:
        tensors = load_tensors(data)
    except (SafetensorError, ValueError) as error:
        raise StepError(f"optimizer state: not a safetensors file: {error}") from None
    parameters = dict(network.named_parameters())
    state: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        name, _, slot = key.rpartition(".")
        if name not in parameters or slot not in OPTIMIZER_SLOTS or tensor.dtype != torch.float32:
            raise StepError(f"optimizer state: {key[:80]!r} is no float32 slot of a parameter of the model")
        expected = () if slot == "step" else parameters[name].shape
        if tensor.shape != expected:
            raise StepError(f"optimizer state: {key!r} has shape {tuple(tensor.shape)}, expected {tuple(expected)}")
        state.setdefault(name, {})[slot] = tensor
    partial = [name for name, slots in state.items() if set(slots) != set(OPTIMIZER_SLOTS)]
    if partial:
        raise StepError(f"optimizer state: parameter {partial[0]!r} lacks some of {OPTIMIZER_SLOTS}")
    optimizer.state.clear()
    # A fused (or capturable) optimizer keeps its step count on the parameter's device, as torch's
    # own load_state_dict puts it; on a GPU the fused kernel reads it there. On a CPU both are the CPU.
    on_device = any(g.get("fused") or g.get("capturable") for g in optimizer.param_groups)
    for name, slots in state.items():
        parameter = parameters[name]
        optimizer.state[parameter] = {slot: (t if slot == "step" and not on_device else t.to(parameter.device)).clone()
                                      for slot, t in slots.items()}


# -- the step ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PolicyForward:
    """One forward pass of the policy, with its graph, over whole rollouts: what GRPO's loss
    needs, and the hidden states and logits the verifier can check the same rollouts against."""

    rows: dict[bytes, int]  # a rollout's signature -> its row
    logprobs: torch.Tensor  # (B, T) log pi(token | prefix) at the sampling temperature, 0 on padding
    mask: torch.Tensor  # (B, T) real completion tokens
    behaviour: torch.Tensor  # (B, T) the behaviour logprobs the rollouts recorded
    recomputed: list[Prefilled]  # the verifier's view of the same pass, when captured

    def select(self, rollouts: list[Rollout]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(logprobs, mask, behaviour)`` of these rollouts, in their order, graph kept, as wide
        as their longest completion (so any pass over the same rollouts has the same shape)."""
        rows = torch.tensor([self.rows[r.signature] for r in rollouts], device=self.logprobs.device)
        width = max(len(r.completion_tokens) for r in rollouts)
        return self.logprobs[rows, :width], self.mask[rows, :width], self.behaviour[rows, :width]


def policy_forward(network: torch.nn.Module, rollouts: list[Rollout], temperature: float, pad: int,
                   *, capture_hidden: bool = False) -> PolicyForward:
    """Run ``network`` over the rollouts' prompts and completions under the caller's grad mode.

    The logits are divided by the sampling temperature, so the logprobs are those of the same
    distribution the sampler drew from and the behaviour logprobs were recorded under.
    """
    continued = continue_prompts(network, [list(r.prompt_tokens) for r in rollouts],
                                 [list(r.completion_tokens) for r in rollouts], pad, capture_hidden=capture_hidden)
    mask = continued.mask.bool()
    behaviour = torch.zeros(mask.shape, device=HOST)
    for b, r in enumerate(rollouts):
        behaviour[b, : len(r.behaviour_logprobs)] = torch.tensor(r.behaviour_logprobs, device=HOST)
    behaviour = behaviour.to(mask.device)
    return PolicyForward({r.signature: b for b, r in enumerate(rollouts)},
                         token_logprobs(continued, temperature).masked_fill(~mask, 0.0), mask, behaviour,
                         prefilled(continued) if capture_hidden else [])



def grpo_step(network: torch.nn.Module, optimizer: torch.optim.Optimizer, groups: list[list[Rollout]],
              weights: list[float], config: StepConfig, step_index: int, pad: int, *,
              reference: torch.nn.Module | None = None, track_kl: bool = False, forward: Any = None,
              informative: list[bool] | None = None, rewards: list[list[float]] | None = None) -> dict[str, float]:
    """One GRPO step on whole groups, in place; returns its stats.

    ``rewards`` (per group, per record) replaces the records' own where a record's reward is
    not all it claims: a private task's, whose correctness the answer holder proved
    (vrl.zk.training_rewards, specs/zk.md §11).

    ``weights`` (one per group, finite, >= 0: the admission weights) scale each group's
    advantages. ``reference`` is pi_ref, needed when ``config.grpo.kl_beta > 0``; with
    ``track_kl`` and beta 0 the KL is measured without entering the loss. ``forward``, a
    :func:`vrl.rl.train.policy_forward` of the current weights over every informative group,
    and ``informative``, the groups' :func:`~vrl.rl.grpo.informative_groups`, only save work:
    the step is the same without them.
    """
    if len(weights) != len(groups):
        raise ValueError(f"{len(weights)} weights for {len(groups)} groups")
    stats = {"groups_used": 0, "groups_zero_variance": 0, "loss": 0.0, "kl": 0.0, "clip_fraction": 0.0,
             "is_weight_mean": 1.0, "is_truncated_fraction": 0.0}
    if not groups:
        return stats
    table = torch.tensor([[r.reward for r in g] for g in groups] if rewards is None else rewards, device=HOST)
    keep = informative_groups(table) if informative is None else torch.tensor(informative, device=HOST)
    stats["groups_zero_variance"] = int((~keep).sum())
    if not bool(keep.any()):
        return stats  # no gradient at all: the weights and the optimizer stay as they were
    groups = [g for g, k in zip(groups, keep.tolist()) if k]
    weights = [w for w, k in zip(weights, keep.tolist()) if k]
    advantages = group_advantages(table[keep], config.grpo.advantage, config.grpo.std_eps)
    advantages = weight_advantages(advantages, torch.tensor(weights, dtype=advantages.dtype, device=HOST)).reshape(-1)
    rollouts = [r for g in groups for r in g]
    ref_logprobs = None
    if reference is not None and (config.grpo.kl_beta > 0 or track_kl):
        with torch.no_grad():  # pi_ref never changes: one pass serves every iteration
            ref_logprobs, _, _ = policy_forward(reference, rollouts, config.temperature, pad).select(rollouts)
    if config.grpo.kl_beta > 0 and ref_logprobs is None:
        raise ValueError("a reference policy is required when grpo.kl_beta > 0")
    for group in optimizer.param_groups:
        group["lr"] = config.learning_rate_at(step_index)
    old_logprobs = None
    totals: dict[str, float] = {}
    for iteration in range(config.grpo.iterations):  # mu steps on one batch, GRPO Algorithm 1
        if forward is None or iteration > 0:
            forward = policy_forward(network, rollouts, config.temperature, pad)
        logprobs, mask, behaviour = forward.select(rollouts)
        if iteration == 0 and config.grpo.iterations > 1:
            old_logprobs = logprobs.detach()  # pi_old: the policy that the batch was drawn for
        # The KL enters the loss only with a weight: measured at beta 0 it would add 0 x its
        # gradient, which is not always 0 (0 x inf), and a replay must not depend on track_kl.
        in_loss = ref_logprobs if config.grpo.kl_beta > 0 else None
        loss, loss_stats = policy_loss(logprobs, behaviour, advantages, mask, config.grpo, ref_logprobs=in_loss,
                                       max_completion_tokens=config.max_new_tokens, old_logprobs=old_logprobs)
        if in_loss is None and ref_logprobs is not None:
            loss_stats["kl"] = _mean_k3(logprobs.detach(), ref_logprobs, mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        torch.nn.utils.clip_grad_norm_(network.parameters(), config.grad_clip)
        optimizer.step()
        for name, value in {**loss_stats, "loss": float(loss.detach())}.items():
            totals[name] = totals.get(name, 0.0) + value
    means = {name: value / config.grpo.iterations for name, value in totals.items()}
    return {**stats, **means, "groups_used": len(groups)}


def _mean_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> float:
    """The k3 estimate of KL(pi_theta || pi_ref) per completion token (Schulman 2020)."""
    keep = mask.bool()
    log_ratio = (ref_logprobs - logprobs).masked_fill(~keep, 0.0)
    return mean_k3(k3_estimate(log_ratio), keep, keep.sum().clamp(min=1))


# -- replaying a step (specs/training.md §4) ----------------------------------------------------------

# How far a replay on another platform may land from the announced weights, as the share of the
# step itself: ||theta_claimed - theta_replay|| / ||theta_replay - theta_parent|| (and the same
# for the optimizer moments). Calibrated by bench/results/replay.json (python bench/replay.py
# --model quick --model base: 6 steps of each model with the node trainer's step config, 12
# groups of 8; this AMD EPYC, CPU only). The largest honest drift was 1.65e-4 (the base model's
# batch forwarded one rollout at a time against whole; AVX2 against AVX-512: 1.39e-4; 2 threads
# against 1: 2.5e-5; optimizer moments at most 4e-8). The smallest dishonest change of a group
# drifted 4.5e-2 (a foreign group in place of an admitted one; an admitted group with a
# gradient dropped: 7.5e-2), and a learning rate off by a fraction e drifts e (0.1%: 1.01e-3).
# 1e-3 stands 6x above the worst honest drift, room for what was not measured (Intel's MKL,
# longer completions, a GPU), and 45x below the smallest group change; it catches a learning
# rate 0.1% off, just, and 0.2% off with 2x to spare. No tolerance sees an admitted group
# without a gradient (all its rewards equal) dropped: that only rescales the other weights,
# drift 1.1e-5 to 6.4e-5, inside honest drift: the group had no gradient to give the step.
DRIFT_TOLERANCE = 1e-3


@dataclass(frozen=True)
class StepReplay:
    """What replaying a step gave, against what was announced: the replay's model hash and
    optimizer file hash, and how far the announced weights and optimizer moments lie from the
    replay's, each relative to the size of the replayed step (0 when bit-identical)."""

    model_hash: bytes
    optimizer_hash: bytes
    drift: float
    optimizer_drift: float
    weights_exact: bool  # the announced weights are the replay's, bit for bit
    optimizer_exact: bool  # the announced optimizer file is the replay's, byte for byte
    stats: dict[str, float]

    @property
    def exact(self) -> bool:
        return self.weights_exact and self.optimizer_exact

    def weights_agree(self, same_platform: bool, tolerance: float = DRIFT_TOLERANCE) -> bool:
        """Bit-exact on the announcing trainer's platform; within ``tolerance`` elsewhere."""
        return self.weights_exact or (not same_platform and self.drift <= tolerance)

    def optimizer_agrees(self, same_platform: bool, tolerance: float = DRIFT_TOLERANCE) -> bool:
        return self.optimizer_exact or (not same_platform and self.optimizer_drift <= tolerance)

    def agrees(self, same_platform: bool, tolerance: float = DRIFT_TOLERANCE) -> bool:
        return self.weights_agree(same_platform, tolerance) and self.optimizer_agrees(same_platform, tolerance)


def replay(parent: torch.nn.Module, optimizer_state: bytes, groups: list[list[Rollout]], weights: list[float],
           config: StepConfig, step_index: int, pad: int, *, reference: torch.nn.Module | None = None,
           rewards: list[list[float]] | None = None) -> tuple[torch.nn.Module, torch.optim.Optimizer, dict[str, float]]:
    """Run the step again on a copy of ``parent``: ``(network, optimizer, stats)`` after it."""
    network = copy.deepcopy(parent).eval().requires_grad_(True)
    optimizer = optimizer_for(network, config)
    load_optimizer_bytes(network, optimizer, optimizer_state)
    stats = grpo_step(network, optimizer, groups, weights, config, step_index, pad, reference=reference,
                      rewards=rewards)
    return network.requires_grad_(False), optimizer, stats


# Elements per float64 block of a distance: a tensor's float64 copies are made a block at a
# time, not whole (the 0.5B shape's embedding is 136M parameters: 1.1 GB a float64 copy, three
# at once before; bench/results/optimizer-memory.json).
DISTANCE_BLOCK = 1 << 22


def _squared_distance(a: torch.Tensor, b: torch.Tensor | None) -> float:
    """``sum((a - b)^2)`` in float64 (``b`` None: zeros), a block at a time."""
    a = a.detach().reshape(-1)
    b = None if b is None else b.detach().reshape(-1)
    total = 0.0
    for start in range(0, a.numel(), DISTANCE_BLOCK):
        block = a[start:start + DISTANCE_BLOCK].double()
        if b is not None:
            block -= b[start:start + DISTANCE_BLOCK].double()
        total += float(block.pow_(2).sum())
    return total


def relative_drift(parent: dict[str, torch.Tensor], replayed: dict[str, torch.Tensor],
                   claimed: dict[str, torch.Tensor]) -> float:
    """``||claimed - replayed|| / ||replayed - parent||`` over all tensors together (float64
    sums). 0 when claimed is replayed; inf when the replay moved nothing and the claim did."""
    if set(claimed) != set(replayed) or any(claimed[k].shape != replayed[k].shape or (
            k in parent and parent[k].shape != replayed[k].shape) for k in replayed):
        return math.inf
    off = sum(_squared_distance(claimed[k], replayed[k]) for k in replayed)
    step = sum(_squared_distance(replayed[k], parent[k]) if k in parent else _squared_distance(replayed[k], None)
               for k in replayed)
    if off == 0.0:
        return 0.0
    return math.sqrt(off / step) if step > 0 else math.inf


def compare(parent: torch.nn.Module, parent_optimizer: bytes, network: torch.nn.Module,
            optimizer: torch.optim.Optimizer, claimed: dict[str, torch.Tensor], claimed_optimizer: bytes,
            stats: dict[str, float], dtype_name: str = "float32") -> StepReplay:
    """A replay (``network``, ``optimizer``) against the announced weights and optimizer file."""
    replayed_state = {k: v.detach().cpu() for k, v in network.state_dict().items()}
    parent_state = {k: v.detach().cpu() for k, v in parent.state_dict().items()}
    replayed_optimizer = optimizer_bytes(network, optimizer)
    try:
        claimed_moments = load_tensors(claimed_optimizer)
    except (SafetensorError, ValueError):
        claimed_moments = {}
    # The live state the file was just made from, not the file read back: the same float32
    # values, and one optimizer-sized copy fewer.
    replayed_moments = optimizer_tensors(network, optimizer)
    before = load_tensors(parent_optimizer) if parent_optimizer else {}
    weights_exact = set(claimed) == set(replayed_state) and all(
        torch.equal(claimed[k].detach().cpu(), v) for k, v in replayed_state.items())
    return StepReplay(model_hash=weights_hash(network, dtype_name),
                      optimizer_hash=hashlib.sha256(replayed_optimizer).digest(),
                      drift=relative_drift(parent_state, replayed_state, claimed),
                      optimizer_drift=relative_drift(before, replayed_moments, claimed_moments),
                      weights_exact=weights_exact, optimizer_exact=replayed_optimizer == claimed_optimizer, stats=stats)
