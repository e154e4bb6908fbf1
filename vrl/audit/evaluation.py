"""The ``evaluation`` check: held-out accuracy claims on private test sets, re-checked from
their records and proofs without the answers (specs/zk.md §9, specs/audit.md §3)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from proofs import zk
from vrl.audit.checks import Run, finding
from vrl.audit.findings import Finding, Severity
from vrl.zk import Claim, ZkFileError, check_claim, companion_path, read_attachments, work_directory



def check_evaluation(run: Run, findings: list[Finding], tell: Callable[[str, int], None], srs: Sequence[zk.Srs],
                     allow_dev: bool) -> None:
    """Each claim given: upheld, not upheld (an error against its evaluator), or not checked
    (a warning: its model, task file, records or proofs could not be had)."""
    from vrl.rollouts.files import RolloutFileError, iter_records
    from vrl.rollouts.model import ModelError, load_model
    from vrl.tasks import TaskFileError, open_task_set

    check = "evaluation"
    upheld = 0
    for path in run.inputs.claims:
        try:
            claim = Claim.read(path)
        except ZkFileError as error:
            findings.append(finding(check, "claim_unchecked", Severity.WARNING, f"{error}", claim=str(path)))
            tell(check, 1)
            continue
        evidence = {"claim": str(path), "claimed": [claim.correct, claim.total]}
        try:
            model = load_model(claim.model)
            tasks = getattr(open_task_set(claim.task_file)[0], "tasks", None)
            if tasks is None:
                raise TaskFileError(f"{claim.task_file}: not a task file")
            records = list(iter_records(path.parent / claim.records))
            attachments = read_attachments(companion_path(path.parent / claim.records))
            result = check_claim(claim, records, attachments, model, tasks, srs, work_directory(), allow_dev=allow_dev)
        except (ModelError, TaskFileError, ValueError, RolloutFileError, ZkFileError, zk.ZkError, OSError) as error:
            findings.append(finding(check, "claim_unchecked", Severity.WARNING,
                                    f"{path}: the claim could not be checked ({error})", **evidence))
            tell(check, 1)
            continue
        if result.ok:
            upheld += 1
        else:
            # Against the evaluator only when it signed the claim: anyone can write a claim
            # file naming someone else's records.
            findings.append(finding(
                check, "claim_not_upheld", Severity.ERROR,
                f"{path}: claims {claim.correct} of {claim.total} correct; {result.problems[0]}",
                claim.evaluator if claim.signature_valid() else b"", **evidence, proven=[result.correct, result.total], problems=list(result.problems[:10])))
        tell(check, 1)
    run.stats[check] = {"claims": len(run.inputs.claims), "upheld": upheld,
                        **({"INSECURE: dev SRS allowed": True} if allow_dev else {})}
