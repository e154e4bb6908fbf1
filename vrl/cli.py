"""The ``vrl`` command line: keygen, generate, verify, inspect, train, export, build-base-model,
node, devnet, reputation, audit.

Exit codes of ``verify``: 0 every rollout accepted, 1 any rejected, 2 unusable input. Of
``audit``: 0 a clean audit, 1 findings, 2 unusable input.
"""

from __future__ import annotations

import json
import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Annotated

import structlog
import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from vrl.errors import VrlError

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


class _StderrHandler(logging.StreamHandler):
    """A handler writing to whatever ``sys.stderr`` is when a record comes (as structlog's
    loggers below do): a redirected or replaced stderr must not leave it writing to a closed file."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass  # StreamHandler.__init__ sets one; the current stderr is always the one


def configure_logging(json_mode: bool, level: int | None = None) -> None:
    """structlog's lines on stderr, JSON with ``json_mode``, from ``level`` (INFO, or WARNING
    in JSON mode) up; and every standard-library record (py-libp2p's, transformers', any
    library's) rendered by the same processors, so that in JSON mode each stderr line is JSON."""
    level = level if level is not None else logging.WARNING if json_mode else logging.INFO
    renderer = structlog.processors.JSONRenderer() if json_mode else structlog.dev.ConsoleRenderer(colors=err.is_terminal)
    shared = [structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso")]
    structlog.configure(
        processors=[*shared, renderer],
        # Resolve sys.stderr per logger, not once: a redirected or replaced stderr (tests, daemons)
        # must not leave loggers writing to a closed file.
        logger_factory=lambda *_: structlog.PrintLogger(file=sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(level),
    )
    handler = _StderrHandler()
    handler.setLevel(level)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        # A foreign record's level, time and logger name, then its traceback as text in JSON
        # (the console renderer draws exc_info itself).
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name,
                           *([structlog.processors.format_exc_info] if json_mode else [])],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer]))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StderrHandler)]:  # a second call replaces the first
        root.removeHandler(old)
    root.addHandler(handler)
    # py-libp2p, when imported without LIBP2P_DEBUG, cuts its "libp2p" logger off (propagate
    # off, no handler): its warnings then reach only logging's handler of last resort, which
    # printed them as bare text among the JSON lines. That handler is this one now. (With
    # LIBP2P_DEBUG set, libp2p logs through handlers of its own, to stderr and a file, as asked.)
    logging.lastResort = handler
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    hf_logging.disable_default_handler()  # its errors through the root's handler, as every library's
    hf_logging.enable_propagation()


def _fail(message: str) -> typer.Exit:
    # A message quoting a config's table ("[grpo] eps_low: ...") or a value is never read as markup;
    # soft-wrapped, so a path in it, or a skipped row's reason on its own line, stays whole.
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
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


TASK_HELP = ("'arithmetic[:digits=N,ops=+-*,terms=N]', a task file (JSONL, Parquet, CSV: GSM8K question/answer, "
             "MATH problem/solution, or prompt/answer rows, a prompt a text or chat messages), or a dataset "
             "directory (datasets' save_to_disk; DIR:SPLIT picks a split).")
COLUMNS_HELP = "The task file's columns for the fields rows are read by, e.g. 'prompt=question,answer=solution'."


def _task_set(spec: str, columns: str = ""):
    """Open a task set, warning about skipped lines; unusable input exits 2."""
    from vrl.tasks import TaskFileError, open_task_set

    try:
        tasks, problems = open_task_set(spec, columns)
    except (TaskFileError, ValueError) as error:
        raise _fail(str(error)) from None
    for problem in problems:
        log.warning("skipped task line", problem=str(problem))
    return tasks


def _answer_key(path: Path):
    from vrl.zk import AnswerKey, ZkFileError

    try:
        return AnswerKey.read(path)
    except ZkFileError as error:
        raise _fail(str(error)) from None


def _srs_for(srs: Path | None, dev: bool, logrows: int):
    """The SRS a prover uses: the user's file, or (``--dev-srs``) the dev one, made once."""
    from proofs import zk
    from vrl.zk import work_directory

    if (srs is None) == (not dev):
        raise _fail("give the SRS with --srs PATH, or --dev-srs for an insecure test SRS (specs/zk.md §6)")
    try:
        return zk.Srs.load(srs) if srs is not None else zk.dev_srs(work_directory(), logrows)
    except zk.ZkError as error:
        raise _fail(str(error)) from None


def _trusted_srs(srs: Path | None, allow_dev: bool) -> list:
    """The SRS files a verifier holds: the user's, and this machine's dev SRS when it is
    allowed or exists (known, so that proofs against it are named as dev ones: zk_dev_srs).
    Raises ZkError for an unreadable file."""
    from proofs import zk
    from proofs.circuits import ANSWER_MATCH
    from vrl.zk import work_directory

    trusted = [zk.Srs.load(srs)] if srs is not None else []
    if allow_dev or (work_directory() / f"dev-kzg{ANSWER_MATCH.logrows}.srs").exists():
        trusted.append(zk.dev_srs(work_directory(), ANSWER_MATCH.logrows))
    return trusted


# What --model takes (vrl.rl.export.load_model).
MODELS = ("a preset (tiny, micro, small), a built model (base), a model directory, a Hub id (org/name) or a "
          "vrl train run")
DEVICE_HELP = "Where the model runs: auto (CUDA when there is one), cpu, cuda or cuda:N."
REWARD_HELP = ("A reward term NAME[/vN][:WEIGHT][:KEY=VALUE,...], repeatable, summed (specs/rewards.md §5): answer, "
               "numeric, choice, format, length-penalty, code, or an installed one. Default: answer.")


def _pinned_reward(reward: list[str] | None):
    """The reward spec ``--reward`` terms name, or None when none is given."""
    from vrl.tasks import RewardError, parse_spec

    try:
        return parse_spec(reward) if reward else None
    except RewardError as error:
        raise _fail(f"--reward {error.problem}") from None


def _load(model: str, dtype: str | None, device: str):
    from vrl.rl.export import load_model
    from vrl.rollouts.model import ModelError

    try:
        return load_model(model, dtype=dtype, device=device)
    except ModelError as error:
        raise _fail(str(error)) from None


@app.command()
def keygen(out_path: Annotated[Path, typer.Option("--out", help="Where to write the PEM key (never overwritten).")]):
    """Create an Ed25519 node key."""
    from vrl.rollouts.keys import NodeKey

    key = NodeKey.generate()
    if not out_path.parent.is_dir():
        raise _fail(f"{out_path.parent}: no such folder; create it first (a key is written only where you chose)")
    try:
        key.save(out_path)
    except FileExistsError:
        raise _fail(f"{out_path} exists; refusing to overwrite a key") from None
    except OSError as error:  # a directory in its place, no permission, a full disk
        raise _fail(f"{out_path}: cannot write the key: {error.strerror or error}") from None
    out.print(f"node id {key.node_id.hex()}", highlight=False)


@app.command()
def generate(
    model: Annotated[str, typer.Option(help=f"The model: {MODELS}.")],
    task: Annotated[str, typer.Option(help=TASK_HELP)],
    key: Annotated[Path, typer.Option(help="Node key (see vrl keygen).")],
    out_path: Annotated[Path, typer.Option("--out", help="Rollout file to write.")],
    groups: Annotated[int, typer.Option(min=1, help="Groups to generate: group indices 0 .. N-1.")] = 4,
    group_size: Annotated[int, typer.Option(min=1, max=1024)] = 4,
    max_new_tokens: Annotated[int | None, typer.Option(min=1, help="Default: chosen from the task set (8 for "
                                                          "arithmetic, the reference solutions' length).")] = None,
    columns: Annotated[str, typer.Option(help=COLUMNS_HELP)] = "",
    round_seed: Annotated[str, typer.Option(help="64 hex digits or an integer.")] = "0",
    temperature: Annotated[float, typer.Option(min=0.0)] = 1.0,
    top_k: Annotated[int, typer.Option(min=0)] = 0,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0)] = 1.0,
    policy_version: Annotated[int, typer.Option(min=0)] = 0,
    batch_size: Annotated[int, typer.Option(min=1)] = 8,
    dtype: Annotated[str | None, typer.Option(help="Compute dtype (part of the model's identity).")] = None,
    device: Annotated[str, typer.Option(help=DEVICE_HELP)] = "auto",
    json_output: Annotated[bool, typer.Option("--json", help="Machine-readable summary; no progress bar.")] = False,
    answers: Annotated[Path | None, typer.Option(help="Answer key of a task set of committed references "
                                                    "(vrl commit-answers): rewards from it, records keep the "
                                                    "commitments. Without it such records claim only the reward's "
                                                    "format part.")] = None,
    hidden_states: Annotated[bool, typer.Option(help="Commit each sampled token's hidden state (Poseidon hash) for "
                                                "sampling proofs, and keep the rows in OUT.hidden (vrl prove "
                                                "--kind sampling).")] = False,
    reward: Annotated[list[str] | None, typer.Option(help=REWARD_HELP)] = None,
):
    """Generate committed, signed rollouts: --groups whole groups of the tasks this key is assigned."""
    configure_logging(json_output)
    from proofs.errors import InvalidParameters
    from vrl.rollouts.files import RolloutWriter
    from vrl.rollouts.generate import GenerationStats, choose_max_new_tokens, iter_generate, sampling_for
    from vrl.rollouts.keys import KeyFileError, NodeKey
    from vrl.tasks import RewardSpec
    from vrl.tasks.answers import committed_reference
    from vrl.zk import ZkFileError

    seed = parse_round_seed(round_seed)
    reward_spec = _pinned_reward(reward) or RewardSpec()
    try:
        node_key = NodeKey.load(key)
    except KeyFileError as error:
        raise _fail(str(error)) from None
    tasks = _task_set(task, columns)
    score = None
    try:
        if answers is not None:
            answer_key = _answer_key(answers)
            answer_key.check(getattr(tasks, "tasks", ()))
            score = answer_key.scorer(reward_spec)
        # A committed reference's record claims its public reward (specs/zk.md §11), which a
        # reward reading the reference in the clear cannot give (specs/rewards.md §4).
        committed = [t for t in getattr(tasks, "tasks", ()) if committed_reference(t.answer) is not None]
        if committed and (problem := reward_spec.provable()):
            raise _fail(f"{task}: task {committed[0].id!r} has a committed reference: {problem}")
    except (ValueError, ZkFileError) as error:  # a malformed zk: reference; a key that does not open one
        raise _fail(f"{task}: {error}") from None
    loaded = _load(model, dtype, device)
    try:
        chosen, why = choose_max_new_tokens(loaded, tasks, max_new_tokens or 0)
        sampling = sampling_for(loaded, temperature, top_k, top_p, chosen)
    except (InvalidParameters, ValueError) as error:  # ValueError: a chat task the model cannot render
        raise _fail(str(error)) from None
    if max_new_tokens is None:
        log.info("max_new_tokens chosen from the task set", max_new_tokens=chosen, why=why)
    # Written to a side file and renamed when complete: a crash keeps every finished group in
    # OUT.partial and never leaves a half-written OUT.
    partial = out_path.with_name(out_path.name + ".partial")
    partial.unlink(missing_ok=True)
    stats = GenerationStats()
    log.info("generating", model=loaded.name, model_hash=loaded.model_hash.hex()[:16], tasks=tasks.name,
             groups=groups, group_size=group_size, node_id=node_key.node_id.hex()[:16])
    witness_rows: list | None = None
    if hidden_states:
        from vrl.zk.sampling import SamplingProofError, circuit_for, supported, witness_path, write_witness

        try:
            circuit_for(loaded)
        except SamplingProofError as error:
            raise _fail(str(error)) from None
        if not supported(sampling):
            raise _fail("--hidden-states: sampling proofs do not cover a top-k or top-p mask (specs/zk.md §10)")
        witness_rows = []
    written = 0
    try:
        with _progress(json_output) as bar, RolloutWriter(partial) as writer:
            task_bar = bar.add_task("generating groups", total=groups)
            for group in iter_generate(loaded, tasks, node_key, round_seed=seed, sampling=sampling, groups=groups,
                                       group_size=group_size, policy_version=policy_version,
                                       batch_size=batch_size, stats=stats, score=score, reward_spec=reward_spec,
                                       witness=(lambda r, rows: witness_rows.append((r, rows)))
                                       if witness_rows is not None else None):
                for rollout in group:
                    writer.write(rollout)
                writer.flush()
                written += len(group)
                bar.advance(task_bar)
    except ValueError as error:  # a task the model cannot take (past its context), the task set's end
        if written == 0:
            partial.unlink(missing_ok=True)
            raise _fail(str(error)) from None
        raise _fail(f"{error}; the {written} records before it are kept in {partial}") from None
    if witness_rows is not None:  # before the rollouts appear: records are never without their rows
        try:
            write_witness(witness_path(out_path), witness_rows)
        except OSError as error:
            raise _fail(f"{witness_path(out_path)}: cannot write the hidden states ({error})") from None
    partial.replace(out_path)
    summary = {"rollouts": written, "groups": written // group_size, "tokens": stats.tokens,
               "out": str(out_path), "model_hash": loaded.model_hash.hex(),
               "commitment_bytes_per_token": round(stats.commitment_bytes / max(stats.tokens, 1), 3)}
    if json_output:
        out.print_json(data=summary)
    else:
        out.print(f"wrote {written} rollouts ({written // group_size} groups, {stats.tokens} tokens) to {out_path}",
                  highlight=False)


def verdict_table(verdicts, title: str = "verification"):
    """The verdicts as a table readable at 80 columns (every header and reason code whole; the
    task, the one free text, takes what is left and wraps), then each rejection's stage and
    sentence on a line of its own below it, where it has the whole width."""
    from rich.console import Group
    from rich.text import Text

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False,
                  show_edge=False)
    for column in ("#", "node", "task", "sample", "verdict", "reason"):
        # Only the task wraps, so rich narrows it alone. The rest are at most 53 columns with
        # their gaps (the longest reason code, sampling_params_mismatch, is 24 characters), which
        # leaves an arithmetic task id's 27 at 80 columns.
        table.add_column(column, no_wrap=column != "task", overflow="fold", min_width=len(column))
    details = []
    for v in verdicts:
        mark = "[green]accepted[/]" if v.accepted else "[red]rejected[/]"
        # Task ids and messages come from records: text, never markup (a "[/x]" would raise).
        table.add_row(str(v.index), v.node_id[:8], escape(v.task_id), str(v.sample_index) if v.sample_index >= 0
                      else "", mark, "" if v.accepted else v.reason)
        if not v.accepted:
            details.append(Text(f"{v.index} ({v.stage.name.lower()}): {v.message}"))
    return Group(table, *details)


@app.command()
def verify(
    rollouts: Annotated[Path, typer.Argument(help="Rollout file.")],
    model: Annotated[str, typer.Option(help=f"The model the rollouts claim: {MODELS}.")],
    task: Annotated[str | None, typer.Option(help="Task set pinning each group's assignment. " + TASK_HELP)] = None,
    columns: Annotated[str, typer.Option(help=COLUMNS_HELP)] = "",
    round_seed: Annotated[str | None, typer.Option(help="Require this round seed.")] = None,
    dtype: Annotated[str | None, typer.Option()] = None,
    batch_size: Annotated[int, typer.Option(min=1)] = 4,
    device: Annotated[str, typer.Option(help=DEVICE_HELP)] = "auto",
    json_output: Annotated[bool, typer.Option("--json", help="One JSON document on stdout; no progress bar.")] = False,
    # vrl.rollouts.verify.DEFAULT_MAX_TOKENS, written out: importing vrl.verify loads torch before --help.
    max_tokens: Annotated[int, typer.Option(min=1, help="Refuse records with more prompt plus completion tokens, "
                                            "before the model runs (the model's context applies too).")] = 4096,
    producer_device: Annotated[str, typer.Option(help="Device kind the rollouts were made on (same, cpu, cuda): "
                                                 "which calibrated profile applies.")] = "same",
    zk_file: Annotated[Path | None, typer.Option("--zk", help="Proofs of the records' rewards (vrl prove); "
                                                    "default: FILE.zk when it exists.")] = None,
    srs: Annotated[Path | None, typer.Option(help="A public KZG SRS file (kzg15.srs or larger) proofs must be "
                                                "made against.")] = None,
    allow_dev_srs: Annotated[bool, typer.Option(help="Accept proofs against this machine's dev SRS: INSECURE, "
                                                "for tests and demos.")] = False,
    sampling_file: Annotated[Path | None, typer.Option("--sampling", help="Sampling proofs at challenged "
                                                          "positions (vrl prove --kind sampling); default: "
                                                          "FILE.sampling when it exists.")] = None,
    challenge: Annotated[str | None, typer.Option(help="The challenge you issued (64 hex digits): every position "
                                                     "it picks must be proven, and no other.")] = None,
    positions: Annotated[int, typer.Option(min=1, max=64, help="Positions per record the challenge asked for.")] = 4,
    reward: Annotated[list[str] | None, typer.Option(help="Require this reward (repeatable terms, as generate's "
                                                        "--reward). Without it a record's own is recomputed, except "
                                                        "one that runs code (code/v1), which is run only when named "
                                                        "here.")] = None,
):
    """Verify every rollout in a file, and test each producer's sampling over all of its rollouts.
    Exit 0 all accepted, 1 any rejected, any producer's sequential test failed or any sampling
    proof failed, 2 unusable input."""
    configure_logging(json_output)
    from vrl.rollouts.files import RolloutFileError, iter_records
    from vrl.rollouts.generate import longest_prompt
    from vrl.rollouts.profiles import ProfileError, profile_of
    from vrl.rollouts.sequential import RaceTest, threshold
    from vrl.rollouts.verify import Expectations
    from vrl.rollouts.verify import verify as run_verify
    from vrl.tasks.chat import ChatTemplateError

    expect = Expectations(tasks=_task_set(task, columns) if task is not None else None,
                          round_seed=parse_round_seed(round_seed) if round_seed else None, max_tokens=max_tokens,
                          reward_spec=_pinned_reward(reward))
    try:
        records = list(iter_records(rollouts))
    except RolloutFileError as error:
        raise _fail(str(error)) from None
    if not records:
        raise _fail(f"{rollouts}: no records")
    loaded = _load(model, dtype, device)
    try:
        profile = profile_of(loaded, producer_device)
        if expect.tasks is not None:
            longest_prompt(loaded, expect.tasks)  # a chat task set this model cannot render: said once, here
    except (ProfileError, ChatTemplateError) as error:
        raise _fail(str(error)) from None
    proven, zk_summary = _check_proofs(rollouts, zk_file, records, loaded, srs, allow_dev_srs)
    with _progress(json_output) as bar:
        task_bar = bar.add_task("verifying", total=len(records))
        verdicts = run_verify(records, loaded, expect=expect, batch_size=batch_size, tolerances=profile.tolerances,
                              on_progress=lambda n: bar.advance(task_bar, n), proven=proven)
    sampling_summary = _check_sampling(rollouts, sampling_file, records, loaded, srs, allow_dev_srs,
                                       _challenge(challenge), positions, profile.tolerances.race_margin)
    accepted = sum(v.accepted for v in verdicts)
    reasons = Counter(v.reason for v in verdicts if not v.accepted)
    # specs/verification.md §7: each producer's races over all of its records in the file.
    tests: dict[str, RaceTest] = {}
    for v in verdicts:
        if "race_tokens" in v.scores:
            tests[v.node_id] = (tests.get(v.node_id) or RaceTest(profile.race_loss_rate)).add(*v.race_evidence)
    producers = {node: {"race_tokens": t.tokens, "races_lost": t.lost, "log_e": round(t.log_e, 4),
                        "rejected": t.rejected} for node, t in sorted(tests.items())}
    failed = [node for node, t in tests.items() if t.rejected]
    if json_output:
        out.print_json(data={"file": str(rollouts), "model_hash": loaded.model_hash.hex(), "profile": profile.name,
                             "total": len(verdicts), "accepted": accepted, "rejected": len(verdicts) - accepted,
                             "reasons": dict(reasons), "producers": producers, "zk": zk_summary,
                             "sampling_proofs": sampling_summary, "verdicts": [v.to_json() for v in verdicts]})
    else:
        out.print(verdict_table(verdicts, f"{rollouts}: {accepted} of {len(verdicts)} accepted"))
        for node, row in producers.items():
            verdict = "[red]FAILED[/]" if row["rejected"] else "passed"
            out.print(f"producer {node[:16]}: {row['races_lost']} of {row['race_tokens']} races lost, "
                      f"ln E = {row['log_e']:.2f} of {threshold():.2f} ({profile.name}): sequential test {verdict}")
        if zk_summary is not None:
            failed_proofs = ", ".join(f"{r} {n}" for r, n in zk_summary["failed"].items()) or "none failed"
            out.print(f"proofs ({zk_summary['file']}): {zk_summary['proven']} records' rewards proven, "
                      f"{failed_proofs}" + (" [red]INSECURE: dev SRS allowed[/]" if allow_dev_srs else ""))
        if sampling_summary is not None:
            out.print(_sampling_line(sampling_summary, allow_dev_srs), highlight=False)
    sampling_failed = sampling_summary is not None and sampling_summary["failed"]
    raise typer.Exit(EXIT_ACCEPTED if accepted == len(verdicts) and not failed and not sampling_failed
                     else EXIT_REJECTED)


def _check_sampling(rollouts: Path, sampling_file: Path | None, records: list, model, srs: Path | None,
                    allow_dev: bool, challenge: bytes | None, positions: int, drift: float) -> dict | None:
    """What the sampling proofs show (specs/zk.md §8.4), as a summary; None without a file."""
    from proofs import zk
    from vrl.rollouts.record import Rollout
    from vrl.zk import work_directory
    from vrl.zk.sampling import SamplingProofError, check_openings, openings_path, read_openings

    path = sampling_file or (openings_path(rollouts) if openings_path(rollouts).exists() else None)
    if path is None:
        return None
    in_file = [i for i, r in enumerate(records) if isinstance(r, Rollout)]  # damaged records have no proofs
    decoded = [records[i] for i in in_file]
    try:
        issued, openings = read_openings(path)
        if challenge is not None and challenge != issued:
            raise SamplingProofError(f"{path}: answers challenge {issued.hex()[:16]}..., not the one given")
        checks = check_openings(decoded, openings, model, _trusted_srs(srs, allow_dev), work_directory(),
                                challenge=challenge, count=positions, allow_dev=allow_dev, drift=drift)
    except (SamplingProofError, zk.ZkError) as error:
        raise _fail(str(error)) from None
    failed = Counter(str(c.outcome) for c in checks if c.outcome != "ok")
    margins = [c.margin for c in checks if c.outcome == "ok"]
    return {"file": str(path), "challenge": issued.hex(), "challenge_given": challenge is not None,
            "positions": len(checks), "proven": len(checks) - sum(failed.values()), "failed": dict(failed),
            "records_failed": len({c.record for c in checks if c.outcome != "ok"}),
            "max_margin": max(margins, default=0.0), "dev_srs_allowed": allow_dev,
            "checks": [{"record": in_file[c.record], "position": c.position, "outcome": str(c.outcome)}
                       for c in checks]}


def _sampling_line(summary: dict, allow_dev: bool) -> str:
    failed = ", ".join(f"{r} {n}" for r, n in summary["failed"].items()) or "none failed"
    origin = "" if summary["challenge_given"] else " (positions as the file says: pass --challenge to hold them to yours)"
    return (f"sampling proofs ({summary['file']}): {summary['proven']} of {summary['positions']} challenged tokens "
            f"proven, {failed}{origin}" + (" INSECURE: dev SRS allowed" if allow_dev else ""))


def _check_proofs(rollouts: Path, zk_file: Path | None, records: list, model, srs: Path | None,
                  allow_dev: bool) -> tuple[dict | None, dict | None]:
    """What the companion file's proofs show, for verify(proven=), and a summary; (None, None)
    without one."""
    from proofs import zk
    from vrl.zk import ZkFileError, companion_path, proven_correctness, read_attachments, work_directory

    path = zk_file or (companion_path(rollouts) if companion_path(rollouts).exists() else None)
    if path is None:
        return None, None
    try:
        attachments = read_attachments(path)
        proven = proven_correctness(records, attachments, model.decode, _trusted_srs(srs, allow_dev), work_directory(),
                                    allow_dev=allow_dev)
    except (ZkFileError, zk.ZkError) as error:
        raise _fail(str(error)) from None
    failed = Counter(v for v in proven.values() if isinstance(v, str))
    return proven, {"file": str(path), "attachments": len(attachments), "dev_srs_allowed": allow_dev,
                    "proven": sum(isinstance(v, bool) for v in proven.values()), "failed": dict(failed)}


@app.command()
def inspect(
    rollouts: Annotated[Path, typer.Argument(help="Rollout file.")],
    json_output: Annotated[bool, typer.Option("--json")] = False,
):
    """List the records of a rollout file, or the proofs of a companion file (.zk, .sampling), without
    verifying them."""
    from vrl.rollouts.files import RolloutFileError, iter_records
    from vrl.rollouts.record import RecordError

    if rollouts.suffix == ".zk":
        return _inspect_proofs(rollouts, json_output)
    if rollouts.suffix == ".sampling":
        return _inspect_openings(rollouts, json_output)
    rows = []
    try:
        for index, item in enumerate(iter_records(rollouts)):
            if isinstance(item, RecordError):
                rows.append({"index": index, "error": str(item.at(index))})
            else:
                rows.append({"index": index, "node_id": item.node_id.hex(), "group_index": item.group_index,
                             "task_id": item.task_id,
                             "sample_index": item.sample_index, "group_size": item.group_size,
                             "policy_version": item.policy_version, "model_hash": item.model_hash.hex(),
                             "prompt_tokens": len(item.prompt_tokens), "completion_tokens": len(item.completion_tokens),
                             "finish_reason": item.finish_reason, "reward": item.reward,
                             "reward_spec": str(item.reward_spec), "temperature": item.sampling.temperature, "commitment_bytes": len(item.commitment)})
    except RolloutFileError as error:
        raise _fail(str(error)) from None
    if json_output:
        out.print_json(data=rows)
        return
    # Readable at 80 columns: no vertical rules, one space between columns, every header whole;
    # only the task id, the one free-length text, gives way (cut with an ellipsis).
    table = Table(title=f"{rollouts}: {len(rows)} records", title_justify="left", box=box.SIMPLE_HEAD,
                  padding=0, pad_edge=False, show_edge=False)
    for column in ("#", "node", "group", "task", "sample", "version", "prompt", "tokens", "finish", "reward", "T",
                   "commit B"):
        table.add_column(column, no_wrap=True, overflow="ellipsis", min_width=len(column),
                         max_width=24 if column == "task" else None)
    for row in rows:
        if "error" in row:
            table.add_row(str(row["index"]), f"[red]{escape(row['error'])}[/]")
            continue
        table.add_row(str(row["index"]), row["node_id"][:8], str(row["group_index"]), escape(row["task_id"]),
                      f"{row['sample_index']}/{row['group_size']}",
                      str(row["policy_version"]), str(row["prompt_tokens"]), str(row["completion_tokens"]),
                      row["finish_reason"], f"{row['reward']:g}", f"{row['temperature']:g}", str(row["commitment_bytes"]))
    out.print(table)


def _inspect_proofs(path: Path, json_output: bool) -> None:
    from vrl.zk import ZkFileError, read_attachments

    try:
        attachments = read_attachments(path)
    except ZkFileError as error:
        raise _fail(str(error)) from None
    rows = [{"index": i, "circuit": a.circuit, "subject": a.subject.hex(), "srs": a.srs_hash.hex(),
             "vk": a.vk_hash.hex(), "instances": [x.hex() for x in a.instances], "proof_bytes": len(a.proof)}
            for i, a in enumerate(attachments)]
    if json_output:
        out.print_json(data=rows)
        return
    table = Table(title=f"{path}: {len(rows)} proofs", title_justify="left")
    for column in ("#", "circuit", "record", "SRS", "key", "public inputs", "bytes"):
        table.add_column(column)
    for row in rows:
        table.add_row(str(row["index"]), escape(row["circuit"]), row["subject"][:12], row["srs"][:12],
                      row["vk"][:12], str(len(row["instances"])), str(row["proof_bytes"]))
    out.print(table)


def _inspect_openings(path: Path, json_output: bool) -> None:
    from vrl.zk.sampling import SamplingProofError, read_openings

    try:
        challenge, openings = read_openings(path)
    except SamplingProofError as error:
        raise _fail(str(error)) from None
    rows = [{"index": i, "record": o.record.hex(), "position": o.position, "circuit": o.attachment.circuit,
             "srs": o.attachment.srs_hash.hex(), "vk": o.attachment.vk_hash.hex(),
             "instances": len(o.attachment.instances), "proof_bytes": len(o.attachment.proof)}
            for i, o in enumerate(openings)]
    if json_output:
        out.print_json(data={"challenge": challenge.hex(), "openings": rows})
        return
    table = Table(title=f"{path}: {len(rows)} sampling proofs, challenge {challenge.hex()[:16]}...",
                  title_justify="left")
    for column in ("#", "record", "position", "circuit", "SRS", "key", "bytes"):
        table.add_column(column)
    for row in rows:
        table.add_row(str(row["index"]), row["record"][:12], str(row["position"]), escape(row["circuit"]),
                      row["srs"][:12], row["vk"][:12], str(row["proof_bytes"]))
    out.print(table)


@app.command("commit-answers")
def commit_answers_command(
    task: Annotated[str, typer.Argument(help="Task file whose reference answers are to stay private.")],
    out_path: Annotated[Path, typer.Option("--out", help="Public task file to write: references as commitments.")],
    key_path: Annotated[Path, typer.Option("--key", help="Private answer key to write (never overwritten).")],
    columns: Annotated[str, typer.Option(help=COLUMNS_HELP + " The public file is written in vrl's own "
                                         "field names.")] = "",
):
    """Publish a task set with its reference answers as salted commitments; keep the key (specs/zk.md §7)."""
    configure_logging(False)
    from vrl.zk import ZkFileError, commit_answers, write_key, write_task_file

    tasks = getattr(_task_set(task, columns), "tasks", None)
    if tasks is None:
        raise _fail(f"{task}: a generated task set has no answers to keep private; give a task file")
    if key_path.exists():
        raise _fail(f"{key_path} exists; an answer key is never overwritten (its salts open the published "
                    "commitments)")
    if key_path.resolve() == out_path.resolve():
        raise _fail("--out and --key name one file: the public tasks would overwrite the private key")
    try:
        public, key = commit_answers(tasks)
        write_key(key_path, key)
        write_task_file(out_path, public)
    except (ZkFileError, OSError, ValueError) as error:  # ValueError: a malformed zk: reference
        raise _fail(str(error)) from None
    out.print(f"wrote {len(public)} tasks with committed references to {out_path}; the answer key to {key_path} "
              "(keep it private)", highlight=False)


@app.command()
def prove(
    rollouts: Annotated[Path, typer.Argument(help="Rollout file.")],
    model: Annotated[str, typer.Option(help=f"The model the rollouts claim (for its tokenizer): {MODELS}.")],
    answers: Annotated[Path | None, typer.Option(help="--kind reward: the answer key of the rollouts' task set "
                                                    "(vrl commit-answers).")] = None,
    kind: Annotated[str, typer.Option(help="What to prove: reward (the answer's correctness against a private "
                                      "reference) or sampling (challenged tokens won their races).")] = "reward",
    positions: Annotated[int, typer.Option(min=1, max=64, help="--kind sampling: positions per record.")] = 4,
    challenge: Annotated[str | None, typer.Option(help="--kind sampling: the verifier's challenge, 64 hex digits "
                                                     "(it picks the positions).")] = None,
    witness: Annotated[Path | None, typer.Option(help="--kind sampling: the hidden states (default FILE.hidden, "
                                                    "written by vrl generate --hidden-states).")] = None,
    srs: Annotated[Path | None, typer.Option(help="A public KZG SRS file (kzg15.srs or larger) to prove "
                                                "against.")] = None,
    dev_srs: Annotated[bool, typer.Option(help="Prove against this machine's dev SRS: INSECURE, for tests and "
                                          "demos.")] = False,
    out_path: Annotated[Path | None, typer.Option("--out", help="File to write; default FILE.zk (reward) or "
                                                     "FILE.sampling (sampling).")] = None,
    json_output: Annotated[bool, typer.Option("--json")] = False,
):
    """Prove the rewards of a rollout file's records of private tasks, or the tokens a challenge
    picks in each record; write the proofs beside it."""
    configure_logging(json_output)
    from proofs import zk
    from proofs.circuits import ANSWER_MATCH
    from vrl.rollouts.files import RolloutFileError, read_rollouts
    from vrl.rollouts.record import RecordError
    from vrl.zk import (
        ZkFileError,
        companion_path,
        named_proofs,
        proof_plan,
        prove_statements,
        work_directory,
        write_attachments,
    )

    if kind == "sampling":
        return _prove_sampling(rollouts, model, positions, challenge, witness, srs, dev_srs, out_path, json_output)
    if kind != "reward":
        raise _fail(f"--kind {kind}: choose reward or sampling")
    if answers is None:
        raise _fail("--kind reward needs the answer key: --answers FILE")
    key = _answer_key(answers)
    try:
        records = list(read_rollouts(rollouts))
    except (RolloutFileError, RecordError) as error:  # proofs are for a whole, intact file
        raise _fail(f"{rollouts}: {error}") from None
    loaded = _load(model, None, "cpu")
    chosen = _srs_for(srs, dev_srs, ANSWER_MATCH.logrows)
    target = out_path or companion_path(rollouts)
    try:
        statements, named = proof_plan(records, key, loaded.decode)
        with _progress(json_output) as bar:
            task_bar = bar.add_task("proving", total=len(statements))
            attachments = named_proofs(prove_statements(statements, chosen, work_directory(),
                                                        on_progress=lambda n: bar.advance(task_bar, n)), named)
    except (ZkFileError, zk.ZkError) as error:
        raise _fail(str(error)) from None
    try:
        write_attachments(target, attachments)
    except (ZkFileError, OSError) as error:
        raise _fail(f"{target}: cannot write the proofs ({error})") from None
    _proved(len(records), len(attachments), f"proofs ({len(statements)} distinct)", target, chosen, json_output)


def _proved(records: int, proofs: int, what: str, target: Path, srs, json_output: bool) -> None:
    """What ``vrl prove`` reports: the proofs written, and whether they are insecure."""
    if json_output:
        out.print_json(data={"records": records, "proofs": proofs, "out": str(target), "srs": srs.sha256.hex(),
                             "dev_srs": srs.dev})
    else:
        out.print(f"wrote {proofs} {what} for {records} records to {target}"
                  + (" [red](INSECURE: dev SRS)[/]" if srs.dev else ""), highlight=False)


def _challenge(text: str | None) -> bytes | None:
    if text is None:
        return None
    try:
        value = bytes.fromhex(text)
    except ValueError:
        value = b""
    if len(value) != 32:
        raise _fail(f"--challenge {text!r}: 64 hex digits")
    return value


def _prove_sampling(rollouts: Path, model: str, positions: int, challenge: str | None, witness: Path | None,
                    srs: Path | None, dev_srs: bool, out_path: Path | None, json_output: bool) -> None:
    from proofs import zk
    from vrl.rollouts.files import RolloutFileError, read_rollouts
    from vrl.rollouts.record import RecordError
    from vrl.zk import ZkFileError, work_directory
    from vrl.zk.sampling import (
        SamplingProofError,
        circuit_for,
        openings_path,
        prove_sampling,
        read_witness,
        witness_path,
        write_openings,
    )

    issued = _challenge(challenge)
    if issued is None:
        raise _fail("--kind sampling needs the verifier's --challenge (64 hex digits): the prover never picks "
                    "its own positions")
    try:
        records = list(read_rollouts(rollouts))
    except (RolloutFileError, RecordError) as error:
        raise _fail(f"{rollouts}: {error}") from None
    loaded = _load(model, None, "cpu")
    target = out_path or openings_path(rollouts)
    try:
        circuit = circuit_for(loaded)
        chosen = _srs_for(srs, dev_srs, circuit.logrows)
        rows = read_witness(witness or witness_path(rollouts))
        with _progress(json_output) as bar:
            task_bar = bar.add_task("proving sampled tokens", total=len(records) * positions)
            openings = prove_sampling(loaded, records, rows, issued, positions, chosen, work_directory(),
                                      on_proof=lambda n: bar.advance(task_bar, n))
        write_openings(target, issued, openings)
    except (SamplingProofError, ZkFileError, zk.ZkError) as error:
        raise _fail(str(error)) from None
    except OSError as error:
        raise _fail(f"{target}: cannot write the proofs ({error})") from None
    _proved(len(records), len(openings), "sampling proofs", target, chosen, json_output)


@app.command()
def evaluate(
    model: Annotated[str, typer.Option(help=f"The model to evaluate: {MODELS}.")],
    task: Annotated[str, typer.Option(help="Public task file of committed references (vrl commit-answers).")],
    answers: Annotated[Path | None, typer.Option(help="Its answer key: make a claim.")] = None,
    key: Annotated[Path | None, typer.Option(help="The evaluator's node key (see vrl keygen): make a claim.")] = None,
    out_path: Annotated[Path | None, typer.Option("--out", help="The claim's rollout file (new); beside it OUT.zk "
                                                     "(proofs) and OUT.claim.json.")] = None,
    check: Annotated[Path | None, typer.Option(help="Check this claim (OUT.claim.json) instead of making one.")] = None,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="The answers' length limit (decoding is greedy).")] = 64,
    srs: Annotated[Path | None, typer.Option(help="A public KZG SRS file proofs are made (or must be made) "
                                                "against.")] = None,
    dev_srs: Annotated[bool, typer.Option(help="Prove against this machine's dev SRS: INSECURE.")] = False,
    allow_dev_srs: Annotated[bool, typer.Option(help="Accept proofs against the dev SRS: INSECURE.")] = False,
    json_output: Annotated[bool, typer.Option("--json")] = False,
):
    """Held-out accuracy on a private test set, proven (specs/zk.md §9): make a claim with
    --answers, --key and --out; check one, without the answers, with --check. Exit 0 a claim
    made or upheld, 1 a claim its own signed files do not uphold, 2 unusable input or a claim
    that could not be judged (its files are not the ones it signs, another model or task set)."""
    configure_logging(json_output)
    from proofs import zk
    from proofs.circuits import ANSWER_MATCH
    from vrl.rollouts.keys import KeyFileError, NodeKey
    from vrl.zk import ZkFileError, check_claim_file, companion_path, evaluate_private, work_directory, write_claim

    public = getattr(_task_set(task), "tasks", None)
    if public is None:
        raise _fail(f"{task}: an evaluation needs a task file, not a generated set")
    if check is not None:
        loaded = _load(model, None, "cpu")
        try:
            claim, result = check_claim_file(check, loaded, public, _trusted_srs(srs, allow_dev_srs), work_directory(),
                                             allow_dev=allow_dev_srs)
        except (ZkFileError, zk.ZkError) as error:
            raise _fail(str(error)) from None
        if result.unchecked:
            raise _fail(f"{check}: cannot be judged: " + "; ".join(result.unchecked))
        summary = {"claim": str(check), "claimed": [claim.correct, claim.total], "proven": [result.correct, result.total],
                   "max_new_tokens": claim.max_new_tokens, "accuracy": claim.accuracy, "upheld": result.ok,
                   "problems": list(result.problems), "dev_srs_allowed": allow_dev_srs}
        if json_output:
            out.print_json(data=summary)
        else:
            for problem in result.problems:
                out.print(f"[red]{escape(problem)}[/]")
            verdict = "upheld" if result.ok else "[red]NOT upheld[/]"
            out.print(f"claim {check}: {claim.correct} of {claim.total} correct ({claim.accuracy:.1%}), greedy, up to "
                      f"{claim.max_new_tokens} tokens; the proofs show {result.correct} of {result.total}: {verdict}"
                      + (" [red](INSECURE: dev SRS allowed)[/]" if allow_dev_srs else ""))
        raise typer.Exit(EXIT_ACCEPTED if result.ok else EXIT_REJECTED)
    if answers is None or key is None or out_path is None:
        raise _fail("to make a claim give --answers, --key and --out; to check one, --check CLAIM")
    targets = (out_path, companion_path(out_path), out_path.with_name(out_path.name + ".claim.json"))
    taken = next((t for t in targets if t.exists() or t.resolve() in (answers.resolve(), Path(task).resolve())), None)
    if taken is not None:
        raise _fail(f"{taken} exists or is an input: a claim's files are new files")
    if not out_path.resolve().parent.is_dir():
        raise _fail(f"{out_path.parent}: no such folder")
    answer_key = _answer_key(answers)
    try:
        node_key = NodeKey.load(key)
    except KeyFileError as error:
        raise _fail(str(error)) from None
    loaded = _load(model, None, "cpu")
    chosen = _srs_for(srs, dev_srs, ANSWER_MATCH.logrows)
    try:
        with _progress(json_output) as bar:
            task_bar = bar.add_task("answering and proving", total=len(public))
            records, attachments, claim = evaluate_private(
                loaded, public, answer_key, node_key, max_new_tokens=max_new_tokens, srs=chosen,
                workdir=work_directory(), records_name=out_path.name,
                model_locator=str(Path(model).resolve()) if Path(model).exists() else model,
                task_file=str(Path(task).resolve()), on_progress=lambda n: bar.advance(task_bar, n))
        claim_path = write_claim(out_path, records, attachments, claim)
    except (ZkFileError, zk.ZkError, ValueError, OSError) as error:
        raise _fail(str(error)) from None
    if json_output:
        out.print_json(claim.to_json())
    else:
        out.print(f"{claim.correct} of {claim.total} correct ({claim.accuracy:.1%}) on {len(public)} private tasks, "
                  f"greedy, up to {max_new_tokens} tokens; claim {claim_path}, {len(attachments)} proofs"
                  + (" [red](INSECURE: dev SRS)[/]" if chosen.dev else ""), highlight=False)


class _TrainCommand(typer.core.TyperCommand):
    """``vrl train``, whose help shows each flag's default: the default of the config key the
    flag sets, defined once, in :class:`vrl.rl.config.TrainConfig` (or its ``[grpo]`` table).
    The flags' own defaults are None, so that a --config file's keys apply where no flag is
    given; their ranges are the config's too (a value out of range is refused naming the key).
    Read when the help is shown: every other command starts without importing the configs."""

    def format_help(self, ctx, formatter) -> None:
        from dataclasses import fields

        from vrl.rl.config import TrainConfig

        defaults = TrainConfig()
        owners = {f.name: config for config in (defaults, defaults.grpo) for f in fields(config)}
        for param in self.params:
            if param.name in owners and "[default:" not in (param.help or ""):  # once a process
                value = getattr(owners[param.name], param.name)
                shown = (",".join(value) or "none") if isinstance(value, tuple) else value
                param.help = f"{param.help or ''}  [default: {shown}]".strip()
        super().format_help(ctx, formatter)


@app.command(cls=_TrainCommand)
def train(
    run_dir: Annotated[Path, typer.Option("--out", help="Run directory (metrics, checkpoints, rollouts, plot).")],
    config: Annotated[Path | None, typer.Option(help="TOML config (the keys of vrl.rl.config.TrainConfig): its "
                                                   "values replace the defaults below, and flags given here "
                                                   "override it.")] = None,
    model: Annotated[str | None, typer.Option(help=f"The model to start from: {MODELS}.")] = None,
    task: Annotated[str | None, typer.Option(help=TASK_HELP)] = None,
    columns: Annotated[str | None, typer.Option(help=COLUMNS_HELP)] = None,
    steps: Annotated[int | None, typer.Option(help="GRPO steps, each a policy version.")] = None,
    group_size: Annotated[int | None, typer.Option(help="Samples per task.")] = None,
    groups_per_step: Annotated[int | None, typer.Option()] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="0: chosen from the task set (8 for arithmetic, the "
                                                          "reference solutions' length), and recorded in "
                                                          "RUN/config.toml.")] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature.")] = None,
    learning_rate: Annotated[float | None, typer.Option("--lr")] = None,
    verify_fraction: Annotated[float | None, typer.Option(help="Share of groups verified (1 = all).")] = None,
    advantage: Annotated[str | None, typer.Option(help="std (GRPO) or mean (Dr. GRPO).")] = None,
    aggregation: Annotated[str | None, typer.Option(help="token (DAPO), sequence (GRPO), constant (Dr. GRPO).")] = None,
    kl_beta: Annotated[float | None, typer.Option(help="Weight of the KL penalty.")] = None,
    iterations: Annotated[int | None, typer.Option(help="Optimizer steps per batch (GRPO's mu).")] = None,
    reward: Annotated[list[str] | None, typer.Option(help=REWARD_HELP)] = None,
    device: Annotated[str | None, typer.Option(help=DEVICE_HELP)] = None,
    report_to: Annotated[list[str] | None, typer.Option(metavar="<name,...>", help=(
        "Where each step's metrics go besides RUN/metrics.jsonl, as TRL's report_to: wandb, tensorboard, all "
        "(those installed) or none; repeat it or separate with commas. wandb reads its own environment "
        "(WANDB_MODE=offline: files only)."))] = None,
    resume: Annotated[bool, typer.Option(help="Continue the run in --out from its newest checkpoint.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="JSON logs and a JSON summary; no progress bar.")] = False,
):
    """GRPO on verified rollouts: generate, verify, update, publish a policy version; repeat."""
    configure_logging(json_output, logging.INFO)  # --json: a JSON line per step on stderr, as promised
    from vrl.rl.plots import plot_run
    from vrl.rl.trackers import report_to as trackers_named
    from vrl.rl.train import TrainConfig, Trainer

    try:
        trackers = None if report_to is None else trackers_named(report_to)
    except VrlError as error:
        raise _fail(str(error)) from None
    flags = {"model": model, "task": task, "columns": columns, "steps": steps, "group_size": group_size,
             "groups_per_step": groups_per_step, "max_new_tokens": max_new_tokens, "temperature": temperature,
             "learning_rate": learning_rate, "verify_fraction": verify_fraction, "device": device,
             "report_to": trackers, "reward": tuple(reward) if reward else None,
             "grpo": {"advantage": advantage, "aggregation": aggregation, "kl_beta": kl_beta,
                      "iterations": iterations}}
    saved = run_dir / "config.toml"
    try:
        if config is not None:
            settings = TrainConfig.from_toml(config, **flags)
        elif resume and saved.exists():
            settings = TrainConfig.from_saved(saved, **flags)
        else:
            settings = TrainConfig.from_dict({}, **flags)
        # The task set opened as generate opens it: a skipped line is the same warning in both.
        trainer = Trainer(settings, run_dir, resume=resume, log=log.info, fall_back=True,  # past damaged ones, logged
                          tasks=_task_set(settings.task, settings.columns))
    except VrlError as error:  # a config, model, task set, checkpoint, run directory or tracker, named
        raise _fail(str(error)) from None
    log.info("training", model=settings.model, task=settings.task, steps=settings.steps, start=trainer.step_index,
             node_id=trainer.key.node_id.hex()[:16])
    with _progress(json_output) as bar:
        steps_bar = bar.add_task("GRPO steps", total=settings.steps, completed=trainer.step_index)
        unlearnable: list[int] = []  # steps no group could be learned from, said once

        def report(record: dict) -> None:
            if record["groups_used"] == 0 and record["groups_zero_variance"] and not unlearnable:
                unlearnable.append(record["step"])
                # GRPO learns from differences within a group (specs/training.md §4; DAPO §3.2):
                # a group whose samples all score alike has no advantage, hence no gradient.
                log.warning("no group could be learned from: within every group the samples scored alike "
                            f"(mean reward {record['reward_mean']:g}), so the step changed nothing; a longer "
                            "--max-new-tokens, a higher --temperature or an easier task set gives groups "
                            "that differ", step=record["step"], max_new_tokens=trainer.config.max_new_tokens,
                            truncated_fraction=record.get("truncated_fraction"))
            accuracy = record.get("held_out_accuracy")
            bar.update(steps_bar, advance=1, description=(
                f"GRPO step {record['step'] + 1}: reward {record['reward_mean']:.2f}"
                + (f", held-out {accuracy:.0%}" if accuracy is not None else "")
                + (f", [red]{record['rejected']} rejected[/]" if record["rejected"] else "")))
            if json_output:
                log.info("step", **{k: v for k, v in record.items() if not k.startswith("seconds")})

        final = trainer.run(report)
    png = plot_run(trainer.metrics_path, run_dir / "curves.png", title=f"{settings.model} on {settings.task}")
    summary = {"run": str(run_dir), "steps": final["step"], "model_hash": final["model_hash"],
               "held_out_accuracy": final["held_out_accuracy"], "plot": str(png),
               **({"trackers_failed": trainer.trackers.failures} if trainer.trackers.failures else {})}
    for name, what in trainer.trackers.failures.items():  # said when it happened; again, where it is read
        log.warning("a tracker stopped during the run; metrics.jsonl has every step", tracker=name, error=what)
    if json_output:
        out.print_json(data=summary)
    else:
        out.print(f"{final['step']} steps; held-out accuracy {final['held_out_accuracy']:.1%}; "
                  f"policy {final['model_hash'][:16]}; curves in {png}", highlight=False)


@app.command()
def export(
    policy: Annotated[str, typer.Argument(help="A run directory (its newest checkpoint), a checkpoint directory, "
                                               "a node or devnet folder (the newest policy it holds), or a "
                                               "policy's model hash (8+ hex digits) with --from.",
                                          show_default=False)],
    out_dir: Annotated[Path, typer.Option("--out", help="The Hugging Face directory to write (must not exist).")],
    source: Annotated[Path | None, typer.Option("--from", help="Where a model hash is looked up: a run, a "
                                                                   "node folder or a devnet folder.")] = None,
    base: Annotated[str | None, typer.Option(help="The model a checkpoint outside its run was trained from "
                                                     "(default: the run's config.toml).")] = None,
    dtype: Annotated[str, typer.Option(help="How the weights are stored: float32 keeps the version's model "
                                            "hash; bfloat16 or float16 halve the size.")] = "float32",
    json_output: Annotated[bool, typer.Option("--json", help="Print what was written as JSON.")] = False,
):
    """Write a trained policy as a standard Hugging Face directory (model and tokenizer,
    safetensors) that transformers, vLLM and TRL load as is."""
    configure_logging(json_output)
    from vrl.audit.sources import STORE_FILE, announced_policy
    from vrl.rl.export import PROVENANCE_FILE, ExportError, is_checkpoint, is_run, open_checkpoint, open_version
    from vrl.rl.export import export as write

    try:
        if Path(policy).is_dir() and (is_run(Path(policy)) or is_checkpoint(Path(policy))):
            trained = open_checkpoint(Path(policy), base=base)
        elif Path(policy).is_dir():  # a node or a devnet folder: the newest policy it holds
            if not any(Path(policy).glob(f"{STORE_FILE}")) and not any(Path(policy).glob(f"node-*/{STORE_FILE}")):
                raise ExportError(f"{policy}: neither a run directory (config.toml and checkpoints/), a checkpoint "
                                  f"(MANIFEST.json), a node folder ({STORE_FILE}) nor a devnet folder "
                                  f"(node-*/{STORE_FILE})")
            trained = announced_policy(None, Path(policy))
        elif source is None:
            raise ExportError(f"{policy}: not a directory; to name a policy by its model hash, say where it is "
                              "(--from a run, a node folder or a devnet folder)")
        elif is_run(source):
            trained = open_version(policy, source)
        else:
            trained = announced_policy(policy, source)
        target = write(trained, out_dir, dtype=dtype)
    except ExportError as error:
        raise _fail(str(error)) from None
    facts = {**trained.provenance(), "out": str(target), "stored_dtype": dtype}
    if json_output:
        out.print_json(data=facts)
        return
    out.print(f"exported policy version {trained.version} of {trained.base} (model {facts['model_hash'][:16]}) "
              f"to {target}", highlight=False, soft_wrap=True)
    out.print(f"transformers loads it as is: AutoModelForCausalLM.from_pretrained({str(target)!r}); where it came "
              f"from is in {PROVENANCE_FILE}", highlight=False, soft_wrap=True)


@app.command("build-base-model")
def build_base_model_command(
    steps: Annotated[int | None, typer.Option(min=1, help="SFT steps (default: the measured default).")] = None,
    model: Annotated[str, typer.Option(help="Which built model: base (the tiny preset) or base-micro (the micro "
                                            "preset, whose tokens zk proofs can cover).")] = "base",
    out_dir: Annotated[Path | None, typer.Option("--out", help="Directory (default: the data directory).")] = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if it is cached.")] = False,
):
    """Supervised fine-tuning of a preset on the arithmetic format (cached; about 3 minutes for base)."""
    configure_logging(False)
    import dataclasses

    from vrl.rl.base_model import build_base_model, is_pinned_build
    from vrl.rollouts.presets import BUILT, base_model_dir, read_meta

    if model not in BUILT:
        raise _fail(f"--model {model}: choose one of {', '.join(BUILT)}")
    config = dataclasses.replace(BUILT[model], steps=steps) if steps else BUILT[model]
    target = out_dir or base_model_dir(config)
    if is_pinned_build(target) and not force:  # one built before the pins is built again
        meta = read_meta(target)
        out.print(f"{model} model already built: {target} (held-out accuracy {meta['held_out_accuracy']:.1%})",
                  highlight=False)
        return
    with _progress(False) as bar:
        sft = bar.add_task("supervised fine-tuning", total=config.steps)
        path = build_base_model(config, target, on_step=lambda step, loss: bar.update(
            sft, advance=1, description=f"supervised fine-tuning, loss {loss:.3f}"))
    meta = read_meta(path)
    out.print(f"built {path} in {meta['train_seconds']:.0f} s: held-out accuracy {meta['held_out_accuracy']:.1%} "
              f"sampled, {meta['held_out_accuracy_greedy']:.1%} greedy; model {meta['model_hash'][:16]}", highlight=False)


@app.command()
def node(
    config_path: Annotated[Path, typer.Option("--config", help="node.toml (see README: roles, listen, bootstrap...)")],
    json_logs: Annotated[bool, typer.Option("--json", help="JSON log lines (structlog) instead of console logs.")] = False,
):
    """Run a node daemon until SIGINT/SIGTERM: worker, verifier and/or trainer on a libp2p network."""
    import asyncio

    from rich.markup import escape

    from vrl.adversary import node_for
    from vrl.node.config import ConfigError, NodeConfig
    from vrl.node.run import serve

    def fail(message: str) -> typer.Exit:
        # One line however wide (soft_wrap), and a value quoted in it is never read as markup.
        err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
        return typer.Exit(EXIT_UNUSABLE)

    configure_logging(json_logs, level=logging.INFO)
    try:
        config = NodeConfig.from_toml(config_path)
    except ConfigError as error:  # names the file and the key
        raise fail(str(error)) from None
    try:
        asyncio.run(serve(config, node_for(config.adversary)))
    except ConfigError as error:  # what only the start finds, named by key
        raise fail(f"{config_path}: {error}") from None
    except VrlError as error:  # a checkpoint, store, key or model: these name their file
        raise fail(str(error)) from None


@app.command()
def devnet(
    nodes: Annotated[int, typer.Option(min=2, help="Node processes; node 0 trains, the rest work and verify.")] = 4,
    adversaries: Annotated[str, typer.Option(help="Comma-separated cheats for the last nodes: "
                                             "fabricated-reward, quantized-model, other-model, tampered-tokens, "
                                             "replay, lazy-verifier; and at most one for the trainer (node 0): "
                                             "trainer-rejected-group, trainer-foreign-data, trainer-drops-node, "
                                             "trainer-learning-rate, trainer-fake-weights, "
                                             "trainer-inflated-rewards (with --answers).")] = "",
    rounds: Annotated[int, typer.Option(min=1, help="Stop after the trainer has published this many versions.")] = 6,
    model: Annotated[str, typer.Option(help="Model every node builds its skeleton from (weights come from the trainer).")] = "base",
    task: Annotated[str, typer.Option()] = "arithmetic:digits=2,ops=+",
    directory: Annotated[Path | None, typer.Option("--dir", help="Node directories (default: a new temp dir).")] = None,
    base_port: Annotated[int, typer.Option(help="libp2p ports start here, metrics ports at +1000; keep both "
                                           "below the ephemeral range (32768+), which outgoing dials use.")] = 29000,
    deadline: Annotated[float, typer.Option(help="Stop after this many seconds whatever happened.")] = 900.0,
    plant_every: Annotated[int, typer.Option(help="The trainer plants a known-bad group every N rounds (0: never).")] = 2,
    answers: Annotated[Path | None, typer.Option(help="Private tasks: --task is a public file of committed "
                                                    "references and this its answer key, which only the trainer "
                                                    "gets; it proves every trained record's reward.")] = None,
    srs: Annotated[Path | None, typer.Option(help="With --answers: the network's public KZG SRS file.")] = None,
    dev_srs: Annotated[bool, typer.Option(help="With --answers: a single-party test SRS (INSECURE).")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
):
    """Start N real node processes on 127.0.0.1, show them live, stop after ROUNDS policy versions.

    Exits 1, saying why, when a node dies, the nodes cannot reach each other, or the network
    never gets past policy version 0."""
    import tempfile

    from vrl.node import devnet as dn

    configure_logging(False)
    kinds = [k for k in adversaries.split(",") if k]
    if model == "base":
        from vrl.rl.base_model import ensure_base_model

        ensure_base_model()
    zk: dict = {}
    if answers is not None:  # specs/zk.md §11: the key goes to the trainer's node.toml only (dn.plan)
        if (srs is None) == (not dev_srs):
            raise _fail("--answers needs the network's SRS: --srs PATH, or --dev-srs (INSECURE)")
        zk = {"answers": str(answers), **({"srs": str(srs)} if srs is not None else {"dev_srs": True})}
    elif srs is not None or dev_srs:
        raise _fail("--srs and --dev-srs are for a network of private tasks: give --answers too")
    directory = directory or Path(tempfile.mkdtemp(prefix="vrl-devnet-"))  # resolved once, by dn.plan
    try:
        summary = dn.run(directory, nodes, kinds, rounds, deadline, base_port, err,
                         work={"model": model, "task": task}, protocol={"plant_every": plant_every},
                         **({"zk": zk} if zk else {}))
    except ValueError as error:
        raise _fail(str(error)) from None
    if json_out:
        out.print_json(json.dumps(summary, default=str))
    else:
        out.print(f"devnet finished: {dn.outcome_line(summary)}", highlight=False)
    if summary["failure"]:  # a network that did nothing is not a success
        from rich.markup import escape

        err.print(f"[bold red]error:[/] devnet failed: {escape(summary['failure'])}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


@app.command()
def reputation(
    store_path: Annotated[Path, typer.Argument(help="A node's node.sqlite.")],
    trust: Annotated[list[str], typer.Option(help="Hex node ids to pre-trust (the node itself, its trainer...).")],
    at_round: Annotated[int | None, typer.Option("--round", help="Evaluate as of this round (default: newest).")] = None,
    json_out: Annotated[bool, typer.Option("--json")] = False,
):
    """Recompute every node's reputation from the signed verdicts in a store, as an auditor would."""
    from vrl.node.messages import SignedVerdict, Submission
    from vrl.node.protocol import report_of
    from vrl.node.reputation import Reputation
    from vrl.node.store import Store, StoreError

    try:
        store = Store(store_path) if store_path.exists() else None
    except StoreError as error:
        raise _fail(str(error)) from None
    if store is None:
        raise _fail(f"{store_path}: no such store")
    try:
        anchors = frozenset(bytes.fromhex(t) for t in trust)
    except ValueError:
        raise _fail("--trust takes hex node ids") from None
    view = Reputation(anchors)
    invalid = 0
    rounds = [0]
    groups: dict[bytes, tuple[bytes, int]] = {}  # digest -> (signer of its records, policy version)
    for kind, data, extra in store.replay():
        if kind == "group":
            groups[Submission.from_bytes(data).digest] = extra[:2]
        if kind != "verdict":
            continue
        verdict = SignedVerdict.from_bytes(data)
        report = report_of(verdict, *groups[verdict.group]) if verdict.group in groups else None
        if not verdict.valid() or (verdict.checked and report is None):
            invalid += 1
            continue
        rounds.append(verdict.policy_version)
        if report is not None:
            view.add(report)
    store.close()
    standings = view.standings(max(rounds) if at_round is None else at_round)
    rows = [{"node": n.hex(), "score": s.score, "check_rate": s.check_rate, "quarantined": s.quarantined,
             "trust": s.trust, "checked_groups": s.checked_groups} for n, s in sorted(
        standings.items(), key=lambda item: (-item[1].score, item[0]))]
    if json_out:
        out.print_json(json.dumps({"invalid_verdicts": invalid, "nodes": rows}))
        return
    table = Table(title=f"reputation recomputed from {len(view.reports())} reports ({invalid} invalid verdicts skipped)",
                  title_justify="left")
    for column in ("node", "score", "check rate", "trust", "checked groups", "quarantined"):
        table.add_column(column, justify="left" if column == "node" else "right")
    for row in rows:
        table.add_row(row["node"][:16], f"{row['score']:.3f}", f"{row['check_rate']:.2f}", f"{row['trust']:.2f}",
                      str(row["checked_groups"]), "[red]yes[/]" if row["quarantined"] else "no")
    out.print(table)


@app.command()
def audit(
    paths: Annotated[list[Path], typer.Argument(help="Devnet folders, node folders, node.sqlite stores (opened "
                                                     "read-only), rollout files (.vrl) and evaluation claims "
                                                     "(.claim.json).", show_default=False)],
    # vrl.audit.DEFAULT_SAMPLE, written out: importing vrl.audit loads torch before --help.
    sample: Annotated[float, typer.Option(help="Share of groups, steps and versions re-executed (hash-drawn: "
                                               "two audits at one share re-execute the same).")] = 0.25,
    all_items: Annotated[bool, typer.Option("--all", help="Re-execute every group, step and version "
                                                          "(--sample 1).")] = False,
    check: Annotated[list[str] | None, typer.Option(help="Run only this check (repeatable): signatures, "
                                                            "reputation, duplicates, lazy_verifiers, admission, "
                                                            "quarantine, groups, steps, accuracy, evaluation, sampling.")] = None,
    html_path: Annotated[Path | None, typer.Option("--html", help="Write the self-contained HTML report "
                                                                     "here.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    srs: Annotated[Path | None, typer.Option(help="The KZG SRS file an evaluation claim's or a rollout file's "
                                                "sampling proofs must be made against.")] = None,
    allow_dev_srs: Annotated[bool, typer.Option(help="Accept proofs against the dev SRS: INSECURE.")] = False,
    allow_code_rewards: Annotated[bool, typer.Option(help="Re-execute a network whose reward runs code (code/v1) "
                                                     "its task set and records carry, in the code reward's "
                                                     "sandbox.")] = False,
):
    """Re-check a whole run: signatures, reputation, duplicates, lazy verifiers, admission,
    quarantine, groups re-verified, training steps replayed, accuracy re-measured, held-out
    claims on private test sets (*.claim.json) re-checked. Exit 0: a clean audit; 1:
    findings; 2: unusable input."""
    import vrl.audit as va
    from proofs.zk import ZkError

    try:
        trusted = _trusted_srs(srs, allow_dev_srs)
    except ZkError as error:
        raise _fail(str(error)) from None

    configure_logging(json_mode=True)
    share = 1.0 if all_items else sample
    try:
        with va.open(paths) as auditor:
            with _progress(quiet or json_out) as bar:
                work = auditor.work(share)
                tasks = {}

                def advance(what: str, n: int) -> None:
                    if what not in tasks:
                        tasks[what] = bar.add_task(what, total=work.get(what))
                    bar.advance(tasks[what], n)

                report = auditor.run(checks=check, sample=share, progress=advance, srs=trusted,
                                     allow_dev_srs=allow_dev_srs, allow_code_rewards=allow_code_rewards)
    except va.AuditError as error:
        raise _fail(str(error)) from None
    if html_path is not None:
        try:
            report.write_html(html_path)
        except OSError as error:
            raise _fail(f"{html_path}: cannot write the HTML report ({error.strerror or error})") from None
    if json_out:
        out.print_json(json.dumps(report.to_json(), default=str))
    else:
        from vrl.audit.report import summary_tables

        for table in summary_tables(report):
            out.print(table)
        out.print(("[green]clean audit[/]" if report.clean else "[red]findings[/]")
                  + (f"; HTML report: {html_path}" if html_path is not None else ""), highlight=False)
    raise typer.Exit(report.exit_code)


if __name__ == "__main__":  # pragma: no cover
    app()
