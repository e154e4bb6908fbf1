"""The task core: tasks, task sets, assignment and the held-out split (specs/tasks.md); the
reward is :mod:`vrl.tasks.rewards`. :mod:`vrl.tasks` is its face, with the two task sets beside it."""


from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from vrl.errors import VrlError, shown

ASSIGNMENT_DOMAIN = b"vrl/assignment/v2\x00"
HELD_OUT_DOMAIN = b"vrl/held-out/v2\x00"
#: One problem in 16 is held out (specs/tasks.md section 1): 625 of the 10,000 problems of the
#: default two-digit addition set, enough for the trainer's 256-problem evaluation set, while
#: training keeps 15/16 of every task set.
HELD_OUT_SHARE = 16
#: What a record can carry of a task (specs/record.md §3, specs/tasks.md §4.1), in UTF-8 bytes:
#: its id, and its prompt (a chat task's messages as canonical JSON) and reference. A longer
#: task is refused when it is read, since every record of it would fail to decode.
MAX_TASK_ID_BYTES = 256
MAX_TEXT_BYTES = 1 << 20
#: Draws before assignment gives up: a set with the expected 1/16 held out fails only with
#: probability 16^-64; a list whose every task is held out is refused when it is built.
MAX_ASSIGNMENT_ATTEMPTS = 64


@dataclass(frozen=True, slots=True)
class Task:
    """A problem: its id, its prompt, its reference answer (specs/tasks.md §4).

    With ``chat``, ``prompt`` is the canonical JSON of a list of chat messages
    (:func:`vrl.tasks.chat.canonical_messages`), which a model renders with its chat template
    (:func:`vrl.tasks.chat.prompt_text`); the held-out hash and a task's identity cover those
    messages, not a rendering. ``solution`` is the row's worked reference solution, when it has
    one: not part of the task (equality ignores it), only what a run's default generation
    length is measured on (vrl.rollouts.generate.default_max_new_tokens)."""

    id: str
    prompt: str
    answer: str
    chat: bool = False
    solution: str = field(default="", compare=False, repr=False)


class TaskFileError(VrlError, ValueError):
    """A task line that cannot be used; names the file, line and field."""


def utf8_over(text: str, limit: int) -> int | None:
    """``text``'s UTF-8 length when it is over ``limit`` bytes, else None (encoding only a text
    that could be: a character is at most 4 bytes)."""
    if len(text) > limit // 4 and (size := len(text.encode())) > limit:
        return size
    return None


def oversized(task: Task) -> str | None:
    """What of ``task`` no record can carry (MAX_TASK_ID_BYTES, MAX_TEXT_BYTES), or None."""
    for name, value, limit in (("id", task.id, MAX_TASK_ID_BYTES), ("prompt", task.prompt, MAX_TEXT_BYTES),
                               ("answer", task.answer, MAX_TEXT_BYTES)):
        if (size := utf8_over(value, limit)) is not None:
            return f"field {name!r}: {size} bytes, more than a record carries ({limit})"
    return None


class TaskSet(Protocol):
    """Anything that maps an assignment index to a task, the same way on every machine."""

    @property
    def name(self) -> str: ...  # read-only, so a frozen dataclass's field satisfies it

    def task(self, index: int) -> Task: ...


@dataclass(frozen=True, slots=True)
class TaskList:
    """A finite task set, such as a file; index ``i`` is ``tasks[i mod len]``.

    With 64-bit assignment indices the modulo bias is below ``len / 2**64``: negligible.
    """

    name: str
    tasks: tuple[Task, ...]

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError(f"task set {self.name!r} is empty")
        for task in self.tasks:
            if problem := oversized(task):
                raise ValueError(f"task set {self.name!r}: task {shown(task.id)}: {problem}")
        if all(map(is_held_out, self.tasks)):
            raise ValueError(f"task set {self.name!r}: all {len(self.tasks)} tasks are held out for evaluation "
                             f"(1 prompt in {HELD_OUT_SHARE} is, by hash), so none is left to train on")

    def task(self, index: int) -> Task:
        return self.tasks[index % len(self.tasks)]


def is_held_out(task: Task) -> bool:
    """Whether a problem is kept out of training, for evaluation (specs/tasks.md section 1).
    By prompt, not index: two indices of a generator, or two lines of a file, can hold the
    same problem, and that problem must be on one side only."""
    digest = hashlib.sha256(HELD_OUT_DOMAIN + task.prompt.encode()).digest()
    return int.from_bytes(digest[:8], "big") < (1 << 64) // HELD_OUT_SHARE


def assignment_index(round_seed: bytes, node_id: bytes, group_index: int, attempt: int) -> int:
    """``u64be(SHA-256(domain, round_seed, node_id, u32be(group_index), u32be(attempt))[:8])``
    (specs/tasks.md section 1)."""
    digest = hashlib.sha256(ASSIGNMENT_DOMAIN + round_seed + node_id + group_index.to_bytes(4, "big")
                            + attempt.to_bytes(4, "big")).digest()
    return int.from_bytes(digest[:8], "big")


def assignment_draws(tasks: TaskSet, round_seed: bytes, node_id: bytes, group_index: int) -> Iterator[Task]:
    """The problems assignment draws for a group, attempt 0 first, at most
    ``MAX_ASSIGNMENT_ATTEMPTS`` of them."""
    for attempt in range(MAX_ASSIGNMENT_ATTEMPTS):
        yield tasks.task(assignment_index(round_seed, node_id, group_index, attempt))


def in_order(tasks: TaskSet, group_index: int) -> Task | None:
    """The task of group ``group_index`` in an evaluation, which answers every task of a
    finite list once, in order (held-out ones too); None past the list's end or for a
    generated set, which has no end."""
    listed = getattr(tasks, "tasks", None)
    return listed[group_index] if listed is not None and 0 <= group_index < len(listed) else None


def assign(tasks: TaskSet, round_seed: bytes, node_id: bytes, group_index: int) -> Task:
    """The task of group ``group_index`` for ``node_id`` in the round of ``round_seed``: the
    first draw that is not a held-out problem."""
    for task in assignment_draws(tasks, round_seed, node_id, group_index):
        if not is_held_out(task):
            return task
    raise ValueError(f"task set {tasks.name!r}: {MAX_ASSIGNMENT_ATTEMPTS} draws for group {group_index} "
                     "all landed on held-out problems")
