"""Reading task files and datasets: GSM8K, MATH, generic and chat rows.

A bad row never stops the read: it comes back as a :class:`TaskFileError` naming the file,
the line (JSONL, 1-based, blank lines counted) or row (parquet, CSV and datasets, 1-based) and
the field, so one typo in a 7,000-row file costs one task, not the run. That holds for hostile
lines too: nesting deeper than the JSON decoder's recursion, integers past Python's 4,300-digit
limit, lone surrogates, an empty prompt. Only a file that cannot be read at all raises, and a
file that is not UTF-8 is one: another encoding would silently cost every line with a
non-ASCII character, so the error names the first line that does not decode.

Row forms (specs/tasks.md §4), told apart by their fields:

* GSM8K ``{"question", "answer"}``, the answer worked reasoning ending in a line
  ``#### <number>``; only that number is kept, as :func:`canonical_number` text, since the
  reward compares final answers only;
* MATH ``{"problem", "solution"}``: the reference is the last ``\\boxed{...}`` of the solution
  (or an ``answer`` field, when the row has one);
* generic ``{"prompt", "answer"}``, and chat, whose ``prompt`` is a list of messages
  (:mod:`vrl.tasks.chat`).

A row's task id is its ``id`` field, else ``"{name}:{line or row}"``, which stays stable as long
as the file does. ``columns`` maps these field names to a file's own column names.

JSON lines and Parquet are read here, streamed; CSV files and dataset directories (written by
``datasets``' ``save_to_disk``, or a folder of data files) through the ``datasets`` library
(an optional extra), locally only: it is never asked to reach the Hugging Face Hub.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from vrl.errors import shown
from vrl.tasks.answers import canonical_number, last_boxed, parse_number
from vrl.tasks.chat import canonical_messages, messages_of
from vrl.tasks.core import Task, TaskFileError, oversized

GSM8K_TEMPLATE = "Question: {question}\nAnswer: "
#: MATH's problems, put as GSM8K's questions are.
MATH_TEMPLATE = "Problem: {problem}\nSolution: "
#: The fields a row's forms read, which ``columns`` may map a file's own column names to.
FIELDS = ("id", "prompt", "answer", "question", "problem", "solution")

_JSONL = {".jsonl", ".json"}
_PARQUET = {".parquet"}
_CSV = {".csv"}
#: What marks a directory written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``.
_SAVED = ("state.json", "dataset_dict.json")
#: Rows decoded per batch from Parquet and datasets: a batch of GSM8K is about 0.5 MB.
_BATCH_ROWS = 1024


def parse_columns(text: str) -> dict[str, str]:
    """``"prompt=question,answer=solution"`` as ``{field: column}``; empty text maps nothing.
    Raises :class:`TaskFileError` naming the item that is wrong."""
    columns: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, equals, column = (part.strip() for part in item.partition("="))
        if not equals or not column:
            raise TaskFileError(f"columns: {item!r} is not FIELD=COLUMN")
        if name not in FIELDS:
            raise TaskFileError(f"columns: {name!r} is no field (fields: {', '.join(FIELDS)})")
        if name in columns:
            raise TaskFileError(f"columns: {name!r} is mapped twice")
        columns[name] = column
    return columns


def read_task_file(
    path: str | Path, *, template: str = GSM8K_TEMPLATE, columns: Mapping[str, str] | None = None,
    split: str | None = None,
) -> tuple[list[Task], list[TaskFileError]]:
    """Tasks and per-row errors from a ``.jsonl``/``.json`` (one object per line), ``.parquet``
    or ``.csv`` file, or a dataset directory (``split`` chooses a DatasetDict's split).

    ``template`` turns a GSM8K ``question`` into the prompt; ``columns`` maps the fields rows
    are read by to the file's column names (:func:`parse_columns`). Raises
    :class:`TaskFileError` only if the file cannot be read at all.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if split is not None and not path.is_dir():
        raise TaskFileError(f"{path}:{split}: a split names a part of a dataset directory, and {path} is none")
    if path.is_dir() or suffix in _CSV:
        rows = _dataset_rows(path, split)
    elif suffix in _JSONL:
        rows = _jsonl_rows(path)
    elif suffix in _PARQUET:
        rows = _parquet_rows(path)
    else:
        raise TaskFileError(f"{path}: unknown task file type {suffix!r} (use .jsonl, .parquet, .csv or a "
                            "dataset directory)")
    tasks: list[Task] = []
    errors: list[TaskFileError] = []
    seen: set[str] = set()
    for where, default_id, item in rows:
        try:
            if isinstance(item, TaskFileError):
                raise item
            task = _task(_mapped(item, columns or {}), default_id, template)
            if problem := oversized(task):
                raise TaskFileError(problem)
            if task.id in seen:
                raise TaskFileError(f"field 'id': duplicate {shown(task.id)}")
        except TaskFileError as error:
            errors.append(TaskFileError(f"{where}: {error}"))
            continue
        seen.add(task.id)
        tasks.append(task)
    return tasks, errors


def _mapped(item: Any, columns: Mapping[str, str]) -> Any:
    """A row with its mapped columns under the field names: a mapped column's own name, and
    any field a column is mapped to, no longer read (a GSM8K ``question`` mapped to ``prompt``
    makes a generic row, not a GSM8K one)."""
    if not columns or not isinstance(item, dict):
        return item
    out = {key: value for key, value in item.items() if key not in columns and key not in columns.values()}
    for name, column in columns.items():
        if column not in item:
            raise TaskFileError(f"no column {column!r} (columns {name}={column}); it has "
                                + ", ".join(repr(str(key)[:40]) for key in list(item)[:8]))
        out[name] = item[column]
    return out


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


def task_from_line(line: bytes, *, default_id: str, template: str = GSM8K_TEMPLATE,
                   columns: Mapping[str, str] | None = None) -> Task:
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
    return _task(_mapped(item, columns or {}), default_id, template)


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
        for batch in pq.ParquetFile(path).iter_batches(batch_size=_BATCH_ROWS):
            for row in batch.to_pylist():
                number += 1
                yield f"{path}: row {number}", f"{path.stem}:{number}", row
    except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
        raise TaskFileError(f"{path}: cannot read parquet: {error}") from error


def _dataset_rows(path: Path, split: str | None) -> Iterator[tuple[str, str, Any]]:
    """(location, fallback id, row dict) per row of a CSV file or a dataset directory, read
    with ``datasets``: ``load_from_disk`` for a directory ``save_to_disk`` wrote, else
    ``load_dataset`` on the local files (a packaged builder and a path, never a Hub name)."""
    try:
        import datasets
    except ImportError as error:
        raise TaskFileError(f"{path}: reading CSV files and dataset directories needs the datasets library: "
                            "pip install datasets (or the vrl[datasets] extra)") from error
    datasets.config.HF_HUB_OFFLINE = True  # local files only, whatever the environment says
    datasets.disable_progress_bars()
    try:
        if any((path / name).is_file() for name in _SAVED):
            loaded = datasets.load_from_disk(str(path))
        elif path.is_dir():
            loaded = datasets.load_dataset(str(path.resolve()))  # a folder of data files: local, inferred
        else:
            loaded = datasets.load_dataset("csv", data_files=str(path.resolve()))
    except Exception as error:  # datasets raises a dozen types (its own, pyarrow's, OS errors): all say "unreadable"
        raise TaskFileError(f"{path}: cannot load with datasets: {str(error)[:300]}") from None
    stem = path.name if path.is_dir() else path.stem  # as a JSON lines file's ids are its stem's
    name, where = (stem, str(path)) if split is None else (f"{stem}:{split}", f"{path}:{split}")
    if isinstance(loaded, datasets.DatasetDict):
        splits = list(loaded)
        if split is None and len(splits) == 1:
            split = splits[0]
        if split not in loaded:
            named = ", ".join(map(repr, splits))
            raise TaskFileError(f"{path}: holds the splits {named}; name one as {path}:SPLIT" if split is None
                                else f"{path}: no split {shown(split)} (it holds {named})")
        loaded = loaded[split]
    elif split is not None:
        raise TaskFileError(f"{path}: one dataset, without splits; name it without ':{split}'")
    number = 0
    try:
        # Arrow batches, as parquet's: no row is decoded (images, audio) beyond its Python values.
        for batch in loaded.with_format("arrow").iter(batch_size=_BATCH_ROWS):
            for row in batch.to_pylist():
                number += 1
                yield f"{where}: row {number}", f"{name}:{number}", row
    except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
        raise TaskFileError(f"{where}: cannot read row {number + 1}: {str(error)[:300]}") from error


def _string(item: dict[str, Any], name: str, *, nonempty: bool = False) -> str:
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


def _reference(text: str) -> str:
    """A reference answer as stored: a number in canonical form, other text as it is."""
    value = parse_number(text)
    return text if value is None else canonical_number(value)


def _answer(item: dict[str, Any]) -> str:
    """The reference of a generic, chat or MATH row: its ``answer`` (text, or an integer, as a
    dataset's integer column holds it), else the last ``\\boxed{}`` of its ``solution``."""
    if "answer" in item or "solution" not in item:
        value = item.get("answer")
        if isinstance(value, int) and not isinstance(value, bool):
            return canonical_number(value)
        if isinstance(value, float):  # 0.1 is no exact number: the text the file means is lost
            raise TaskFileError("field 'answer': a floating-point number; write the answer as text")
        return _reference(_string(item, "answer"))
    boxed = last_boxed(_string(item, "solution"))
    if not boxed:
        raise TaskFileError("field 'solution' has no non-empty \\boxed{...} answer (or give an 'answer' field)")
    return _reference(boxed)


def _id(item: dict[str, Any], default_id: str) -> str:
    """A generic, chat or MATH row's id: its ``id`` text, or integer (a dataset's integer
    column) as decimal text; the fallback when it has none."""
    value = item.get("id")
    if "id" not in item:
        return default_id
    if isinstance(value, int) and not isinstance(value, bool) and -2**63 <= value < 2**63:  # Arrow's int64
        return str(value)
    return _string(item, "id", nonempty=True)


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
            raise TaskFileError(f"field 'answer': {shown(final)} after '####' is not a number")
        task_id = _string(item, "id", nonempty=True) if isinstance(item.get("id"), str) else default_id
        return Task(task_id, template.format(question=question), canonical_number(value), solution=solution)
    task_id = _id(item, default_id)
    solution = item["solution"] if isinstance(item.get("solution"), str) else ""
    if "problem" in item:  # MATH
        problem = _string(item, "problem", nonempty=True)
        return Task(task_id, MATH_TEMPLATE.format(problem=problem), _answer(item), solution=solution)
    if "prompt" not in item:
        keys = ", ".join(repr(str(key)[:40]) for key in list(item)[:8]) + (", ..." if len(item) > 8 else "")
        raise TaskFileError(f"no 'prompt', 'question' or 'problem' field (it has {keys or 'none'}); "
                            "name the prompt's column with --columns prompt=COLUMN")
    if isinstance(item["prompt"], list):
        return Task(task_id, canonical_messages(item["prompt"]), _answer(item), chat=True, solution=solution)
    return Task(task_id, _string(item, "prompt", nonempty=True), _answer(item), solution=solution)


def task_row(task: Task) -> dict[str, Any]:
    """The generic row that reads back as ``task``: a chat task's prompt as its messages."""
    return {"id": task.id, "prompt": messages_of(task) if task.chat else task.prompt, "answer": task.answer}
