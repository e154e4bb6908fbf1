"""Held-out problems (specs/tasks.md section 1): assignment never draws one, the evaluation set
is made of them only, and the base model's fine-tuning data never contains one."""

from __future__ import annotations

import hashlib
import random

import pytest

from vrl.rl.base_model import _training_problems
from vrl.rl.evaluate import held_out
from vrl.tasks import HELD_OUT_SHARE, Arithmetic, Task, TaskList, assign, is_held_out

TWO_DIGIT_SUMS = Arithmetic.parse("arithmetic:digits=2,ops=+")


def test_one_problem_in_sixteen_is_held_out():
    prompts = [f"{a}+{b}=" for a in range(100) for b in range(100)]
    share = sum(is_held_out(Task("t", p, "")) for p in prompts) / len(prompts)
    assert abs(share - 1 / HELD_OUT_SHARE) < 0.01  # 10,000 problems: the binomial sd is 0.0024


def test_assignment_never_draws_a_held_out_problem():
    assigned = {assign(TWO_DIGIT_SUMS, hashlib.sha256(bytes([r])).digest(), bytes(32), g).prompt
                for r in range(4) for g in range(2000)}
    evaluation = {task.prompt for task in held_out(TWO_DIGIT_SUMS, 256)}
    assert len(assigned) > 4000  # most of the 9,400 training problems: the draw is not stuck
    assert len(evaluation) == 256
    assert not assigned & evaluation
    assert not any(is_held_out(Task("t", p, "")) for p in assigned)


def test_evaluation_set_is_distinct_held_out_problems_and_fixed():
    evaluation = held_out(TWO_DIGIT_SUMS, 64)
    assert evaluation == held_out(TWO_DIGIT_SUMS, 64)
    assert len({t.prompt for t in evaluation}) == 64
    assert all(map(is_held_out, evaluation))


def test_base_model_fine_tuning_never_sees_a_held_out_problem():
    problems = _training_problems(TWO_DIGIT_SUMS, random.Random(0), 5000, excludes_held_out=True)
    assert len(problems) == 5000 and not any(map(is_held_out, problems))
    unfiltered = _training_problems(TWO_DIGIT_SUMS, random.Random(0), 5000, excludes_held_out=False)
    assert any(map(is_held_out, unfiltered))


def _list_of(prompts: list[str]) -> tuple[Task, ...]:
    return tuple(Task(f"t{i}", p, "1") for i, p in enumerate(prompts))


def test_a_small_task_list_has_few_or_no_held_out_problems():
    prompts = [f"{a}+{b}=" for a in range(10) for b in range(10)]
    held = [p for p in prompts if is_held_out(Task("t", p, ""))]
    tasks = TaskList("small", _list_of(prompts))
    assert {t.prompt for t in held_out(tasks, 256)} == set(held)  # all of them, not 256
    kept = [p for p in prompts if p not in held]
    assert held_out(TaskList("none", _list_of(kept)), 8) == []


def test_a_task_list_that_is_all_held_out_is_refused():
    prompts = [f"{a}+{b}=" for a in range(100) for b in range(100)]
    held = [p for p in prompts if is_held_out(Task("t", p, ""))][:3]
    with pytest.raises(ValueError, match="all 3 tasks are held out"):
        TaskList("evaluation-only", _list_of(held))
