"""The audit's HTML report as a person reads it (specs/audit.md §5), built from report inputs
directly (no devnet): every plot's text drawn as text (no raw TeX), inside its figure, each
title no wider than its axes; counts spelled right; and at 100 nodes, tables worst first with
the rest folded, plots still few series apiece, and the page one file with no script."""

from __future__ import annotations

import math
import re
from html.parser import HTMLParser

import matplotlib
import pytest

from vrl.audit import Finding, Report, Severity
from vrl.audit.plots import DISTINCT, PAGE_DPI, figures
from vrl.audit.report import SHOWN_ROWS

matplotlib.use("Agg")


def unreadable(figure) -> list[str]:
    """What a person would see wrong in a drawn figure: TeX printed as its source, text cut at
    the figure's edge, an axes' title wider than the axes."""
    renderer = figure.canvas.get_renderer()
    frame = figure.bbox
    found = []
    texts = [t for axis in figure.axes for t in (axis.title, axis.xaxis.label, axis.yaxis.label, *axis.texts)]
    texts += [t for axis in figure.axes for t in (*shown_ticks(axis.xaxis), *shown_ticks(axis.yaxis))]
    texts += [a.xaxis.get_offset_text() for a in figure.axes] + [a.yaxis.get_offset_text() for a in figure.axes]
    texts += [t for legend in (*figure.legends, *(a.get_legend() for a in figure.axes)) if legend
              for t in legend.get_texts()]
    texts += figure.texts
    for text in texts:
        content = text.get_text()
        if not content or not text.get_visible():
            continue
        if "\\mathdefault" in content or content.count("$") >= 2:
            found.append(f"TeX printed as its source: {content!r}")
        box = text.get_window_extent(renderer)
        if box.x0 < frame.x0 - 1 or box.x1 > frame.x1 + 1 or box.y0 < frame.y0 - 1 or box.y1 > frame.y1 + 1:
            found.append(f"cut at the figure's edge: {content!r}")
    for axis in figure.axes:
        if axis.title.get_text() and axis.title.get_window_extent(renderer).width > axis.get_window_extent().width:
            found.append(f"title wider than its axes: {axis.title.get_text()!r}")
    return found


def shown_ticks(axis) -> list:
    """The tick labels an axis draws: a locator also places ticks past the view, undrawn."""
    low, high = sorted(axis.get_view_interval())
    slack = (high - low) * 1e-9
    return [label for minor in (False, True)
            for where, label in zip(axis.get_ticklocs(minor=minor), axis.get_ticklabels(minor=minor))
            if low - slack <= where <= high + slack]


def test_the_checker_sees_raw_tex_and_a_clipped_title():
    """What the report looked like before: a log axis's decades as TeX with TeX parsing off, and
    a title longer than its axes, cut at the figure's edge."""
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"text.parse_math": False}):
        figure, axis = plt.subplots(figsize=(7, 3.2), layout="constrained")
        axis.scatter([1, 2, 3], [1e-12, 1e-3, 1e6])
        axis.set_yscale("log")
        axis.set(ylabel="drift", title="training steps replayed: announced weights against the replay, at length")
        figure.canvas.draw()
        found = unreadable(figure)
    plt.close(figure)
    assert any("TeX" in f and "mathdefault" in f for f in found), found
    assert any(f.startswith("title wider than its axes") for f in found), found
    assert any(f.startswith("cut at the figure's edge") for f in found), found


# -- report inputs --------------------------------------------------------------------------------

def report_of(nodes: int, reasons: list[str] = ("reward_mismatch",), errors: int | None = None) -> Report:
    """A report shaped like a devnet's audit (series as the checks fill them): ``nodes`` nodes,
    node 0 the trainer; workers 3, 7, 11... convicted, 2, 12, 22... suspect."""
    ids = [f"{i:02x}" * 32 for i in range(nodes)]
    info = {node: {"name": f"node-{i}", "role": "trainer" if i == 0 else "worker"} for i, node in enumerate(ids)}
    convicted = ids[3::4][: errors if errors is not None else None]
    suspect = ids[2::10]
    findings = [Finding("groups", "bad_group", Severity.ERROR, f"{n[:8]}'s group fails re-verification", n,
                        {"group": "ab" * 32, "version": 0, "reasons": ["reward_mismatch"]}) for n in convicted]
    findings += [Finding("steps", "step_reported", Severity.WARNING, f"{n[:8]} reported a step as fraud", n,
                         {"version": 4}) for n in suspect]
    findings += [Finding("reputation", "view_differs", Severity.INFO, "two honest views disagree on timing")]
    versions = range(12)
    series = {
        "reputation": {"view": "node-0", "nodes": {n: [(v, 0.0 if n in convicted and v > 2 else min(1.0, 0.5 + v / 20),
                                                        n in convicted and v > 2) for v in versions] for n in ids}},
        "rejections": {reason: 40 - i for i, reason in enumerate(reasons)},
        "latency": {f"node-{i}": [0.1 * ((i * 7 + k) % 13) for k in range(20)] for i in range(nodes)},
        "accuracy": [{"version": v, "claimed": 0.1 + v / 30, "claimed_expected": 0.1 + v / 31, "measured": 0.1 + v / 30,
                      "measured_expected": 0.1 + v / 31} for v in versions],
        "steps": [{"version": v, "ok": v < 8, "exact": v < 8, "drift": 0.0 if v < 4 else (1e-7 if v < 8 else math.inf),
                   "seconds": 0.1, "faults": [] if v < 8 else ["weights_mismatch"], "missing": []}
                  for v in versions[1:]],
    }
    inputs = [{"name": f"node-{i}", "path": f"/runs/dn/node-{i}/node.sqlite", "owner": node,
               "counts": {"policies": 12, "groups": 30}} for i, node in enumerate(ids)]
    checks = ("signatures", "reputation", "groups", "steps", "accuracy")
    return Report(findings, checks, 1.0, inputs, info, {c: {"looked at": 1} for c in checks}, series,
                  {c: 0.1 for c in checks}, "torch-2/cpu")


class Page(HTMLParser):
    """A page's tables (rows, cells' classes, whether a <details> folds them), <details>
    summaries, images."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tables: list[dict] = []
        self.summaries: list[str] = []
        self.images: list[dict] = []
        self.tags: set[str] = set()
        self._open: list[str] = []
        self._summary: list[str] | None = None
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        if tag == "table":
            self.tables.append({"rows": 0, "folded": "details" in self._open, "classes": []})
        elif tag == "tr" and self.tables:
            self.tables[-1]["rows"] += 1
        elif tag == "td" and self.tables and dict(attrs).get("class"):
            self.tables[-1]["classes"].append(dict(attrs)["class"])
        elif tag == "summary":
            self._summary = []
        elif tag == "img":
            self.images.append(dict(attrs))
        if tag not in ("img", "br", "meta", "tr", "td", "th"):
            self._open.append(tag)

    def handle_endtag(self, tag):
        if tag == "summary" and self._summary is not None:
            self.summaries.append("".join(self._summary))
            self._summary = None
        if tag in self._open:
            del self._open[len(self._open) - 1 - self._open[::-1].index(tag):]

    def handle_data(self, data):
        if self._summary is not None:
            self._summary.append(data)


def drawn(report: Report) -> list[tuple[str, list[str], object]]:
    with figures(report.series, report.name, [node for node, _ in report.worst_first()]) as made:
        return [(title, unreadable(figure), figure) for title, figure in made]


# -- what a person sees -----------------------------------------------------------------------------

def test_every_plot_reads_as_drawn_and_one_error_is_one_error():
    report = report_of(6, errors=1)
    plots = drawn(report)
    assert [title for title, _, _ in plots] == ["Reputation per node over rounds", "Rejections by reason",
                                                "Check latency", "Held-out accuracy per version", "Step replays"]
    assert {title: problems for title, problems, _ in plots if problems} == {}
    legend = [t.get_text() for t in plots[0][2].legends[0].get_texts()]  # each node its line, the worst first
    assert legend == ["node-3 (03030303)", "node-2 (02020202)", *(f"node-{i} ({i:02x}{i:02x}{i:02x}{i:02x})"
                                                                  for i in (0, 1, 4, 5))]
    page = report.to_html()
    assert "1 error, 1 warning, 1 info" in page and "1 errors" not in page
    assert "2 errors" in report_of(8, errors=2).to_html()


@pytest.mark.parametrize("reason", ["$\\x{$", "$\\mathdefault{10^{-11}}$", "r" * 300])
def test_a_hostile_reason_is_a_label_drawn_as_itself_and_cut_to_fit(reason):
    """Reasons come from signed messages: a TeX-looking one prints as written, a long one is cut."""
    (_, problems, _), = [p for p in drawn(report_of(4, reasons=[reason])) if p[0] == "Rejections by reason"]
    assert [p for p in problems if "TeX" not in p] == []  # the TeX source is the reason itself here


def test_a_100_node_report_is_worst_first_folded_and_its_plots_stay_legible():
    report = report_of(100, reasons=[f"reason_{i}" for i in range(30)])
    page = report.to_html()
    parsed = Page(page)
    # One file: no script, nothing fetched.
    assert not parsed.tags & {"script", "link", "iframe"} and not re.search(r"(src|href)=['\"]?(https?:|//)", page)
    # Every node and every finding is in the file; what is shown first is the worst.
    assert all(node in page for node in report.nodes) and page.count("bad_group") > 25
    nodes, folded_nodes, kinds, findings, folded_findings, *_ = parsed.tables
    assert nodes["rows"] == SHOWN_ROWS + 1 and not nodes["folded"]  # the header, then 25 nodes: the convicted
    assert nodes["classes"] == ["convicted"] * 25 and folded_nodes["folded"]
    assert page.index("node-3 (") < page.index("node-7 (") < page.index("node-11 (")  # numbers read as numbers
    assert folded_nodes["classes"] == ["suspect"] * 10 + ["clean"] * 65
    assert parsed.summaries[0] == f"{100 - SHOWN_ROWS} more nodes: 10 suspect, 65 clean"
    assert kinds["rows"] == 4 and not kinds["folded"]  # errors, warnings, info: one row per code
    assert findings["rows"] == SHOWN_ROWS + 1 and findings["classes"] == ["error"] * 25 and folded_findings["folded"]
    assert parsed.summaries[1] == "11 more findings: 10 warnings, 1 info"
    assert parsed.summaries[2] == f"{100 - SHOWN_ROWS} more inputs"
    # Five plots, each at most as wide as the page's 7 in, none taller than it is wide.
    assert len(parsed.images) == 5
    for image in parsed.images:
        assert image["src"].startswith("data:image/png;base64,")
        assert int(image["width"]) <= 7 * PAGE_DPI and int(image["height"]) <= int(image["width"])
    # And readable: no series past what a plot tells apart, every text drawn and inside.
    plots = drawn(report)
    assert {title: problems for title, problems, _ in plots if problems} == {}
    figure = dict((title, figure) for title, _, figure in plots)
    assert len(figure["Reputation per node over rounds"].legends[0].get_texts()) == DISTINCT
    assert len(figure["Check latency"].axes[0].get_yticklabels()) == DISTINCT
    assert len(figure["Rejections by reason"].axes[0].get_yticklabels()) == DISTINCT
