"""The comparison of simulated runs as people read it: the table and the detection lines.

:func:`comparison_rows` and :func:`comparison_table` give one row per method (mean ± std over
seeds), :func:`detection_lines` the printed detection summary of one run; both read the summaries
``fedaudit_sim.summaries.summarise_run`` stores on each run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

import numpy as np

from fedaudit_sim.records import RunResult

__all__ = [
    "COMPARISON_COLUMNS",
    "comparison_rows",
    "comparison_table",
    "detection_lines",
    "mean_std",
]


def mean_std(values: Iterable[float | None], fmt: str = ".3f", *, empty: str = "-") -> str:
    """Mean ± population std of the values that are not None (``empty`` for none, one value
    alone)."""
    kept = [float(v) for v in values if v is not None]
    if not kept:
        return empty
    if len(kept) == 1:
        return format(kept[0], fmt)
    return f"{format(float(np.mean(kept)), fmt)} ± {format(float(np.std(kept)), fmt)}"


COMPARISON_COLUMNS: Final[tuple[str, ...]] = (
    "method",
    "seeds",
    "acc best",
    "acc last10%",
    "bal.acc last10%",
    "prec.",
    "recall",
    "F1",
    "matching",
    "AUROC",
    "false flags",
    "rho(expert.)",
    "coord. s/rnd",
)


def comparison_rows(runs: Sequence[RunResult]) -> list[list[str]]:
    """One row per method label (mean ± std over seeds), in first-seen order.

    Detection columns are the last round's precision, recall and F1 ("n/a" where undefined:
    nothing flagged, or no noisy client), the matching ratio over the rounds after warm-up, the
    last round's AUROC and the number of (site, round) false flags after the warm-up.
    """
    labels: list[str] = []
    for run in runs:
        if run.label not in labels:
            labels.append(run.label)
    rows = []
    for label in labels:
        group = [r.summary for r in runs if r.label == label]
        rows.append(
            [
                label,
                ",".join(str(s["seed"]) for s in group),
                mean_std([s["accuracy"]["best"] for s in group]),
                mean_std([s["accuracy"]["last10"] for s in group]),
                mean_std([s["balanced_accuracy"]["last10"] for s in group]),
                mean_std([s["final"]["precision"] for s in group], ".2f", empty="n/a"),
                mean_std([s["final"]["recall"] for s in group], ".2f", empty="n/a"),
                mean_std([s["final"]["f1"] for s in group], ".2f", empty="n/a"),
                mean_std([s["after_warmup"]["matching_ratio"] for s in group], ".2f"),
                mean_std([s["final"]["auroc"] for s in group], ".2f", empty="n/a"),
                mean_std([s["false_alarms"]["total_false_flags"] for s in group], ".1f"),
                mean_std([s["spearman_final"].get("expertise") for s in group], ".2f"),
                mean_std([s["coordinator_seconds_mean"] for s in group], ".2f"),
            ]
        )
    return rows


def _figure_text(value: float | None) -> str:
    """A figure with two decimals, "n/a" when undefined."""
    return "n/a" if value is None else f"{value:.2f}"


def _counted(count: int, noun: str) -> str:
    """``count`` and ``noun``, in the plural unless the count is 1."""
    return f"{count} {noun}" + ("" if count == 1 else "s")


def detection_lines(run: RunResult) -> list[str]:
    """The printed detection summary of one run (call
    ``fedaudit_sim.summaries.summarise_run`` first).

    Three lines: the detection figures after the warm-up and at the last round ("n/a" where
    undefined, with the number of rounds each mean covers), the false alarms on clean sites
    and, when some site is truly noisy, the first detections.
    """
    s = run.summary
    after = s["after_warmup"]
    final = s["final"]
    alarms = s["false_alarms"]
    first = s["first_detection"]
    span = (
        f"rounds {alarms['first_round']}-{alarms['last_round']}" if alarms["rounds"] else "no round"
    )
    head = f"{run.label} seed {run.seed} (primary detector {s['primary_detector']}): "
    if s["true_noisy"] == 0:
        figures = (
            "no truly noisy site, so precision, recall and F1 are undefined (n/a); "
            f"matching ratio {_figure_text(after['matching_ratio'])} over {span} after the "
            f"{s['warmup_rounds']}-round warm-up"
        )
    else:
        figures = (
            f"after the {s['warmup_rounds']}-round warm-up ({span}): precision "
            f"{_figure_text(after['precision'])} (mean over the "
            f"{_counted(after['precision_rounds'], 'round')} that flag a site), recall "
            f"{_figure_text(after['recall'])}, F1 {_figure_text(after['f1'])}, matching ratio "
            f"{_figure_text(after['matching_ratio'])}; last round {s['rounds'] - 1}: precision "
            f"{_figure_text(final['precision'])}, recall {_figure_text(final['recall'])}, F1 "
            f"{_figure_text(final['f1'])}"
        )
    lines = [head + figures]
    if alarms["total_false_flags"] == 0:
        lines.append(
            f"  false alarms: none on the {_counted(alarms['clean_sites'], 'clean site')} "
            f"in {_counted(alarms['rounds'], 'round')} after the warm-up"
        )
    else:
        worst = alarms["worst_round"]
        sites = ", ".join(
            f"{name} ({_counted(count, 'round')})" for name, count in alarms["sites"].items()
        )
        lines.append(
            f"  false alarms: {alarms['total_false_flags']} (site, round) flag(s) on "
            f"{len(alarms['sites'])} of {_counted(alarms['clean_sites'], 'clean site')} in "
            f"{alarms['rounds_with_false_flags']} of {_counted(alarms['rounds'], 'round')} "
            f"after the warm-up; first in round {alarms['first_false_flag_round']}, worst "
            f"round {worst['round']} ({_counted(len(worst['sites']), 'site')}); {sites}"
        )
    if first["noisy_sites"]:
        missed = [name for name, value in first["rounds"].items() if value is None]
        text = (
            f"  first detection: {first['detected']} of "
            f"{_counted(first['noisy_sites'], 'noisy site')} flagged after the warm-up"
        )
        if first["detected"]:
            text += (
                f"; first flagged in round {first['mean']:.1f} on average, "
                f"round {first['max']} at the latest"
            )
        if missed:
            text += f"; never flagged: {', '.join(missed)}"
        lines.append(text)
    return lines


def comparison_table(runs: Sequence[RunResult], *, title: str = "") -> Any:
    """The comparison as a ``rich.table.Table`` (see :func:`comparison_rows`)."""
    from rich.table import Table

    table = Table(title=title or None)
    for i, column in enumerate(COMPARISON_COLUMNS):
        table.add_column(column, justify="left" if i < 2 else "right")
    for row in comparison_rows(runs):
        table.add_row(*row)
    return table
