"""Reading task files: GSM8K rows or generic ``{"id", "prompt", "answer"}`` rows.

A bad row never stops the read: it comes back as a :class:`TaskFileError` naming the file,
the line (JSONL, 1-based, blank lines counted) or row (parquet, 1-based) and the field, so
one typo in a 7,000-row file costs one task, not the run. That holds for hostile lines too:
nesting deeper than the JSON decoder's recursion, integers past Python's 4,300-digit limit,
lone surrogates, an empty prompt. Only a file that cannot be read at all raises, and a file
that is not UTF-8 is one: another encoding would silently cost every line with a non-ASCII
character, so the error names the first line that does not decode.

GSM8K rows are ``{"question", "answer"}`` where the answer is worked reasoning ending in a
line ``#### <number>``; only that number is kept, as :func:`canonical_number` text, since the
reward compares final answers only. A GSM8K row's task id is its ``id`` field when that is a
string, else ``"{file stem}:{line or row}"``, which stays stable as long as the file does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from vrl.tasks.core import Task, TaskFileError
from vrl.tasks.answers import canonical_number, parse_number

GSM8K_TEMPLATE = "Question: {question}\nAnswer: "

_JSONL = {".jsonl", ".json"}
_PARQUET = {".parquet"}


def read_task_file(
    path: str | Path, *, template: str = GSM8K_TEMPLATE
) -> tuple[list[Task], list[TaskFileError]]:
    """Tasks and per-row errors from a ``.jsonl``/``.json`` (one object per line) or ``.parquet``.

    ``template`` turns a GSM8K ``question`` into the prompt; generic rows carry their own.
    Raises :class:`TaskFileError` only if the file cannot be read at all.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in _JSONL:
        rows = _jsonl_rows(path)
    elif suffix in _PARQUET:
        rows = _parquet_rows(path)
    else:
        raise TaskFileError(f"{path}: unknown task file type {suffix!r} (use .jsonl or .parquet)")
    tasks: list[Task] = []
    errors: list[TaskFileError] = []
    seen: set[str] = set()
    for where, default_id, item in rows:
        try:
            if isinstance(item, TaskFileError):
                raise item
            task = _task(item, default_id, template)
            if task.id in seen:
                raise TaskFileError(f"field 'id': duplicate {task.id!r}")
        except TaskFileError as error:
            errors.append(TaskFileError(f"{where}: {error}"))
            continue
        seen.add(task.id)
        tasks.append(task)
    return tasks, errors


def _jsonl_rows(path: Path) -> Iterator[tuple[str, str, Any]]:
    """(location, fallback id, decoded object or error) per non-blank line, streamed."""
    try:
        with path.open("rb") as handle:
            for number, raw in _numbered_lines(handle):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise TaskFileError(f"{path}:{number}: {_not_utf8(error)}; the file must be UTF-8") from None
                if text.strip():
                    yield f"{path}:{number}", f"{path.stem}:{number}", _json(text)
    except OSError as error:
        raise TaskFileError(f"{path}: cannot read: {error}") from error


def _numbered_lines(handle: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """(1-based number, bytes) per line, split as text mode splits (``\\n``, ``\\r\\n`` or a
    lone ``\\r``), so numbers match an editor's. Read as bytes and decoded per line: a text-mode
    decoder reads ahead of the lines, and named the wrong line for invalid UTF-8 (issue 13).
    A UTF-8 byte order mark, which some editors write, is not part of line 1."""
    number = 0
    for chunk in handle:
        if number == 0:
            chunk = chunk.removeprefix(b"\xef\xbb\xbf")
        chunk = chunk.removesuffix(b"\n")
        chunk = chunk.removesuffix(b"\r")
        for line in chunk.split(b"\r"):
            number += 1
            yield number, line


def _not_utf8(error: UnicodeDecodeError) -> str:
    return f"not UTF-8: byte {error.object[error.start]:#04x} at column {error.start + 1}"


def _json(text: str) -> Any:
    """One line's JSON value, or the TaskFileError that says why it is none."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        return TaskFileError(f"not JSON: {error.msg}")
    except RecursionError:
        return TaskFileError("not JSON: nested too deeply")
    except ValueError as error:  # an integer past sys.get_int_max_str_digits()
        return TaskFileError(f"not JSON: {error}")


def task_from_line(line: bytes, *, default_id: str, template: str = GSM8K_TEMPLATE) -> Task:
    """One JSONL line (without its newline) as a Task; raises :class:`TaskFileError` (without
    the location, which the caller adds) naming what is wrong, and nothing else."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as error:
        raise TaskFileError(_not_utf8(error)) from None
    if not text.strip():
        raise TaskFileError("blank line")
    item = _json(text)
    if isinstance(item, TaskFileError):
        raise item
    return _task(item, default_id, template)


def _parquet_rows(path: Path) -> Iterator[tuple[str, str, Any]]:
    """(location, fallback id, row dict) per parquet row, one record batch at a time."""
    try:
        import pyarrow.parquet as pq
    except ImportError as error:
        raise TaskFileError(
            f"{path}: reading parquet needs pyarrow: pip install pyarrow (or the vrl[parquet] extra)"
        ) from error
    number = 0
    try:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                number += 1
                yield f"{path}: row {number}", f"{path.stem}:{number}", row
    except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
        raise TaskFileError(f"{path}: cannot read parquet: {error}") from error


def _string(item: dict, name: str, *, nonempty: bool = False) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise TaskFileError(f"field {name!r} missing or not a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # JSON's "\ud800": no record, tokenizer or file can hold it
        raise TaskFileError(f"field {name!r}: not valid Unicode (a lone surrogate)") from None
    if nonempty and not value:
        # An empty prompt encodes to no tokens, and generation refused it with a traceback.
        raise TaskFileError(f"field {name!r}: empty")
    return value


def _task(item: Any, default_id: str, template: str) -> Task:
    """One row as a Task; raises TaskFileError (without location) naming the bad field."""
    if not isinstance(item, dict):
        raise TaskFileError("expected an object")
    if "question" in item:  # GSM8K
        question, solution = _string(item, "question", nonempty=True), _string(item, "answer")
        lines = [line.strip() for line in solution.splitlines() if line.strip()]
        if not lines or not lines[-1].startswith("####"):
            raise TaskFileError("field 'answer' does not end with a '#### <number>' line")
        final = lines[-1].removeprefix("####").strip()
        value = parse_number(final)
        if value is None:
            raise TaskFileError(f"field 'answer': {final!r} after '####' is not a number")
        task_id = _string(item, "id") if isinstance(item.get("id"), str) else default_id
        return Task(task_id, template.format(question=question), canonical_number(value))
    task_id, prompt, answer = _string(item, "id"), _string(item, "prompt", nonempty=True), _string(item, "answer")
    value = parse_number(answer)
    return Task(task_id, prompt, answer if value is None else canonical_number(value))
