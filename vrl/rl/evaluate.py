"""Held-out accuracy: the learning curve's y-axis, measured the same way by every tool here."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from proofs.sampling_params import SamplingParams
from vrl.rollouts.forward import decode
from vrl.rollouts.model import Model
from vrl.tasks import HELD_OUT_SHARE, RewardSpec, Task, TaskSet, is_held_out

EVAL_INDEX_DOMAIN = b"vrl/eval-index/v1\x00"
EVAL_SEED_DOMAIN = b"vrl/eval-seed/v1\x00"
#: Indices scanned per wanted problem before a small task set is taken to have no more
#: held-out problems: 1 in HELD_OUT_SHARE is one, and a few times that covers the repeats.
_SCAN_PER_PROBLEM = 4 * HELD_OUT_SHARE


def held_out(tasks: TaskSet, count: int) -> list[Task]:
    """The fixed evaluation set: up to ``count`` distinct held-out problems (by prompt), in the
    order a hashed index sequence meets them. Assignment never draws a held-out problem
    (:func:`vrl.tasks.assign`), so no training round has seen any of them. A small task file
    can have fewer than ``count``, or none."""
    found: dict[str, Task] = {}
    for i in range(count * _SCAN_PER_PROBLEM):
        task = tasks.task(int.from_bytes(hashlib.sha256(EVAL_INDEX_DOMAIN + i.to_bytes(4, "big")).digest()[:8], "big"))
        if is_held_out(task):
            found.setdefault(task.prompt, task)
            if len(found) == count:
                break
    return list(found.values())


def accuracy(
    model: Model,
    tasks: list[Task],
    reward_spec: RewardSpec,
    *,
    temperature: float = 0.0,
    max_new_tokens: int = 16,
    batch_size: int = 64,
    on_batch: Callable[[int], None] | None = None,
) -> float:
    """Share of ``tasks`` answered correctly: greedy at temperature 0, else one fixed-seed sample each."""
    if not tasks:
        raise ValueError("accuracy of an empty task list")
    params = SamplingParams(temperature, 0, 1.0, max_new_tokens, model.stop_token_ids)
    correct = 0
    for start in range(0, len(tasks), batch_size):
        batch = tasks[start : start + batch_size]
        seeds = [hashlib.sha256(EVAL_SEED_DOMAIN + task.id.encode()).digest() for task in batch]
        for task, result in zip(batch, decode(model, [model.encode(model.render(t)) for t in batch], seeds, params)):
            correct += reward_spec.is_correct(task, model.decode(result.tokens))
        if on_batch is not None:
            on_batch(len(batch))
    return correct / len(tasks)


def expected_accuracy(model: Model, tasks: list[Task], *, temperature: float = 1.0, batch_size: int = 128) -> float:
    """Mean probability, under the sampling distribution at ``temperature``, that the model
    writes exactly the reference answer and stops: the expected sampled accuracy, measured
    without sampling noise.

    One teacher-forced forward pass per batch. It is a lower bound on the sampled accuracy
    (another spelling of the right number would also be rewarded), and the noise-free curve
    for runs too short for sampled accuracy to leave its +-3-point noise band at 256 tasks.
    """
    if not tasks:
        raise ValueError("expected accuracy of an empty task list")
    return sum(answer_probabilities(model, tasks, temperature=temperature, batch_size=batch_size)) / len(tasks)


def answer_probabilities(model: Model, tasks: list[Task], *, temperature: float = 1.0,
                         batch_size: int = 128) -> list[float]:
    """Per task, the probability that the model writes exactly the reference answer and stops
    (:func:`expected_accuracy` is their mean): two models compared task by task give the
    standard error of their difference (vrl.harness.demo's learning verdict)."""
    import torch

    from vrl.rollouts.forward import continue_prompts, token_logprobs

    stop = model.stop_token_ids[0]
    out: list[float] = []
    for start in range(0, len(tasks), batch_size):
        batch = tasks[start : start + batch_size]
        answers = [model.encode(t.answer) + [stop] for t in batch]
        with torch.no_grad():
            continued = continue_prompts(model.network, [model.encode(model.render(t)) for t in batch], answers,
                                         model.pad_token_id)
        logprobs = token_logprobs(continued, temperature).masked_fill(continued.mask == 0, 0.0)
        out.extend(logprobs.sum(dim=1).exp().tolist())
    return out
