"""Results of simulated federations: records, metrics, JSON, CSV, plots, comparison table.

docs/evaluation.md, "How the figures are made". A :class:`RunResult` is one method configuration
run with one seed; it holds, per round, what the coordinator's stored audit said about every
client next to the ground truth, and the global model's accuracy on the clean test split.
:func:`summarise_run` turns it into the metrics docs/evaluation.md uses (all computed with
``fedaudit_sim.metrics``):

- Detection, per round (``detection_per_round``), after the federation's warm-up
  (``round >= warmup_rounds``, the resolved value the coordinator stored) and at the last round:
  precision, recall, F1 and matching of the primary detector's flags against the ground truth
  (an undetermined flag counts as "not flagged"; the number of such rounds is reported); the
  matching ratio is the mean matching over those rounds. Undefined figures are ``None``
  (``metrics.detection_scores``): precision, recall and F1 in a federation without a truly
  noisy client, precision in a round that flags nothing. The means after the warm-up skip the
  undefined rounds and say how many rounds each covers (``precision_rounds``, ...).
- False alarms (``false_alarms``), the flags the primary detector put on clean sites in the
  rounds after the warm-up: the first such round, each flagged clean site with the number of
  rounds it was flagged in, the worst round (most clean sites flagged; the earliest on ties) and
  the total number of (site, round) false flags. In a clean federation this is the whole story:
  precision, recall and F1 are undefined there.
- First detection (``first_detection``): per truly noisy site, the first round after the
  warm-up in which the primary detector flags it (``None``: never), and the mean and max of
  those rounds over the sites that were detected. Rounds are indexed from 0 everywhere, so the
  first round after a warm-up of W rounds is round W.
- AUROC of the primary detector's noisiness score. Which score (``auroc_source``): the
  verdict's graded score, higher = noisier -- ``fednoro`` its separation statistic (the
  class-standardised loss excess by default, given for every client whether or not the guard
  let the flags through), ``fedncl`` q_k; ``expertise`` uses 1 - expertise.
- Spearman correlation with the *realised* noise rate of the expertise (FedRN reliability; a
  good signal is strongly negative), of each detector's noisiness score (same choices as
  above, but expertise not inverted), and of FedNoRo's evidence: the mean loss, the
  class-standardised excess and the GMM posterior before the separation guard
  (``fednoro_posterior``).
- Label precision and recall of sample selection: the mean over the clients that reported
  ``label_precision``/``label_recall`` in their round metrics (FedRN, RoFL), per round and at the
  last round.
- Model quality: best and last-10% mean of accuracy and balanced accuracy.
- Cost: coordinator seconds per round (the round's ``coordinator_seconds``), bytes up and down per
  client per round, SDK signal time relative to local training time.

Ground truth: the noise protocol's rule (``NoiseReport.noisy_clients``), always from the realised
flips: a client is noisy iff some of its labels changed (realised rate > 0), and under a continuous
protocol only if its realised rate also reaches the scenario's threshold. Every metric, report and
plot here uses that one flag (``ClientRecord.true_noisy``) and the realised rates.

Plots use matplotlib's object-oriented API on the Agg canvas (no pyplot state, no display).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

from fedaudit_sim.metrics import (
    auroc,
    detection_scores,
    spearman,
    summarise_curve,
)
from fedaudit_sim.noise import CONTINUOUS_PROTOCOLS

__all__ = [
    "DETECTOR_NAMES",
    "ClientRecord",
    "ClientRoundRecord",
    "RoundRecord",
    "RunResult",
    "comparison_rows",
    "comparison_table",
    "detection_lines",
    "false_alarm_report",
    "first_detection_report",
    "mean_std",
    "plot_accuracy",
    "plot_per_class_loss",
    "plot_scores_vs_noise",
    "round_metrics",
    "summarise_run",
    "write_outputs",
    "write_run_csv",
    "write_run_json",
]

#: Detectors the coordinator knows, in table order.
DETECTOR_NAMES: Final[tuple[str, ...]] = ("fednoro", "fedncl", "expertise", "evidence")


@dataclass
class ClientRecord:
    """A simulated client and its ground truth."""

    index: int
    name: str
    client_id: str
    num_samples: int
    class_counts: list[int]
    target_rate: float
    realised_rate: float
    true_noisy: bool
    lies_about_losses: bool = False


@dataclass
class ClientRoundRecord:
    """What one round's audit and training said about one client.

    ``detectors`` maps a detector name to ``{"status", "score", "flag", "noisiness"}`` where
    ``noisiness`` is the score used for AUROC/Spearman (module docstring). Since FedNoRo's
    score became graded it equals ``score`` for every detector; it stays a key of its own so
    the JSON and CSV columns of older runs and newer ones line up.
    """

    name: str
    role: str | None
    detectors: dict[str, dict[str, Any]]
    primary_flag: bool | None
    status: str | None
    expertise: float | None
    neighbors: list[str] | None
    self_weight: float | None
    weight: float | None
    train_loss: float | None
    train_seconds: float
    signal_seconds: float
    upload_bytes: int
    download_bytes: int
    label_precision: float | None
    label_recall: float | None
    normalised_loss: list[float | None] | None = None
    per_class_loss: list[float | None] | None = None


@dataclass
class RoundRecord:
    """One closed round."""

    index: int
    in_warmup: bool
    accuracy: float
    balanced_accuracy: float
    coordinator_seconds: float | None
    wall_seconds: float
    aggregation_rule: str | None
    fallback_reason: str | None
    primary: str | None
    detector_status: dict[str, str | None]
    detector_reason: dict[str, str | None]
    ashman_d: float | None
    clients: list[ClientRoundRecord]
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunResult:
    """One method configuration run with one seed."""

    scenario: str
    label: str
    seed: int
    federation_id: str
    config: dict[str, Any]
    clients: list[ClientRecord]
    rounds: list[RoundRecord]
    noise_protocol: str
    noise_threshold: float
    num_classes: int
    wall_seconds: float = 0.0
    report: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def warmup_rounds(self) -> int:
        """The federation's resolved warm-up (rounds before flags take effect)."""
        return int(self.config.get("warmup_rounds", 0))

    @property
    def true_noisy(self) -> np.ndarray:
        """Ground-truth noisy flags, in client order."""
        return np.asarray([c.true_noisy for c in self.clients], dtype=bool)

    @property
    def realised_rates(self) -> np.ndarray:
        """Realised noise rates, in client order."""
        return np.asarray([c.realised_rate for c in self.clients], dtype=np.float64)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values (no NaN)."""
        data: dict[str, Any] = _clean(dataclasses.asdict(self))
        return data


def _clean(value: Any) -> Any:
    """Replace non-finite floats by None so the JSON is strict."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, np.generic):
        return _clean(value.item())
    return value


# --------------------------------------------------------------------------------------------
# metrics


def _primary_auroc_scores(record: RoundRecord) -> tuple[list[float] | None, str]:
    primary = record.primary or ""
    scores: list[float] = []
    for client in record.clients:
        value = client.detectors.get(primary, {}).get("noisiness")
        if value is None:
            return None, _SOURCES.get(primary, "score")
        scores.append(1.0 - value if primary == "expertise" else value)
    return scores, _SOURCES.get(primary, "score")


_SOURCES: Final[dict[str, str]] = {
    "fednoro": "score: the separation statistic (higher = noisier)",
    "fedncl": "score q_k (higher = noisier)",
    "expertise": "1 - expertise",
}


def round_metrics(run: RunResult, record: RoundRecord) -> dict[str, Any]:
    """Detection, AUROC, Spearman and label-selection metrics of one round."""
    truth = run.true_noisy
    rates = run.realised_rates
    flags = [c.primary_flag for c in record.clients]
    undetermined = any(f is None for f in flags)
    detection = detection_scores(truth, np.asarray([bool(f) for f in flags], dtype=bool))
    scores, source = _primary_auroc_scores(record)
    result: dict[str, Any] = {
        "precision": detection["precision"],
        "recall": detection["recall"],
        "f1": detection["f1"],
        "matching": detection["matching"],
        "flagged": [c.name for c in record.clients if c.primary_flag],
        "false_flags": [
            c.name
            for c, noisy in zip(record.clients, truth, strict=True)
            if c.primary_flag and not noisy
        ],
        "primary_undetermined": undetermined,
        "auroc": None if scores is None else auroc(truth, np.asarray(scores)),
        "auroc_source": source,
    }
    correlations: dict[str, float | None] = {}
    correlations["expertise"] = _spearman_complete([c.expertise for c in record.clients], rates)
    names = sorted({name for c in record.clients for name in c.detectors})
    for name in names:
        values = [c.detectors.get(name, {}).get("noisiness") for c in record.clients]
        correlations[f"{name}_score"] = _spearman_complete(values, rates)
    mean_losses = [c.detectors.get("fednoro", {}).get("mean_loss") for c in record.clients]
    correlations["fednoro_mean_loss"] = _spearman_complete(mean_losses, rates)
    class_z = [c.detectors.get("fednoro", {}).get("class_z") for c in record.clients]
    correlations["fednoro_class_z"] = _spearman_complete(class_z, rates)
    posterior = [c.detectors.get("fednoro", {}).get("posterior") for c in record.clients]
    correlations["fednoro_posterior"] = _spearman_complete(posterior, rates)
    result["spearman"] = correlations
    result["label_precision"] = _mean(c.label_precision for c in record.clients)
    result["label_recall"] = _mean(c.label_recall for c in record.clients)
    return result


def _spearman_complete(values: Sequence[float | None], rates: np.ndarray) -> float | None:
    """Spearman of ``values`` against the noise rates; None when a client has no value."""
    if any(v is None for v in values):
        return None
    return spearman(np.asarray(values, dtype=np.float64), rates)


def _mean(values: Iterable[float | None]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def _defined(values: Iterable[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None]


def _mean_and_count(values: Iterable[float | None]) -> tuple[float | None, int]:
    """Mean of the defined values and how many there were (``None``, 0 when none)."""
    kept = _defined(values)
    return (float(np.mean(kept)) if kept else None), len(kept)


def false_alarm_report(run: RunResult, rounds: Sequence[RoundRecord]) -> dict[str, Any]:
    """The primary detector's flags on clean sites over ``rounds`` (module docstring).

    Call :func:`round_metrics` on the rounds first (their ``false_flags``).
    """
    counts: dict[str, int] = {}
    first: int | None = None
    worst: dict[str, Any] | None = None
    total = 0
    with_flags = 0
    for record in rounds:
        names = list(record.metrics["false_flags"])
        total += len(names)
        for name in names:
            counts[name] = counts.get(name, 0) + 1
        if not names:
            continue
        with_flags += 1
        if first is None:
            first = record.index
        if worst is None or len(names) > len(worst["sites"]):
            worst = {"round": record.index, "sites": names}
    order = {c.name: c.index for c in run.clients}
    return {
        "rounds": len(rounds),
        "first_round": rounds[0].index if rounds else None,
        "last_round": rounds[-1].index if rounds else None,
        "clean_sites": int(sum(1 for c in run.clients if not c.true_noisy)),
        "first_false_flag_round": first,
        "sites": {name: counts[name] for name in sorted(counts, key=lambda n: order.get(n, 0))},
        "worst_round": worst,
        "rounds_with_false_flags": with_flags,
        "total_false_flags": total,
    }


def first_detection_report(run: RunResult, rounds: Sequence[RoundRecord]) -> dict[str, Any]:
    """Per truly noisy site, the first of ``rounds`` whose primary flags include it."""
    first: dict[str, int | None] = {c.name: None for c in run.clients if c.true_noisy}
    for record in rounds:
        for name in record.metrics["flagged"]:
            if name in first and first[name] is None:
                first[name] = record.index
    found = [v for v in first.values() if v is not None]
    return {
        "rounds": first,
        "noisy_sites": len(first),
        "detected": len(found),
        "mean": float(np.mean(found)) if found else None,
        "max": max(found) if found else None,
    }


def summarise_run(run: RunResult) -> dict[str, Any]:
    """Fill every round's ``metrics`` and return the run's summary (also stored on ``run``)."""
    if not run.rounds:
        raise ValueError(f"run {run.label!r} (seed {run.seed}) has no closed round to summarise")
    for record in run.rounds:
        record.metrics = round_metrics(run, record)
    after = [r for r in run.rounds if r.index >= run.warmup_rounds] or run.rounds[-1:]
    last = run.rounds[-1]
    accuracy = summarise_curve([r.accuracy for r in run.rounds])
    balanced = summarise_curve([r.balanced_accuracy for r in run.rounds])
    client_rounds = [c for r in run.rounds for c in r.clients]
    train = sum(c.train_seconds for c in client_rounds)
    signal = sum(c.signal_seconds for c in client_rounds)
    truth = run.true_noisy
    # Undefined rounds (precision without a flag; recall and F1 without a noisy client) are
    # left out of the means, and the means say how many rounds they cover.
    precision, precision_rounds = _mean_and_count(r.metrics["precision"] for r in after)
    recall, recall_rounds = _mean_and_count(r.metrics["recall"] for r in after)
    f1, f1_rounds = _mean_and_count(r.metrics["f1"] for r in after)
    auroc_mean, auroc_rounds = _mean_and_count(r.metrics["auroc"] for r in after)
    summary: dict[str, Any] = {
        "label": run.label,
        "seed": run.seed,
        "rounds": len(run.rounds),
        "warmup_rounds": run.warmup_rounds,
        "clients": len(run.clients),
        "true_noisy": int(truth.sum()),
        "ground_truth_rule": (
            f"realised rate > 0 and >= {run.noise_threshold}"
            if run.noise_protocol in CONTINUOUS_PROTOCOLS
            else "realised rate > 0"
        ),
        "primary_detector": last.primary,
        "final": {
            key: last.metrics[key]
            for key in (
                "precision",
                "recall",
                "f1",
                "matching",
                "auroc",
                "flagged",
                "false_flags",
            )
        },
        "after_warmup": {
            "rounds": len(after),
            "precision": precision,
            "precision_rounds": precision_rounds,
            "recall": recall,
            "recall_rounds": recall_rounds,
            "f1": f1,
            "f1_rounds": f1_rounds,
            "matching_ratio": _mean(r.metrics["matching"] for r in after),
            "auroc": auroc_mean,
            "auroc_rounds": auroc_rounds,
            "rounds_primary_undetermined": sum(
                1 for r in after if r.metrics["primary_undetermined"]
            ),
        },
        "false_alarms": false_alarm_report(run, after),
        "first_detection": first_detection_report(run, after),
        "detection_per_round": [
            {
                "round": r.index,
                "in_warmup": r.in_warmup,
                **{
                    key: r.metrics[key]
                    for key in (
                        "precision",
                        "recall",
                        "f1",
                        "matching",
                        "auroc",
                        "flagged",
                        "false_flags",
                    )
                },
            }
            for r in run.rounds
        ],
        "auroc_source": last.metrics["auroc_source"],
        "spearman_final": dict(last.metrics["spearman"]),
        "label_precision_final": last.metrics["label_precision"],
        "label_recall_final": last.metrics["label_recall"],
        "label_precision_mean": _mean(r.metrics["label_precision"] for r in run.rounds),
        "label_recall_mean": _mean(r.metrics["label_recall"] for r in run.rounds),
        "accuracy": dict(accuracy),
        "balanced_accuracy": dict(balanced),
        "final_accuracy": last.accuracy,
        "final_balanced_accuracy": last.balanced_accuracy,
        "coordinator_seconds_mean": _mean(r.coordinator_seconds for r in run.rounds),
        "bytes_up_per_client_round": _mean(c.upload_bytes for c in client_rounds),
        "bytes_down_per_client_round": _mean(c.download_bytes for c in client_rounds),
        "signal_to_train_time": signal / train if train > 0 else None,
        "final_status": {c.name: c.status for c in last.clients},
        "wall_seconds": run.wall_seconds,
    }
    run.summary = _clean(summary)
    return run.summary


# --------------------------------------------------------------------------------------------
# JSON and CSV


def _stem(run: RunResult) -> str:
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
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else ""
    if isinstance(value, list | tuple):
        return ";".join(_cell(v) for v in value)
    return str(value)


def _detectors_of(runs: Iterable[RunResult]) -> list[str]:
    seen = {name for run in runs for r in run.rounds for c in r.clients for name in c.detectors}
    known = [d for d in DETECTOR_NAMES if d in seen]
    return known + sorted(seen - set(known))


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
    detectors = _detectors_of(runs)
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


# --------------------------------------------------------------------------------------------
# comparison table


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
    return "n/a" if value is None else f"{value:.2f}"


def _counted(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def detection_lines(run: RunResult) -> list[str]:
    """The printed detection summary of one run (call :func:`summarise_run` first).

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


# --------------------------------------------------------------------------------------------
# plots


def _figure(width: float, height: float) -> Any:
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
    detectors = _detectors_of(firsts) or ["fednoro"]
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
                ax.text(0.5, 0.5, "undetermined", ha="center", va="center", transform=ax.transAxes)
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


# --------------------------------------------------------------------------------------------
# everything at once


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
                "runs": [_clean(run.summary) for run in runs],
                "failures": [_clean(dict(f)) for f in failures],
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
