"""Evaluation metrics of the simulator (docs/evaluation.md, "How the figures are made").

- Noisy-client detection against the ground truth: precision, recall, F1, matching ratio (the
  flagged set equals the noisy set exactly), and AUROC of a noisiness score.
- Reliability: Spearman rank correlation of a signal with the true noise rate.
- Sample selection (FedRN section 5.3): label precision (fraction of selected samples whose label
  is clean) and label recall (fraction of clean samples selected).
- Model quality: accuracy, balanced accuracy (mean per-class recall over the classes present in
  the ground truth, the ISIC metric FedNoRo reports) and a curve summary (best value and mean of
  the last 10% of rounds).

Two conventions for empty denominators:

- :func:`detection_scores` (what the simulator's results report): undefined figures are
  ``None``. Without a truly noisy client (a clean federation) precision, recall and F1 are all
  undefined: there is nothing to detect, and a flag there is a false alarm, which is counted as
  such (``false_positives``) instead of being folded into a precision. With some noisy client,
  precision is undefined in a round that flags nothing; recall and F1 = 2TP / (2TP + FP + FN)
  are always defined, so such a round has recall and F1 0 (a miss, not an undefined figure).
  Averages over rounds must skip the ``None`` rounds and say how many remain.
- :func:`detection_metrics` and :func:`label_precision_recall` (kept for the scripts in
  ``docs/eval`` that reproduce published tables): "nothing to find and nothing claimed" scores
  perfectly and no value is ever ``None``: precision with nothing flagged/selected is 1.0 if
  there was nothing to find (no noisy client, resp. no clean sample), else 0.0; recall with
  nothing to find is 1.0; F1 = 2PR / (P + R), and 0.0 when P + R = 0. These values hide a
  clean federation's false alarms (precision, recall and F1 1.0 in every round that flags
  nothing) and count a round without flags as precision 0: do not average them as detection
  quality.
- AUROC and Spearman return ``None`` when undefined (one class only; a constant input).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

import numpy as np
import numpy.typing as npt
from scipy.stats import rankdata

__all__ = [
    "CurveSummary",
    "DetectionOutcome",
    "DetectionScores",
    "MetricInputError",
    "SelectionScores",
    "accuracy",
    "auroc",
    "balanced_accuracy",
    "class_recall",
    "detection_metrics",
    "detection_scores",
    "label_precision_recall",
    "spearman",
    "summarise_curve",
]


class MetricInputError(ValueError):
    """A metric was given inputs of the wrong shape, type or range."""


class DetectionScores(TypedDict):
    """Noisy-client detection scores (all in [0, 1])."""

    precision: float
    recall: float
    f1: float
    matching: float


class DetectionOutcome(TypedDict):
    """One round's noisy-client decision against the truth; ``None`` = undefined.

    ``true_positives``, ``false_positives`` (clean clients flagged: false alarms) and
    ``false_negatives`` (noisy clients not flagged) are counts.
    """

    precision: float | None
    recall: float | None
    f1: float | None
    matching: float
    true_positives: int
    false_positives: int
    false_negatives: int


class SelectionScores(TypedDict):
    """Sample-selection label precision and recall (FedRN section 5.3)."""

    precision: float
    recall: float


class CurveSummary(TypedDict):
    """Best value of a per-round curve and the mean of its last ceil(10%) rounds."""

    best: float
    last10: float


def _bool_vector(name: str, value: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise MetricInputError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.dtype != np.bool_:
        if arr.size and not np.all(np.isin(arr, (0, 1))):
            raise MetricInputError(f"{name} must be boolean (or 0/1)")
        arr = arr.astype(bool)
    return arr


def _same_length(
    a_name: str, a: npt.NDArray[np.generic], b_name: str, b: npt.NDArray[np.generic]
) -> None:
    if a.shape != b.shape:
        raise MetricInputError(f"{a_name} has shape {a.shape} but {b_name} has shape {b.shape}")


def _precision_recall(
    truth: npt.NDArray[np.bool_], claimed: npt.NDArray[np.bool_]
) -> tuple[float, float]:
    tp = int(np.sum(truth & claimed))
    n_claimed = int(claimed.sum())
    n_true = int(truth.sum())
    if n_claimed == 0:
        precision = 1.0 if n_true == 0 else 0.0
    else:
        precision = tp / n_claimed
    recall = 1.0 if n_true == 0 else tp / n_true
    return precision, recall


def detection_metrics(true_noisy: npt.ArrayLike, flagged: npt.ArrayLike) -> DetectionScores:
    """Precision, recall, F1 and matching ratio of a noisy-client decision, never ``None``.

    The module docstring's second convention (1.0 with nothing to find and nothing flagged):
    kept for ``docs/eval``; the simulator's results use :func:`detection_scores`.

    Parameters
    ----------
    true_noisy : array_like of bool, shape (K,)
        Ground-truth noisy flag of each client.
    flagged : array_like of bool, shape (K,)
        The detector's decision.

    Returns
    -------
    DetectionScores
        ``matching`` is 1.0 iff ``flagged`` equals ``true_noisy`` for every client (all noisy
        clients found and no clean one flagged), else 0.0; averaged over rounds it becomes the
        matching ratio. Empty-denominator conventions are in the module docstring.
    """
    truth = _bool_vector("true_noisy", true_noisy)
    claimed = _bool_vector("flagged", flagged)
    _same_length("true_noisy", truth, "flagged", claimed)
    if truth.size == 0:
        raise MetricInputError("detection_metrics needs at least one client")
    precision, recall = _precision_recall(truth, claimed)
    f1 = 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)
    matching = 1.0 if np.array_equal(truth, claimed) else 0.0
    return DetectionScores(precision=precision, recall=recall, f1=f1, matching=matching)


def detection_scores(true_noisy: npt.ArrayLike, flagged: npt.ArrayLike) -> DetectionOutcome:
    """Precision, recall, F1 and matching of a noisy-client decision, ``None`` where undefined.

    Parameters
    ----------
    true_noisy : array_like of bool, shape (K,)
        Ground-truth noisy flag of each client.
    flagged : array_like of bool, shape (K,)
        The detector's decision.

    Returns
    -------
    DetectionOutcome
        precision = TP / (TP + FP), recall = TP / (TP + FN), F1 = 2TP / (2TP + FP + FN); all
        three ``None`` when no client is noisy, precision ``None`` too when nothing is flagged;
        ``matching`` 1.0 iff ``flagged`` equals ``true_noisy`` (always defined: in a clean
        federation it is 1.0 exactly when nothing is flagged).
    """
    truth = _bool_vector("true_noisy", true_noisy)
    claimed = _bool_vector("flagged", flagged)
    _same_length("true_noisy", truth, "flagged", claimed)
    if truth.size == 0:
        raise MetricInputError("detection_scores needs at least one client")
    tp = int(np.sum(truth & claimed))
    fp = int(np.sum(~truth & claimed))
    fn = int(np.sum(truth & ~claimed))
    noisy = tp + fn > 0
    return DetectionOutcome(
        precision=tp / (tp + fp) if noisy and tp + fp > 0 else None,
        recall=tp / (tp + fn) if noisy else None,
        f1=2 * tp / (2 * tp + fp + fn) if noisy else None,
        matching=1.0 if np.array_equal(truth, claimed) else 0.0,
        true_positives=tp,
        false_positives=fp,
        false_negatives=fn,
    )


def _finite_vector(name: str, value: npt.ArrayLike) -> npt.NDArray[np.float64]:
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim != 1:
        raise MetricInputError(f"{name} must be 1-D, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise MetricInputError(f"{name} must be finite")
    return arr


def auroc(true_noisy: npt.ArrayLike, scores: npt.ArrayLike) -> float | None:
    """Area under the ROC curve of a noisiness score (higher score = more likely noisy).

    Computed as the Mann-Whitney statistic: the probability that a random noisy client scores
    higher than a random clean one, ties counting one half.

    Returns
    -------
    float or None
        ``None`` when only one class is present (the AUROC is undefined).
    """
    truth = _bool_vector("true_noisy", true_noisy)
    s = _finite_vector("scores", scores)
    _same_length("true_noisy", truth, "scores", s)
    n_pos = int(truth.sum())
    n_neg = int(truth.size - n_pos)
    if n_pos == 0 or n_neg == 0:
        return None
    ranks = rankdata(s)  # average ranks, so ties count one half
    u = float(ranks[truth].sum()) - n_pos * (n_pos + 1) / 2.0
    return u / (n_pos * n_neg)


def spearman(x: npt.ArrayLike, y: npt.ArrayLike) -> float | None:
    """Spearman rank correlation (Pearson correlation of average ranks).

    Returns
    -------
    float or None
        ``None`` when either input is constant or has fewer than two values.
    """
    a = _finite_vector("x", x)
    b = _finite_vector("y", y)
    _same_length("x", a, "y", b)
    if a.size < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    ra = rankdata(a) - (a.size + 1) / 2.0
    rb = rankdata(b) - (b.size + 1) / 2.0
    rho = float(np.sum(ra * rb) / np.sqrt(np.sum(ra * ra) * np.sum(rb * rb)))
    # Rounding can push a perfect correlation a hair past 1.
    return float(np.clip(rho, -1.0, 1.0))


def label_precision_recall(true_clean: npt.ArrayLike, selected: npt.ArrayLike) -> SelectionScores:
    """Label precision and recall of a sample selection (FedRN section 5.3).

    Parameters
    ----------
    true_clean : array_like of bool, shape (n,)
        True where the sample's (possibly noisy) label equals its true label.
    selected : array_like of bool, shape (n,)
        True where the method selected the sample as clean.

    Returns
    -------
    SelectionScores
        precision = |selected and clean| / |selected|; recall = |selected and clean| / |clean|.
    """
    clean = _bool_vector("true_clean", true_clean)
    chosen = _bool_vector("selected", selected)
    _same_length("true_clean", clean, "selected", chosen)
    if clean.size == 0:
        raise MetricInputError("label_precision_recall needs at least one sample")
    precision, recall = _precision_recall(clean, chosen)
    return SelectionScores(precision=precision, recall=recall)


def _label_vectors(
    y_true: npt.ArrayLike, y_pred: npt.ArrayLike
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    t = np.asarray(y_true)
    p = np.asarray(y_pred)
    for name, arr in (("y_true", t), ("y_pred", p)):
        if arr.ndim != 1:
            raise MetricInputError(f"{name} must be 1-D, got shape {arr.shape}")
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise MetricInputError(f"{name} must hold integer class labels, got {arr.dtype}")
    _same_length("y_true", t, "y_pred", p)
    if t.size == 0:
        raise MetricInputError("accuracy needs at least one sample")
    return t.astype(np.int64), p.astype(np.int64)


def accuracy(y_true: npt.ArrayLike, y_pred: npt.ArrayLike) -> float:
    """Fraction of predictions equal to the true label."""
    t, p = _label_vectors(y_true, y_pred)
    return float(np.mean(t == p))


def class_recall(
    y_true: npt.ArrayLike, y_pred: npt.ArrayLike, num_classes: int
) -> list[float | None]:
    """Per class c in [0, num_classes): the fraction of the samples of class c predicted as c;
    None for a class absent from ``y_true``.

    Parameters
    ----------
    y_true, y_pred : array_like of int, shape (n,)
        True and predicted labels in [0, num_classes).
    num_classes : int
        Number of classes C (used to validate the labels).
    """
    t, p = _label_vectors(y_true, y_pred)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise MetricInputError(f"num_classes={num_classes!r} must be an int >= 1")
    for name, arr in (("y_true", t), ("y_pred", p)):
        if int(arr.min()) < 0 or int(arr.max()) >= num_classes:
            raise MetricInputError(f"{name} has labels outside [0, {num_classes})")
    return [
        float(np.mean(p[t == c] == c)) if bool(np.any(t == c)) else None for c in range(num_classes)
    ]


def balanced_accuracy(y_true: npt.ArrayLike, y_pred: npt.ArrayLike, num_classes: int) -> float:
    """Mean per-class recall over the classes present in ``y_true`` (:func:`class_recall`,
    whose parameters these are)."""
    recalls = [r for r in class_recall(y_true, y_pred, num_classes) if r is not None]
    return float(np.mean(recalls))


def summarise_curve(values: Sequence[float] | npt.ArrayLike) -> CurveSummary:
    """Best value and mean of the last ceil(10%) of a per-round curve.

    ``last10`` averages the last ceil(R / 10) values of an R-round curve (at least one), computed
    in integers as (R + 9) // 10 (no floating-point rounding involved).
    """
    arr = _finite_vector("values", values)
    if arr.size == 0:
        raise MetricInputError("summarise_curve needs at least one value")
    tail = (arr.size + 9) // 10
    return CurveSummary(best=float(arr.max()), last10=float(arr[-tail:].mean()))
