"""The audit's checks are declared once (vrl.audit.registry): the audit runs them, states
their work and the command line offers them from that one registry."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import vrl.audit
from vrl.audit.registry import REGISTRY, Registry
from vrl.audit.sources import AuditError, Inputs
from vrl.cli import app


def test_the_cli_choices_the_work_keys_and_the_registry_agree(tmp_path):
    refused = CliRunner().invoke(app, ["audit", str(tmp_path), "--check", "bogus"])
    choices = " ".join(refused.output.split()).split("choose from ", 1)[1].rstrip(".").split(", ")
    shown = " ".join(CliRunner().invoke(app, ["audit", "--help"], env={"COLUMNS": "2000"}).output.split())
    with vrl.audit.Audit(Inputs()) as audit:  # no stores: every estimate of nothing
        work = audit.work(0.5)
    assert refused.exit_code == 2
    assert choices == list(REGISTRY.names) == list(vrl.audit.CHECKS) == list(work)
    assert all(f"{check.name}, {check.help}" in shown for check in REGISTRY), shown
    assert vrl.audit.REEXECUTING == ("groups", "steps", "accuracy")
    assert REGISTRY.unbound() == ()  # the audit's checks bound their functions as they were imported


def test_the_library_still_refuses_a_check_it_does_not_have():
    with vrl.audit.Audit(Inputs()) as audit, pytest.raises(AuditError, match="unknown check 'bogus'"):
        audit.run(checks=["bogus"])


def test_a_check_without_its_work_estimate_is_refused_as_it_is_declared():
    registry = Registry()
    registry.declare("first", "the pass that indexes", work=lambda tally, sample: 0, indexes=True)
    with pytest.raises(TypeError, match="states no work estimate"):
        registry.declare("second", "a check", work=None)
    with pytest.raises(TypeError):
        registry.declare("second", "a check")  # the estimate is a required argument
    assert registry.names == ("first",)


def test_a_function_binds_only_a_declared_check_and_only_once():
    registry = Registry()
    registry.declare("first", "the pass that indexes", work=lambda tally, sample: 0, indexes=True)
    registry.declare("one", "a check", work=lambda tally, sample: 1)
    registry.declare("two", "another", work=lambda tally, sample: 2)

    @registry.runs("one", "two")  # one pass, two checks
    def both(audit) -> None: ...

    assert registry.runner("one") is registry.runner("two") is both and registry.unbound() == ()
    for name in ("one", "first", "three"):  # bound already, the indexing pass, undeclared
        with pytest.raises(ValueError):
            registry.runs(name)(lambda audit: None)
    with pytest.raises(ValueError, match="declared first"):
        registry.declare("again", "an indexing pass after the first", work=lambda tally, sample: 0, indexes=True)
