"""The audit library: anyone re-checks a whole run, afterwards, from what its nodes stored.

::

    import vrl.audit

    with vrl.audit.open(["devnet/"]) as audit:          # node stores (read-only), node or devnet
        report = audit.run(sample=0.25)                  # folders, rollout files
    for finding in report.findings:                      # Finding: check, code, severity, subject,
        print(finding.severity, finding.sentence)        # evidence, sentence
    report.write_html("audit.html")                      # or report.to_json(); report.exit_code

What each check does, and the bytes of the JSON report, are specs/audit.md.

Importing this package loads no model code: the command line reads its checks
(:mod:`vrl.audit.registry`) and defaults while ``vrl --help`` starts. An audit imports the
checks, and torch with them, when it is opened.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vrl.audit.findings import Finding, Severity
from vrl.audit.registry import REGISTRY, CheckContext, Runner, Tally
from vrl.audit.report import Report

if TYPE_CHECKING:
    from proofs.zk import Srs
    from vrl.audit.index import Run
    from vrl.audit.models import Models
    from vrl.audit.replay import StepCheck, replay_step, replay_steps
    from vrl.audit.sources import AuditError, Inputs

#: Every check, in the order they run (specs/audit.md §3; :data:`vrl.audit.registry.REGISTRY`).
#: ``signatures`` always runs: it is the pass that reads the log.
CHECKS = REGISTRY.names
#: The checks that re-execute models, at ``sample``; the others read the whole log.
REEXECUTING = tuple(check.name for check in REGISTRY if check.reexecutes)
#: The default share of re-executed items: the verifiers' own step_audit_rate
#: (vrl.node.params.ProtocolParams), so an audit costs about what one more verifier did.
DEFAULT_SAMPLE = 0.25

# vrl.audit.open is called by its module's name; ``from vrl.audit import *`` must not shadow open().
__all__ = ["CHECKS", "DEFAULT_SAMPLE", "Audit", "AuditError", "Finding", "Report", "Severity", "StepCheck",
           "replay_step", "replay_steps"]
# The names this package gives from modules that load torch, imported when first asked for.
_LATER = {"AuditError": "vrl.audit.sources", "StepCheck": "vrl.audit.replay", "replay_step": "vrl.audit.replay",
          "replay_steps": "vrl.audit.replay"}


def __getattr__(name: str) -> Any:
    if name in _LATER:
        return getattr(importlib.import_module(_LATER[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _runners() -> None:
    """Every declared check bound to its function: the modules whose checks bind their
    functions to the registry as they are imported, imported."""
    from vrl.audit import checks, committees, evaluation, reexecute  # noqa: F401

    if unbound := REGISTRY.unbound():
        raise RuntimeError(f"audit checks declared but run by no function: {', '.join(unbound)}")


class Audit:
    """An audit of the inputs given to :func:`open`. Close it (or use ``with``) to release
    the stores."""

    def __init__(self, inputs: Inputs) -> None:
        _runners()
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
            progress: Callable[[str, int], None] | None = None, *, srs: Sequence[Srs] = (),
            allow_dev_srs: bool = False, allow_code_rewards: bool = False) -> Report:
        """Run ``checks`` (default: all of :data:`CHECKS`), re-executing a ``sample`` share of
        the groups, steps and versions (1.0: all of them). ``progress(check, n)`` is told as
        items are done. ``srs`` (:class:`proofs.zk.Srs`) are the SRS files a claim's proofs,
        and a private task set's reward proofs, may be made against, the dev one only with
        ``allow_dev_srs``. A network whose reward runs code (code/v1) is re-executed only with
        ``allow_code_rewards``: its node.toml, among the inputs, chose that code. Raises
        :class:`AuditError` for an unknown check or a share outside [0, 1]."""
        from vrl.audit.checks import collect_latency
        from vrl.audit.index import index_run
        from vrl.audit.models import Models
        from vrl.audit.sources import AuditError

        if self.closed:
            raise AuditError("this audit is closed: vrl.audit.open() the inputs again")
        chosen = tuple(CHECKS if checks is None else dict.fromkeys([checks] if isinstance(checks, str) else checks))
        if (unknown := REGISTRY.unknown(chosen)) is not None:
            raise AuditError(unknown)
        _check_share(sample)
        chosen = ("signatures", *(c for c in chosen if c != "signatures"))
        tell = progress or (lambda what, n: None)
        findings: list[Finding] = []
        seconds: dict[str, float] = {}
        started = time.perf_counter()
        run = index_run(self.inputs, tell, findings)
        seconds["signatures"] = time.perf_counter() - started
        models: Models | None = None
        ran: set[Runner] = set()
        for name in chosen[1:]:
            started = time.perf_counter()
            if REGISTRY[name].reexecutes and models is None:
                models = Models(run, srs, allow_dev_srs, allow_code_rewards)
            runner = REGISTRY.runner(name)
            if runner not in ran:  # one pass may run several checks (admission and quarantine)
                ran.add(runner)
                runner(CheckContext(run, findings, tell, sample, models, srs, allow_dev_srs))
            seconds[name] = time.perf_counter() - started
        collect_latency(run)
        return _report(run, chosen, sample, findings, seconds, models)

    def work(self, sample: float = DEFAULT_SAMPLE) -> dict[str, int]:
        """How many items each check will tell its progress in at ``sample``, for a progress
        bar: every check's estimate (:class:`vrl.audit.registry.AuditCheck`)."""
        from vrl.audit.checks import sampled

        _check_share(sample)
        return REGISTRY.work(Tally(self.inputs, sampled), sample)


def _check_share(sample: object) -> None:
    """A share of items is a number in [0, 1]; NaN, infinities and booleans are not."""
    if isinstance(sample, bool) or not (isinstance(sample, (int, float)) and 0.0 <= sample <= 1.0):
        from vrl.audit.sources import AuditError

        raise AuditError(f"sample must be a share between 0 and 1, got {sample!r}")


def open(paths: Iterable[str | Path] | str | Path) -> Audit:  # noqa: A001 (the module's verb, as builtins.open is the file's)
    """An :class:`Audit` of these inputs: devnet folders, node folders, node stores
    (``node.sqlite``, opened read-only) and rollout files. Raises :class:`AuditError`, naming
    the path, for one it cannot use."""
    from vrl.audit.sources import open_inputs

    return Audit(open_inputs([Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]))


def _report(run: Run, checks: tuple[str, ...], sample: float, findings: list[Finding], seconds: dict[str, float],
            models: Models | None) -> Report:
    from vrl.rollouts.model import platform_tag

    names = {node.owner.hex(): node.name for node in run.inputs.nodes if node.owner is not None}
    nodes: dict[str, dict[str, Any]] = {}
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

