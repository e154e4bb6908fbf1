"""An audit's result (specs/audit.md §5): the findings, what each check looked at, and the
series the report plots; as JSON, as a terminal table, and as one self-contained HTML page
(plots embedded as PNG data, no script, no link outside the file; long tables fold, worst rows first)."""

from __future__ import annotations

import html
import json
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vrl.audit.findings import Finding, Severity

if TYPE_CHECKING:
    from rich.table import Table

REPORT_VERSION = 1
#: A node's verdict, worst first (specs/audit.md §5).
VERDICTS = ("convicted", "suspect", "clean")


@dataclass
class Report:
    """What one :meth:`vrl.audit.Audit.run` found."""

    findings: list[Finding]
    checks: tuple[str, ...]
    sample: float
    inputs: list[dict[str, Any]]  # one entry per store or file read: name, path, owner, counts
    nodes: dict[str, dict[str, Any]]  # hex node id -> name, role, what it did
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    series: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    platform: str = ""

    # -- the verdict ---------------------------------------------------------------------------------
    @property
    def clean(self) -> bool:
        """No error and no warning: every check that ran found everything in order."""
        return not any(f.severity >= Severity.WARNING for f in self.findings)

    @property
    def exit_code(self) -> int:
        """``vrl audit``'s: 0 for a clean audit, 1 when there are findings (2, unusable input,
        is raised as :class:`vrl.audit.AuditError` before a report exists)."""
        return 0 if self.clean else 1

    def of(self, severity: Severity) -> list[Finding]:
        return [f for f in self.findings if f.severity == severity]

    def name(self, node: str) -> str:
        """``worker-2 (ab12cd34)`` for a node the inputs name, else its short id."""
        known = self.nodes.get(node, {}).get("name")
        return f"{known} ({node[:8]})" if known else node[:8]

    def verdicts_by_node(self) -> dict[str, dict[str, Any]]:
        """Per node: its role, its errors and warnings by code, and one word: clean or not."""
        out = {}
        nodes = dict(self.nodes)
        for f in self.findings:  # a node only a finding names (a foreign trainer, say)
            if f.subject and f.subject not in nodes:
                nodes[f.subject] = {"name": "", "role": "named by a finding"}
        for node, info in nodes.items():
            mine = [f for f in self.findings if f.subject == node and f.severity >= Severity.WARNING]
            errors = Counter(f.code for f in mine if f.severity == Severity.ERROR)
            warnings = Counter(f.code for f in mine if f.severity == Severity.WARNING)
            out[node] = {**info, "id": node, "errors": dict(errors), "warnings": dict(warnings),
                         "verdict": "convicted" if errors else ("suspect" if warnings else "clean")}
        return out

    def worst_first(self) -> list[tuple[str, dict[str, Any]]]:
        """:meth:`verdicts_by_node`'s items, the convicted first, then the suspect, then the clean;
        by name within each, numbers read as numbers (``node-2`` before ``node-10``), unnamed last."""
        def key(item: tuple[str, dict[str, Any]]) -> tuple[int, bool, list[int | str], str]:
            node, info = item
            name = [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", info.get("name") or "")]
            return VERDICTS.index(info["verdict"]), not name[0] and len(name) == 1, name, node

        return sorted(self.verdicts_by_node().items(), key=key)

    # -- outputs --------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The report as JSON values (specs/audit.md §5); a non-finite number (a replay that
        moved nothing where the claim moved, drift inf) is written as its string, since JSON has none."""
        data: dict[str, Any] = _finite(self._json())  # a map stays a map
        return data

    def _json(self) -> dict[str, Any]:
        return {"report": REPORT_VERSION, "clean": self.clean, "exit_code": self.exit_code,
                "checks": list(self.checks), "sample": self.sample, "platform": self.platform,
                "inputs": self.inputs, "nodes": self.verdicts_by_node(),
                "counts": {str(s): len(self.of(s)) for s in Severity},
                "findings": [f.to_json() for f in sorted(self.findings, key=lambda f: (-f.severity, f.check, f.code))],
                "stats": self.stats, "seconds": self.seconds, "series": self.series}

    def to_html(self) -> str:
        return _html(self)

    def write_html(self, path: str | Path) -> Path:
        """Write the HTML report atomically (a crash mid-write leaves the old file or none)."""
        from vrl.rollouts.files import write_bytes_atomic

        path = Path(path)
        write_bytes_atomic(path, self.to_html().encode())
        return path


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def counted(n: int, noun: str) -> str:
    """``1 error``, ``2 errors``, ``3 info``: ``noun`` is its singular, made plural with an s
    (``info`` is uncountable)."""
    return f"{n} {noun}" if n == 1 or noun == str(Severity.INFO) else f"{n} {noun}s"


def looked_at(stats: dict[str, Any]) -> str:
    """A check's stats as one line: ``replayed 12, replayed from node-0 (archive tier) 12``."""
    def value(v: object) -> str:
        return ", ".join(f"{k} {n}" for k, n in v.items()) if isinstance(v, dict) else str(v)

    return ", ".join(f"{k} {value(v)}" for k, v in stats.items()) or "-"


def _severities(report: Report) -> str:
    return ", ".join(counted(len(report.of(s)), str(s)) for s in sorted(Severity, reverse=True))


# -- the terminal -------------------------------------------------------------------------------------

def summary_tables(report: Report) -> tuple[Table, Table, Table]:
    """Rich renderables: the verdict per node, then the findings (worst first, at most
    ``limit`` rows, the rest counted), then what each check looked at."""
    from rich.markup import escape
    from rich.table import Table

    nodes = Table(title="nodes", title_justify="left")
    for column in ("node", "role", "verdict", "evidence"):
        nodes.add_column(column)
    style = {"clean": "green", "suspect": "yellow", "convicted": "bold red"}
    for node, info in report.worst_first():
        evidence = ", ".join(f"{c} x{n}" for c, n in {**info["errors"], **info["warnings"]}.items())
        verdict = info["verdict"]
        nodes.add_row(escape(report.name(node)), info.get("role", ""), f"[{style[verdict]}]{verdict}[/]",
                      evidence or "-")
    findings = Table(title=f"findings ({_severities(report)})", title_justify="left")
    for column in ("severity", "check", "finding"):
        findings.add_column(column, overflow="fold")
    limit = 20
    ordered = sorted(report.findings, key=lambda f: (-f.severity, f.check, f.code))
    colour = {Severity.ERROR: "red", Severity.WARNING: "yellow", Severity.INFO: "dim"}
    for f in ordered[:limit]:
        findings.add_row(f"[{colour[f.severity]}]{f.severity}[/]", f.check, escape(f.sentence))  # paths, ids: text
    if len(ordered) > limit:
        findings.add_row("", "", f"... and {len(ordered) - limit} more (--json or the HTML report lists all)")
    checks = Table(title=f"checks (sample {report.sample:.0%})", title_justify="left")
    for column in ("check", "looked at", "seconds"):
        checks.add_column(column, justify="right" if column == "seconds" else "left", overflow="fold")
    for name in report.checks:
        stats = report.stats.get(name, {})
        checks.add_row(name, looked_at(stats),
                       f"{report.seconds.get(name, 0.0):.1f}")
    return nodes, findings, checks


# -- HTML ------------------------------------------------------------------------------------------------

#: Rows a table shows before the rest fold into a <details> under it, its summary counting
#: what is folded: about one screen at 1080 px (25 rows of about 40 px). The rows come worst
#: first, so what folds away is what matters least (clean nodes, info).
SHOWN_ROWS = 25

_STYLE = """body{font:14px/1.45 system-ui,sans-serif;max-width:980px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;width:100%}td,th{border-bottom:1px solid #ddd;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#f4f4f4}td code{overflow-wrap:anywhere}.error{color:#b00}
.warning{color:#a60}.info{color:#777}.clean{color:#080}.convicted{color:#b00;font-weight:bold}.suspect{color:#a60}
code{font-size:12px}img{max-width:100%;height:auto}h1 small,h2 small{font-weight:normal;color:#666;font-size:60%}
details{margin:-1em 0 1.5em}summary{cursor:pointer;color:#05a;padding:3px 0}"""


def _table(head: tuple[str, ...], rows: list[tuple[str, str]], noun: str,
           spell: Callable[[int, str], str] = lambda n, kind: f"{n} {kind}") -> str:
    """A table of ``(kind, <tr>)`` rows, in order: the first :data:`SHOWN_ROWS` shown, the rest
    folded into a <details> whose summary counts them by kind, each as ``spell(n, kind)`` says
    (``75 more nodes: 9 suspect, 66 clean``)."""
    header = "<tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
    if not rows:
        return f"<table>{header}<tr><td colspan={len(head)} class='clean'>none</td></tr></table>"
    shown, folded = rows[:SHOWN_ROWS], rows[SHOWN_ROWS:]
    out = f"<table>{header}{''.join(row for _, row in shown)}</table>"
    if folded:
        kinds = Counter(kind for kind, _ in folded)
        detail = ", ".join(spell(n, kind) for kind, n in kinds.items() if kind)
        out += (f"<details><summary>{len(folded)} more {noun}{': ' + detail if detail else ''}</summary>"
                f"<table>{header}{''.join(row for _, row in folded)}</table></details>")
    return out


def _html(report: Report) -> str:
    from vrl.audit.plots import figures, png

    e = html.escape
    verdicts = report.worst_first()
    tally = Counter(info["verdict"] for _, info in verdicts)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'>"
             "<meta name='viewport' content='width=device-width, initial-scale=1'><title>vrl audit</title>"
             f"<style>{_STYLE}</style></head><body>",
             f"<h1>vrl audit <small>{'clean' if report.clean else 'findings'}: {_severities(report)}</small></h1>",
             f"<p>Checks: {e(', '.join(report.checks))}; sample {report.sample:.0%}; platform "
             f"<code>{e(report.platform)}</code>.</p>",
             f"<h2>Nodes <small>{counted(len(verdicts), 'node')}: "
             f"{', '.join(f'{tally[v]} {v}' for v in VERDICTS if tally[v])}</small></h2>"]
    rows = []
    for node, info in verdicts:  # the convicted first, then the suspect, then the clean
        evidence = ", ".join(f"{c} x{n}" for c, n in {**info["errors"], **info["warnings"]}.items()) or "-"
        rows.append((info["verdict"], f"<tr><td>{e(report.name(node))}<br><code>{node}</code></td>"
                                      f"<td>{e(info.get('role', ''))}</td><td class='{info['verdict']}'>"
                                      f"{info['verdict']}</td><td>{e(evidence)}</td></tr>"))
    parts.append(_table(("node", "role", "verdict", "evidence"), rows, "nodes"))
    ordered = sorted(report.findings, key=lambda f: (-f.severity, f.check, f.code))
    parts.append(f"<h2>Findings <small>{_severities(report)}</small></h2>")
    if ordered:  # what kinds, how many, naming whom: the list below can be long
        kinds: dict[tuple[Severity, str, str], list[Finding]] = {}
        for f in ordered:
            kinds.setdefault((f.severity, f.check, f.code), []).append(f)
        parts.append("<table><tr><th>severity</th><th>check</th><th>code</th><th>findings</th><th>nodes named</th>"
                     "</tr>" + "".join(f"<tr><td class='{s}'>{s}</td><td>{e(c)}</td><td>{e(code)}</td>"
                                       f"<td>{len(fs)}</td><td>{len({f.subject for f in fs if f.subject})}</td></tr>"
                                       for (s, c, code), fs in kinds.items()) + "</table>")
    parts.append(_table(("severity", "check", "code", "finding", "evidence"), [
        (str(f.severity), f"<tr><td class='{f.severity}'>{f.severity}</td><td>{e(f.check)}</td><td>{e(f.code)}</td>"
                          f"<td>{e(f.sentence)}</td><td><code>{e(json.dumps(dict(f.evidence), default=str))}</code>"
                          "</td></tr>") for f in ordered], "findings", counted))
    with figures(report.series, report.name, [n for n, _ in verdicts]) as drawn:
        for title, figure in drawn:
            data, width, height = png(figure)
            parts.append(f"<h2>{e(title)}</h2><img alt='{e(title)}' width={width} height={height} src='{data}'>")
    parts.append("<h2>Checks</h2><table><tr><th>check</th><th>looked at</th><th>seconds</th></tr>")
    for name in report.checks:
        stats = looked_at(report.stats.get(name, {}))
        parts.append(f"<tr><td>{e(name)}</td><td>{e(stats)}</td><td>{report.seconds.get(name, 0.0):.1f}</td></tr>")
    parts.append("</table><h2>Inputs</h2>")
    rows = []
    for item in report.inputs:
        holds = ", ".join(f"{k} {v}" for k, v in item.get("counts", {}).items())
        rows.append(("", f"<tr><td>{e(item['name'])}<br><code>{e(item['path'])}</code></td>"
                         f"<td><code>{e(item.get('owner') or '-')}</code></td><td>{e(item.get('tier') or '-')}</td>"
                         f"<td>{e(holds)}</td></tr>"))
    parts.append(_table(("input", "owner", "storage tier", "holds"), rows, "inputs"))
    parts.append("</body></html>")
    return "\n".join(parts)
