"""The canonical sampler and its check (specs/sampler.md).

Sampling: temperature, then the optional top-k and top-p masks, then Gumbel-max with the
stateless noise of :mod:`proofs.prf`. Because the noise is a pure function of
``(sample_seed, position, token)``, a verifier that recomputes the logits by one prefill can
replay every race: the claimed token must have won it, up to a margin ``tau`` that absorbs
the honest numerical drift between a KV-cache decode and a batched prefill.

All arithmetic is float64 on logits that the model produced (in its compute dtype, cast up).
Margins are in raw-logit units (the race ``z/T + g`` multiplied by ``T``), so one tolerance
serves every temperature: the drift is a property of the logits, not of ``T``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from proofs import prf
from proofs.errors import UndefinedRace
from proofs.sampling_params import SamplingParams

#: Margin of a token that the masks exclude outright, or that the verifier's masks could
#: not have admitted even with the tolerance.
EXCLUDED = math.inf


def _check_racable(z: torch.Tensor, params: SamplingParams) -> None:
    """Refuse, before any race, what float64 cannot race (specs/sampler.md section 1): a logit
    that is not finite, or a ``z / T`` that overflows.

    Logits are float32, bf16 or fp16 cast up, so ``|z| < 2^128`` and ``z / T`` stays finite for
    every ``T >= 2^-896``: only absurd temperatures (or a model that emits inf or NaN logits)
    are refused. Past that, ``inf - inf`` makes NaN margins and logprobs, and a NaN compares
    false with every tolerance: a record at ``T = 5e-324`` was accepted whatever its tokens
    (issue 13). Division is monotone, so one ``max |z| / T`` decides for the whole batch."""
    if not bool(torch.isfinite(z).all()):
        raise UndefinedRace("the logits are not all finite")
    if z.numel() and not params.greedy and not math.isfinite(float(z.abs().max()) / params.temperature):
        raise UndefinedRace(f"z / T overflows float64 at T = {params.temperature!r}: the race is undefined")


#: ``ln 2``: the verifier's loosened top-p bound is capped at 2 (see :func:`_mass_bound`).
_LN2 = math.log(2.0)


def _mass_bound(params: SamplingParams, slack: float) -> float:
    """The top-p bound: ``p``, or on the verifier's side ``p * e^(2 slack / T)`` (specs/sampler.md
    section 4), computed in log space so it never overflows.

    A mass ``M_i`` is a prefix sum of a softmax, so it exceeds 1 by rounding at most, and any
    bound of 2 or more keeps every token exactly as the unbounded value would: the exponent is
    capped at ``ln 2``. Unbounded, ``e^(2 * 0.05 / 1e-4) = e^1000`` overflows float64 and
    ``math.exp`` raised OverflowError, killing ``vrl verify`` (issue 13). Below the cap the value
    is ``p * e^x`` up to rounding in its last bit, which a slack bound tolerates (section 1 says
    the same of the masses themselves)."""
    if not slack:
        return params.top_p
    return math.exp(min(math.log(params.top_p) + 2.0 * slack / params.temperature, _LN2))


def _allowed(logits: torch.Tensor, params: SamplingParams, slack: float = 0.0) -> torch.Tensor:
    """Boolean mask of the tokens the top-k / top-p masks keep, per row of float64 logits.

    A token is kept by top-k when fewer than ``k`` tokens beat its logit, and by top-p when the
    probability mass of the tokens that beat it is below ``p`` (the shortest prefix, in
    descending logit order, whose mass reaches ``p``). Ties share one fate, so the order among
    equal logits never decides membership. With ``slack > 0`` (the verifier's side) "beat"
    means "exceed by more than ``slack``", and the mass bound is loosened by ``exp(2 slack / T)``:
    a logit drift of at most ``slack`` scales every probability by at most that factor.
    """
    keep = torch.ones_like(logits, dtype=torch.bool)
    if params.greedy:
        return keep
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        keep &= logits + slack >= kth
    if params.top_p < 1.0:
        probs = torch.softmax(torch.where(keep, logits / params.temperature, -math.inf), dim=-1)
        keep &= _mass_above(logits, probs, slack) < _mass_bound(params, slack)
    return keep


def _mass_above(logits: torch.Tensor, probs: torch.Tensor, slack: float) -> torch.Tensor:
    """Per token, the probability mass of the tokens whose logit exceeds it by more than slack."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    cumulative = torch.cumsum(probs.gather(-1, order), dim=-1)
    cumulative = torch.cat([torch.zeros_like(cumulative[..., :1]), cumulative], dim=-1)
    # How many tokens exceed z + slack: a binary search in the ascending view of -logits.
    beaten_by = torch.searchsorted(
        (-sorted_logits).contiguous(), (-(logits + slack)).contiguous(), side="left"
    )
    return cumulative.gather(-1, beaten_by)


#: Rows of noise words materialised at once: ``rows x vocab`` float64 scores stay near 32 MiB
#: whatever the vocabulary, while a small vocabulary still gets every row of a batch in one go.
_RACE_BLOCK_ENTRIES = 1 << 22


def _races(
    scaled: npt.NDArray[np.float64], seeds: list[bytes], positions: list[int], reference: npt.NDArray[np.int64],
    slack: float,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Run one seeded race per row; returns ``(winner, best score, reference's score)`` per row.

    ``scaled`` is ``z/T`` with ``-inf`` outside the masks; row ``r`` races with the noise of
    ``(seeds[r], positions[r])``. The noise never exceeds the Gumbel value of the largest word
    drawn, so a token whose ``z/T`` plus that bound stays below the reference token's score
    (less ``slack``) cannot win, and its logarithms are never taken. This is exact, not an
    approximation: the result equals the full race over every token (winner ties go to the
    lowest id). Rows are processed in blocks, vectorized across rollouts and positions.
    """
    n_rows, vocab = scaled.shape
    winner = np.empty(n_rows, dtype=np.int64)
    best = np.empty(n_rows)
    mine = np.empty(n_rows)
    block = max(1, _RACE_BLOCK_ENTRIES // max(vocab, 1))
    for start in range(0, n_rows, block):
        rows = slice(start, min(start + block, n_rows))
        words = np.stack([prf.raw_words(seed, position, vocab)
                          for seed, position in zip(seeds[rows], positions[rows])])
        part, ref = scaled[rows], reference[rows]
        index = np.arange(len(ref))
        ceiling = prf.to_gumbel(words.max(axis=1))
        floor = part[index, ref] + prf.to_gumbel(words[index, ref]) - slack
        candidates = part + ceiling[:, None] >= floor[:, None]
        scores = np.full(part.shape, -np.inf)
        scores[candidates] = part[candidates] + prf.to_gumbel(words[candidates])
        winner[rows] = np.argmax(scores, axis=1)
        best[rows] = scores[index, winner[rows]]
        mine[rows] = scores[index, ref]
    return winner, best, mine


def sample(
    logits: torch.Tensor, seeds: list[bytes], positions: list[int], params: SamplingParams
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; returns ``(tokens, behaviour_logprobs)``.

    Row ``b`` of ``logits`` is position ``positions[b]`` of the rollout seeded ``seeds[b]``.
    The winner is ``argmax_j z_j/T + g_j`` over the kept tokens, ties to the lowest id. The
    behaviour logprob is ``log softmax(z/T)`` over the kept tokens (0 for greedy decoding).
    """
    z = logits.detach().to(torch.float64).cpu()
    if params.greedy:
        tokens = torch.argmax(z, dim=-1)
        return tokens, torch.zeros(len(tokens), dtype=torch.float64, device=z.device)
    _check_racable(z, params)
    keep = _allowed(z, params)
    scaled = torch.where(keep, z / params.temperature, -math.inf).numpy()
    winners, _, _ = _races(scaled, list(seeds), list(positions), np.argmax(scaled, axis=1), 0.0)
    tokens = torch.from_numpy(winners)
    return tokens, _logprob_of(z, keep, tokens, params)


def _logprob_of(
    z: torch.Tensor, keep: torch.Tensor, tokens: torch.Tensor, params: SamplingParams
) -> torch.Tensor:
    if params.greedy:
        return torch.zeros(len(tokens), dtype=torch.float64, device=z.device)
    scaled = torch.where(keep, z / params.temperature, -math.inf)
    return torch.log_softmax(scaled, dim=-1).gather(-1, tokens[:, None])[:, 0]


@dataclass(frozen=True, slots=True)
class RaceReplay:
    """The verifier's replay of every sampled position of one rollout."""

    margins: npt.NDArray[np.float64]  # raw-logit margin by which each claimed token lost its race (0 = won)
    logprobs: npt.NDArray[np.float64]  # the verifier's logprob of each claimed token

    def worst(self) -> tuple[int, float]:
        """The position that lost by the most, and by how much."""
        if len(self.margins) == 0:
            return -1, 0.0
        position = int(np.argmax(self.margins))
        return position, float(self.margins[position])


def replay(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    seeds: list[bytes],
    positions: list[int],
    params: SamplingParams,
    slack: float,
) -> RaceReplay:
    """Replay seeded races against logits recomputed by a prefill, one race per row.

    ``logits[i]`` must be the logits that chose ``tokens[i]``, sampled at position
    ``positions[i]`` of the rollout seeded ``seeds[i]``: rows of many rollouts that share
    ``params`` are replayed in one vectorized pass. The margin of token ``y`` is
    ``T * (max_j (z_j/T + g_j) - (z_y/T + g_y))`` over the verifier's kept set plus ``y``, or
    ``inf`` when ``y`` is outside the masks even with ``slack``; 0 means it won outright.
    """
    z = logits.detach().to(torch.float64).cpu()
    y = tokens.to(torch.long).cpu()
    rows = torch.arange(len(y), device=y.device)
    _check_racable(z, params)
    if params.greedy:
        lost_by = z.max(dim=-1).values - z[rows, y]
        return RaceReplay(lost_by.numpy(), np.zeros(len(y)))
    admissible = _allowed(z, params, slack)[rows, y].numpy()
    keep = _allowed(z, params)
    keep[rows, y] = True
    scaled = torch.where(keep, z / params.temperature, -math.inf).numpy()
    racing = np.flatnonzero(admissible)
    margins = np.full(len(y), EXCLUDED)
    _, best, mine = _races(scaled[racing], [seeds[r] for r in racing], [positions[r] for r in racing],
                           y.numpy()[racing], slack / params.temperature)
    margins[racing] = params.temperature * (best - mine)
    logprobs = _logprob_of(z, keep, y, params).numpy()
    # With every z / T finite neither can be NaN (_check_racable); checked again because a NaN
    # here would pass every tolerance downstream.
    if np.isnan(margins).any() or np.isnan(logprobs).any():
        raise UndefinedRace("a race margin or logprob is NaN")
    return RaceReplay(margins, logprobs)


#: Rows of logits replayed at once by :func:`replay_sequences`: ``rows x vocab`` stays near
#: 2^22 entries (32 MiB per float64 copy), whatever the batch. Replayed all at once, a group of 8
#: completions of 32 tokens over Qwen2.5-0.5B's 151,936-entry vocabulary (156 MB of float32
#: logits) took 1.45 GB above them, 9.3 times their size, growing with the batch (so about 11.6
#: GB for 8 x 256 tokens); in blocks 0.34 GB, in the same CPU time (2.90 s against 2.86 s;
#: ``python bench/scale_model.py --only replay-memory,replay-memory:at-once``,
#: bench/results/qwen0.5b.json). Each row's margin and logprob depend on that row alone, so the
#: blocks change no result (tests/test_qwen_shape.py).
_REPLAY_BLOCK_ENTRIES = 1 << 22


def replay_sequences(
    sequences: Sequence[tuple[torch.Tensor, torch.Tensor, bytes, SamplingParams]], slack: float
) -> list[RaceReplay]:
    """Replay whole sampled sequences, each ``(logits, tokens, sample_seed, params)`` with its
    tokens at positions ``0 .. n-1``: the rows of every sequence that shares ``params`` go
    through :func:`replay` together, which is what makes checking a batch cheap, in blocks of
    about ``_REPLAY_BLOCK_ENTRIES`` logits, which bounds its memory."""
    by_params: dict[SamplingParams, list[int]] = {}
    for which, (_, _, _, params) in enumerate(sequences):
        by_params.setdefault(params, []).append(which)
    margins = [np.empty(len(tokens)) for _, tokens, _, _ in sequences]
    logprobs = [np.empty(len(tokens)) for _, tokens, _, _ in sequences]
    for params, members in by_params.items():
        vocab = max(int(sequences[which][0].shape[-1]) for which in members)
        block = max(1, _REPLAY_BLOCK_ENTRIES // max(vocab, 1))
        # (sequence, first row, end row) pieces, in order, gathered into blocks of ``block`` rows.
        pieces = [(which, start, min(start + block, len(sequences[which][1])))
                  for which in members for start in range(0, len(sequences[which][1]), block)]
        batch: list[tuple[int, int, int]] = []
        rows = 0
        for piece in [*pieces, None]:
            if piece is not None and rows + piece[2] - piece[1] <= block:
                batch.append(piece)
                rows += piece[2] - piece[1]
                continue
            if batch:
                together = replay(
                    torch.cat([sequences[which][0][start:end] for which, start, end in batch]),
                    torch.cat([sequences[which][1][start:end] for which, start, end in batch]),
                    [sequences[which][2] for which, start, end in batch for _ in range(start, end)],
                    [position for _, start, end in batch for position in range(start, end)],
                    params,
                    slack,
                )
                offset = 0
                for which, start, end in batch:
                    margins[which][start:end] = together.margins[offset : offset + end - start]
                    logprobs[which][start:end] = together.logprobs[offset : offset + end - start]
                    offset += end - start
            batch, rows = ([piece], piece[2] - piece[1]) if piece is not None else ([], 0)
    return [RaceReplay(m, lp) for m, lp in zip(margins, logprobs)]
