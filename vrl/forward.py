"""The two forward paths of the protocol: batched KV-cache decoding (the prover) and one
batched prefill (the verifier). Both capture the final hidden state, the LM head's input,
with a forward pre-hook, so they work for any causal LM whose head is its output embedding
(and keep whatever the model does after the head, such as logit soft-capping).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from proofs.sampler import SamplingParams, sample
from vrl.model import Model


@contextmanager
def _capture_head_input(model: Model):
    captured: list[torch.Tensor] = []

    def hook(_module: torch.nn.Module, args: tuple) -> None:
        captured.append(args[0].detach())

    handle = model.network.get_output_embeddings().register_forward_pre_hook(hook)
    try:
        yield captured
    finally:
        handle.remove()


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that ignore left padding (padding gets 1, as transformers does)."""
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)


def right_padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows padded on the right, and their attention mask: the layout training uses."""
    width = max(map(len, rows))
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        input_ids[b, : len(row)] = torch.tensor(row)
        mask[b, : len(row)] = 1
    return input_ids, mask


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
    A finished sequence keeps being fed padding (masked) until every sequence is done.
    """
    batch = len(prompts)
    width = max(map(len, prompts))
    pad = model.pad_token_id
    input_ids = torch.full((batch, width), pad, dtype=torch.long)
    mask = torch.zeros((batch, width), dtype=torch.long)
    for b, prompt in enumerate(prompts):
        input_ids[b, width - len(prompt) :] = torch.tensor(prompt)
        mask[b, width - len(prompt) :] = 1
    positions = _positions(mask)
    stops = set(params.stop_token_ids)
    tokens: list[list[int]] = [[] for _ in range(batch)]
    logprobs: list[list[float]] = [[] for _ in range(batch)]
    rows: list[list[torch.Tensor]] = [[] for _ in range(batch)]
    finish: list[str | None] = [None] * batch
    closed = [False] * batch
    cache = DynamicCache()
    step = 0
    with _capture_head_input(model) as captured:
        while True:
            captured.clear()
            out = model.network(
                input_ids=input_ids, attention_mask=mask, position_ids=positions,
                past_key_values=cache, use_cache=True, logits_to_keep=1,
            )
            hidden = captured[-1][:, -1, :].float()
            sampling = [b for b in range(batch) if finish[b] is None]
            for b in range(batch):
                if not closed[b] and (finish[b] is None or len(rows[b]) == len(tokens[b])):
                    rows[b].append(hidden[b].clone())
                    closed[b] = finish[b] is not None
            if sampling:
                chosen, chosen_logprobs = sample(
                    out.logits[sampling, -1, :], [seeds[b] for b in sampling], [step] * len(sampling), params
                )
                for b, token, logprob in zip(sampling, chosen.tolist(), chosen_logprobs.tolist()):
                    tokens[b].append(token)
                    logprobs[b].append(logprob)
                    if token in stops:
                        finish[b] = "stop"
                    elif len(tokens[b]) == params.max_new_tokens:
                        finish[b] = "length"
            if all(closed):
                break
            fed = torch.tensor([b in sampling for b in range(batch)], dtype=torch.long)
            input_ids = torch.tensor([[tokens[b][-1] if fed[b] else pad] for b in range(batch)])
            positions = positions[:, -1:] + fed[:, None]
            mask = torch.cat([mask, fed[:, None]], dim=1)
            step += 1
            if on_step is not None:
                on_step()
    return [
        Decoded(tokens[b], np.asarray(logprobs[b], dtype=np.float32), finish[b], torch.stack(rows[b]))
        for b in range(batch)
    ]


@dataclass(frozen=True, slots=True)
class Prefilled:
    """The verifier's recomputation for one rollout."""

    hidden: torch.Tensor  # (n + 1, hidden), aligned with Decoded.hidden
    logits: torch.Tensor  # (n, vocab) float32: the logits that chose each completion token


@torch.inference_mode()
def prefill(model: Model, sequences: list[tuple[list[int], list[int]]]) -> list[Prefilled]:
    """One forward pass over ``prompt + completion`` for a batch (left-padded).

    Only the last ``n + 1`` positions of each sequence reach the LM head (``logits_to_keep``),
    so the prompt costs attention and MLP work but no vocabulary projection.
    """
    lengths = [len(p) + len(c) for p, c in sequences]
    width = max(lengths)
    keep = max(len(c) for _, c in sequences) + 1
    input_ids = torch.full((len(sequences), width), model.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for b, (prompt, completion) in enumerate(sequences):
        input_ids[b, width - lengths[b] :] = torch.tensor([*prompt, *completion])
        mask[b, width - lengths[b] :] = 1
    with _capture_head_input(model) as captured:
        out = model.network(
            input_ids=input_ids, attention_mask=mask, position_ids=_positions(mask),
            use_cache=False, logits_to_keep=keep,
        )
    hidden = captured[-1].float()
    results = []
    for b, (_, completion) in enumerate(sequences):
        n = len(completion)
        results.append(Prefilled(hidden[b, keep - n - 1 :].clone(), out.logits[b, keep - n - 1 : keep - 1].float()))
    return results
