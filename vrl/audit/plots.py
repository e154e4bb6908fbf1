"""The HTML report's plots (specs/audit.md §5), drawn with matplotlib from a report's series.

Every label is text, never TeX: reason codes and node names come from signed messages and
store folders, so ``$\\x{$`` must print as itself, not crash the mathtext parser. The axes'
own labels (a log axis's decades) are therefore written as plain text too. A plot stays
readable at any number of nodes: past :data:`DISTINCT` series the rest are pooled."""

from __future__ import annotations

import base64
import io
import math
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: Lines a plot tells apart by colour: matplotlib's default cycle (tab10) less its grey, which
#: draws the pooled rest. Past these, two lines would share a colour and the legend would no
#: longer say which is which.
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
POOLED = "#7f7f7f"
#: Series a plot shows, the pooled rest included (grey lines under one legend entry, one box,
#: one bar): as many as the legend of lines has entries, so every plot reads alike.
DISTINCT = len(COLOURS) + 1
#: Pixels per figure inch as the page lays the plots out, and as rendered: twice that, so the
#: text stays sharp on a high-density screen or zoomed in (a 7 in plot is 630 px on the page).
PAGE_DPI = 90
RENDER_DPI = 2 * PAGE_DPI
#: A label longer than this is cut with an ellipsis: a node's folder name or a reason from a
#: signed message has no length bound, and a plot has room for about this much beside its axes.
LABEL_CHARS = 32
#: The step replays' log axis: an exact replay has drift 0, drawn at the floor; a replay that
#: moved nothing where the claim moved has drift inf, drawn at the ceiling.
DRIFT_FLOOR, DRIFT_CEILING = 1e-12, 1e6
_SUPERSCRIPT = str.maketrans("-0123456789", "\u207b\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079")


def label(text: str) -> str:
    """``text``, cut to :data:`LABEL_CHARS` characters."""
    return text if len(text) <= LABEL_CHARS else text[:LABEL_CHARS - 1] + "\u2026"


def decade(value: float, _position: object = None) -> str:
    """A log axis's tick as plain text: ``10⁻¹²`` where matplotlib would write TeX."""
    exponent = round(math.log10(value)) if value > 0 else 0
    if value <= 0 or not math.isclose(value, 10.0 ** exponent, rel_tol=1e-9):
        return f"{value:g}"
    return "10" + str(exponent).translate(_SUPERSCRIPT)


@contextmanager
def figures(series: dict[str, Any], name: Callable[[str], str], worst: list[str]) -> Iterator[list[tuple[str, Figure]]]:
    """``(title, figure)`` for every series the checks filled, drawn (laid out, every tick
    labelled) so their texts can be measured; closed on leaving. ``name`` gives a node's
    label, ``worst`` the nodes, worst first (:meth:`vrl.audit.Report.worst_first`)."""
    import matplotlib

    matplotlib.use("Agg")  # no screen here, and none needed
    import matplotlib.pyplot as plt

    # Labels include reason codes and names from signed messages: text, never TeX ("$\\x{$").
    # Ticks are labelled when drawn, so the drawing happens inside this context too.
    with matplotlib.rc_context({"text.parse_math": False}):
        drawn = []
        try:
            for draw in (_reputation, _rejections, _latency, _accuracy, _steps):
                made = draw(plt, series, name, worst)
                if made:
                    made[1].canvas.draw()
                    drawn.append(made)
            yield drawn
        finally:
            for _, figure in drawn:
                plt.close(figure)


def png(figure: Figure) -> tuple[str, int, int]:
    """The figure as a PNG data URL, and its width and height on the page in CSS pixels."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=RENDER_DPI)
    width, height = figure.get_size_inches()
    return ("data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode(),
            round(width * PAGE_DPI), round(height * PAGE_DPI))


def _reputation(plt: ModuleType, series: dict[str, Any], name: Callable[[str], str], worst: list[str],
                ) -> tuple[str, Figure] | None:
    reputation = series.get("reputation", {})
    if not reputation.get("nodes"):
        return None
    from matplotlib.ticker import MaxNLocator

    figure, axis = plt.subplots(figsize=(7, 4), layout="constrained")
    place = {node: i for i, node in enumerate(worst)}
    nodes = sorted(reputation["nodes"].items(), key=lambda i: (place.get(i[0], len(place)), name(i[0])))
    # Few enough nodes: each its own colour. More: the worst keep one, the rest go grey.
    coloured, pooled = nodes[:len(COLOURS)], nodes[len(COLOURS):]
    for node, points in pooled:
        rounds, scores, _ = zip(*points)
        axis.plot(rounds, scores, color=POOLED, linewidth=0.8, alpha=0.6, zorder=1,
                  label=f"{len(pooled)} other node{'s' * (len(pooled) != 1)}" if node == pooled[0][0] else None)
    for (node, points), colour in zip(coloured, COLOURS):
        rounds, scores, _ = zip(*points)
        axis.plot(rounds, scores, marker=".", color=colour, label=label(name(node)), zorder=2)
        marks = [(r, s) for r, s, q in points if q]
        if marks:
            axis.plot(*zip(*marks), "x", color=colour, markersize=9, zorder=3)
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set(xlabel="round (policy version)", ylabel="score", ylim=(-0.03, 1.03),
             title=f"reputation in {label(reputation['view'])}'s view (x: quarantined)")
    figure.legend(loc="outside lower center", ncols=3, fontsize=8)
    return "Reputation per node over rounds", figure


def _rejections(plt: ModuleType, series: dict[str, Any], name: Callable[[str], str], worst: list[str],
                ) -> tuple[str, Figure] | None:
    rejections = series.get("rejections", {})
    if not rejections:
        return None
    ordered = sorted(rejections.items(), key=lambda i: (-i[1], i[0]))
    if len(ordered) > DISTINCT:
        rest = ordered[DISTINCT - 1:]
        ordered = [*ordered[:DISTINCT - 1], (f"{len(rest)} other reasons, summed", sum(n for _, n in rest))]
    names = [label(reason) for reason, _ in ordered][::-1]
    figure, axis = plt.subplots(figsize=(7, 1.1 + 0.3 * len(names)), layout="constrained")
    axis.barh(range(len(names)), [n for _, n in ordered][::-1], color="#c44", tick_label=names)
    axis.set(xlabel="failed verdicts naming the reason (planted groups excluded)", title="rejections by reason")
    return "Rejections by reason", figure


def _latency(plt: ModuleType, series: dict[str, Any], name: Callable[[str], str], worst: list[str],
             ) -> tuple[str, Figure] | None:
    latency = {k: v for k, v in series.get("latency", {}).items() if v}
    if not latency:
        return None
    ordered = sorted(latency.items(), key=lambda i: (-statistics.median(i[1]), i[0]))  # the slowest store on top
    if len(ordered) > DISTINCT:
        rest = ordered[DISTINCT - 1:]
        ordered = [*ordered[:DISTINCT - 1], (f"{len(rest)} other stores, pooled", [s for _, v in rest for s in v])]
    ordered.reverse()
    figure, axis = plt.subplots(figsize=(7, 1.1 + 0.35 * len(ordered)), layout="constrained")
    axis.boxplot([v for _, v in ordered], tick_labels=[label(k) for k, _ in ordered], orientation="horizontal",
                 showfliers=True)
    axis.set(xlabel="seconds from a group's arrival to the store owner's own verdict", title="check latency per store")
    return "Check latency", figure


def _accuracy(plt: ModuleType, series: dict[str, Any], name: Callable[[str], str], worst: list[str],
              ) -> tuple[str, Figure] | None:
    accuracy = series.get("accuracy", [])
    if not accuracy:
        return None
    from matplotlib.ticker import MaxNLocator

    figure, axis = plt.subplots(figsize=(7, 3.4), layout="constrained")
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
    axis.legend(fontsize=8)
    return "Held-out accuracy per version", figure


def _steps(plt: ModuleType, series: dict[str, Any], name: Callable[[str], str], worst: list[str],
           ) -> tuple[str, Figure] | None:
    steps = series.get("steps", [])
    if not steps:
        return None
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    figure, axis = plt.subplots(figsize=(7, 3.4), layout="constrained")
    for ok, colour, text in ((True, "#2a2", "what its step makes"), (False, "#c22", "not what its step makes")):
        points = [(s["version"], min(max(s["drift"], DRIFT_FLOOR), DRIFT_CEILING)) for s in steps
                  if s["ok"] == ok and not s["missing"]]
        if points:
            axis.scatter(*zip(*points), color=colour, label=text, zorder=3)
    axis.set_yscale("log")
    # The whole range, whatever the points: exact and inf replays sit on the frame, and the
    # axis reads the same from one audit to the next. Decades as text (see the module's note).
    axis.set_ylim(DRIFT_FLOOR / 10, DRIFT_CEILING * 10)
    axis.yaxis.set_major_locator(LogLocator(base=10, numticks=8))
    axis.yaxis.set_major_formatter(FuncFormatter(decade))
    axis.yaxis.set_minor_formatter(NullFormatter())
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set(xlabel="policy version", ylabel=f"drift (0 at {decade(DRIFT_FLOOR)}, inf at {decade(DRIFT_CEILING)})",
             title="announced weights against the replay of their step")
    axis.legend(fontsize=8)
    return "Step replays", figure
