"""The forward paths: batched KV-cache decoding (the prover), and one batched pass over prompts
and their continuations (the verifier's prefill, the trainer's GRPO forward, evaluation). They
capture the final hidden state, the LM head's input, with a forward pre-hook, so they work for
any causal LM whose head is its output embedding (and keep whatever the model does after the
head, such as logit soft-capping).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from proofs.sampler import sample
from proofs.sampling_params import SamplingParams
from vrl.rollouts.model import Model, network_device

#: Where inputs are assembled before one copy each to the network's device, and where the
#: sampler and the commitments run (on every device, so their results agree everywhere).
HOST = torch.device("cpu")


@contextmanager
def _capture_head_input(network: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    captured: list[torch.Tensor] = []

    def hook(_module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        captured.append(args[0].detach())

    # A transformers model's method, which torch's Module.__getattr__ types as a tensor or module.
    head: torch.nn.Module = network.get_output_embeddings()  # type: ignore[operator]
    handle = head.register_forward_pre_hook(hook)
    try:
        yield captured
    finally:
        handle.remove()


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that ignore left padding (padding gets 1, as transformers does)."""
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)


def _distinct_prompts(prompts: list[list[int]], pad: int,
                      device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(which, input_ids, mask)`` on ``device``: the distinct prompts left-padded, and for
    every row the index of its prompt among them (GRPO groups repeat one prompt
    ``group_size`` times)."""
    distinct: dict[tuple[int, ...], int] = {}
    which = torch.tensor([distinct.setdefault(tuple(p), len(distinct)) for p in prompts], device=HOST)
    width = max(map(len, distinct))
    input_ids = torch.full((len(distinct), width), pad, dtype=torch.long, device=HOST)
    mask = torch.zeros_like(input_ids)
    for row, prompt in enumerate(distinct):
        input_ids[row, width - len(prompt) :] = torch.tensor(prompt, device=HOST)
        mask[row, width - len(prompt) :] = 1
    return which.to(device), input_ids.to(device), mask.to(device)


def right_padded(rows: list[list[int]], pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows padded on the right, and their attention mask, on ``device``: the layout
    training uses. Built on the CPU and moved in one copy each."""
    width = max(map(len, rows))
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long, device=HOST)
    mask = torch.zeros((len(rows), width), dtype=torch.long, device=HOST)
    for b, row in enumerate(rows):
        input_ids[b, : len(row)] = torch.tensor(row, device=HOST)
        mask[b, : len(row)] = 1
    return input_ids.to(device), mask.to(device)


@dataclass(frozen=True, slots=True)
class Decoded:
    """One sampled completion as the prover saw it."""

    tokens: list[int]
    logprobs: np.ndarray  # float32, behaviour logprob of each token
    finish_reason: str
    hidden: torch.Tensor  # (len(tokens) + 1, hidden): the rows that chose each token, then one more


@torch.inference_mode()
def decode(
    model: Model,
    prompts: list[list[int]],
    seeds: list[bytes],
    params: SamplingParams,
    on_step: Callable[[], None] | None = None,
) -> list[Decoded]:
    """Sample completions for a batch of prompts with a KV cache.

    Row ``j`` of a completion's hidden states is the LM-head input that chose token ``j``; the
    extra last row comes from feeding the last token once more, so that token is committed.
    A sequence leaves the batch (and the KV cache) as soon as that closing row is captured:
    completions of very different lengths then cost what their tokens cost, not what the
    longest one does.
    """
    batch = len(prompts)
    # Each distinct prompt is prefilled once; its KV cache is gathered for every row after.
    device = network_device(model.network)
    which, input_ids, mask = _distinct_prompts(prompts, model.pad_token_id, device)
    positions = _positions(mask)
    stops = set(params.stop_token_ids)
    tokens: list[list[int]] = [[] for _ in range(batch)]
    logprobs: list[list[float]] = [[] for _ in range(batch)]
    rows: list[list[torch.Tensor]] = [[] for _ in range(batch)]
    finish: list[str | None] = [None] * batch
    active = list(range(batch))  # the sequences in the batched forward, in batch order
    cache = DynamicCache()
    step = 0
    with _capture_head_input(model.network) as captured:
        while active:
            captured.clear()
            out = model.network(
                input_ids=input_ids, attention_mask=mask, position_ids=positions,
                past_key_values=cache, use_cache=True, logits_to_keep=1,
            )
            # One copy per step off the accelerator: the commitment and the sampler work on
            # the CPU (the sampler in float64, identically on every device).
            hidden = captured[-1][:, -1, :].float().to(HOST)
            logits = out.logits[:, -1, :].to(HOST)
            if step == 0:
                cache.batch_select_indices(which)
                positions, mask = positions[which], mask[which]
                which = which.to(HOST)
                hidden, logits = hidden[which], logits[which]
            for i, b in enumerate(active):
                rows[b].append(hidden[i].clone())  # chooses token `step`, or closes a finished sequence
            sampling = [i for i, b in enumerate(active) if finish[active[i]] is None]
            if sampling:
                chosen, chosen_logprobs = sample(
                    logits[sampling], [seeds[active[i]] for i in sampling], [step] * len(sampling), params
                )
                for i, token, logprob in zip(sampling, chosen.tolist(), chosen_logprobs.tolist()):
                    b = active[i]
                    tokens[b].append(token)
                    logprobs[b].append(logprob)
                    if token in stops:
                        finish[b] = "stop"
                    elif len(tokens[b]) == params.max_new_tokens:
                        finish[b] = "length"
            # A sequence that was not sampled this step has just had its closing row captured.
            kept = sampling
            if len(kept) < len(active):
                if kept:
                    cache.batch_select_indices(torch.tensor(kept, device=device))
                positions, mask = positions[kept], mask[kept]
                active = [active[i] for i in kept]
            if not active:
                break
            input_ids = torch.tensor([[tokens[b][-1]] for b in active], device=device)
            positions = positions[:, -1:] + 1
            mask = torch.cat([mask, torch.ones((len(active), 1), dtype=torch.long, device=device)], dim=1)
            step += 1
            if on_step is not None:
                on_step()
    reasons = [reason for reason in finish if reason is not None]
    assert len(reasons) == batch  # a sequence leaves the batch only once it has its reason
    return [
        Decoded(tokens[b], np.asarray(logprobs[b], dtype=np.float32), reasons[b], torch.stack(rows[b]))
        for b in range(batch)
    ]


@dataclass(frozen=True, slots=True)
class Continued:
    """A forward pass over ``prompt + continuation`` rows, aligned on the continuations.

    Position ``j`` of ``logits`` and ``hidden`` is what the model computed right before
    continuation token ``j``: position 0 is the last prompt token, position ``j`` the
    continuation token ``j - 1``. Both have one position more than ``tokens``, so the last real
    one of a row is the state after its last token.
    """

    tokens: torch.Tensor  # (B, W) continuation tokens, right-padded
    mask: torch.Tensor  # (B, W) 1 where a continuation token is real
    logits: torch.Tensor  # (B, W + 1, vocab)
    hidden: torch.Tensor | None  # (B, W + 1, hidden), the LM-head input, when captured


def continue_prompts(
    network: torch.nn.Module, prompts: list[list[int]], continuations: list[list[int]], pad: int,
    *, capture_hidden: bool = False,
) -> Continued:
    """Run the model over each prompt followed by its continuation, computing each distinct
    prompt once.

    GRPO groups share their prompt, so the distinct prompts go through the model first
    (left-padded) and their KV cache is then gathered for every row; the continuations follow
    in one right-padded pass over that cache. A group of 8 with a prompt longer than its
    completions costs about a third of a full pass over every row. Runs under the caller's
    grad mode: gradients reach the shared prompt through the gathered cache.
    """
    if not prompts or any(not p for p in prompts) or any(not c for c in continuations):
        raise ValueError("every row needs a non-empty prompt and continuation")
    device = network_device(network)
    which, prompt_ids, prompt_mask = _distinct_prompts(prompts, pad, device)
    tokens, mask = right_padded(continuations, pad, device)
    starts = torch.tensor([len(p) for p in prompts], device=device)
    cache = DynamicCache()
    with _capture_head_input(network) as captured:
        first = network(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=_positions(prompt_mask),
                        past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache.batch_select_indices(which)
        rest = network(input_ids=tokens, attention_mask=torch.cat([prompt_mask[which], mask], dim=1),
                       position_ids=starts[:, None] + torch.arange(tokens.shape[1], device=device),
                       past_key_values=cache, use_cache=True)
    hidden = torch.cat([captured[0][which], captured[1]], dim=1) if capture_hidden else None
    return Continued(tokens, mask, torch.cat([first.logits[which], rest.logits], dim=1), hidden)


def token_logprobs(continued: Continued, temperature: float) -> torch.Tensor:
    """``log pi(token_j | prefix)`` at ``temperature`` for every continuation token, (B, W);
    padding positions hold the logprob of the pad token, for the caller's mask to drop."""
    logits = continued.logits[:, :-1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, continued.tokens[..., None]).squeeze(-1)


@dataclass(frozen=True, slots=True)
class Prefilled:
    """The verifier's recomputation for one rollout."""

    hidden: torch.Tensor  # (n + 1, hidden), aligned with Decoded.hidden
    logits: torch.Tensor  # (n, vocab) float32: the logits that chose each completion token


def prefilled(continued: Continued) -> list[Prefilled]:
    """Per row, the verifier's view of a forward pass that captured the hidden states."""
    if continued.hidden is None:
        raise ValueError("the forward pass did not capture the hidden states")
    return [Prefilled(continued.hidden[b, : n + 1].detach().float().clone(), continued.logits[b, :n].detach().float())
            for b, n in enumerate(continued.mask.sum(dim=1).tolist())]


@torch.inference_mode()
def prefill(model: Model, sequences: list[tuple[list[int], list[int]]]) -> list[Prefilled]:
    """The verifier's recomputation: one batched forward over ``prompt + completion``."""
    return prefilled(continue_prompts(model.network, [p for p, _ in sequences], [c for _, c in sequences],
                                      model.pad_token_id, capture_hidden=True))
