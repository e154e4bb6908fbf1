"""The ``vrl`` command line: keygen, generate, verify, inspect.

Exit codes of ``verify``: 0 every rollout accepted, 1 any rejected, 2 unusable input.
"""

from __future__ import annotations

import json
import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Annotated, Optional

import structlog
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Verifiable-compute RL rollouts: generate, commit, sign and verify.")
out = Console()
err = Console(stderr=True)
log = structlog.get_logger("vrl")

EXIT_ACCEPTED, EXIT_REJECTED, EXIT_UNUSABLE = 0, 1, 2


def _configure_logging(json_mode: bool) -> None:
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    renderer = structlog.processors.JSONRenderer() if json_mode else structlog.dev.ConsoleRenderer(colors=err.is_terminal)
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso"), renderer],
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING if json_mode else logging.INFO),
    )


def _fail(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(EXIT_UNUSABLE)


def _progress(quiet: bool) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err, disable=quiet or not err.is_terminal, transient=True)


def parse_round_seed(text: str) -> bytes:
    """A round seed: 64 hex digits, or a decimal integer (encoded as 32 bytes big-endian)."""
    text = text.strip()
    if len(text) == 64:
        try:
            return bytes.fromhex(text)
        except ValueError:
            pass
    if text.isdigit() and int(text) < 1 << 256:
        return int(text).to_bytes(32, "big")
    raise typer.BadParameter("expected 64 hex digits or a non-negative integer")


def _load(model: str, dtype: Optional[str]):
    from vrl.model import ModelError, load_model

    try:
        return load_model(model, dtype=dtype)
    except ModelError as error:
        raise _fail(str(error)) from None


@app.command()
def keygen(out_path: Annotated[Path, typer.Option("--out", help="Where to write the PEM key (never overwritten).")]):
    """Create an Ed25519 node key."""
    from vrl.keys import NodeKey

    key = NodeKey.generate()
    try:
        key.save(out_path)
    except FileExistsError:
        raise _fail(f"{out_path} exists; refusing to overwrite a key") from None
    out.print(f"node id {key.node_id.hex()}", highlight=False)


@app.command()
def generate(
    model: Annotated[str, typer.Option(help="Preset (tiny, small) or a local model directory.")],
    prompts: Annotated[Path, typer.Option(help='JSONL lines of {"id", "prompt", "answer"}.')],
    key: Annotated[Path, typer.Option(help="Node key (see vrl keygen).")],
    out_path: Annotated[Path, typer.Option("--out", help="Rollout file to write.")],
    group_size: Annotated[int, typer.Option(min=1, max=1024)] = 4,
    max_new_tokens: Annotated[int, typer.Option(min=1)] = 64,
    round_seed: Annotated[str, typer.Option(help="64 hex digits or an integer.")] = "0",
    temperature: Annotated[float, typer.Option(min=0.0)] = 1.0,
    top_k: Annotated[int, typer.Option(min=0)] = 0,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0)] = 1.0,
    policy_version: Annotated[int, typer.Option(min=0)] = 0,
    batch_size: Annotated[int, typer.Option(min=1)] = 8,
    dtype: Annotated[Optional[str], typer.Option(help="Compute dtype (part of the model's identity).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Machine-readable summary; no progress bar.")] = False,
):
    """Generate committed, signed rollouts: one whole group of --group-size samples per prompt."""
    _configure_logging(json_output)
    from proofs.errors import InvalidParameters
    from vrl.generate import GenerationStats, iter_generate, sampling_for
    from vrl.io import RolloutWriter
    from vrl.keys import KeyFileError, NodeKey
    from vrl.tasks import TaskFileError, read_tasks

    seed = parse_round_seed(round_seed)
    try:
        node_key = NodeKey.load(key)
        tasks, problems = read_tasks(prompts)
    except (KeyFileError, TaskFileError) as error:
        raise _fail(str(error)) from None
    for problem in problems:
        log.warning("skipped prompt line", problem=str(problem))
    if not tasks:
        raise _fail(f"{prompts}: no usable prompts")
    loaded = _load(model, dtype)
    try:
        sampling = sampling_for(loaded, temperature, top_k, top_p, max_new_tokens)
    except InvalidParameters as error:
        raise _fail(str(error)) from None
    # Written to a side file and renamed when complete: a crash keeps every finished group in
    # OUT.partial and never leaves a half-written OUT.
    partial = out_path.with_name(out_path.name + ".partial")
    partial.unlink(missing_ok=True)
    stats = GenerationStats()
    log.info("generating", model=loaded.name, model_hash=loaded.model_hash.hex()[:16], prompts=len(tasks),
             group_size=group_size, node_id=node_key.node_id.hex()[:16])
    written = 0
    with _progress(json_output) as bar, RolloutWriter(partial) as writer:
        task_bar = bar.add_task("generating groups", total=len(tasks))
        for group in iter_generate(loaded, tasks, node_key, round_seed=seed, sampling=sampling,
                                   group_size=group_size, policy_version=policy_version,
                                   batch_size=batch_size, stats=stats):
            for rollout in group:
                writer.write(rollout)
            writer.flush()
            written += len(group)
            bar.advance(task_bar)
    partial.replace(out_path)
    summary = {"rollouts": written, "groups": written // group_size, "tokens": stats.tokens,
               "out": str(out_path), "model_hash": loaded.model_hash.hex(),
               "commitment_bytes_per_token": round(stats.commitment_bytes / max(stats.tokens, 1), 3)}
    if json_output:
        out.print_json(data=summary)
    else:
        out.print(f"wrote {written} rollouts ({written // group_size} groups, {stats.tokens} tokens) to {out_path}",
                  highlight=False)


def verdict_table(verdicts, title: str = "verification") -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("#", "node", "task", "sample", "verdict", "stage", "reason", "detail"):
        table.add_column(column, overflow="fold")
    for v in verdicts:
        mark = "[green]accepted[/]" if v.accepted else "[red]rejected[/]"
        table.add_row(str(v.index), v.node_id[:8], v.task_id, str(v.sample_index) if v.sample_index >= 0 else "",
                      mark, "" if v.accepted else v.stage.name.lower(), "" if v.accepted else v.reason,
                      "" if v.accepted else v.message)
    return table


@app.command()
def verify(
    rollouts: Annotated[Path, typer.Argument(help="Rollout file.")],
    model: Annotated[str, typer.Option(help="Preset or model directory the rollouts claim.")],
    tasks: Annotated[Optional[Path], typer.Option(help="Task file pinning prompts and reference answers.")] = None,
    round_seed: Annotated[Optional[str], typer.Option(help="Require this round seed.")] = None,
    dtype: Annotated[Optional[str], typer.Option()] = None,
    batch_size: Annotated[int, typer.Option(min=1)] = 4,
    json_output: Annotated[bool, typer.Option("--json", help="One JSON document on stdout; no progress bar.")] = False,
):
    """Verify every rollout in a file. Exit 0 all accepted, 1 any rejected, 2 unusable input."""
    _configure_logging(json_output)
    from vrl.io import RolloutFileError, iter_records
    from vrl.tasks import TaskFileError, read_tasks
    from vrl.verify import Expectations
    from vrl.verify import verify as run_verify

    expect_tasks = None
    if tasks is not None:
        try:
            task_list, problems = read_tasks(tasks)
        except TaskFileError as error:
            raise _fail(str(error)) from None
        for problem in problems:
            log.warning("skipped task line", problem=str(problem))
        expect_tasks = {task.id: task for task in task_list}
    expect = Expectations(tasks=expect_tasks, round_seed=parse_round_seed(round_seed) if round_seed else None)
    try:
        records = list(iter_records(rollouts))
    except RolloutFileError as error:
        raise _fail(str(error)) from None
    if not records:
        raise _fail(f"{rollouts}: no records")
    loaded = _load(model, dtype)
    with _progress(json_output) as bar:
        task_bar = bar.add_task("verifying", total=len(records))
        verdicts = run_verify(records, loaded, expect=expect, batch_size=batch_size,
                              on_progress=lambda n: bar.advance(task_bar, n))
    accepted = sum(v.accepted for v in verdicts)
    reasons = Counter(v.reason for v in verdicts if not v.accepted)
    if json_output:
        out.print_json(data={"file": str(rollouts), "model_hash": loaded.model_hash.hex(), "total": len(verdicts),
                             "accepted": accepted, "rejected": len(verdicts) - accepted,
                             "reasons": dict(reasons), "verdicts": [v.to_json() for v in verdicts]})
    else:
        out.print(verdict_table(verdicts, f"{rollouts}: {accepted} of {len(verdicts)} accepted"))
    raise typer.Exit(EXIT_ACCEPTED if accepted == len(verdicts) else EXIT_REJECTED)


@app.command()
def inspect(
    rollouts: Annotated[Path, typer.Argument(help="Rollout file.")],
    json_output: Annotated[bool, typer.Option("--json")] = False,
):
    """List the records of a rollout file without verifying them."""
    from vrl.io import RolloutFileError, iter_records
    from vrl.rollout import RecordError

    rows = []
    try:
        for index, item in enumerate(iter_records(rollouts)):
            if isinstance(item, RecordError):
                rows.append({"index": index, "error": str(item.at(index))})
            else:
                rows.append({"index": index, "node_id": item.node_id.hex(), "task_id": item.task_id,
                             "sample_index": item.sample_index, "group_size": item.group_size,
                             "policy_version": item.policy_version, "model_hash": item.model_hash.hex(),
                             "prompt_tokens": len(item.prompt_tokens), "completion_tokens": len(item.completion_tokens),
                             "finish_reason": item.finish_reason, "reward": item.reward,
                             "temperature": item.sampling.temperature, "commitment_bytes": len(item.commitment)})
    except RolloutFileError as error:
        raise _fail(str(error)) from None
    if json_output:
        out.print_json(data=rows)
        return
    table = Table(title=f"{rollouts}: {len(rows)} records", title_justify="left")
    for column in ("#", "node", "task", "sample", "policy", "prompt", "completion", "finish", "reward", "T", "commit B"):
        table.add_column(column)
    for row in rows:
        if "error" in row:
            table.add_row(str(row["index"]), f"[red]{row['error']}[/]")
            continue
        table.add_row(str(row["index"]), row["node_id"][:8], row["task_id"], f"{row['sample_index']}/{row['group_size']}",
                      str(row["policy_version"]), str(row["prompt_tokens"]), str(row["completion_tokens"]),
                      row["finish_reason"], f"{row['reward']:g}", f"{row['temperature']:g}", str(row["commitment_bytes"]))
    out.print(table)


if __name__ == "__main__":  # pragma: no cover
    app()
