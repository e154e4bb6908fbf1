"""Rollout files: ``vrl keygen``, ``generate``, ``verify`` and ``inspect``.

Exit codes of ``verify``: 0 every rollout accepted, 1 any rejected, 2 unusable input.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from vrl.cli.common import (
    EXIT_ACCEPTED,
    EXIT_REJECTED,
    MAX_POSITIONS,
    MODELS,
    TASK_HELP,
    BatchSizeOption,
    ColumnsOption,
    DeviceOption,
    JsonOption,
    RewardOption,
    RolloutsArgument,
    answer_key,
    app,
    configure_logging,
    fail,
    log,
    open_model,
    out,
    parse_challenge,
    parse_round_seed,
    pinned_reward,
    progress,
    task_set,
)
from vrl.rollouts.tables import verdict_table

if TYPE_CHECKING:  # imported by the command that uses it: vrl.zk loads torch
    import torch

    from vrl.rollouts.record import Rollout
    from vrl.zk.summary import SamplingProofs


@app.command()
def keygen(
    out_path: Annotated[Path, typer.Option("--out", help="Where to write the PEM key (never overwritten).")],
) -> None:
    """Create an Ed25519 node key."""
    from vrl.rollouts.keys import NodeKey

    key = NodeKey.generate()
    if not out_path.parent.is_dir():
        raise fail(f"{out_path.parent}: no such folder; create it first (a key is written only where you chose)")
    try:
        key.save(out_path)
    except FileExistsError:
        raise fail(f"{out_path} exists; refusing to overwrite a key") from None
    except OSError as error:  # a directory in its place, no permission, a full disk
        raise fail(f"{out_path}: cannot write the key: {error.strerror or error}") from None
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
    columns: ColumnsOption = "",
    round_seed: Annotated[str, typer.Option(help="64 hex digits or an integer.")] = "0",
    temperature: Annotated[float, typer.Option(min=0.0)] = 1.0,
    top_k: Annotated[int, typer.Option(min=0)] = 0,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0)] = 1.0,
    policy_version: Annotated[int, typer.Option(min=0)] = 0,
    batch_size: BatchSizeOption = 8,
    dtype: Annotated[str | None, typer.Option(help="Compute dtype (part of the model's identity).")] = None,
    device: DeviceOption = "auto",
    json_output: Annotated[bool, typer.Option("--json", help="Machine-readable summary; no progress bar.")] = False,
    answers: Annotated[Path | None, typer.Option(help="Answer key of a task set of committed references "
                                                    "(vrl commit-answers): rewards from it, records keep the "
                                                    "commitments. Without it such records claim only the reward's "
                                                    "format part.")] = None,
    hidden_states: Annotated[bool, typer.Option(help="Commit each sampled token's hidden state (Poseidon hash) for "
                                                "sampling proofs, and keep the rows in OUT.hidden (vrl prove "
                                                "--kind sampling).")] = False,
    reward: RewardOption = None,
) -> None:
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
    reward_spec = pinned_reward(reward) or RewardSpec()
    try:
        node_key = NodeKey.load(key)
    except KeyFileError as error:
        raise fail(str(error)) from None
    tasks = task_set(task, columns)
    score = None
    try:
        if answers is not None:
            opened = answer_key(answers)
            opened.check(getattr(tasks, "tasks", ()))
            score = opened.scorer(reward_spec)
        # A committed reference's record claims its public reward (specs/zk.md §11), which a
        # reward reading the reference in the clear cannot give (specs/rewards.md §4).
        committed = [t for t in getattr(tasks, "tasks", ()) if committed_reference(t.answer) is not None]
        if committed and (problem := reward_spec.provable()):
            raise fail(f"{task}: task {committed[0].id!r} has a committed reference: {problem}")
    except (ValueError, ZkFileError) as error:  # a malformed zk: reference; a key that does not open one
        raise fail(f"{task}: {error}") from None
    loaded = open_model(model, dtype, device)
    try:
        chosen, why = choose_max_new_tokens(loaded, tasks, max_new_tokens or 0)
        sampling = sampling_for(loaded, temperature, top_k, top_p, chosen)
    except (InvalidParameters, ValueError) as error:  # ValueError: a chat task the model cannot render
        raise fail(str(error)) from None
    if max_new_tokens is None:
        log.info("max_new_tokens chosen from the task set", max_new_tokens=chosen, why=why)
    # Written to a side file and renamed when complete: a crash keeps every finished group in
    # OUT.partial and never leaves a half-written OUT.
    partial = out_path.with_name(out_path.name + ".partial")
    partial.unlink(missing_ok=True)
    stats = GenerationStats()
    log.info("generating", model=loaded.name, model_hash=loaded.model_hash.hex()[:16], tasks=tasks.name,
             groups=groups, group_size=group_size, node_id=node_key.node_id.hex()[:16])
    witness_rows: list[tuple[Rollout, torch.Tensor]] | None = None
    if hidden_states:
        from vrl.zk.sampling import SamplingProofError, circuit_for, supported, witness_path, write_witness

        try:
            circuit_for(loaded)
        except SamplingProofError as error:
            raise fail(str(error)) from None
        if not supported(sampling):
            raise fail("--hidden-states: sampling proofs do not cover a top-k or top-p mask (specs/zk.md §10)")
        witness_rows = []
    written = 0
    try:
        with progress(json_output) as bar, RolloutWriter(partial) as writer:
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
            raise fail(str(error)) from None
        raise fail(f"{error}; the {written} records before it are kept in {partial}") from None
    if witness_rows is not None:  # before the rollouts appear: records are never without their rows
        try:
            write_witness(witness_path(out_path), witness_rows)
        except OSError as error:
            raise fail(f"{witness_path(out_path)}: cannot write the hidden states ({error})") from None
    partial.replace(out_path)
    summary = {"rollouts": written, "groups": written // group_size, "tokens": stats.tokens,
               "out": str(out_path), "model_hash": loaded.model_hash.hex(),
               "commitment_bytes_per_token": round(stats.commitment_bytes / max(stats.tokens, 1), 3)}
    if json_output:
        out.print_json(data=summary)
    else:
        out.print(f"wrote {written} rollouts ({written // group_size} groups, {stats.tokens} tokens) to {out_path}",
                  highlight=False)


def _beside(given: Path | None, default: Path) -> Path | None:
    """A companion file: the one given, else the default one beside the rollout file when it exists."""
    return given or (default if default.exists() else None)


@app.command()
def verify(
    rollouts: RolloutsArgument,
    model: Annotated[str, typer.Option(help=f"The model the rollouts claim: {MODELS}.")],
    task: Annotated[str | None, typer.Option(help="Task set pinning each group's assignment. " + TASK_HELP)] = None,
    columns: ColumnsOption = "",
    round_seed: Annotated[str | None, typer.Option(help="Require this round seed.")] = None,
    dtype: Annotated[str | None, typer.Option()] = None,
    batch_size: BatchSizeOption = 4,
    device: DeviceOption = "auto",
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
    positions: Annotated[int, typer.Option(min=1, max=MAX_POSITIONS, help="Positions per record the challenge "
                                           "asked for.")] = 4,
    reward: Annotated[list[str] | None, typer.Option(help="Require this reward (repeatable terms, as generate's "
                                                        "--reward). Without it a record's own is recomputed, except "
                                                        "one that runs code (code/v1), which is run only when named "
                                                        "here.")] = None,
) -> None:
    """Verify every rollout in a file, and test each producer's sampling over all of its rollouts.
    Exit 0 all accepted, 1 any rejected, any producer's sequential test failed or any sampling
    proof failed, 2 unusable input."""
    configure_logging(json_output)
    from proofs import zk
    from vrl.rollouts.files import RolloutFileError, iter_records
    from vrl.rollouts.generate import longest_prompt
    from vrl.rollouts.profiles import ProfileError, profile_of
    from vrl.rollouts.sequential import threshold
    from vrl.rollouts.verify import Expectations, producer_tests
    from vrl.rollouts.verify import verify as run_verify
    from vrl.tasks.chat import ChatTemplateError
    from vrl.zk import ZkFileError, companion_path
    from vrl.zk.sampling import SamplingProofError, openings_path
    from vrl.zk.summary import check_reward_proofs, check_sampling_proofs

    expect = Expectations(tasks=task_set(task, columns) if task is not None else None,
                          round_seed=parse_round_seed(round_seed) if round_seed else None, max_tokens=max_tokens,
                          reward_spec=pinned_reward(reward))
    try:
        records = list(iter_records(rollouts))
    except RolloutFileError as error:
        raise fail(str(error)) from None
    if not records:
        raise fail(f"{rollouts}: no records")
    loaded = open_model(model, dtype, device)
    try:
        profile = profile_of(loaded, producer_device)
        if expect.tasks is not None:
            longest_prompt(loaded, expect.tasks)  # a chat task set this model cannot render: said once, here
    except (ProfileError, ChatTemplateError) as error:
        raise fail(str(error)) from None
    reward_proofs = None
    if (path := _beside(zk_file, companion_path(rollouts))) is not None:
        try:
            reward_proofs = check_reward_proofs(path, records, loaded, srs=srs, allow_dev=allow_dev_srs)
        except (ZkFileError, zk.ZkError) as error:
            raise fail(str(error)) from None
    with progress(json_output) as bar:
        task_bar = bar.add_task("verifying", total=len(records))
        verdicts = run_verify(records, loaded, expect=expect, batch_size=batch_size, tolerances=profile.tolerances,
                              on_progress=lambda n: bar.advance(task_bar, n),
                              proven=reward_proofs.by_record if reward_proofs is not None else None)
    issued = parse_challenge(challenge)
    sampling_proofs = None
    if (path := _beside(sampling_file, openings_path(rollouts))) is not None:
        try:
            sampling_proofs = check_sampling_proofs(path, records, loaded, srs=srs, allow_dev=allow_dev_srs,
                                                    challenge=issued, count=positions,
                                                    drift=profile.tolerances.race_margin)
        except (SamplingProofError, zk.ZkError) as error:
            raise fail(str(error)) from None
    accepted = sum(v.accepted for v in verdicts)
    reasons = Counter(v.reason for v in verdicts if not v.accepted)
    # specs/verification.md §7: each producer's races over all of its records in the file.
    tests = producer_tests(verdicts, profile.race_loss_rate)
    if json_output:
        producers = {node: {"race_tokens": t.tokens, "races_lost": t.lost, "log_e": round(t.log_e, 4),
                            "rejected": t.rejected} for node, t in tests.items()}
        out.print_json(data={"file": str(rollouts), "model_hash": loaded.model_hash.hex(), "profile": profile.name,
                             "total": len(verdicts), "accepted": accepted, "rejected": len(verdicts) - accepted,
                             "reasons": dict(reasons), "producers": producers,
                             "zk": reward_proofs.to_json() if reward_proofs is not None else None,
                             "sampling_proofs": sampling_proofs.to_json() if sampling_proofs is not None else None,
                             "verdicts": [v.to_json() for v in verdicts]})
    else:
        out.print(verdict_table(verdicts, f"{rollouts}: {accepted} of {len(verdicts)} accepted"))
        for node, t in tests.items():
            verdict = "[red]FAILED[/]" if t.rejected else "passed"
            # ln E as --json gives it (4 places), shown to 2
            out.print(f"producer {node[:16]}: {t.lost} of {t.tokens} races lost, "
                      f"ln E = {round(t.log_e, 4):.2f} of {threshold():.2f} ({profile.name}): "
                      f"sequential test {verdict}")
        if reward_proofs is not None:
            failed_proofs = ", ".join(f"{r} {n}" for r, n in reward_proofs.failed.items()) or "none failed"
            out.print(f"proofs ({reward_proofs.file}): {reward_proofs.proven} records' rewards proven, "
                      f"{failed_proofs}" + (" [red]INSECURE: dev SRS allowed[/]" if reward_proofs.dev_srs_allowed
                                            else ""))
        if sampling_proofs is not None:
            out.print(_sampling_line(sampling_proofs), highlight=False)
    rejected = any(t.rejected for t in tests.values()) or bool(sampling_proofs is not None and sampling_proofs.failed)
    raise typer.Exit(EXIT_ACCEPTED if accepted == len(verdicts) and not rejected else EXIT_REJECTED)


def _sampling_line(summary: SamplingProofs) -> str:
    failed = ", ".join(f"{r} {n}" for r, n in summary.failed.items()) or "none failed"
    origin = "" if summary.challenge_given else " (positions as the file says: pass --challenge to hold them to yours)"
    return (f"sampling proofs ({summary.file}): {summary.proven} of {summary.positions} challenged tokens "
            f"proven, {failed}{origin}" + (" INSECURE: dev SRS allowed" if summary.dev_srs_allowed else ""))


@app.command()
def inspect(rollouts: RolloutsArgument, json_output: JsonOption = False) -> None:
    """List the records of a rollout file, or the proofs of a companion file (.zk, .sampling), without
    verifying them."""
    from vrl.rollouts.files import RolloutFileError, iter_records
    from vrl.rollouts.record import RecordError

    if rollouts.suffix == ".zk":
        return _inspect_proofs(rollouts, json_output)
    if rollouts.suffix == ".sampling":
        return _inspect_openings(rollouts, json_output)
    rows: list[dict[str, Any]] = []  # JSON rows, as --json prints them
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
                             "reward_spec": str(item.reward_spec), "temperature": item.sampling.temperature,
                             "commitment_bytes": len(item.commitment)})
    except RolloutFileError as error:
        raise fail(str(error)) from None
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
                      row["finish_reason"], f"{row['reward']:g}", f"{row['temperature']:g}",
                      str(row["commitment_bytes"]))
    out.print(table)


def _inspect_proofs(path: Path, json_output: bool) -> None:
    from vrl.zk import ZkFileError, read_attachments

    try:
        attachments = read_attachments(path)
    except ZkFileError as error:
        raise fail(str(error)) from None
    rows: list[dict[str, Any]]  # JSON rows, as --json prints them
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
        raise fail(str(error)) from None
    rows: list[dict[str, Any]]  # as above
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
