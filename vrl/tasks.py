"""Tasks and rewards. For now a task is a prompt with a reference answer, and the reward is
exact match; rewards are pure functions of ``(task, completion text)`` so that any verifier
recomputes them bit for bit."""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Task:
    id: str
    prompt: str
    answer: str


class TaskFileError(ValueError):
    """A task line that cannot be used; names the file, line and field."""


def _normalize(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).split())


def exact_match_reward(completion: str, answer: str) -> float:
    """1.0 when the completion, whitespace- and Unicode-normalized, equals the answer."""
    return 1.0 if _normalize(completion) == _normalize(answer) else 0.0


def read_tasks(path: str | Path) -> tuple[list[Task], list[TaskFileError]]:
    """Read ``{"id", "prompt", "answer"}`` lines; bad lines are returned as errors, not raised.

    Raises :class:`TaskFileError` only if the file cannot be read at all.
    """
    tasks: list[Task] = []
    errors: list[TaskFileError] = []
    seen: set[str] = set()
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise TaskFileError(f"{path}: cannot read: {error}") from error
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as error:
            errors.append(TaskFileError(f"{where}: not JSON: {error.msg}"))
            continue
        if not isinstance(item, dict):
            errors.append(TaskFileError(f"{where}: expected an object"))
            continue
        problem = next(
            (f"field {name!r} missing or not a string" for name in ("id", "prompt", "answer")
             if not isinstance(item.get(name), str)),
            None,
        )
        if problem is None and item["id"] in seen:
            problem = f"duplicate id {item['id']!r}"
        if problem:
            errors.append(TaskFileError(f"{where}: {problem}"))
            continue
        seen.add(item["id"])
        tasks.append(Task(item["id"], item["prompt"], item["answer"]))
    return tasks, errors
