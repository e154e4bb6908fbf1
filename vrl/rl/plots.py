"""Learning curves from a run's ``metrics.jsonl``, drawn with matplotlib into one PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PANELS = (
    ("held_out_accuracy", "held-out accuracy"),
    ("reward_mean", "mean reward of the batch"),
    ("kl", "KL to the initial policy (k3)"),
    ("clip_fraction", "clip fraction"),
    ("completion_length_mean", "completion length (tokens)"),
    ("rejected", "rejected rollouts"),
)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def plot_run(metrics_path: Path, png_path: Path, title: str = "") -> Path:
    """One panel per curve, step on the x-axis; returns ``png_path``."""
    import matplotlib

    matplotlib.use("Agg")  # no screen here, and none needed
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    figure, axes = plt.subplots(2, 3, figsize=(13, 6.5), constrained_layout=True)
    for axis, (key, label) in zip(axes.flat, PANELS):
        points = [(r["step"], r[key]) for r in records if key in r]
        if points:
            axis.plot(*zip(*points), marker="." if key == "held_out_accuracy" else None,
                      label="sampled (the run's temperature)" if key == "held_out_accuracy" else None)
        if key == "held_out_accuracy":
            greedy = [(r["step"], r["held_out_accuracy_greedy"]) for r in records if "held_out_accuracy_greedy" in r]
            if greedy:
                axis.plot(*zip(*greedy), marker=".", label="greedy")
            axis.legend(loc="lower right")
        axis.set_title(label)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    if title:
        figure.suptitle(title)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png_path, dpi=110)
    plt.close(figure)
    return png_path
