"""The zk checks: ``evaluation``, held-out accuracy claims on private test sets, re-checked from
their records and proofs without the answers (specs/zk.md §9), and ``sampling``, rollout
files' sampling proofs (specs/zk.md §10); specs/audit.md §3."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from proofs import zk
from vrl.audit.findings import Severity
from vrl.audit.index import Run, finding
from vrl.audit.registry import REGISTRY, CheckContext
from vrl.zk import ZkFileError, check_claim_file, work_directory

if TYPE_CHECKING:
    from vrl.rollouts.model import Model
    from vrl.rollouts.record import Rollout


@REGISTRY.runs("evaluation")
def check_evaluation(audit: CheckContext) -> None:
    """Each claim given: upheld; not upheld by the files it signs (an error against its
    signer); or not judged (a warning against no one): its files are not the ones it signs,
    its model or task file could not be had or is not its own, its signature does not verify."""
    from vrl.rl.export import load_model
    from vrl.rollouts.model import ModelError
    from vrl.tasks import TaskFileError, open_task_set
    from vrl.zk import Claim

    run, findings, tell, srs, allow_dev = audit.run, audit.findings, audit.progress, audit.srs, audit.allow_dev_srs
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


@REGISTRY.runs("sampling")
def check_sampling(audit: CheckContext) -> None:
    """Each rollout file given with its sampling proofs beside it (``FILE.sampling``, specs/zk.md
    §10): the openings checked against the challenge the file names, at as many positions per
    record as it answers. The file is not signed, so an opening that fails incriminates no one
    (anyone could have edited the file): its records' tokens are merely not proven."""
    from vrl.rollouts.files import RolloutFileError, read_rollouts
    from vrl.rollouts.record import RecordError
    from vrl.zk.sampling import SamplingProofError, check_openings, openings_path, read_openings

    run, findings, tell, srs, allow_dev = audit.run, audit.findings, audit.progress, audit.srs, audit.allow_dev_srs
    check = "sampling"
    proven = failed = 0
    for path in run.inputs.rollout_files:
        companion = openings_path(path)
        if not companion.exists():
            continue
        tell(check, 1)
        try:
            records = list(read_rollouts(path))
            challenge, openings = read_openings(companion)
            model = _model_of(records, run)
            per_record = max(Counter(o.record for o in openings).values(), default=1)
            checks = check_openings(records, openings, model, srs, work_directory(), challenge=challenge,
                                    count=per_record, allow_dev=allow_dev)
        except (RolloutFileError, RecordError, SamplingProofError, ZkFileError, zk.ZkError, ValueError) as error:
            findings.append(finding(check, "sampling_unchecked", Severity.WARNING,
                                    f"{companion}: the sampling proofs could not be checked ({error})",
                                    file=str(companion)))
            continue
        bad = [c for c in checks if c.outcome != "ok"]
        proven, failed = proven + len(checks) - len(bad), failed + len(bad)
        if bad:
            findings.append(finding(
                check, "sampling_not_proven", Severity.WARNING,
                f"{companion}: {len(bad)} of {len(checks)} challenged tokens not proven "
                f"({', '.join(sorted({str(c.outcome) for c in bad}))})", file=str(companion),
                positions=[[c.record, c.position, str(c.outcome)] for c in bad[:20]]))
    run.stats[check] = {"proven": proven, "not_proven": failed,
                        **({"INSECURE: dev SRS allowed": True} if allow_dev else {})}


def _model_of(records: list[Rollout], run: Run) -> Model:
    """The model the records claim, among those the audit can load: the network's, and the
    presets whose head has a sampling circuit (micro, base-micro when built)."""
    from vrl.rl.export import load_model
    from vrl.rollouts.model import ModelError

    wanted = {r.model_hash for r in records}
    if len(wanted) != 1:
        raise ValueError(f"records of {len(wanted)} models")
    candidates = [run.config.work.model] if run.config is not None else []
    for spec in (*candidates, "micro", "base-micro"):
        try:
            model = load_model(spec, dtype="float32")
        except ModelError:
            continue
        if model.model_hash in wanted:
            return model
    raise ValueError("the records' model is none the audit can load (the network's, micro or base-micro)")
