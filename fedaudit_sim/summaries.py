"""Metrics of simulated federations: per-round detection scores and each run's summary.

docs/evaluation.md, "How the figures are made". A :class:`~fedaudit_sim.records.RunResult` is
one method configuration run with one seed; it holds, per round, what the coordinator's stored
audit said about every client next to the ground truth, and the global model's accuracy on the
clean test split. :func:`summarise_run` turns it into the metrics docs/evaluation.md uses (all
computed with ``fedaudit_sim.metrics``):

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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

import numpy as np

from fedaudit_sim.metrics import (
    auroc,
    detection_scores,
    spearman,
    summarise_curve,
)
from fedaudit_sim.noise_protocols import CONTINUOUS_PROTOCOLS
from fedaudit_sim.records import RoundRecord, RunResult, clean_json

__all__ = [
    "false_alarm_report",
    "first_detection_report",
    "round_metrics",
    "summarise_run",
]


def _primary_auroc_scores(record: RoundRecord) -> tuple[list[float] | None, str]:
    """The primary detector's noisiness per client (None if a client has none) and its source."""
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
    """Mean of the values that are not None (None when there are none)."""
    kept = [float(v) for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def _defined(values: Iterable[float | None]) -> list[float]:
    """The values that are not None, as floats."""
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


#: The per-round detection figures the summary repeats for the last round and for every round.
_DETECTION_KEYS: Final[tuple[str, ...]] = (
    "precision",
    "recall",
    "f1",
    "matching",
    "auroc",
    "flagged",
    "false_flags",
)


def summarise_run(run: RunResult) -> dict[str, Any]:
    """Fill every round's ``metrics`` and return the run's summary (also stored on ``run``)."""
    if not run.rounds:
        raise ValueError(f"run {run.label!r} (seed {run.seed}) has no closed round to summarise")
    for record in run.rounds:
        record.metrics = round_metrics(run, record)
    after = [r for r in run.rounds if r.index >= run.warmup_rounds] or run.rounds[-1:]
    last = run.rounds[-1]
    summary: dict[str, Any] = {
        "label": run.label,
        "seed": run.seed,
        "rounds": len(run.rounds),
        "warmup_rounds": run.warmup_rounds,
        "clients": len(run.clients),
        "true_noisy": int(run.true_noisy.sum()),
        "ground_truth_rule": _ground_truth_rule(run),
        "primary_detector": last.primary,
        "final": {key: last.metrics[key] for key in _DETECTION_KEYS},
        "after_warmup": _after_warmup_summary(after),
        "false_alarms": false_alarm_report(run, after),
        "first_detection": first_detection_report(run, after),
        "detection_per_round": [_round_detection(r) for r in run.rounds],
        **_scores_summary(run, last),
        **_quality_and_cost_summary(run, last),
        "final_status": {c.name: c.status for c in last.clients},
        "wall_seconds": run.wall_seconds,
    }
    run.summary = clean_json(summary)
    return run.summary


def _round_detection(record: RoundRecord) -> dict[str, Any]:
    """One entry of ``detection_per_round``: the round, its warm-up flag and its figures."""
    return {
        "round": record.index,
        "in_warmup": record.in_warmup,
        **{key: record.metrics[key] for key in _DETECTION_KEYS},
    }


def _ground_truth_rule(run: RunResult) -> str:
    """The rule that made a client truly noisy in this run, in words."""
    if run.noise_protocol in CONTINUOUS_PROTOCOLS:
        return f"realised rate > 0 and >= {run.noise_threshold}"
    return "realised rate > 0"


def _after_warmup_summary(after: Sequence[RoundRecord]) -> dict[str, Any]:
    """Mean detection figures over the rounds after the warm-up.

    Undefined rounds (precision without a flag; recall and F1 without a noisy client) are left
    out of the means, and the means say how many rounds they cover.
    """
    precision, precision_rounds = _mean_and_count(r.metrics["precision"] for r in after)
    recall, recall_rounds = _mean_and_count(r.metrics["recall"] for r in after)
    f1, f1_rounds = _mean_and_count(r.metrics["f1"] for r in after)
    auroc_mean, auroc_rounds = _mean_and_count(r.metrics["auroc"] for r in after)
    return {
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
        "rounds_primary_undetermined": sum(1 for r in after if r.metrics["primary_undetermined"]),
    }


def _scores_summary(run: RunResult, last: RoundRecord) -> dict[str, Any]:
    """The AUROC source, the last round's Spearman correlations and the label-selection
    figures (last round and mean over the rounds)."""
    return {
        "auroc_source": last.metrics["auroc_source"],
        "spearman_final": dict(last.metrics["spearman"]),
        "label_precision_final": last.metrics["label_precision"],
        "label_recall_final": last.metrics["label_recall"],
        "label_precision_mean": _mean(r.metrics["label_precision"] for r in run.rounds),
        "label_recall_mean": _mean(r.metrics["label_recall"] for r in run.rounds),
    }


def _quality_and_cost_summary(run: RunResult, last: RoundRecord) -> dict[str, Any]:
    """Model quality (best, last-10% and final accuracies) and cost (coordinator seconds,
    bytes per client and round, signal time relative to training time)."""
    client_rounds = [c for r in run.rounds for c in r.clients]
    train = sum(c.train_seconds for c in client_rounds)
    signal = sum(c.signal_seconds for c in client_rounds)
    return {
        "accuracy": dict(summarise_curve([r.accuracy for r in run.rounds])),
        "balanced_accuracy": dict(summarise_curve([r.balanced_accuracy for r in run.rounds])),
        "final_accuracy": last.accuracy,
        "final_balanced_accuracy": last.balanced_accuracy,
        "final_class_recall": last.class_recall,
        "coordinator_seconds_mean": _mean(r.coordinator_seconds for r in run.rounds),
        "bytes_up_per_client_round": _mean(c.upload_bytes for c in client_rounds),
        "bytes_down_per_client_round": _mean(c.download_bytes for c in client_rounds),
        "signal_to_train_time": signal / train if train > 0 else None,
    }
