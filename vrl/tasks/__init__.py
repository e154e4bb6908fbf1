"""Verifiable tasks: what a node is assigned, and the reward a verifier recomputes.

A reward is a pure function of ``(task, completion text, reward spec)``, so any verifier
recomputes it bit for bit; a spec is a weighted sum of named, versioned reward functions
(:mod:`vrl.tasks.rewards`, specs/rewards.md). A node does not choose its tasks: group ``g`` of
a round is ``task_set.task(assignment_index(round_seed, node_id, g, 0))``, a hash no node can
steer once the round seed is public, and the verifier recomputes the same assignment. One
problem in 16, by the hash of its prompt, is held out for evaluation: assignment draws again
(attempt 1, 2, ...) when it lands on one, so no round ever trains on a held-out problem.

Two task sets: the built-in :class:`~vrl.tasks.arithmetic.Arithmetic` generator, and a
:class:`TaskList` read from a file (GSM8K format or ``{"id", "prompt", "answer"}`` lines).
"""

from __future__ import annotations

from pathlib import Path

from vrl.config import path_like
from vrl.tasks.arithmetic import Arithmetic
from vrl.tasks.core import (
    HELD_OUT_SHARE, Task, TaskFileError, TaskList, TaskSet, assign, assignment_draws, assignment_index, in_order, is_held_out,
)
from vrl.tasks.files import read_task_file
from vrl.tasks.rewards import RewardError, RewardFunction, RewardSpec, RewardTerm, parse_spec, term


def open_task_set(spec: str) -> tuple[TaskSet, list[TaskFileError]]:
    """``arithmetic[:digits=N,ops=+-*,terms=N]`` or a task file; returns the set and skipped lines.

    Raises :class:`TaskFileError` when a file is unreadable or has no usable task, and
    ``ValueError`` for a bad arithmetic spec.
    """
    if spec == "arithmetic" or spec.startswith("arithmetic:"):
        return Arithmetic.parse(spec), []
    tasks, problems = read_task_file(spec)
    if not tasks:
        raise TaskFileError(f"{spec}: no usable task ({len(problems)} lines skipped)")
    return TaskList(Path(spec).name, tuple(tasks)), problems


def task_spec(text: str) -> str | None:
    """What is wrong with a task spec (config field metadata), or None: an arithmetic spec is
    parsed here; a task file's path is only read when the task set is opened."""
    if problem := path_like(text):
        return problem
    if text == "arithmetic" or text.startswith("arithmetic:"):
        try:
            Arithmetic.parse(text)
        except ValueError as error:
            return str(error)
    return None


__all__ = [
    "HELD_OUT_SHARE", "Arithmetic", "RewardError", "RewardFunction", "RewardSpec", "RewardTerm", "Task", "TaskFileError",
    "TaskList", "TaskSet", "assign", "assignment_draws", "assignment_index", "in_order", "is_held_out", "open_task_set",
    "parse_spec", "read_task_file", "task_spec", "term",
]
