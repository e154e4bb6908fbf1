"""GRPO on verified rollouts: group advantages, staleness, and the clipped, off-policy-corrected loss.

One page, no classes (its settings, GRPOConfig, are in vrl.rl.config). References, cited per line below:
  GRPO      DeepSeekMath, arXiv 2402.03300 §4.1 (group-relative advantage, eq. 3 objective, eq. 4 KL)
  Dr. GRPO  Liu et al., arXiv 2503.20783 §3.1 (no std division, no 1/|o_i|, constant normaliser)
  DAPO      Yu et al., arXiv 2503.14476 §3.1 clip-higher, §3.2 dynamic sampling, §3.3 token-level loss
  k3        Schulman 2020, "Approximating KL divergence" (unbiased, always >= 0 estimator)
  TIS       Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"
"""

from __future__ import annotations

import torch
from torch import Tensor

from vrl.rl.config import ADVANTAGES, GRPOConfig


def group_advantages(rewards: Tensor, mode: str = "std", std_eps: float = 1e-4) -> Tensor:
    """(num_groups, G) rewards -> same-shape advantages, each reward against its own group.

    The std is the unbiased sample std (torch's default, as TRL's ``.std()``). A group of one
    has no baseline: its advantage is 0 rather than the NaN that an unbiased std of one gives.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (num_groups, G), got shape {tuple(rewards.shape)}")
    if mode not in ADVANTAGES:
        raise ValueError(f"mode must be one of {ADVANTAGES}, got {mode!r}")
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # r_i - mean(r), GRPO §4.1.2 / Dr. GRPO
    if mode == "mean" or rewards.shape[1] == 1:
        return centred  # Dr. GRPO §3.1 drops the std (and a single sample centres to exactly 0)
    return centred / (rewards.std(dim=1, keepdim=True) + std_eps)  # GRPO §4.1.2, eps as TRL


def informative_groups(rewards: Tensor) -> Tensor:
    """True where a group's rewards are not all equal; the rest have zero advantage, no gradient (DAPO §3.2)."""
    return (rewards != rewards[:, :1]).any(dim=1)


def weight_advantages(advantages: Tensor, weights: Tensor) -> Tensor:
    """Scale each group's advantages by a finite weight >= 0 (e.g. node reputation); a sign never flips."""
    if weights.shape != advantages.shape[:1]:
        raise ValueError(f"weights must be ({advantages.shape[0]},), got shape {tuple(weights.shape)}")
    if not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()):
        raise ValueError("weights must be finite and >= 0")
    return advantages * weights.unsqueeze(1)


def is_fresh(rollout_version: int, trainer_version: int, max_staleness: int) -> bool:
    """A rollout is usable when it lags the trainer by 0..max_staleness versions; one from the future is not."""
    return 0 <= trainer_version - rollout_version <= max_staleness


def k3_estimate(log_ratio: Tensor) -> Tensor:
    """Schulman's (2020) k3 estimate of KL per token, ``r - log r - 1`` with ``log r`` =
    ``log_ratio`` (log pi_ref - log pi_theta): unbiased, and >= 0 for every real input."""
    return torch.exp(log_ratio) - log_ratio - 1


def mean_k3(k3: Tensor, mask: Tensor, tokens: Tensor) -> float:
    """The mean k3 over the masked tokens, as a number to report. Each term is >= 0 exactly,
    but exp(r) - r - 1 rounds to -1.1e-16 near r = 0 (Hypothesis found one), so a term below
    0 is reported as the 0 it is; the loss itself uses the terms as computed."""
    return float((k3.clamp(min=0.0) * mask).sum() / tokens)


def policy_loss(
    logprobs: Tensor,
    behaviour_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    config: GRPOConfig,
    ref_logprobs: Tensor | None = None,
    max_completion_tokens: int | None = None,
    old_logprobs: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Scalar GRPO loss over (B, T) token logprobs, and python-float stats.

    pi_old is ``old_logprobs`` when given (several optimiser steps on one batch: pass the logprobs
    from before the first step), else ``logprobs.detach()`` (one step per batch, so r == 1 in value
    and the clip never binds). mu = ``behaviour_logprobs``, recorded by the sampling node, maybe
    from an older policy version; TIS corrects pi_old vs mu. ``ref_logprobs`` is required iff
    ``config.kl_beta > 0``; when given with beta 0 the KL is still reported. Padded positions
    (mask 0) may hold anything, even -inf: they are zeroed before any arithmetic.
    """
    if logprobs.dim() != 2 or advantages.shape != logprobs.shape[:1]:
        shapes = f"{tuple(logprobs.shape)}, {tuple(advantages.shape)}"
        raise ValueError(f"need logprobs (B, T) and advantages (B,), got {shapes}")
    given = dict(behaviour_logprobs=behaviour_logprobs, mask=mask, ref_logprobs=ref_logprobs)
    for name, t in {**given, "old_logprobs": old_logprobs}.items():
        if t is not None and t.shape != logprobs.shape:
            raise ValueError(f"{name} must have shape {tuple(logprobs.shape)}, got {tuple(t.shape)}")
    if config.kl_beta > 0 and ref_logprobs is None:
        raise ValueError("ref_logprobs is required when GRPOConfig.kl_beta > 0")
    constant = config.aggregation == "constant"
    if constant and (not isinstance(max_completion_tokens, int) or max_completion_tokens <= 0):
        raise ValueError("max_completion_tokens (an int > 0) is required for aggregation 'constant'")

    keep = mask.bool()
    def pad(t: torch.Tensor) -> torch.Tensor:
        return t.masked_fill(~keep, 0.0)

    logp = pad(logprobs)
    old = pad((logprobs if old_logprobs is None else old_logprobs).detach())
    mu = pad(behaviour_logprobs.detach())
    adv = advantages.detach().to(logp).unsqueeze(1)  # A_i broadcast over o_i's tokens, GRPO §4.1.2

    ratio = torch.exp(logp - old)  # r_t = pi_theta / pi_old, GRPO eq. 3
    clipped = ratio.clamp(1 - config.eps_low, 1 + config.eps_high)  # decoupled clip range, DAPO §3.1
    surrogate = torch.minimum(ratio * adv, clipped * adv)  # pessimistic PPO bound, GRPO eq. 3
    raw_is = torch.exp(old - mu)  # pi_old / mu, the sampler-vs-trainer mismatch (TIS)
    is_weight = raw_is.clamp(max=config.is_cap)  # min(pi_old/mu, C), detached (TIS)
    per_token = -is_weight * surrogate
    k3 = torch.zeros_like(logp)
    if ref_logprobs is not None:
        log_ref_ratio = pad(ref_logprobs.detach()) - logp  # log(pi_ref / pi_theta)
        k3 = k3_estimate(log_ref_ratio)  # GRPO eq. 4
        per_token = per_token + config.kl_beta * k3  # beta * D_KL, GRPO eq. 3

    m = keep.to(logp.dtype)
    masked = per_token * m
    tokens = m.sum()
    if config.aggregation == "token":
        loss = masked.sum() / tokens.clamp(min=1)  # sum over all tokens / total tokens, DAPO §3.3
    elif config.aggregation == "sequence":
        loss = (masked.sum(1) / m.sum(1).clamp(min=1)).mean()  # 1/G sum_i 1/|o_i| sum_t, GRPO eq. 3
    else:
        assert max_completion_tokens is not None  # required for 'constant', checked above
        loss = masked.sum() / (logp.shape[0] * max_completion_tokens)  # constant normaliser, Dr. GRPO §3.1

    n = tokens.clamp(min=1)
    binds = ((ratio > 1 + config.eps_high) & (adv > 0)) | ((ratio < 1 - config.eps_low) & (adv < 0))
    stats = {
        "clip_fraction": float((binds & keep).sum() / n),  # tokens where min() picks the clipped branch
        "kl": mean_k3(k3.detach(), m, n),
        "is_weight_mean": float((is_weight * m).sum() / n),
        "is_truncated_fraction": float(((raw_is > config.is_cap) & keep).sum() / n),
        "tokens": float(tokens),
    }
    return loss, stats
