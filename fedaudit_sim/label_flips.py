"""Label flips for the simulator: one client's labels flipped at a rate, and the
instance-dependent probabilities that the ``instance`` flip draws from.

:func:`flip_labels` flips one client's labels (``fedaudit_sim.noise.inject_noise`` applies it to
every client of a partition), reproducibly from an explicit ``numpy.random.Generator`` (or int
seed). Flip types:


- ``symmetric``: exactly floor(rate * n) samples chosen without replacement, each moved to a
  uniformly drawn *other* class, so the realised rate is that count / n (the references that
  may keep the true label realise only about rate * (C - 1) / C).
- ``symmetric_any`` (Fed-NCL's and FedCorr's code): exactly floor(rate * n) samples chosen
  without replacement, each given a label drawn uniformly from *all* C classes, so about one in
  C keeps its true label and the realised rate is about rate * (C - 1) / C (half the rate for
  C = 2, where ``symmetric`` inverts every chosen label).
- ``pairflip`` (RoFL): exactly floor(rate * n) samples, c -> (c + 1) mod C.
- ``asymmetric``: a class map {source: target}; in each mapped class c, exactly
  floor(rate * n_c) samples move to map[c]; classes outside the map never flip, so the realised
  rate over the client is lower than ``rate``, and is what the report records.
- ``instance`` (FedNoRo's H-IDN): exactly floor(rate * n) samples drawn without replacement with
  probability proportional to 1 - p(true class); each moves to a class drawn from its
  other-class probabilities, renormalised. FedNoRo's probabilities come from a trained DNN; ours
  come from :func:`instance_probabilities`, a logistic regression cross-validated on the
  client's clean data (out-of-fold, so a sample's probability never comes from a model that saw
  it).

Counts are taken as ``fedaudit_sim.noise_protocols.floor_count`` takes them (floor(r * n + 1e-9)).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import KFold, StratifiedKFold
from threadpoolctl import threadpool_limits

from fedaudit_sim.noise_protocols import NoiseError, check_rate, floor_count
from fedaudit_sim.partition import RngLike, as_generator

__all__ = [
    "FLIP_TYPES",
    "InstanceProbabilities",
    "flip_labels",
    "instance_probabilities",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

FLIP_TYPES: Final[tuple[str, ...]] = (
    "symmetric",
    "symmetric_any",
    "pairflip",
    "asymmetric",
    "instance",
)


def check_labels(labels: npt.ArrayLike, num_classes: int) -> IntArray:
    """``labels`` as int64, or a :class:`NoiseError` unless they are 1-D integers in [0, C)."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int | np.integer):
        raise NoiseError(f"num_classes={num_classes!r} must be an int")
    if num_classes < 1:
        raise NoiseError(f"num_classes={num_classes} must be at least 1")
    y = np.asarray(labels)
    if y.ndim != 1:
        raise NoiseError(f"labels must be 1-D, got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise NoiseError(f"labels must have an integer dtype, got {y.dtype}")
    if y.size and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise NoiseError(f"labels must lie in [0, num_classes={num_classes})")
    return y.astype(np.int64)


def _check_class_map(class_map: Mapping[int, int] | None, num_classes: int) -> dict[int, int]:
    """The asymmetric flip's {source: target} map, checked: non-empty, in range, no identity."""
    if class_map is None or len(class_map) == 0:
        raise NoiseError("flip='asymmetric' needs a non-empty class_map {source: target}")
    checked: dict[int, int] = {}
    for src, dst in class_map.items():
        s, d = int(src), int(dst)
        if not (0 <= s < num_classes and 0 <= d < num_classes):
            raise NoiseError(f"class_map entry {src}->{dst} is outside [0, {num_classes})")
        if s == d:
            raise NoiseError(f"class_map entry {src}->{dst} maps a class to itself")
        checked[s] = d
    return checked


def check_instance_probs(probs: npt.ArrayLike | None, n: int, num_classes: int) -> FloatArray:
    """Per-sample class probabilities (n, C), checked and with every row renormalised."""
    if probs is None:
        raise NoiseError(
            "flip='instance' needs instance_probs, per-sample class probabilities (n, C); "
            "compute them with instance_probabilities()"
        )
    p = np.asarray(probs, dtype=np.float64)
    if p.shape != (n, num_classes):
        raise NoiseError(f"instance_probs has shape {p.shape}, expected {(n, num_classes)}")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise NoiseError("instance_probs must be finite and non-negative")
    sums = p.sum(axis=1, keepdims=True)
    if np.any(sums <= 0):
        raise NoiseError("every row of instance_probs must have a positive sum")
    normalised: FloatArray = p / sums
    return normalised


def _draw_rows(weights: FloatArray, gen: np.random.Generator) -> IntArray:
    """Draw one column per row with probability proportional to the row's weights.

    A column with zero weight is never drawn: the first cumulative sum strictly above u * total
    always sits at a column with a positive increment.
    """
    cum = np.cumsum(weights, axis=1)
    u = gen.random(weights.shape[0]) * cum[:, -1]
    drawn: IntArray = np.argmax(cum > u[:, None], axis=1).astype(np.int64)
    return drawn


def _flip_instance(
    y: IntArray, count: int, probs: FloatArray, gen: np.random.Generator
) -> IntArray:
    """The ``instance`` flip: ``count`` samples drawn by hardness, each moved to an other class
    drawn from its probabilities (module docstring)."""
    n = y.size
    p_true = probs[np.arange(n), y]
    hardness = np.clip(1.0 - p_true, 0.0, None)
    positive = np.flatnonzero(hardness > 0)
    if positive.size >= count:
        chosen = gen.choice(n, size=count, replace=False, p=hardness / hardness.sum())
    else:
        # Fewer samples than needed have any other-class mass (a model certain of every label):
        # take all of those, then the rest uniformly, so the count stays exact.
        rest = np.setdiff1d(np.arange(n), positive)
        chosen = np.concatenate(
            [positive, gen.choice(rest, size=count - positive.size, replace=False)]
        )
    other = probs[chosen].copy()
    other[np.arange(chosen.size), y[chosen]] = 0.0
    # No other-class mass at all: fall back to a uniform other class (symmetric noise).
    empty = other.sum(axis=1) <= 0
    other[empty] = 1.0
    other[np.flatnonzero(empty), y[chosen][empty]] = 0.0
    noisy = y.copy()
    noisy[chosen] = _draw_rows(other, gen)
    return noisy


def flip_labels(
    labels: npt.ArrayLike,
    rate: float,
    num_classes: int,
    flip: str,
    rng: RngLike,
    *,
    class_map: Mapping[int, int] | None = None,
    instance_probs: npt.ArrayLike | None = None,
) -> tuple[IntArray, BoolArray]:
    """Flip one client's labels with the given noise type and rate.

    Parameters
    ----------
    labels : array_like of int, shape (n,)
        The client's true labels in [0, num_classes).
    rate : float
        Target noise rate in [0, 1].
    num_classes : int
        Number of classes C; a flip needs C >= 2.
    flip : str
        One of :data:`FLIP_TYPES` (definitions in the module docstring).
    rng : numpy.random.Generator or int
        Random source or seed.
    class_map : mapping of int to int, optional
        Required for ``asymmetric``: {source class: target class}, no class mapped to itself.
    instance_probs : array_like, shape (n, C), optional
        Required for ``instance``: per-sample class probabilities (rows are renormalised).

    Returns
    -------
    noisy_labels : numpy.ndarray
        int64 copy of ``labels`` with the flips applied.
    flipped : numpy.ndarray
        bool mask, True where the label changed. Every chosen sample changes, so for
        ``symmetric``, ``pairflip`` and ``instance`` exactly floor(rate * n) entries are True;
        for ``symmetric_any`` at most that many (a chosen sample may draw its own label).

    Raises
    ------
    NoiseError
        Invalid type, rate, labels, class map or probabilities.
    """
    y = check_labels(labels, num_classes)
    r = check_rate("rate", rate)
    if flip not in FLIP_TYPES:
        raise NoiseError(f"flip={flip!r} is not a flip type; choose one of {', '.join(FLIP_TYPES)}")
    gen = as_generator(rng)
    n = y.size
    noisy = y.copy()
    if flip == "asymmetric":
        mapping = _check_class_map(class_map, num_classes)
        for src in sorted(mapping):
            members = np.flatnonzero(y == src)
            chosen = gen.choice(members, size=floor_count(r * members.size), replace=False)
            noisy[chosen] = mapping[src]
        return noisy, noisy != y

    count = floor_count(r * n)
    if flip == "instance":
        probs = check_instance_probs(instance_probs, n, num_classes)
        if count == 0:
            return noisy, np.zeros(n, dtype=bool)
        if num_classes < 2:
            raise NoiseError("flipping a label needs num_classes >= 2")
        noisy = _flip_instance(y, count, probs, gen)
        return noisy, noisy != y
    if count == 0:
        return noisy, np.zeros(n, dtype=bool)
    if num_classes < 2:
        raise NoiseError("flipping a label needs num_classes >= 2")
    chosen = gen.choice(n, size=count, replace=False)
    if flip == "symmetric":
        # An offset in 1..C-1 added mod C is a uniform draw among the C-1 other classes.
        noisy[chosen] = (y[chosen] + gen.integers(1, num_classes, size=count)) % num_classes
    elif flip == "symmetric_any":
        noisy[chosen] = gen.integers(0, num_classes, size=count)
    else:  # pairflip
        noisy[chosen] = (y[chosen] + 1) % num_classes
    return noisy, noisy != y


# --------------------------------------------------------------------------------------------
# instance-dependent probabilities


# eq=False: the fields hold numpy arrays, whose == is elementwise (no usable equality/hash).
@dataclass(frozen=True, eq=False)
class InstanceProbabilities:
    """Out-of-fold class probabilities for instance-dependent noise.

    Attributes
    ----------
    probs : numpy.ndarray
        float64 (n, C); row i comes from a model that did not see sample i. Columns of classes
        missing from a training fold are 0.
    converged : bool
        False when some logistic-regression fit stopped at ``max_iter`` (ConvergenceWarning caught);
        its probabilities are still used.
    n_folds : int
        Cross-validation folds used (0 when the labels hold a single class).
    note : str or None
        Why a fallback was taken (single class, too few samples per class for stratification).
    """

    probs: FloatArray
    converged: bool
    n_folds: int
    note: str | None = None


def instance_probabilities(
    x: npt.ArrayLike,
    y: npt.ArrayLike,
    num_classes: int,
    rng: RngLike,
    *,
    max_folds: int = 5,
    regularization: float = 1.0,
    max_iter: int = 500,
) -> InstanceProbabilities:
    """Cross-validated class probabilities of a logistic regression on one client's clean data.

    The stand-in for FedNoRo's DNN soft labels: a multinomial ``LogisticRegression`` (lbfgs,
    inverse regularisation ``regularization``) on the flattened features, evaluated out of fold.
    Folds: stratified, ``min(max_folds, smallest class count)``; when a class has one sample,
    plain shuffled K-fold with ``min(max_folds, n)`` folds (a fold whose training part holds one
    class predicts that class with probability 1).

    Parameters
    ----------
    x : array_like, shape (n, ...)
        Features (flattened to (n, d)).
    y : array_like of int, shape (n,)
        Clean labels in [0, num_classes).
    num_classes : int
        Number of classes C (the width of the output).
    rng : numpy.random.Generator or int
        Random source or seed (used for the fold shuffling).
    max_folds : int
        Upper bound on the number of folds, >= 2.
    regularization : float
        Inverse regularisation strength ``C`` of the logistic regression.
    max_iter : int
        lbfgs iteration cap.

    Returns
    -------
    InstanceProbabilities
    """
    labels = check_labels(y, num_classes)
    feats = np.asarray(x, dtype=np.float64)
    n = labels.size
    if n == 0 or feats.shape[0] != n:
        raise NoiseError(
            f"x has {feats.shape[0] if feats.ndim else 0} rows, y has {n}; need n >= 1"
        )
    if isinstance(max_folds, bool) or not isinstance(max_folds, int) or max_folds < 2:
        raise NoiseError(f"max_folds={max_folds!r} must be an int >= 2")
    feats = feats.reshape(n, -1)
    gen = as_generator(rng)
    probs = np.zeros((n, num_classes))
    present, counts = np.unique(labels, return_counts=True)
    if present.size == 1:
        probs[:, present[0]] = 1.0
        return InstanceProbabilities(probs, True, 0, "single class: probabilities are one-hot")
    seed = int(gen.integers(2**31 - 1))
    note = None
    n_folds = min(max_folds, int(counts.min()))
    splitter: StratifiedKFold | KFold
    if n_folds >= 2:
        splitter = StratifiedKFold(n_splits=n_folds, shuffle=True, random_state=seed)
    else:
        n_folds = min(max_folds, n)
        splitter = KFold(n_splits=n_folds, shuffle=True, random_state=seed)
        note = "a class has one sample: unstratified folds"
    # These fits are tiny (a client's few hundred samples): multi-threaded BLAS/OpenMP only adds
    # contention, measured 10-20x slower on a loaded 2-core machine than one thread.
    with threadpool_limits(limits=1):
        converged = _fit_out_of_fold(feats, labels, splitter, probs, regularization, max_iter)
    return InstanceProbabilities(probs, converged, n_folds, note)


def _fit_out_of_fold(
    feats: FloatArray,
    labels: IntArray,
    splitter: StratifiedKFold | KFold,
    probs: FloatArray,
    regularization: float,
    max_iter: int,
) -> bool:
    """Fill ``probs`` (in place) fold by fold; return False if a fit did not converge."""
    converged = True
    for train, test in splitter.split(feats, labels):
        train_classes = np.unique(labels[train])
        if train_classes.size == 1:
            probs[test, train_classes[0]] = 1.0
            continue
        model = LogisticRegression(C=regularization, max_iter=max_iter)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            model.fit(feats[train], labels[train])
        for item in caught:
            if issubclass(item.category, ConvergenceWarning):
                converged = False
            else:
                warnings.warn_explicit(item.message, item.category, item.filename, item.lineno)
        probs[np.ix_(test, model.classes_)] = model.predict_proba(feats[test])
    return converged
