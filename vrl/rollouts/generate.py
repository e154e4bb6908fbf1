"""Generation of committed, signed rollouts: whole GRPO groups, seeds bound to the assignment."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from proofs import commitment
from proofs.sampling_params import SamplingParams
from vrl.errors import shown
from vrl.rollouts.forward import Decoded, decode
from vrl.rollouts.keys import NodeKey
from vrl.rollouts.model import Model, context_length
from vrl.rollouts.record import MAX_PROMPT_TOKENS, Rollout, sample_seed
from vrl.tasks import Arithmetic, RewardSpec, Task, TaskFileError, TaskSet, assign, in_order
from vrl.tasks.core import MAX_TEXT_BYTES, utf8_over


@dataclass
class GenerationStats:
    """Wall time split, for the benchmarks: decoding versus building commitments."""

    tokens: int = 0
    decode_seconds: float = 0.0
    commit_seconds: float = 0.0
    commitment_bytes: int = 0
    per_batch: list[float] = field(default_factory=list)


#: The least an arithmetic set gets: the default set's answers are at most 3 bytes ("-99",
#: "198"), and 8 is the length the README's runs of the base model use, with room to spare.
ARITHMETIC_MAX_NEW_TOKENS = 8
#: A task list without worked reference solutions to measure: TRL's GRPOConfig default
#: (max_completion_length = 256), room for a short worked answer before the final one.
FREE_TEXT_MAX_NEW_TOKENS = 256
#: The percentile of reference solutions' lengths the chosen length fits (nearest rank): a
#: policy that writes as long as the references is cut short on 1 in 100, and one outlier does
#: not set every group's length.
SOLUTION_PERCENTILE = 99
#: The chosen length is rounded up to a multiple of this: up to 63 tokens of headroom over the
#: references' length, for a policy whose solutions run a little longer, and a number to recognise.
LENGTH_STEP = 64


def prompt_of(model: Model, task: Task) -> tuple[str, list[int]]:
    """The text ``model`` is given for ``task`` (a chat task's, rendered) and its tokens, as a
    record carries them: a :class:`~vrl.tasks.TaskFileError` naming the task when there are no
    tokens, or more text or tokens than a record holds (MAX_TEXT_BYTES, MAX_PROMPT_TOKENS:
    specs/record.md §3), since no one could decode its records."""
    text = model.render(task)
    if (size := utf8_over(text, MAX_TEXT_BYTES)) is not None:
        raise TaskFileError(f"task {shown(task.id)}: its prompt as the model is given it is {size} "
                            f"bytes, more than a record carries ({MAX_TEXT_BYTES})")
    tokens = model.encode(text)
    if not tokens:
        raise TaskFileError(f"task {shown(task.id)}: the prompt encodes to no tokens")
    if len(tokens) > MAX_PROMPT_TOKENS:
        raise TaskFileError(f"task {shown(task.id)}: its prompt is {len(tokens)} tokens, more than a record carries "
                            f"({MAX_PROMPT_TOKENS})")
    return text, tokens


def longest_prompt(model: Model, tasks: TaskSet) -> tuple[Task, int] | None:
    """A task list's longest prompt as ``model`` is given it, with its length in tokens; None
    for a generated set. Renders every prompt (:func:`prompt_of`), so a chat task the model
    cannot render, or a prompt no record can carry, is a :class:`~vrl.tasks.TaskFileError`
    naming the task set before anything runs."""
    listed = getattr(tasks, "tasks", None)
    if listed is None:
        return None
    try:
        return max(((task, len(prompt_of(model, task)[1])) for task in listed), key=lambda pair: pair[1])
    except TaskFileError as error:
        raise type(error)(f"{tasks.name}: {error}") from None


def choose_max_new_tokens(model: Model, tasks: TaskSet, requested: int = 0) -> tuple[int, str]:
    """``(max_new_tokens, why)``: ``requested`` when it is not 0, else the task set's default
    (specs/tasks.md §5): ARITHMETIC_MAX_NEW_TOKENS for the generator; for a task list, the
    SOLUTION_PERCENTILE of its reference solutions' token lengths plus the stop token, rounded up
    to LENGTH_STEP, or FREE_TEXT_MAX_NEW_TOKENS without solutions; either kept within the
    model's context after the longest prompt. A pure function of the model's tokenizer and the
    tasks, so every node of a network chooses alike.

    Every prompt of a list is rendered here (:func:`longest_prompt`), whether or not a length
    was requested."""
    listed = getattr(tasks, "tasks", None)
    longest = longest_prompt(model, tasks)
    if requested:
        return requested, "as set"
    if isinstance(tasks, Arithmetic):
        # The largest value's digits and a sign, plus the stop token: a byte a token at most.
        biggest_operand = 10**tasks.digits - 1
        largest = biggest_operand**tasks.terms if "*" in tasks.operations else tasks.terms * biggest_operand
        chosen = max(ARITHMETIC_MAX_NEW_TOKENS, len(str(largest)) + 2)
        why = f"the longest answer of {tasks.name}, plus the stop token"
    elif listed is None:
        raise ValueError(f"task set {tasks.name!r}: no default max_new_tokens for it; set one")
    elif solutions := sorted(len(model.encode(task.solution)) for task in listed if task.solution):
        quantile = solutions[-(-SOLUTION_PERCENTILE * len(solutions) // 100) - 1]
        chosen = -(-(quantile + 1) // LENGTH_STEP) * LENGTH_STEP
        why = (f"{SOLUTION_PERCENTILE}% of the {len(solutions)} reference solutions are at most {quantile} tokens, "
               f"plus the stop token, rounded up to a multiple of {LENGTH_STEP}")
    else:
        chosen, why = FREE_TEXT_MAX_NEW_TOKENS, "no reference solutions to measure: TRL's default completion length"
    context = context_length(model)
    if longest is not None and context is not None:
        room = context - longest[1]
        if room < 1:
            raise ValueError(f"{tasks.name}: task {longest[0].id!r} has a prompt of {longest[1]} tokens, which leaves "
                             f"no room in the model's context of {context} positions")
        if chosen > room:
            chosen, why = room, f"{why}; cut to what the model's context of {context} leaves after the longest prompt"
    return chosen, why


#: What samples a batch's completions and captures the rows that commit them:
#: ``(model, prompts, seeds, sampling, on_step) -> one Decoded per prompt``. An honest node's is
#: :func:`vrl.rollouts.forward.decode`; the decode-spoofing cheats of :mod:`vrl.harness.adversary`
#: bring their own, and the rest of a record (assignment, seeds, reward, signature) is made
#: here alike for both.
Decoder = Callable[[Model, list[list[int]], list[bytes], SamplingParams, Callable[[], None] | None], list[Decoded]]


def sampling_for(model: Model, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 max_new_tokens: int = 256) -> SamplingParams:
    """Sampling parameters with the model's own stop tokens."""
    return SamplingParams(temperature, top_k, top_p, max_new_tokens, model.stop_token_ids)


def iter_generate(
    model: Model,
    tasks: TaskSet,
    key: NodeKey,
    *,
    round_seed: bytes,
    sampling: SamplingParams,
    groups: int | Iterable[int],
    reward_spec: RewardSpec = RewardSpec(),
    group_size: int = 4,
    policy_version: int = 0,
    batch_size: int = 8,
    stats: GenerationStats | None = None,
    on_step: Callable[[], None] | None = None,
    decoder: Decoder = decode,
    score: Callable[[Task, str], float] | None = None,
    ordered: bool = False,
    witness: Callable[[Rollout, torch.Tensor], None] | None = None,
) -> Iterator[list[Rollout]]:
    """Yield one whole GRPO group (``group_size`` signed rollouts) per group index, in order.

    ``groups`` is a count (group indices ``0 .. n-1``) or the group indices themselves; the
    task of each is its assignment (:func:`vrl.tasks.assign`), never the node's choice.
    ``decoder`` samples the completions (:data:`Decoder`). ``score`` rewards a completion,
    ``reward_spec.public_reward`` by default: for a committed reference, the reward without the
    correctness only a key holder knows (specs/zk.md §11); a key holder passes the answer key's
    (vrl.zk.AnswerKey.scorer). The records carry only the commitments. With
    ``ordered``, group g answers task g of a task list (an evaluation: vrl.tasks.in_order).
    With ``witness``, each record also commits its hidden states' hashes (``hidden_hashes``,
    specs/zk.md §10), and ``witness(record, rows)`` receives the rows they hash (the body rows
    of its commitment, float32): what the node keeps to prove sampled tokens later.
    """
    score = score or reward_spec.public_reward
    if len(round_seed) != 32:
        raise ValueError(f"round_seed must be 32 bytes, got {len(round_seed)}")
    run = _Run(model, tasks, key, round_seed, sampling, reward_spec, group_size, policy_version,
               stats if stats is not None else GenerationStats(), on_step, decoder, score, ordered, witness)
    groups_per_batch = max(1, batch_size // group_size)
    pending: list[int] = []
    for group_index in range(groups) if isinstance(groups, int) else groups:
        pending.append(group_index)
        if len(pending) == groups_per_batch:
            yield from _generate_groups(run, pending)
            pending = []
    if pending:
        yield from _generate_groups(run, pending)


def _hidden_hashes(rows: torch.Tensor) -> bytes:
    from proofs.circuits import hidden_hash, quantize_hidden

    return b"".join(hidden_hash(row) for row in quantize_hidden(rows.float().numpy()))


@dataclass(frozen=True)
class _Run:
    """What every batch of one :func:`iter_generate` call shares (its arguments, checked)."""

    model: Model
    task_set: TaskSet
    key: NodeKey
    round_seed: bytes
    sampling: SamplingParams
    reward_spec: RewardSpec
    group_size: int
    policy_version: int
    stats: GenerationStats
    on_step: Callable[[], None] | None
    decoder: Decoder
    score: Callable[[Task, str], float]
    ordered: bool
    witness: Callable[[Rollout, torch.Tensor], None] | None


def _generate_groups(run: _Run, group_indices: list[int]) -> Iterator[list[Rollout]]:
    """One batch: the groups ``group_indices`` of ``run``, decoded together."""
    model, task_set, key, round_seed, sampling = run.model, run.task_set, run.key, run.round_seed, run.sampling
    group_size, stats, witness = run.group_size, run.stats, run.witness
    found = [(g, in_order(task_set, g) if run.ordered else assign(task_set, round_seed, key.node_id, g))
             for g in group_indices]
    assigned = [(g, task) for g, task in found if task is not None]
    if len(assigned) < len(found):
        raise ValueError(f"groups {group_indices[0]}..{group_indices[-1]} run past the end of task set "
                         f"{task_set.name!r}")
    jobs = [(g, task, index) for g, task in assigned for index in range(group_size)]
    rendered = {task.id: prompt_of(model, task) for _, task in assigned}  # a chat task's, through the chat template
    texts = {task_id: text for task_id, (text, _) in rendered.items()}
    prompts = {task_id: tokens for task_id, (_, tokens) in rendered.items()}
    context = context_length(model)
    for _, task in assigned:
        if context is not None and len(prompts[task.id]) + sampling.max_new_tokens > context:
            # Past its positions a model fails deep inside (GPT-2: an IndexError), or silently.
            raise ValueError(f"task {task.id!r}: its prompt's {len(prompts[task.id])} tokens and max_new_tokens "
                             f"{sampling.max_new_tokens} pass the model's context of {context} positions; "
                             f"max_new_tokens can be at most {context - len(prompts[task.id])} here")
    seeds = [sample_seed(round_seed, key.node_id, task.id, index) for _, task, index in jobs]
    started = time.perf_counter()
    decoded = run.decoder(model, [prompts[task.id] for _, task, _ in jobs], seeds, sampling, run.on_step)
    stats.decode_seconds += time.perf_counter() - started
    started = time.perf_counter()
    commitments = commitment.build_many([result.hidden for result in decoded])
    # The body rows: row j chose token j; the closing row chose nothing (specs/commitment.md §1).
    hashes = [_hidden_hashes(result.hidden[:-1]) if witness else b"" for result in decoded]
    stats.commit_seconds += time.perf_counter() - started
    rollouts = []
    for (group_index, task, index), result, committed, hashed in zip(jobs, decoded, commitments, hashes):
        stats.commitment_bytes += len(committed)
        stats.tokens += len(result.tokens)
        unsigned = Rollout(
            node_id=key.node_id,
            model_hash=model.model_hash,
            policy_version=run.policy_version,
            round_seed=round_seed,
            group_index=group_index,
            task_id=task.id,
            sample_index=index,
            group_size=group_size,
            prompt=texts[task.id],
            reference=task.answer,
            prompt_tokens=tuple(prompts[task.id]),
            completion_tokens=tuple(result.tokens),
            finish_reason=result.finish_reason,
            sampling=sampling,
            behaviour_logprobs=tuple(float(x) for x in result.logprobs),
            reward=run.score(task, model.decode(result.tokens)),
            reward_spec=run.reward_spec,
            commitment=committed,
            hidden_hashes=hashed,
        )
        rollouts.append(unsigned.signed(key))
        if witness:
            witness(rollouts[-1], result.hidden[:-1].float())
    for start in range(0, len(rollouts), group_size):
        yield rollouts[start : start + group_size]


def generate(model: Model, tasks: TaskSet, key: NodeKey, **options: Any) -> list[Rollout]:
    """All groups for ``tasks`` as one list; see :func:`iter_generate` for the options."""
    return [rollout for group in iter_generate(model, tasks, key, **options) for rollout in group]
