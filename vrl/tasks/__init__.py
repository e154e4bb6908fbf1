"""Verifiable tasks: what a node is assigned, and the reward a verifier recomputes.

A reward is a pure function of ``(task, completion text, reward spec)``, so any verifier
recomputes it bit for bit; a spec is a weighted sum of named, versioned reward functions
(:mod:`vrl.tasks.rewards`, specs/rewards.md). A node does not choose its tasks: group ``g`` of
a round is ``task_set.task(assignment_index(round_seed, node_id, g, 0))``, a hash no node can
steer once the round seed is public, and the verifier recomputes the same assignment. One
problem in 16, by the hash of its prompt, is held out for evaluation: assignment draws again
(attempt 1, 2, ...) when it lands on one, so no round ever trains on a held-out problem.

Three task sets: the built-in :class:`~vrl.tasks.arithmetic.Arithmetic` generator, reasoning-gym's
procedural datasets (:class:`~vrl.tasks.gym.GymTasks`, ``gym:DATASET``), and a :class:`TaskList`
read from a file or dataset directory (GSM8K, MATH, generic or chat rows: :mod:`vrl.tasks.files`).
"""

from __future__ import annotations

from pathlib import Path

from vrl.config import path_like
from vrl.tasks.arithmetic import Arithmetic
from vrl.tasks.core import (
    HELD_OUT_SHARE,
    Task,
    TaskFileError,
    TaskList,
    TaskSet,
    assign,
    assignment_draws,
    assignment_index,
    in_order,
    is_held_out,
)
from vrl.tasks.files import parse_columns, read_task_file
from vrl.tasks.gym import GymError, GymTasks
from vrl.tasks.rewards import RewardError, RewardFunction, RewardSpec, RewardTerm, parse_spec, term

#: Skipped rows a file without a usable one shows the reasons of: the first few tell a wrong
#: format or column name (every row fails alike) from scattered bad rows.
SHOWN_PROBLEMS = 5


def open_task_set(spec: str, columns: str = "") -> tuple[TaskSet, list[TaskFileError]]:
    """``arithmetic[:digits=N,ops=+-*,terms=N]``, ``gym:DATASET[:KEY=VALUE,...][+DATASET...]``
    (reasoning-gym), a task file, or a dataset directory (``DIR:SPLIT`` chooses a split);
    returns the set and skipped rows. ``columns`` maps the fields rows are read by to the
    file's columns (``"prompt=question,answer=solution"``).

    Raises :class:`TaskFileError` when a file is unreadable or has no usable task (naming the
    first few reasons), and ``ValueError`` for a bad arithmetic or gym spec (a gym one is a
    :class:`GymError`, one line naming the dataset or key).
    """
    if spec == "arithmetic" or spec.startswith("arithmetic:"):
        if columns:
            raise TaskFileError(f"{spec}: columns name a task file's columns; the arithmetic set has none")
        return Arithmetic.parse(spec), []
    if _is_gym(spec):
        if columns:
            raise TaskFileError(f"{spec}: columns name a task file's columns; a gym task set has none")
        return GymTasks.parse(spec), []
    path, split = _path_and_split(spec)
    tasks, problems = read_task_file(path, columns=parse_columns(columns), split=split)
    if not tasks:
        if not problems:
            raise TaskFileError(f"{spec}: no usable task: it holds no rows")
        shown = "".join(f"\n  {problem}" for problem in problems[:SHOWN_PROBLEMS])
        more = f"\n  ... and {len(problems) - SHOWN_PROBLEMS} more" if len(problems) > SHOWN_PROBLEMS else ""
        raise TaskFileError(f"{spec}: no usable task ({len(problems)} lines skipped):{shown}{more}")
    return TaskList(Path(spec).name, tuple(tasks)), problems


def _path_and_split(spec: str) -> tuple[Path, str | None]:
    """``DIR:SPLIT`` as the dataset directory and the split, when DIR is one and the whole spec
    names nothing; any other spec is a path (a colon in a file's name stays its own)."""
    head, colon, split = spec.rpartition(":")
    if colon and split and not Path(spec).exists() and Path(head).is_dir():
        return Path(head), split
    return Path(spec), None


def _is_gym(spec: str) -> bool:
    """Whether a spec names reasoning-gym tasks (``gym`` alone is one, missing its dataset)."""
    return spec == "gym" or spec.startswith("gym:")


def task_spec(text: str) -> str | None:
    """What is wrong with a task spec (config field metadata), or None: an arithmetic or gym
    spec is parsed here (a gym one imports reasoning-gym); a task file's path is only read
    when the task set is opened."""
    if problem := path_like(text):
        return problem
    if text == "arithmetic" or text.startswith("arithmetic:"):
        try:
            Arithmetic.parse(text)
        except ValueError as error:
            return str(error)
    if _is_gym(text):
        try:
            GymTasks.parse(text)
        except GymError as error:
            return str(error)
    return None


def columns_spec(text: str) -> str | None:
    """What is wrong with a columns mapping (config field metadata), or None."""
    try:
        parse_columns(text)
    except TaskFileError as error:
        return str(error).removeprefix("columns: ")
    return None


__all__ = [
    "HELD_OUT_SHARE", "Arithmetic", "GymError", "GymTasks", "RewardError", "RewardFunction", "RewardSpec",
    "RewardTerm", "Task", "TaskFileError", "TaskList", "TaskSet", "assign", "assignment_draws", "assignment_index",
    "columns_spec", "in_order", "is_held_out", "open_task_set", "parse_spec", "read_task_file", "task_spec", "term",
]
