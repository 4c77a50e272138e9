"""The files of simulated runs: JSON, CSV, and everything at once (:func:`write_outputs`).

docs/evaluation.md, "How the figures are made". Per run the whole record as strict JSON and its
rounds and clients as CSV; for all runs together the summaries (``results.json``, one row per
run in ``summary.csv``), the rounds and clients of every run, and the plots
(``fedaudit_sim.plots``). The records are ``fedaudit_sim.records``; the summaries
``fedaudit_sim.summaries``.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedaudit_sim.plots import plot_accuracy, plot_per_class_loss, plot_scores_vs_noise
from fedaudit_sim.records import (
    ClientRecord,
    ClientRoundRecord,
    RoundRecord,
    RunResult,
    clean_json,
    detectors_of,
)
from fedaudit_sim.summaries import summarise_run

__all__ = [
    "write_outputs",
    "write_run_csv",
    "write_run_json",
    "write_summary_csv",
]


def _stem(run: RunResult) -> str:
    """``<label>_seed<seed>``: the stem of a run's file names."""
    return f"{run.label}_seed{run.seed}"


def write_run_json(run: RunResult, directory: Path) -> Path:
    """Write ``<label>_seed<seed>.json`` (the whole run, strict JSON); return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    return _write_json(directory / f"{_stem(run)}.json", run.to_json())


def _write_json(path: Path, data: Any) -> Path:
    """Strict JSON (NaN is an error: clean it first), one-space indent, trailing newline."""
    path.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    return path


def _cell(value: Any) -> str:
    """One CSV cell: empty for None and non-finite floats, 1/0 for booleans, lists joined by
    semicolons."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else ""
    if isinstance(value, list | tuple):
        return ";".join(_cell(v) for v in value)
    return str(value)


def _round_row(run: RunResult, r: RoundRecord) -> dict[str, Any]:
    """One ``rounds.csv`` row: column name -> value, in column order."""
    m = r.metrics
    return {
        "label": run.label,
        "seed": run.seed,
        "round": r.index,
        "in_warmup": r.in_warmup,
        "accuracy": r.accuracy,
        "balanced_accuracy": r.balanced_accuracy,
        "coordinator_seconds": r.coordinator_seconds,
        "wall_seconds": r.wall_seconds,
        "aggregation_rule": r.aggregation_rule,
        "fallback_reason": r.fallback_reason,
        "primary": r.primary,
        "primary_status": r.detector_status.get(r.primary or ""),
        "ashman_d": r.ashman_d,
        "precision": m.get("precision"),
        "recall": m.get("recall"),
        "f1": m.get("f1"),
        "matching": m.get("matching"),
        "auroc": m.get("auroc"),
        "spearman_expertise": (m.get("spearman") or {}).get("expertise"),
        "label_precision": m.get("label_precision"),
        "label_recall": m.get("label_recall"),
        "flagged": m.get("flagged"),
        "false_flags": m.get("false_flags"),
    }


def _client_rows(run: RunResult, detectors: Sequence[str]) -> Iterator[dict[str, Any]]:
    """The ``clients.csv`` rows of one run (per round and client)."""
    truth = {c.name: c for c in run.clients}
    for r in run.rounds:
        for c in r.clients:
            yield _client_row(run, r, c, truth[c.name], detectors)


def _client_row(
    run: RunResult,
    r: RoundRecord,
    c: ClientRoundRecord,
    gt: ClientRecord,
    detectors: Sequence[str],
) -> dict[str, Any]:
    """One ``clients.csv`` row: column name -> value, in column order (4 columns per detector)."""
    row: dict[str, Any] = {
        "label": run.label,
        "seed": run.seed,
        "round": r.index,
        "in_warmup": r.in_warmup,
        "client": c.name,
        "target_rate": gt.target_rate,
        "true_noise_rate": gt.realised_rate,
        "true_noisy": gt.true_noisy,
        "role": c.role,
    }
    for name in detectors:
        entry = c.detectors.get(name, {})
        for key in ("status", "score", "flag", "noisiness"):
            row[f"{name}_{key}"] = entry.get(key)
    row.update(
        {
            "primary_flag": c.primary_flag,
            "status": c.status,
            "expertise": c.expertise,
            "neighbors": c.neighbors,
            "self_weight": c.self_weight,
            "weight": c.weight,
            "train_loss": c.train_loss,
            "label_precision": c.label_precision,
            "label_recall": c.label_recall,
            "upload_bytes": c.upload_bytes,
            "download_bytes": c.download_bytes,
        }
    )
    return row


def _write_rows(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """CSV with the first row's keys as the header; every row must have the same keys.

    No rows: an empty file (there is nothing to name the columns of)."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        header: list[str] | None = None
        for row in rows:
            if header is None:
                header = list(row)
                writer.writerow(header)
            elif list(row) != header:
                raise ValueError(f"{path.name}: row columns {list(row)} differ from {header}")
            writer.writerow(_cell(v) for v in row.values())


def write_run_csv(
    runs: Sequence[RunResult], directory: Path, *, prefix: str = ""
) -> tuple[Path, Path]:
    """Write ``<prefix>rounds.csv`` (one row per run and round) and ``<prefix>clients.csv``
    (per run, round and client); return both paths. Call :func:`summarise_run` first (for the
    metrics columns)."""
    directory.mkdir(parents=True, exist_ok=True)
    rounds_path = directory / f"{prefix}rounds.csv"
    clients_path = directory / f"{prefix}clients.csv"
    detectors = detectors_of(runs)
    _write_rows(rounds_path, (_round_row(run, r) for run in runs for r in run.rounds))
    _write_rows(clients_path, (row for run in runs for row in _client_rows(run, detectors)))
    return rounds_path, clients_path


def _summary_row(run: RunResult) -> dict[str, Any]:
    """One ``summary.csv`` row: column name -> value, in column order."""
    s = run.summary
    final = s["final"]
    spear = s["spearman_final"]
    return {
        "label": run.label,
        "seed": run.seed,
        "rounds": s["rounds"],
        "warmup_rounds": s["warmup_rounds"],
        "true_noisy": s["true_noisy"],
        "primary_detector": s["primary_detector"],
        "final_precision": final["precision"],
        "final_recall": final["recall"],
        "final_f1": final["f1"],
        "final_matching": final["matching"],
        "final_auroc": final["auroc"],
        "matching_ratio": s["after_warmup"]["matching_ratio"],
        "mean_precision_after_warmup": s["after_warmup"]["precision"],
        "precision_rounds": s["after_warmup"]["precision_rounds"],
        "mean_f1_after_warmup": s["after_warmup"]["f1"],
        "false_flags_after_warmup": s["false_alarms"]["total_false_flags"],
        "first_false_flag_round": s["false_alarms"]["first_false_flag_round"],
        "noisy_sites_detected": s["first_detection"]["detected"],
        "first_detection_mean": s["first_detection"]["mean"],
        "first_detection_max": s["first_detection"]["max"],
        "spearman_expertise": spear.get("expertise"),
        "spearman_fednoro": spear.get("fednoro_score"),
        "spearman_fedncl": spear.get("fedncl_score"),
        "spearman_fednoro_mean_loss": spear.get("fednoro_mean_loss"),
        "spearman_fednoro_class_z": spear.get("fednoro_class_z"),
        "spearman_fednoro_posterior": spear.get("fednoro_posterior"),
        "label_precision": s["label_precision_final"],
        "label_recall": s["label_recall_final"],
        "accuracy_best": s["accuracy"]["best"],
        "accuracy_last10": s["accuracy"]["last10"],
        "balanced_accuracy_best": s["balanced_accuracy"]["best"],
        "balanced_accuracy_last10": s["balanced_accuracy"]["last10"],
        "coordinator_seconds_mean": s["coordinator_seconds_mean"],
        "bytes_up_per_client_round": s["bytes_up_per_client_round"],
        "bytes_down_per_client_round": s["bytes_down_per_client_round"],
        "signal_to_train_time": s["signal_to_train_time"],
        "wall_seconds": s["wall_seconds"],
    }


def write_summary_csv(runs: Sequence[RunResult], path: Path) -> Path:
    """One row per run (``summary.csv``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_rows(path, (_summary_row(run) for run in runs))
    return path


def write_outputs(
    runs: Sequence[RunResult],
    directory: Path,
    *,
    plots: bool = True,
    failures: Sequence[Mapping[str, Any]] = (),
) -> list[Path]:
    """Summarise every run and write JSON, CSV and (optionally) PNG plots under ``directory``.

    Files: per run ``runs/<label>_seed<seed>.json`` (everything), ``..._rounds.csv`` and
    ``..._clients.csv``; for all runs together ``results.json`` (every run's summary, and under
    ``failures`` the runs that stopped early, as ``RunFailure.to_json`` gives them),
    ``rounds.csv`` and ``clients.csv`` (with label and seed columns), ``summary.csv`` (one row
    per run), ``accuracy.png``,
    ``scores_vs_noise.png``, ``per_class_loss_<label>_seed<seed>.png`` (first seed of each
    method).
    """
    directory.mkdir(parents=True, exist_ok=True)
    for run in runs:
        if not run.summary:
            summarise_run(run)
    written: list[Path] = []
    for run in runs:
        written.append(write_run_json(run, directory / "runs"))
        written.extend(write_run_csv([run], directory / "runs", prefix=f"{_stem(run)}_"))
    written.append(
        _write_json(
            directory / "results.json",
            {
                "runs": [clean_json(run.summary) for run in runs],
                "failures": [clean_json(dict(f)) for f in failures],
            },
        )
    )
    written.extend(write_run_csv(runs, directory))
    written.append(write_summary_csv(runs, directory / "summary.csv"))
    if plots and runs:
        written.append(plot_accuracy(runs, directory / "accuracy.png"))
        written.append(plot_scores_vs_noise(runs, directory / "scores_vs_noise.png"))
        done: set[str] = set()
        for run in runs:
            if run.label in done:
                continue
            done.add(run.label)
            heat = plot_per_class_loss(run, directory / f"per_class_loss_{_stem(run)}.png")
            if heat is not None:
                written.append(heat)
    return written
