"""An audit's result (specs/audit.md §5): the findings, what each check looked at, and the
series the report plots; as JSON, as a terminal table, and as one self-contained HTML page
(plots embedded as PNG data, no script, no link outside the file)."""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from vrl.audit.findings import Finding, Severity

REPORT_VERSION = 1


@dataclass
class Report:
    """What one :meth:`vrl.audit.Audit.run` found."""

    findings: list[Finding]
    checks: tuple[str, ...]
    sample: float
    inputs: list[dict]  # one entry per store or file read: name, path, owner, counts
    nodes: dict[str, dict]  # hex node id -> name, role, what it did
    stats: dict[str, dict] = field(default_factory=dict)
    series: dict = field(default_factory=dict)
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

    def verdicts_by_node(self) -> dict[str, dict]:
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

    # -- outputs --------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        """The report as JSON values (specs/audit.md §5); a non-finite number (a replay that
        moved nothing where the claim moved, drift inf) is written as its string, since JSON has none."""
        return _finite(self._json())

    def _json(self) -> dict:
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


def _finite(value):
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


def _severities(report: Report) -> str:
    return ", ".join(counted(len(report.of(s)), str(s)) for s in sorted(Severity, reverse=True))


# -- the terminal -------------------------------------------------------------------------------------

def summary_tables(report: Report):
    """Rich renderables: the verdict per node, then the findings (worst first, at most
    ``limit`` rows, the rest counted), then what each check looked at."""
    from rich.markup import escape
    from rich.table import Table

    nodes = Table(title="nodes", title_justify="left")
    for column in ("node", "role", "verdict", "evidence"):
        nodes.add_column(column)
    style = {"clean": "green", "suspect": "yellow", "convicted": "bold red"}
    for node, info in sorted(report.verdicts_by_node().items(), key=lambda i: (i[1].get("name") or "~", i[0])):
        evidence = ", ".join(f"{c} x{n}" for c, n in {**info["errors"], **info["warnings"]}.items())
        nodes.add_row(escape(report.name(node)), info.get("role", ""), f"[{style[info['verdict']]}]{info['verdict']}[/]",
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
        checks.add_row(name, ", ".join(f"{k} {v}" for k, v in stats.items()) or "-",
                       f"{report.seconds.get(name, 0.0):.1f}")
    return nodes, findings, checks


# -- HTML ------------------------------------------------------------------------------------------------

def _png(figure) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    plt.close(figure)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _plots(report: Report) -> list[tuple[str, str]]:
    """``(title, PNG data URL)`` for every series the checks filled."""
    import matplotlib

    matplotlib.use("Agg")  # no screen here, and none needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    # Labels include reason codes and names from signed messages: text, never TeX ("$\\x{$").
    with matplotlib.rc_context({"text.parse_math": False}):
        return _draw(report, plt, MaxNLocator)


def _draw(report: Report, plt, MaxNLocator) -> list[tuple[str, str]]:  # noqa: N803 (a class)
    out = []
    reputation = report.series.get("reputation", {})
    if reputation.get("nodes"):
        figure, axis = plt.subplots(figsize=(7, 3.6), constrained_layout=True)
        for node, points in sorted(reputation["nodes"].items(), key=lambda i: report.name(i[0])):
            rounds, scores, quarantined = zip(*points)
            line, = axis.plot(rounds, scores, marker=".", label=report.name(node))
            marks = [(r, s) for r, s, q in points if q]
            if marks:
                axis.plot(*zip(*marks), "x", color=line.get_color(), markersize=9)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set(xlabel="round (policy version)", ylabel="score", ylim=(-0.03, 1.03),
                 title=f"reputation per node ({reputation['view']}'s view; x: quarantined)")
        axis.legend(fontsize=7, loc="best")
        out.append(("Reputation per node over rounds", _png(figure)))
    rejections = report.series.get("rejections", {})
    if rejections:
        figure, axis = plt.subplots(figsize=(7, 0.6 + 0.35 * len(rejections)), constrained_layout=True)
        names = list(rejections)[::-1]
        axis.barh(names, [rejections[n] for n in names], color="#c44")
        axis.set(xlabel="failed verdicts naming the reason (planted groups excluded)", title="rejections by reason")
        out.append(("Rejections by reason", _png(figure)))
    latency = {k: v for k, v in report.series.get("latency", {}).items() if v}
    if latency:
        figure, axis = plt.subplots(figsize=(7, 3.2), constrained_layout=True)
        axis.boxplot(list(latency.values()), tick_labels=list(latency), showfliers=True)
        axis.set(ylabel="seconds", title="check latency: a group's arrival to its verifier's own verdict")
        out.append(("Check latency", _png(figure)))
    accuracy = report.series.get("accuracy", [])
    if accuracy:
        figure, axis = plt.subplots(figsize=(7, 3.4), constrained_layout=True)
        versions = [p["version"] for p in accuracy]
        axis.plot(versions, [p["claimed"] for p in accuracy], marker=".", label="claimed, sampled")
        if all(p.get("claimed_expected") is not None for p in accuracy):
            axis.plot(versions, [p["claimed_expected"] for p in accuracy], marker=".", label="claimed, expected")
        measured = [p for p in accuracy if "measured" in p]
        if measured:
            axis.plot([p["version"] for p in measured], [p["measured"] for p in measured], "o", fillstyle="none",
                      markersize=9, label="re-measured, sampled")
            axis.plot([p["version"] for p in measured], [p["measured_expected"] for p in measured], "s",
                      fillstyle="none", markersize=9, label="re-measured, expected")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set(xlabel="policy version", ylabel="held-out accuracy", title="accuracy per version")
        axis.legend(fontsize=7)
        out.append(("Held-out accuracy per version", _png(figure)))
    steps = report.series.get("steps", [])
    if steps:
        figure, axis = plt.subplots(figsize=(7, 3.2), constrained_layout=True)
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        floor = 1e-12  # an exact replay has drift 0, drawn at the floor of the log axis
        for ok, colour, label in ((True, "#2a2", "what its step makes"), (False, "#c22", "not what its step makes")):
            points = [(s["version"], min(max(s["drift"], floor), 1e6)) for s in steps if s["ok"] == ok
                      and not s["missing"]]
            if points:
                axis.scatter(*zip(*points), color=colour, label=label, zorder=3)
        axis.set_yscale("log")
        # The whole range, whatever the points: exact and inf replays sit on the frame. Decades as
        # text: matplotlib writes them as TeX, printed as its source with TeX parsing off (above).
        axis.set_ylim(floor / 10, 1e7)
        axis.yaxis.set_major_locator(LogLocator(base=10, numticks=8))
        axis.yaxis.set_major_formatter(FuncFormatter(lambda y, _: "10" + str(round(math.log10(y))).translate(_SUP)))
        axis.yaxis.set_minor_formatter(NullFormatter())
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set(xlabel="policy version", ylabel="drift (0 drawn at 1e-12)",
                 title="announced weights against the replay of their step")
        axis.legend(fontsize=7)
        out.append(("Step replays", _png(figure)))
    return out


_SUP = str.maketrans("-0123456789", "\u207b\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079")
_STYLE = """body{font:14px/1.45 system-ui,sans-serif;max-width:980px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;width:100%}td,th{border-bottom:1px solid #ddd;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#f4f4f4}.error{color:#b00}.warning{color:#a60}.info{color:#777}
.clean{color:#080}.convicted{color:#b00;font-weight:bold}.suspect{color:#a60}code{font-size:12px}
img{max-width:100%}h1 small{font-weight:normal;color:#666;font-size:60%}"""


def _html(report: Report) -> str:
    e = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>vrl audit</title><style>{_STYLE}</style>"
             "</head><body>",
             f"<h1>vrl audit <small>{'clean' if report.clean else 'findings'}: {_severities(report)}</small></h1>",
             f"<p>Checks: {e(', '.join(report.checks))}; sample {report.sample:.0%}; platform "
             f"<code>{e(report.platform)}</code>.</p>", "<h2>Nodes</h2><table><tr><th>node</th><th>role</th>"
             "<th>verdict</th><th>evidence</th></tr>"]
    for node, info in sorted(report.verdicts_by_node().items(), key=lambda i: (i[1].get("name") or "~", i[0])):
        evidence = ", ".join(f"{c} x{n}" for c, n in {**info["errors"], **info["warnings"]}.items()) or "-"
        parts.append(f"<tr><td>{e(report.name(node))}<br><code>{node}</code></td><td>{e(info.get('role', ''))}</td>"
                     f"<td class='{info['verdict']}'>{info['verdict']}</td><td>{e(evidence)}</td></tr>")
    parts.append("</table><h2>Findings</h2><table><tr><th>severity</th><th>check</th><th>code</th><th>finding</th>"
                 "<th>evidence</th></tr>")
    for f in sorted(report.findings, key=lambda f: (-f.severity, f.check, f.code)):
        parts.append(f"<tr><td class='{f.severity}'>{f.severity}</td><td>{e(f.check)}</td><td>{e(f.code)}</td>"
                     f"<td>{e(f.sentence)}</td><td><code>{e(json.dumps(dict(f.evidence), default=str))}</code></td></tr>")
    if not report.findings:
        parts.append("<tr><td colspan=5 class='clean'>none</td></tr>")
    parts.append("</table>")
    for title, data in _plots(report):
        parts.append(f"<h2>{e(title)}</h2><img alt='{e(title)}' src='{data}'>")
    parts.append("<h2>Checks</h2><table><tr><th>check</th><th>looked at</th><th>seconds</th></tr>")
    for name in report.checks:
        stats = ", ".join(f"{k} {v}" for k, v in report.stats.get(name, {}).items()) or "-"
        parts.append(f"<tr><td>{e(name)}</td><td>{e(stats)}</td><td>{report.seconds.get(name, 0.0):.1f}</td></tr>")
    parts.append("</table><h2>Inputs</h2><table><tr><th>input</th><th>owner</th><th>holds</th></tr>")
    for item in report.inputs:
        holds = ", ".join(f"{k} {v}" for k, v in item.get("counts", {}).items())
        parts.append(f"<tr><td>{e(item['name'])}<br><code>{e(item['path'])}</code></td>"
                     f"<td><code>{e(item.get('owner') or '-')}</code></td><td>{e(holds)}</td></tr>")
    parts.append("</table></body></html>")
    return "\n".join(parts)
