"""What every ``vrl`` command shares: the app, its consoles and logging, the exit codes, the
error line, the progress bar, the options several commands declare alike, and the inputs
they open alike (a task set, a model, a reward spec, an answer key, an SRS).

Nothing heavy is imported here at module level: ``vrl --help``, ``keygen`` and ``inspect``
must start without torch or transformers (bench/cli_startup.py, tests/test_cli.py); each
helper imports what it needs when called."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import structlog
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

# Every command's logging; below the CLI, since the harness's scripts set it up alike.
from vrl.logs import StderrHandler as StderrHandler
from vrl.logs import configure_logging as configure_logging

if TYPE_CHECKING:  # `vrl --help` imports none of them
    from proofs.zk import Srs
    from vrl.rollouts.model import Model
    from vrl.tasks import RewardSpec, TaskSet
    from vrl.zk import AnswerKey

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Verifiable-compute RL rollouts: generate, commit, sign and verify.")
out = Console()
err = Console(stderr=True)
log = structlog.get_logger("vrl")

EXIT_ACCEPTED, EXIT_REJECTED, EXIT_UNUSABLE = 0, 1, 2


def _version(shown: bool) -> None:
    if shown:
        from importlib.metadata import version

        out.print(f"vrl {version('vrl')}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print vrl's version and exit.")] = False) -> None:
    pass  # the options every command shares; the app's help says what vrl is


# -- help texts and options several commands share ----------------------------------------------

TASK_HELP = ("'arithmetic[:digits=N,ops=+-*,terms=N]', a task file (JSONL, Parquet, CSV: GSM8K question/answer, "
             "MATH problem/solution, or prompt/answer rows, a prompt a text or chat messages), or a dataset "
             "directory (datasets' save_to_disk; DIR:SPLIT picks a split).")
COLUMNS_HELP = "The task file's columns for the fields rows are read by, e.g. 'prompt=question,answer=solution'."
# What --model takes (vrl.rl.export.load_model).
MODELS = ("a preset (tiny, micro, small, qwen2.5-0.5b, qwen2.5-0.5b-2layer), a built model (base), a model directory, "
          "a Hub id (org/name) or a vrl train run")
DEVICE_HELP = "Where the model runs: auto (CUDA when there is one), cpu, cuda or cuda:N."
REWARD_HELP = ("A reward term NAME[/vN][:WEIGHT][:KEY=VALUE,...], repeatable, summed (specs/rewards.md §5): answer, "
               "numeric, choice, format, length-penalty, code, or an installed one. Default: answer.")

# vrl.zk.sampling.MAX_POSITIONS, written out: importing vrl.zk.sampling loads torch before --help.
MAX_POSITIONS = 64

RolloutsArgument = Annotated[Path, typer.Argument(help="Rollout file.")]
ColumnsOption = Annotated[str, typer.Option(help=COLUMNS_HELP)]
DeviceOption = Annotated[str, typer.Option(help=DEVICE_HELP)]
RewardOption = Annotated[list[str] | None, typer.Option(help=REWARD_HELP)]
BatchSizeOption = Annotated[int, typer.Option(min=1)]
JsonOption = Annotated[bool, typer.Option("--json")]
AllowDevSrsOption = Annotated[bool, typer.Option(help="Accept proofs against the dev SRS: INSECURE.")]


# -- errors, progress (logging: vrl.logs) ---------------------------------------------------------

def fail(message: str, code: int = EXIT_UNUSABLE) -> typer.Exit:
    """The error line on stderr, and the exit (unusable input unless ``code`` says otherwise) to raise."""
    # A message quoting a config's table ("[grpo] eps_low: ...") or a value is never read as markup;
    # soft-wrapped, so a path in it, or a skipped row's reason on its own line, stays whole.
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def progress(quiet: bool) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err, disable=quiet or not err.is_terminal, transient=True)


# -- inputs several commands open alike -----------------------------------------------------------

def parse_round_seed(text: str) -> bytes:
    """A round seed: 64 hex digits, or a decimal integer (encoded as 32 bytes big-endian)."""
    text = text.strip()
    if len(text) == 64:
        try:
            return bytes.fromhex(text)
        except ValueError:
            pass  # not hex: read as an integer below, or refused
    if text.isdigit() and int(text) < 1 << 256:
        return int(text).to_bytes(32, "big")
    raise typer.BadParameter("expected 64 hex digits or a non-negative integer")


def parse_challenge(text: str | None) -> bytes | None:
    """A verifier's sampling challenge (``--challenge``): 64 hex digits; None when not given."""
    if text is None:
        return None
    try:
        value = bytes.fromhex(text)
    except ValueError:
        value = b""
    if len(value) != 32:
        raise fail(f"--challenge {text!r}: 64 hex digits")
    return value


def task_set(spec: str, columns: str = "") -> TaskSet:
    """Open a task set, warning about skipped lines; unusable input exits 2."""
    from vrl.tasks import TaskFileError, open_task_set

    try:
        tasks, problems = open_task_set(spec, columns)
    except (TaskFileError, ValueError) as error:
        raise fail(str(error)) from None
    for problem in problems:
        log.warning("skipped task line", problem=str(problem))
    return tasks


def answer_key(path: Path) -> AnswerKey:
    from vrl.zk import AnswerKey, ZkFileError

    try:
        return AnswerKey.read(path)
    except ZkFileError as error:
        raise fail(str(error)) from None


def srs_for(srs: Path | None, dev: bool, logrows: int) -> Srs:
    """The SRS a prover uses: the user's file, or (``--dev-srs``) the dev one, made once."""
    from proofs import zk
    from vrl.zk import work_directory

    if (srs is None) == (not dev):
        raise fail("give the SRS with --srs PATH, or --dev-srs for an insecure test SRS (specs/zk.md §6)")
    try:
        return zk.Srs.load(srs) if srs is not None else zk.dev_srs(work_directory(), logrows)
    except zk.ZkError as error:
        raise fail(str(error)) from None


def trusted_srs(srs: Path | None, allow_dev: bool) -> list[Srs]:
    """The SRS files a verifier holds (vrl.zk.summary.trusted_srs); an unreadable one exits 2."""
    from proofs import zk
    from vrl.zk.summary import trusted_srs as held

    try:
        return held(srs, allow_dev)
    except zk.ZkError as error:
        raise fail(str(error)) from None


def pinned_reward(reward: list[str] | None) -> RewardSpec | None:
    """The reward spec ``--reward`` terms name, or None when none is given."""
    from vrl.tasks import RewardError, parse_spec

    try:
        return parse_spec(reward) if reward else None
    except RewardError as error:
        raise fail(f"--reward {error.problem}") from None


def open_model(model: str, dtype: str | None, device: str) -> Model:
    """The model ``--model`` names (vrl.rl.export.load_model); one that cannot be loaded exits 2."""
    from vrl.rl.export import load_model
    from vrl.rollouts.model import ModelError

    try:
        return load_model(model, dtype=dtype, device=device)
    except ModelError as error:
        raise fail(str(error)) from None
