"""Plots of simulated runs: accuracy per round, detector scores against the true noise, and
the per-class loss heat map.

Plots use matplotlib's object-oriented API on the Agg canvas (no pyplot state, no display);
matplotlib is imported when a plot is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedaudit_sim.records import RunResult, detectors_of

__all__ = [
    "plot_accuracy",
    "plot_per_class_loss",
    "plot_scores_vs_noise",
]


def _figure(width: float, height: float) -> Any:
    """A matplotlib figure of that size (inches, 100 dpi) on the Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(figure)
    return figure


def plot_accuracy(runs: Sequence[RunResult], path: Path) -> Path:
    """Accuracy and balanced accuracy per round, one line per method (mean over seeds, the
    band is the min-max over seeds)."""
    from matplotlib.ticker import MaxNLocator

    figure = _figure(10, 4)
    axes = figure.subplots(1, 2)
    labels: list[str] = []
    for run in runs:
        if run.label not in labels:
            labels.append(run.label)
    for ax, key, title in (
        (axes[0], "accuracy", "test accuracy"),
        (axes[1], "balanced_accuracy", "test balanced accuracy"),
    ):
        for label in labels:
            group = [r for r in runs if r.label == label]
            length = min(len(r.rounds) for r in group)
            values = np.asarray(
                [[getattr(rec, key) for rec in r.rounds[:length]] for r in group], dtype=np.float64
            )
            x = np.arange(1, length + 1)
            (line,) = ax.plot(x, values.mean(axis=0), label=label)
            if len(group) > 1:
                ax.fill_between(
                    x, values.min(axis=0), values.max(axis=0), alpha=0.2, color=line.get_color()
                )
        warmup = runs[0].warmup_rounds if runs else 0
        if warmup:
            ax.axvline(warmup + 0.5, color="grey", linestyle=":", linewidth=1)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("rounds completed")
        ax.set_title(title)
        ax.set_ylim(0.0, 1.0)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path)
    return path


def plot_scores_vs_noise(runs: Sequence[RunResult], path: Path) -> Path:
    """Each detector's noisiness score (last round) against the realised noise rate; one row
    per method (first seed), one column per detector; filled markers were flagged."""
    firsts: list[RunResult] = []
    for run in runs:
        if run.label not in {r.label for r in firsts}:
            firsts.append(run)
    detectors = detectors_of(firsts) or ["fednoro"]
    figure = _figure(3.6 * len(detectors), 3.2 * len(firsts))
    grid = figure.subplots(len(firsts), len(detectors), squeeze=False)
    for row, run in enumerate(firsts):
        last = run.rounds[-1]
        rates = {c.name: c.realised_rate for c in run.clients}
        truth = {c.name: c.true_noisy for c in run.clients}
        for col, name in enumerate(detectors):
            ax = grid[row][col]
            xs, ys, flagged, noisy = [], [], [], []
            for c in last.clients:
                entry = c.detectors.get(name, {})
                if entry.get("noisiness") is None:
                    continue
                xs.append(rates[c.name])
                ys.append(entry["noisiness"])
                flagged.append(bool(entry.get("flag")))
                noisy.append(truth[c.name])
            if xs:
                colours = ["tab:red" if n else "tab:blue" for n in noisy]
                faces = [col_ if f else "none" for col_, f in zip(colours, flagged, strict=True)]
                ax.scatter(xs, ys, edgecolors=colours, facecolors=faces, s=36)
            else:
                ax.text(0.5, 0.5, "no score", ha="center", va="center", transform=ax.transAxes)
            score_name = {
                "fednoro": "FedNoRo score",
                "fedncl": "Fed-NCL q",
                "expertise": "expertise",
            }.get(name, f"{name} score")
            ax.set_title(f"{run.label} run: {score_name} (round {last.index})", fontsize=9)
            ax.set_xlabel("true (realised) noise rate")
            ax.grid(alpha=0.3)
    figure.suptitle(
        "detector score vs true noise (red = truly noisy, filled = flagged)", fontsize=10
    )
    figure.tight_layout()
    figure.savefig(path)
    return path


def plot_per_class_loss(run: RunResult, path: Path) -> Path | None:
    """Heat map of the last round's FedNoRo per-class losses (min-max normalised across
    clients, the detector's input), clients sorted by true noise rate. Falls back to the raw
    reported losses when no FedNoRo evidence is stored. Returns None when neither exists."""
    last = run.rounds[-1]
    key = "normalised_loss"
    if all(c.normalised_loss is None for c in last.clients):
        key = "per_class_loss"
        if all(c.per_class_loss is None for c in last.clients):
            return None
    rates = {c.name: c.realised_rate for c in run.clients}
    ordered = sorted(last.clients, key=lambda c: (rates[c.name], c.name))
    matrix = np.full((len(ordered), run.num_classes), np.nan)
    for i, c in enumerate(ordered):
        values = getattr(c, key) or []
        for j, v in enumerate(values[: run.num_classes]):
            if v is not None:
                matrix[i, j] = float(v)
    figure = _figure(1.0 + 0.5 * run.num_classes, 1.2 + 0.28 * len(ordered))
    ax = figure.subplots()
    image = ax.imshow(np.ma.masked_invalid(matrix), aspect="auto", cmap="viridis")
    figure.colorbar(image, ax=ax, label="normalised loss" if key == "normalised_loss" else "loss")
    ax.set_yticks(range(len(ordered)))
    ax.set_yticklabels([f"{c.name} ({rates[c.name]:.2f})" for c in ordered], fontsize=7)
    ax.set_xticks(range(run.num_classes))
    ax.set_xlabel("class")
    ax.set_title(f"{run.label} seed {run.seed}: per-class loss, round {last.index}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path)
    return path
