"""The audit library: anyone re-checks a whole run, afterwards, from what its nodes stored.

::

    import vrl.audit

    with vrl.audit.open(["devnet/"]) as audit:          # node stores (read-only), node or devnet
        report = audit.run(sample=0.25)                  # folders, rollout files
    for finding in report.findings:                      # Finding: check, code, severity, subject,
        print(finding.severity, finding.sentence)        # evidence, sentence
    report.write_html("audit.html")                      # or report.to_json(); report.exit_code

What each check does, and the bytes of the JSON report, are specs/audit.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from vrl.audit.checks import check_batches, check_duplicates, check_planted, check_reputation, collect_latency
from vrl.audit.committees import check_committees
from vrl.audit.evaluation import check_evaluation, check_sampling
from vrl.audit.findings import Finding, Severity
from vrl.audit.index import Run, index_run
from vrl.audit.reexecute import Models, check_accuracy, check_groups, check_steps
from vrl.audit.replay import StepCheck, replay_step, replay_steps
from vrl.audit.report import Report
from vrl.audit.sources import AuditError, Inputs, open_inputs

#: Every check, in the order they run (specs/audit.md §3). ``signatures`` always runs: it is
#: the pass that reads the log. ``admission`` and ``quarantine`` are one pass over the batches.
CHECKS = ("signatures", "reputation", "duplicates", "lazy_verifiers", "committees", "admission", "quarantine", "groups",
          "steps", "accuracy", "evaluation", "sampling")
#: The checks that re-execute models, at ``sample``; the others read the whole log.
REEXECUTING = ("groups", "steps", "accuracy")
#: The default share of re-executed items: the verifiers' own step_audit_rate
#: (vrl.node.params.ProtocolParams), so an audit costs about what one more verifier did.
DEFAULT_SAMPLE = 0.25

# vrl.audit.open is called by its module's name; ``from vrl.audit import *`` must not shadow open().
__all__ = ["CHECKS", "DEFAULT_SAMPLE", "Audit", "AuditError", "Finding", "Report", "Severity", "StepCheck",
           "replay_step", "replay_steps"]


class Audit:
    """An audit of the inputs given to :func:`open`. Close it (or use ``with``) to release
    the stores."""

    def __init__(self, inputs: Inputs) -> None:
        self.inputs = inputs
        self.closed = False

    def __enter__(self) -> Audit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.inputs.close()
        self.closed = True

    def run(self, checks: Iterable[str] | None = None, sample: float = DEFAULT_SAMPLE,
            progress: Callable[[str, int], None] | None = None, *, srs: Sequence = (),
            allow_dev_srs: bool = False, allow_code_rewards: bool = False) -> Report:
        """Run ``checks`` (default: all of :data:`CHECKS`), re-executing a ``sample`` share of
        the groups, steps and versions (1.0: all of them). ``progress(check, n)`` is told as
        items are done. ``srs`` (:class:`proofs.zk.Srs`) are the SRS files a claim's proofs,
        and a private task set's reward proofs, may be made against, the dev one only with
        ``allow_dev_srs``. A network whose reward runs code (code/v1) is re-executed only with
        ``allow_code_rewards``: its node.toml, among the inputs, chose that code. Raises
        :class:`AuditError` for an unknown check or a share outside [0, 1]."""
        if self.closed:
            raise AuditError("this audit is closed: vrl.audit.open() the inputs again")
        chosen = tuple(CHECKS if checks is None else dict.fromkeys([checks] if isinstance(checks, str) else checks))
        unknown = [c for c in chosen if c not in CHECKS]
        if unknown:
            raise AuditError(f"unknown check {unknown[0]!r}; choose from {', '.join(CHECKS)}")
        _check_share(sample)
        chosen = ("signatures", *(c for c in chosen if c != "signatures"))
        tell = progress or (lambda what, n: None)
        findings: list[Finding] = []
        seconds: dict[str, float] = {}
        started = time.perf_counter()
        run = index_run(self.inputs, tell, findings)
        seconds["signatures"] = time.perf_counter() - started
        models: Models | None = None
        done: set = set()
        for name in chosen[1:]:
            started = time.perf_counter()
            if name in REEXECUTING and models is None:
                models = Models(run, srs, allow_dev_srs, allow_code_rewards)
            if name == "reputation":
                check_reputation(run, findings, tell, sample)
            elif name == "duplicates":
                check_duplicates(run, findings, tell, sample)
            elif name == "lazy_verifiers":
                check_planted(run, findings, tell, sample)
            elif name == "committees":
                check_committees(run, findings, tell, sample)
            elif name in ("admission", "quarantine") and "batches" not in done:
                done.add("batches")
                check_batches(run, findings, tell, sample)
            elif name == "groups":
                check_groups(run, findings, tell, sample, models)
            elif name == "steps":
                check_steps(run, findings, tell, sample, models)
            elif name == "accuracy":
                check_accuracy(run, findings, tell, sample, models)
            elif name == "evaluation":
                check_evaluation(run, findings, tell, srs, allow_dev_srs)
            elif name == "sampling":
                check_sampling(run, findings, tell, srs, allow_dev_srs)
            seconds[name] = time.perf_counter() - started
        collect_latency(run)
        return _report(run, chosen, sample, findings, seconds, models)

    def work(self, sample: float = DEFAULT_SAMPLE) -> dict[str, int]:
        """How many items each re-executing check will do at ``sample``, for a progress bar."""
        from vrl.audit.checks import sampled

        _check_share(sample)
        stores = self.inputs.nodes
        groups = {row[0] for node in stores for row in node.store.group_headers()}
        versions = max((node.store.counts()["policies"] for node in stores), default=0)
        return {"signatures": sum(node.store.counts()["groups"] for node in stores),
                "duplicates": len(groups),
                "groups": sum(sampled(d, sample) for d in groups),
                "steps": int(versions * sample) + 1,
                "evaluation": len(self.inputs.claims),
                "sampling": len(self.inputs.rollout_files),
                "accuracy": int(versions * sample) + 2}


def _check_share(sample: object) -> None:
    """A share of items is a number in [0, 1]; NaN, infinities and booleans are not."""
    if isinstance(sample, bool) or not (isinstance(sample, (int, float)) and 0.0 <= sample <= 1.0):
        raise AuditError(f"sample must be a share between 0 and 1, got {sample!r}")


def open(paths: Iterable[str | Path] | str | Path) -> Audit:  # noqa: A001 (the module's verb, as builtins.open is the file's)
    """An :class:`Audit` of these inputs: devnet folders, node folders, node stores
    (``node.sqlite``, opened read-only) and rollout files. Raises :class:`AuditError`, naming
    the path, for one it cannot use."""
    return Audit(open_inputs([Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]))


def _report(run: Run, checks: tuple[str, ...], sample: float, findings: list[Finding], seconds: dict[str, float],
            models: Models | None) -> Report:
    from vrl.rollouts.model import platform_tag

    names = {node.owner.hex(): node.name for node in run.inputs.nodes if node.owner is not None}
    nodes: dict[str, dict] = {}
    for index in run.stores:
        for head in index.groups.values():
            if head.subject.hex() not in nodes:
                nodes[head.subject.hex()] = {"name": names.get(head.subject.hex(), ""), "role": "worker"}
        for v in index.verdicts:
            nodes.setdefault(v.verifier.hex(), {"name": names.get(v.verifier.hex(), ""), "role": "verifier"})
    for canary in run.canaries:  # the trainer's throw-away identities for planted groups are not nodes
        if canary.hex() not in names:
            nodes.pop(canary.hex(), None)
    if run.trainer is not None:
        nodes[run.trainer.hex()] = {"name": names.get(run.trainer.hex(), ""), "role": "trainer"}
    for hex_id, name in names.items():
        nodes.setdefault(hex_id, {"name": name, "role": "verifier"})
    inputs = [{"name": node.name, "path": str(node.store.path), "owner": node.owner.hex() if node.owner else None,
               "counts": node.store.counts(), "tier": node.tier} for node in run.inputs.nodes]
    inputs += [{"name": path.name, "path": str(path), "owner": None, "counts": {}, "tier": None}
               for path in (*run.inputs.rollout_files, *run.inputs.claims)]
    platform = platform_tag(models.base) if models is not None and models.problem is None else ""
    return Report(findings, checks, sample, inputs, nodes, run.stats, run.series, seconds, platform)

