from __future__ import annotations

import json
import re
import signal
import time
from contextlib import contextmanager
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vrl.tasks import Task, TaskFileError
from vrl.tasks.answers import answer_form, answers_match, canonical_number, extract_answer, has_format, parse_number
from vrl.tasks.files import GSM8K_TEMPLATE, read_task_file

F = Fraction

PARSE = [
    ("42", F(42)),
    ("  42 \n", F(42)),
    ("+7", F(7)),
    ("-7", F(-7)),
    ("\u22127", F(-7)),  # unicode minus sign
    ("\uff14\uff12", F(42)),  # full-width digits (NFKC)
    ("1,234,567", F(1234567)),
    ("1,2", None),
    ("12,34", None),
    ("1,234,5678", None),
    ("3.50", F(7, 2)),
    (".5", F(1, 2)),
    ("5.", F(5)),
    ("42.", F(42)),
    ("3.5.", F(7, 2)),
    ("5..", None),
    ("3/4", F(3, 4)),
    ("-3/4", F(-3, 4)),
    ("6/8", F(3, 4)),
    ("\\frac{3}{4}", F(3, 4)),
    ("\\dfrac{3}{4}", F(3, 4)),
    ("-\\frac{1}{2}", F(-1, 2)),
    ("1 1/2", F(3, 2)),
    ("-1 1/2", F(-3, 2)),
    ("1\\frac{1}{2}", F(3, 2)),
    ("$5", F(5)),
    ("-$5", F(-5)),
    ("$1,234.00", F(1234)),
    ("50%", F(50)),
    ("12.5\\%", F(25, 2)),
    ("\\boxed{42}", F(42)),
    ("\\boxed{\\frac{1}{2}}", F(1, 2)),
    ("\\boxed{5 \\text{ cm}}", F(5)),
    ("$\\boxed{-3/4}$", F(-3, 4)),
    ("\\(7\\)", F(7)),
    ("$\\boxed{\\boxed{\\(7\\)}}$", F(7)),  # four wrappers: the most peeled
    ("$\\boxed{\\boxed{\\(\\boxed{7}\\)}}$", None),
    ("5 \\text{ cm}", None),  # units only ignored inside \boxed{}
    ("\\boxed{5} and \\boxed{6}", None),
    ("7/0", None),
    ("\\frac{1}{0}", None),
    ("1e3", None),  # scientific notation rejected (documented)
    ("1" * 5000, None),  # past the int-parsing digit limit
    ("", None),
    ("abc", None),
    ("1 2", None),
    ("3 apples", None),
    ("x = 3", None),
]


@pytest.mark.parametrize(("text", "value"), PARSE)
def test_parse_number(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize(
    ("value", "text"),
    [(F(42), "42"), (F(-7), "-7"), (F(0), "0"), (F(6, 8), "3/4"), (F(-7, 2), "-7/2"), (F(4, 2), "2")],
)
def test_canonical_number(value, text):
    assert canonical_number(value) == text
    assert parse_number(text) == value


EXTRACT = [
    ("The answer is <answer>42</answer>", "answer", "42"),
    ("<answer>1</answer> wait, <answer> 2 </answer>", "answer", "2"),  # last tag wins
    ("<answer>1<answer>2</answer>", "answer", "2"),
    ("no tag here, 42", "answer", None),
    ("<answer>42", "answer", None),
    ("42</answer>", "answer", None),
    ("<final>9</final>", "final", "9"),
    ("so \\boxed{1} then \\boxed{\\frac{1}{\\sqrt{2}}}.", None, "\\frac{1}{\\sqrt{2}}"),  # nested braces
    ("reasoning\n#### 1,234\n", None, "1,234"),
    ("#### 1\nmore\n#### 2", None, "2"),
    ("I had 3 apples and ate 1, so 2.", None, "2"),
    ("It cost -5 dollars", None, "-5"),
    ("pages 3-4", None, "4"),  # a hyphen is not a sign
    ("about 2,000 people", None, "2,000"),
    ("half is 1/2", None, "1/2"),
    ("\\boxed{ {1}", None, "1"),  # unbalanced box is ignored
    ("<answer>5</answer> \\boxed{6}", "", "6"),  # "" means no tag, like None
    ("no numbers", None, None),
]


@pytest.mark.parametrize(("completion", "tag", "answer"), EXTRACT)
def test_extract_answer(completion, tag, answer):
    assert extract_answer(completion, tag) == answer


MATCH = [
    ("\\boxed{\\frac{1}{2}}", "0.5", True),
    ("-3/4", "-0.75", True),
    ("$1,234.00", "1234", True),
    ("50%", "50", True),
    ("1 1/2", "3/2", True),
    ("42.", "42", True),
    ("0.33", "1/3", False),  # exact: no float tolerance
    ("41", "42", False),
    ("abc", "42", False),
    (None, "42", False),
    ("Paris ", "Paris", True),  # non-numeric reference: normalized text
    ("\uff30aris", "Paris", True),
    ("paris", "Paris", False),
]


@pytest.mark.parametrize(("given", "reference", "expected"), MATCH)
def test_answers_match(given, reference, expected):
    assert answers_match(given, reference) is expected


FORMAT = [
    ("think... <answer>42</answer>", True),
    ("<answer> 3/4 </answer>\n  ", True),
    ("<answer>\\boxed{7}</answer>", True),
    ("<answer>42</answer> trailing", False),
    ("<answer>1</answer><answer>2</answer>", False),
    ("<answer>forty-two</answer>", False),
    ("<answer>42", False),
    ("</answer>42<answer>", False),
    ("42", False),
]


def test_answer_forms_are_equal_exactly_when_answers_match():
    """What a zk proof of a private answer compares (specs/zk.md §3) is what the reward compares."""
    for answer, reference, expected in MATCH:
        if answer is not None:
            assert (answer_form(answer) == answer_form(reference)) is expected, (answer, reference)
    assert answer_form("\\boxed{1,000}") == answer_form("1000") == b"n:1000"
    assert answer_form("-0.75") == answer_form("-3/4") == b"n:-3/4"
    assert answer_form(" Paris ") == b"t:Paris"


_ANSWERISH = st.one_of(
    st.text(alphabet="0123456789,./-+ $%\\{}abcfrxod\u2212", max_size=12),
    st.fractions(max_denominator=50).map(lambda f: str(f)),
    st.decimals(allow_nan=False, allow_infinity=False, places=2).map(str))


@given(_ANSWERISH, _ANSWERISH)
def test_answer_form_equality_is_answers_match_for_any_pair(given_answer, reference):
    assert (answer_form(given_answer) == answer_form(reference)) is answers_match(given_answer, reference)


@pytest.mark.parametrize(("completion", "expected"), FORMAT)
def test_has_format(completion, expected):
    assert has_format(completion, "answer") is expected


def test_has_format_needs_a_tag():
    assert not has_format("<>1</>", "")


@contextmanager
def _time_limit(seconds: float):
    """Fail, rather than hang, when the block runs past ``seconds`` of wall time. SIGALRM
    interrupts Python code and a backtracking regex alike (CPython's ``re`` checks for
    signals while it matches)."""

    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


N = 50_000
# Hostile completions for the reward a verifier recomputes, each with the answer the spec's
# rules give (specs/tasks.md §3): an unclosed or deeply nested \boxed{}, a long #### line, a
# long comma run, nested answer tags.
ADVERSARIAL = [
    ("\\boxed{" * N, None, None),
    ("\\boxed{" * N + "1" + "}" * N, None, "1"),
    ("#### " + " " * N + "x", None, "x"),
    ("1," * N + "x", None, ("1," * N)[:-1]),
    ("<answer>" * N + "1" + "</answer>" * N, "answer", "1" + "</answer>" * (N - 1)),
    ("\\frac{1}{2}" * N, None, "2"),
]


def test_adversarial_completions_are_cheap():
    """Verifiers recompute rewards on untrusted text, so answer extraction, number parsing and
    the format check must stay linear in the text. At N = 50,000 the whole set takes about
    0.5 s here; a quadratic scan (a brace match from every \\boxed{, a backtracking regex)
    takes minutes, so 10 s is a generous bound that still tells them apart."""
    start = time.monotonic()
    try:
        with _time_limit(10.0):
            for completion, tag, answer in ADVERSARIAL:
                assert extract_answer(completion, tag) == answer
                assert parse_number(completion) is None
                assert not has_format(completion, "answer")
                assert not answers_match(completion, "1")
    except TimeoutError:
        pytest.fail(f"answer checks on {N:,}-character completions ran past 10 s "
                    f"({time.monotonic() - start:.1f} s): not linear any more")


# --- task files ---------------------------------------------------------------------------


def _write_lines(path, lines):
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def test_gsm8k_jsonl(tmp_path):
    path = _write_lines(
        tmp_path / "gsm8k.jsonl",
        [
            {"question": "What is 6*7?", "answer": "6*7 = 42\n#### 42"},  # line 1
            "{not json",  # line 2
            "",  # line 3: blank, skipped but counted
            {"question": "No answer?"},  # line 4
            {"question": "Q", "answer": "so\n#### abc"},  # line 5
            {"question": "Q", "answer": "just reasoning"},  # line 6
            {"id": "a", "question": "Cost?", "answer": "It costs\n#### $1,234.50\n\n"},  # line 7
            {"id": "a", "question": "Again", "answer": "#### 1"},  # line 8: duplicate id
            ["not", "an", "object"],  # line 9
        ],
    )
    tasks, errors = read_task_file(path)
    assert tasks == [
        Task("gsm8k:1", "Question: What is 6*7?\nAnswer: ", "42"),
        Task("a", GSM8K_TEMPLATE.format(question="Cost?"), "2469/2"),
    ]
    expected = {2: "JSON", 4: "'answer'", 5: "'answer'", 6: "'answer'", 8: "'id'", 9: "object"}
    assert len(errors) == len(expected)
    for error, (line, field) in zip(errors, expected.items()):
        assert isinstance(error, TaskFileError)
        assert str(error).startswith(f"{path}:{line}: ")
        assert field in str(error)
    assert "'abc'" in str(errors[2])


def test_template(tmp_path):
    path = _write_lines(tmp_path / "t.jsonl", [{"question": "1+1?", "answer": "#### 2"}])
    tasks, errors = read_task_file(path, template="Q: {question}\nA:")
    assert tasks == [Task("t:1", "Q: 1+1?\nA:", "2")] and not errors


def test_generic_jsonl(tmp_path):
    path = _write_lines(
        tmp_path / "generic.json",
        [
            {"id": "x", "prompt": "2+2=", "answer": "4.0"},
            {"id": "y", "prompt": "Capital of France?", "answer": "Paris"},
            {"id": "z", "prompt": "p"},
            {"id": 3.5, "prompt": "p", "answer": "1"},
            {"id": "x", "prompt": "p", "answer": "1"},
        ],
    )
    tasks, errors = read_task_file(path)
    assert tasks == [Task("x", "2+2=", "4"), Task("y", "Capital of France?", "Paris")]
    assert [str(e).split(": ", 1)[0] for e in errors] == [f"{path}:{n}" for n in (3, 4, 5)]
    assert ["'answer'" in str(errors[0]), "'id'" in str(errors[1]), "'id'" in str(errors[2])] == [True] * 3


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "train.parquet"
    table = pa.table(
        {
            "question": ["What is 1/2 + 1/4?", "Broken", "Ten?"],
            "answer": ["1/2 + 1/4 = 3/4\n#### 0.75", "no final line", "#### 10"],
        }
    )
    pq.write_table(table, path)
    tasks, errors = read_task_file(path)
    assert tasks == [
        Task("train:1", GSM8K_TEMPLATE.format(question="What is 1/2 + 1/4?"), "3/4"),
        Task("train:3", GSM8K_TEMPLATE.format(question="Ten?"), "10"),
    ]
    assert len(errors) == 1
    assert str(errors[0]).startswith(f"{path}: row 2: ") and "'answer'" in str(errors[0])


@pytest.mark.parametrize(
    ("name", "content"),
    [("missing.jsonl", None), ("latin1.jsonl", b'{"id": "\xe9"}\n'), ("tasks.csv", b"a,b\n"), ("bad.parquet", b"nope")],
)
def test_unreadable_files_raise(tmp_path, name, content):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    with pytest.raises(TaskFileError, match=re.escape(str(path))):
        read_task_file(path)
