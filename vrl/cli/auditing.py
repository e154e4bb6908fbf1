"""``vrl audit``: re-check a whole run.

Exit codes: 0 a clean audit, 1 findings, 2 unusable input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from vrl.audit import DEFAULT_SAMPLE
from vrl.audit.registry import REGISTRY
from vrl.cli.common import AllowDevSrsOption, app, configure_logging, fail, out, progress, trusted_srs

# --check's help: each check's name and line, from the registry the audit runs.
_CHECK_HELP = "Run only this check (repeatable): " + "; ".join(
    f"{check.name}, {check.help}" for check in REGISTRY) + "."


def _known_checks(chosen: list[str] | None) -> list[str] | None:
    """--check's choices are the registry's: another is refused before any input is opened."""
    if (unknown := REGISTRY.unknown(chosen or ())) is not None:
        raise typer.BadParameter(unknown)
    return chosen


@app.command()
def audit(
    paths: Annotated[list[Path], typer.Argument(help="Devnet folders, node folders, node.sqlite stores (opened "
                                                     "read-only), rollout files (.vrl) and evaluation claims "
                                                     "(.claim.json).", show_default=False)],
    sample: Annotated[float, typer.Option(help="Share of groups, steps and versions re-executed (hash-drawn: "
                                               "two audits at one share re-execute the same).")] = DEFAULT_SAMPLE,
    all_items: Annotated[bool, typer.Option("--all", help="Re-execute every group, step and version "
                                                          "(--sample 1).")] = False,
    check: Annotated[list[str] | None, typer.Option(help=_CHECK_HELP, metavar="CHECK", callback=_known_checks,
                                                    show_default=False)] = None,
    html_path: Annotated[Path | None, typer.Option("--html", help="Write the self-contained HTML report "
                                                                     "here.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    srs: Annotated[Path | None, typer.Option(help="The KZG SRS file an evaluation claim's or a rollout file's "
                                                "sampling proofs must be made against.")] = None,
    allow_dev_srs: AllowDevSrsOption = False,
    allow_code_rewards: Annotated[bool, typer.Option(help="Re-execute a network whose reward runs code (code/v1) "
                                                     "its task set and records carry, in the code reward's "
                                                     "sandbox.")] = False,
) -> None:
    """Re-check a whole run: signatures, reputation, duplicates, lazy verifiers, committees
    drawn again, admission, quarantine, groups re-verified, training steps replayed, accuracy
    re-measured, held-out claims on private test sets (*.claim.json) and sampling proofs
    re-checked. Exit 0: a clean audit; 1: findings; 2: unusable input."""
    import vrl.audit as va

    trusted = trusted_srs(srs, allow_dev_srs)
    configure_logging(json_mode=True)
    share = 1.0 if all_items else sample
    try:
        with va.open(paths) as auditor:
            with progress(quiet or json_out) as bar:
                work = auditor.work(share)
                tasks = {}

                def advance(what: str, n: int) -> None:
                    if what not in tasks:
                        tasks[what] = bar.add_task(what, total=work.get(what))
                    bar.advance(tasks[what], n)

                report = auditor.run(checks=check, sample=share, progress=advance, srs=trusted,
                                     allow_dev_srs=allow_dev_srs, allow_code_rewards=allow_code_rewards)
    except va.AuditError as error:
        raise fail(str(error)) from None
    if html_path is not None:
        try:
            report.write_html(html_path)
        except OSError as error:
            raise fail(f"{html_path}: cannot write the HTML report ({error.strerror or error})") from None
    if json_out:
        out.print_json(json.dumps(report.to_json(), default=str))
    else:
        from vrl.audit.report import summary_tables

        for table in summary_tables(report):
            out.print(table)
        out.print(("[green]clean audit[/]" if report.clean else "[red]findings[/]")
                  + (f"; HTML report: {html_path}" if html_path is not None else ""), highlight=False)
    raise typer.Exit(report.exit_code)
