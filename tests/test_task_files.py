"""Task files under hostile lines (issue 13 §3): every bad line is a TaskFileError naming the
file and its own line, never a traceback, and never costs the other lines."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from vrl.cli import app
from vrl.tasks import Task, TaskFileError
from vrl.tasks.files import read_task_file, task_from_line

GOOD = [b'{"id": "a", "prompt": "1+1=", "answer": "2"}', b'{"id": "b", "prompt": "2+2=", "answer": "4"}',
        b'{"question": "How many?", "answer": "Some reasoning.\\n#### 1,234"}',
        b'{"problem": "Half?", "solution": "It is $\\\\boxed{\\\\frac{1}{2}}$."}',
        b'{"id": "c", "prompt": [{"role": "user", "content": "3+3="}], "answer": 6}']


def write(tmp_path, lines: list[bytes], name: str = "tasks.jsonl"):
    path = tmp_path / name
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def bad_lines(path, errors: list[TaskFileError]) -> dict[int, str]:
    """{line number: message} of each error, checking that each names the file."""
    found = {}
    for error in errors:
        match = re.match(rf"{re.escape(str(path))}:(\d+): (.*)", str(error))
        assert match, str(error)
        found[int(match[1])] = match[2]
    return found


def test_a_deeply_nested_line_is_a_problem_not_a_recursion_error(tmp_path):
    path = write(tmp_path, [GOOD[0], b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000, GOOD[1]])
    tasks, errors = read_task_file(path)
    assert [t.id for t in tasks] == ["a", "b"]
    found = bad_lines(path, errors)
    assert set(found) == {2, 3} and "nested too deeply" in found[2]


def test_invalid_utf8_is_reported_against_its_own_line(tmp_path):
    """A file that is not UTF-8 is refused whole (tests/test_answers.py), but the error named
    line 1 whatever the line: the text decoder reads ahead of the lines."""
    path = write(tmp_path, [GOOD[0], GOOD[1], GOOD[0].replace(b'"a"', b'"c"'),
                            b'{"id": "x", "prompt": "\xe9t\xe9", "answer": "2"}', GOOD[2]])
    with pytest.raises(TaskFileError, match=re.escape(f"{path}:4: not UTF-8: byte 0xe9 at column 24")):
        read_task_file(path)


def test_an_empty_prompt_is_a_problem_naming_its_line(tmp_path):
    path = write(tmp_path, [b'{"id": "e", "prompt": "", "answer": "2"}', GOOD[1],
                            b'{"question": "", "answer": "#### 3"}'])
    tasks, errors = read_task_file(path)
    assert [t.id for t in tasks] == ["b"]
    found = bad_lines(path, errors)
    assert found == {1: "field 'prompt': empty", 3: "field 'question': empty"}


def test_generate_with_only_an_empty_prompt_exits_2_naming_the_line(tmp_path):
    """`vrl generate` raised ValueError ("the prompt encodes to no tokens") with a traceback."""
    path = write(tmp_path, [b'{"id": "e", "prompt": "", "answer": "2"}'])
    runner = CliRunner()
    key = tmp_path / "node.pem"
    assert runner.invoke(app, ["keygen", "--out", str(key)]).exit_code == 0
    result = runner.invoke(app, ["generate", "--model", "tiny", "--task", str(path), "--key", str(key),
                                 "--out", str(tmp_path / "r.msgpack"), "--groups", "1", "--group-size", "1"])
    assert result.exit_code == 2 and not isinstance(result.exception, ValueError), result.output
    assert "no usable task (1 lines skipped)" in " ".join(result.output.split())  # rich wraps lines


def test_hostile_json_values_are_problems(tmp_path):
    path = write(tmp_path, [b'{"id": "a", "prompt": "1+1=", "answer": ' + b"1" * 5000 + b"}",  # int > 4300 digits
                            b'{"id": "s", "prompt": "\\ud800", "answer": "2"}',  # a lone surrogate
                            b'{"id": "n", "prompt": "x", "answer": NaN}', GOOD[0]])
    tasks, errors = read_task_file(path)
    assert [t.id for t in tasks] == ["a"]
    assert set(bad_lines(path, errors)) == {1, 2, 3}


def test_line_endings_and_bom_keep_their_numbers(tmp_path):
    path = tmp_path / "crlf.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD[0] + b"\r\n\r\n" + b"oops\r" + GOOD[1] + b"\r\n")
    tasks, errors = read_task_file(path)
    assert [t.id for t in tasks] == ["a", "b"]
    assert list(bad_lines(path, errors)) == [3]


# -- property tests: the line decoder, and line numbers in whole files ------------------------------

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=8)
FIELDS = ["id", "prompt", "answer", "question", "problem", "solution"]


@st.composite
def mutated_lines(draw) -> bytes:
    """A valid line with fields replaced by hostile JSON values, removed or added, then maybe
    its bytes flipped, cut, repeated or wrapped in deep nesting."""
    item = json.loads(draw(st.sampled_from(GOOD)))
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(FIELDS + ["extra"]))
        if draw(st.booleans()):
            item[name] = draw(JSON)
        else:
            item.pop(name, None)
    line = bytearray(json.dumps(item, allow_nan=True).encode())
    action = draw(st.sampled_from(["none", "flip", "cut", "repeat", "nest"]))
    if action == "flip" and line:
        at = draw(st.integers(0, len(line) - 1))
        line[at] = draw(st.integers(0, 255))
    elif action == "cut":
        del line[draw(st.integers(0, len(line))):]
    elif action == "repeat":
        line *= draw(st.integers(2, 4))
    elif action == "nest":
        depth = draw(st.sampled_from([10, 1000, 100_000]))
        line = bytearray(b"[" * depth + line + b"]" * depth)
    return bytes(line)


def decode(line: bytes) -> Task | None:
    try:
        task = task_from_line(line, default_id="t:1")
    except TaskFileError as error:
        assert str(error)
        return None
    assert isinstance(task, Task) and task.prompt and task.id
    assert all(isinstance(v, str) for v in (task.id, task.prompt, task.answer))
    return task


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(line=st.one_of(st.binary(max_size=200), mutated_lines()))
def test_a_line_decodes_to_a_task_or_a_task_file_error(line):
    decode(line)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(line=mutated_lines(), columns=st.dictionaries(st.sampled_from(FIELDS), st.sampled_from(FIELDS + ["extra", "q"]),
                                                    max_size=3))
def test_a_line_with_any_columns_decodes_to_a_task_or_a_task_file_error(line, columns):
    try:
        task = task_from_line(line, default_id="t:1", columns=columns)
    except TaskFileError as error:
        assert str(error)
        return
    assert isinstance(task, Task) and task.prompt and task.id


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(lines=st.lists(st.one_of(st.sampled_from(GOOD), mutated_lines(), st.binary(max_size=60)), max_size=12))
def test_errors_name_the_line_they_belong_to(tmp_path_factory, lines):
    """Whatever the lines, read_task_file raises nothing but the TaskFileError of a file that
    is not UTF-8, naming its first such line, and its errors name exactly the lines that do
    not decode alone, by their own numbers."""
    lines = [line.replace(b"\n", b" ").replace(b"\r", b" ") for line in lines]
    path = tmp_path_factory.mktemp("lines") / "t.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    lines[0:1] = [line.removeprefix(b"\xef\xbb\xbf") for line in lines[0:1]]  # a byte order mark
    not_utf8 = [n for n, line in enumerate(lines, 1) if not _is_utf8(line)]
    if not_utf8:
        with pytest.raises(TaskFileError, match=re.escape(f"{path}:{not_utf8[0]}: not UTF-8")):
            read_task_file(path)
        return
    tasks, errors = read_task_file(path)
    alone = {n: decode(line) for n, line in enumerate(lines, 1) if line.decode().strip()}
    found = bad_lines(path, errors)
    duplicates = {n for n, message in found.items() if "duplicate" in message}
    assert set(found) - duplicates == {n for n, task in alone.items() if task is None}
    assert len(tasks) + len(duplicates) == sum(task is not None for task in alone.values())


def _is_utf8(line: bytes) -> bool:
    try:
        line.decode()
    except UnicodeDecodeError:
        return False
    return True
