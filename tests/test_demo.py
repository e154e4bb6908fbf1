"""The demo's learning verdict: expected accuracy per problem adds up to the trainer's number,
and the verdict states the gain against the standard error of each measurement."""

from __future__ import annotations

import io
import math

import pytest
from rich.console import Console

from vrl import load_model
from vrl.harness.demo import learning_table, learning_verdict
from vrl.rl.evaluate import answer_probabilities, expected_accuracy, held_out
from vrl.tasks import Arithmetic


def test_answer_probabilities_are_expected_accuracy_per_problem():
    model = load_model("tiny")
    problems = held_out(Arithmetic.parse("arithmetic:digits=2,ops=+"), 20)
    each = answer_probabilities(model, problems, batch_size=8)  # three batches, the last one short
    assert len(each) == len(problems) and all(0.0 <= p <= 1.0 for p in each)
    assert sum(each) / len(each) == pytest.approx(expected_accuracy(model, problems), rel=1e-6)


def test_verdict_compares_each_gain_with_its_standard_error():
    curve = [{"version": 0, "held_out_accuracy": 0.25, "held_out_expected_accuracy": 0.2168},
             {"version": 24, "held_out_accuracy": 0.30, "held_out_expected_accuracy": 0.2368}]
    line = learning_verdict(curve, (0.02, 0.004, 128))
    assert line.startswith("learning above noise over 24 versions")
    assert "21.68% -> 23.68% (+2.00 points, +5.0 standard errors of 0.40 points, paired over 128 problems)" in line
    sampled_error = math.sqrt(0.25 * 0.75 / 128 + 0.30 * 0.70 / 128)  # binomial, root sum of squares: 5.6 points
    assert learning_verdict(curve, (0.007, 0.004, 128)).startswith("no learning above noise")  # 1.75 errors
    assert f"sampled 25.0% -> 30.0% (+5.0 points, {0.05 / sampled_error:+.1f} standard errors of 5.6 points)" in line


def test_table_shows_about_a_dozen_versions_and_the_last():
    curve = [{"version": v, "held_out_accuracy": 0.25, "held_out_expected_accuracy": 0.2 + v / 1000} for v in range(63)]
    console = Console(width=80, file=io.StringIO())
    console.print(learning_table(curve))
    rows = [line.split("│") for line in console.file.getvalue().splitlines() if line.startswith("│")]
    shown = [int(row[1]) for row in rows]
    assert shown == [*range(0, 61, 5), 62]
