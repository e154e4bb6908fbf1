"""zk proofs (specs/zk.md): ``vrl commit-answers``, ``prove`` and ``evaluate``.

Exit codes of ``evaluate --check``: 0 a claim upheld, 1 not upheld, 2 unusable input.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from vrl.cli.common import (
    COLUMNS_HELP,
    EXIT_ACCEPTED,
    EXIT_REJECTED,
    MAX_POSITIONS,
    MODELS,
    AllowDevSrsOption,
    JsonOption,
    RolloutsArgument,
    answer_key,
    app,
    configure_logging,
    fail,
    open_model,
    out,
    parse_challenge,
    progress,
    srs_for,
    task_set,
    trusted_srs,
)

if TYPE_CHECKING:  # the commands import what they run: `vrl --help` loads no torch
    from proofs.zk import Srs


@app.command("commit-answers")
def commit_answers_command(
    task: Annotated[str, typer.Argument(help="Task file whose reference answers are to stay private.")],
    out_path: Annotated[Path, typer.Option("--out", help="Public task file to write: references as commitments.")],
    key_path: Annotated[Path, typer.Option("--key", help="Private answer key to write (never overwritten).")],
    columns: Annotated[str, typer.Option(help=COLUMNS_HELP + " The public file is written in vrl's own "
                                         "field names.")] = "",
) -> None:
    """Publish a task set with its reference answers as salted commitments; keep the key (specs/zk.md §7)."""
    configure_logging(False)
    from vrl.zk import ZkFileError, commit_answers, write_key, write_task_file

    tasks = getattr(task_set(task, columns), "tasks", None)
    if tasks is None:
        raise fail(f"{task}: a generated task set has no answers to keep private; give a task file")
    if key_path.exists():
        raise fail(f"{key_path} exists; an answer key is never overwritten (its salts open the published "
                   "commitments)")
    if key_path.resolve() == out_path.resolve():
        raise fail("--out and --key name one file: the public tasks would overwrite the private key")
    try:
        public, key = commit_answers(tasks)
        write_key(key_path, key)
        write_task_file(out_path, public)
    except (ZkFileError, OSError, ValueError) as error:  # ValueError: a malformed zk: reference
        raise fail(str(error)) from None
    out.print(f"wrote {len(public)} tasks with committed references to {out_path}; the answer key to {key_path} "
              "(keep it private)", highlight=False)


@app.command()
def prove(
    rollouts: RolloutsArgument,
    model: Annotated[str, typer.Option(help=f"The model the rollouts claim (for its tokenizer): {MODELS}.")],
    answers: Annotated[Path | None, typer.Option(help="--kind reward: the answer key of the rollouts' task set "
                                                    "(vrl commit-answers).")] = None,
    kind: Annotated[str, typer.Option(help="What to prove: reward (the answer's correctness against a private "
                                      "reference) or sampling (challenged tokens won their races).")] = "reward",
    positions: Annotated[int, typer.Option(min=1, max=MAX_POSITIONS, help="--kind sampling: positions per "
                                           "record.")] = 4,
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
    json_output: JsonOption = False,
) -> None:
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
        raise fail(f"--kind {kind}: choose reward or sampling")
    if answers is None:
        raise fail("--kind reward needs the answer key: --answers FILE")
    key = answer_key(answers)
    try:
        records = list(read_rollouts(rollouts))
    except (RolloutFileError, RecordError) as error:  # proofs are for a whole, intact file
        raise fail(f"{rollouts}: {error}") from None
    loaded = open_model(model, None, "cpu")
    chosen = srs_for(srs, dev_srs, ANSWER_MATCH.logrows)
    target = out_path or companion_path(rollouts)
    try:
        statements, named = proof_plan(records, key, loaded.decode)
        with progress(json_output) as bar:
            task_bar = bar.add_task("proving", total=len(statements))
            attachments = named_proofs(prove_statements(statements, chosen, work_directory(),
                                                        on_progress=lambda n: bar.advance(task_bar, n)), named)
    except (ZkFileError, zk.ZkError) as error:
        raise fail(str(error)) from None
    try:
        write_attachments(target, attachments)
    except (ZkFileError, OSError) as error:
        raise fail(f"{target}: cannot write the proofs ({error})") from None
    _proved(len(records), len(attachments), f"proofs ({len(statements)} distinct)", target, chosen, json_output)


def _proved(records: int, proofs: int, what: str, target: Path, srs: Srs, json_output: bool) -> None:
    """What ``vrl prove`` reports: the proofs written, and whether they are insecure."""
    if json_output:
        out.print_json(data={"records": records, "proofs": proofs, "out": str(target), "srs": srs.sha256.hex(),
                             "dev_srs": srs.dev})
    else:
        out.print(f"wrote {proofs} {what} for {records} records to {target}"
                  + (" [red](INSECURE: dev SRS)[/]" if srs.dev else ""), highlight=False)


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

    issued = parse_challenge(challenge)
    if issued is None:
        raise fail("--kind sampling needs the verifier's --challenge (64 hex digits): the prover never picks "
                   "its own positions")
    try:
        records = list(read_rollouts(rollouts))
    except (RolloutFileError, RecordError) as error:
        raise fail(f"{rollouts}: {error}") from None
    loaded = open_model(model, None, "cpu")
    target = out_path or openings_path(rollouts)
    try:
        circuit = circuit_for(loaded)
        chosen = srs_for(srs, dev_srs, circuit.logrows)
        rows = read_witness(witness or witness_path(rollouts))
        with progress(json_output) as bar:
            task_bar = bar.add_task("proving sampled tokens", total=len(records) * positions)
            openings = prove_sampling(loaded, records, rows, issued, positions, chosen, work_directory(),
                                      on_proof=lambda n: bar.advance(task_bar, n))
        write_openings(target, issued, openings)
    except (SamplingProofError, ZkFileError, zk.ZkError) as error:
        raise fail(str(error)) from None
    except OSError as error:
        raise fail(f"{target}: cannot write the proofs ({error})") from None
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
    allow_dev_srs: AllowDevSrsOption = False,
    json_output: JsonOption = False,
) -> None:
    """Held-out accuracy on a private test set, proven (specs/zk.md §9): make a claim with
    --answers, --key and --out; check one, without the answers, with --check. Exit 0 a claim
    made or upheld, 1 a claim its own signed files do not uphold, 2 unusable input or a claim
    that could not be judged (its files are not the ones it signs, another model or task set)."""
    configure_logging(json_output)
    from proofs import zk
    from proofs.circuits import ANSWER_MATCH
    from vrl.rollouts.keys import KeyFileError, NodeKey
    from vrl.zk import ZkFileError, check_claim_file, companion_path, evaluate_private, work_directory, write_claim

    public = getattr(task_set(task), "tasks", None)
    if public is None:
        raise fail(f"{task}: an evaluation needs a task file, not a generated set")
    if check is not None:
        loaded = open_model(model, None, "cpu")
        try:
            claim, result = check_claim_file(check, loaded, public, trusted_srs(srs, allow_dev_srs), work_directory(),
                                             allow_dev=allow_dev_srs)
        except (ZkFileError, zk.ZkError) as error:
            raise fail(str(error)) from None
        if result.unchecked:
            raise fail(f"{check}: cannot be judged: " + "; ".join(result.unchecked))
        summary = {"claim": str(check), "claimed": [claim.correct, claim.total],
                   "proven": [result.correct, result.total], "max_new_tokens": claim.max_new_tokens,
                   "accuracy": claim.accuracy, "upheld": result.ok, "problems": list(result.problems),
                   "dev_srs_allowed": allow_dev_srs}
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
        raise fail("to make a claim give --answers, --key and --out; to check one, --check CLAIM")
    targets = (out_path, companion_path(out_path), out_path.with_name(out_path.name + ".claim.json"))
    taken = next((t for t in targets if t.exists() or t.resolve() in (answers.resolve(), Path(task).resolve())), None)
    if taken is not None:
        raise fail(f"{taken} exists or is an input: a claim's files are new files")
    if not out_path.resolve().parent.is_dir():
        raise fail(f"{out_path.parent}: no such folder")
    opened = answer_key(answers)
    try:
        node_key = NodeKey.load(key)
    except KeyFileError as error:
        raise fail(str(error)) from None
    loaded = open_model(model, None, "cpu")
    chosen = srs_for(srs, dev_srs, ANSWER_MATCH.logrows)
    try:
        with progress(json_output) as bar:
            task_bar = bar.add_task("answering and proving", total=len(public))
            records, attachments, claim = evaluate_private(
                loaded, public, opened, node_key, max_new_tokens=max_new_tokens, srs=chosen,
                workdir=work_directory(), records_name=out_path.name,
                model_locator=str(Path(model).resolve()) if Path(model).exists() else model,
                task_file=str(Path(task).resolve()), on_progress=lambda n: bar.advance(task_bar, n))
        claim_path = write_claim(out_path, records, attachments, claim)
    except (ZkFileError, zk.ZkError, ValueError, OSError) as error:
        raise fail(str(error)) from None
    if json_output:
        out.print_json(claim.to_json())
    else:
        out.print(f"{claim.correct} of {claim.total} correct ({claim.accuracy:.1%}) on {len(public)} private tasks, "
                  f"greedy, up to {max_new_tokens} tokens; claim {claim_path}, {len(attachments)} proofs"
                  + (" [red](INSECURE: dev SRS)[/]" if chosen.dev else ""), highlight=False)
