"""Reading task files: GSM8K rows or generic ``{"id", "prompt", "answer"}`` rows.

A bad row never stops the read: it comes back as a :class:`TaskFileError` naming the file,
the line (JSONL, 1-based, blank lines counted) or row (parquet, 1-based) and the field, so
one typo in a 7,000-row file costs one task, not the run. Only a file that cannot be read at
all raises.

GSM8K rows are ``{"question", "answer"}`` where the answer is worked reasoning ending in a
line ``#### <number>``; only that number is kept, as :func:`canonical_number` text, since the
reward compares final answers only. A GSM8K row's task id is its ``id`` field when that is a
string, else ``"{file stem}:{line or row}"``, which stays stable as long as the file does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vrl.tasks import Task, TaskFileError
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
    number = 0
    try:
        # utf-8-sig: tolerate the BOM some editors write; it is not part of line 1's JSON.
        with path.open(encoding="utf-8-sig") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                except json.JSONDecodeError as error:
                    item = TaskFileError(f"not JSON: {error.msg}")
                yield f"{path}:{number}", f"{path.stem}:{number}", item
    except UnicodeDecodeError as error:
        raise TaskFileError(f"{path}: not UTF-8 (line {number + 1}): {error}") from error
    except OSError as error:
        raise TaskFileError(f"{path}: cannot read: {error}") from error


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


def _string(item: dict, name: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise TaskFileError(f"field {name!r} missing or not a string")
    return value


def _task(item: Any, default_id: str, template: str) -> Task:
    """One row as a Task; raises TaskFileError (without location) naming the bad field."""
    if not isinstance(item, dict):
        raise TaskFileError("expected an object")
    if "question" in item:  # GSM8K
        question, solution = _string(item, "question"), _string(item, "answer")
        lines = [line.strip() for line in solution.splitlines() if line.strip()]
        if not lines or not lines[-1].startswith("####"):
            raise TaskFileError("field 'answer' does not end with a '#### <number>' line")
        final = lines[-1].removeprefix("####").strip()
        value = parse_number(final)
        if value is None:
            raise TaskFileError(f"field 'answer': {final!r} after '####' is not a number")
        task_id = item["id"] if isinstance(item.get("id"), str) else default_id
        return Task(task_id, template.format(question=question), canonical_number(value))
    task_id, prompt, answer = (_string(item, name) for name in ("id", "prompt", "answer"))
    value = parse_number(answer)
    return Task(task_id, prompt, answer if value is None else canonical_number(value))
