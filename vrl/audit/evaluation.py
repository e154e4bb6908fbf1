"""The ``evaluation`` check: held-out accuracy claims on private test sets, re-checked from
their records and proofs without the answers (specs/zk.md §9, specs/audit.md §3)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from proofs import zk
from vrl.audit.checks import Run, finding
from vrl.audit.findings import Finding, Severity
from vrl.zk import ZkFileError, check_claim_file, work_directory


def check_evaluation(run: Run, findings: list[Finding], tell: Callable[[str, int], None], srs: Sequence[zk.Srs],
                     allow_dev: bool) -> None:
    """Each claim given: upheld; not upheld by the files it signs (an error against its
    signer); or not judged (a warning against no one): its files are not the ones it signs,
    its model or task file could not be had or is not its own, its signature does not verify."""
    from vrl.rollouts.model import ModelError, load_model
    from vrl.tasks import TaskFileError, open_task_set
    from vrl.zk import Claim

    check = "evaluation"
    upheld = 0
    for path in run.inputs.claims:
        tell(check, 1)
        try:
            claim = Claim.read(path)
            model = load_model(claim.model)
            tasks = getattr(open_task_set(claim.task_file)[0], "tasks", None)
            if tasks is None:
                raise TaskFileError(f"{claim.task_file}: not a task file")
            claim, result = check_claim_file(path, model, tasks, srs, work_directory(), allow_dev=allow_dev)
        except (ModelError, TaskFileError, ValueError, ZkFileError, zk.ZkError, OSError) as error:
            findings.append(finding(check, "claim_unchecked", Severity.WARNING,
                                    f"{path}: the claim could not be checked ({error})", claim=str(path)))
            continue
        if result.unchecked:
            findings.append(finding(check, "claim_unchecked", Severity.WARNING,
                                    f"{path}: the claim could not be judged: {'; '.join(result.unchecked)}",
                                    claim=str(path)))
        elif result.ok:
            upheld += 1
        else:
            findings.append(finding(
                check, "claim_not_upheld", Severity.ERROR,
                f"{path}: claims {claim.correct} of {claim.total} correct; {result.problems[0]}", claim.evaluator,
                claim=str(path), claimed=[claim.correct, claim.total], proven=[result.correct, result.total],
                problems=list(result.problems[:10])))
    run.stats[check] = {"claims": len(run.inputs.claims), "upheld": upheld,
                        **({"INSECURE: dev SRS allowed": True} if allow_dev else {})}
