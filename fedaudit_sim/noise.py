"""Label-noise protocols for the simulator (the papers' client noise levels and
"Label flips").

Two steps, both reproducible from an explicit ``numpy.random.Generator`` (or int seed):

1. :func:`noise_levels` draws each client's *target* noise rate:

   - ``none``: every rate 0.
   - ``linear(lo, hi)`` (FedRN): rate_u = lo + u * (hi - lo) / K for client u = 0..K-1,
     so the last client gets just under ``hi`` (FedRN's "0.0-0.4" is 0.0 ... 0.396 with K = 100).
   - ``rho_tau(rho, tau, exact_count=True)`` (FedCorr, as FLR uses it): floor(rho * K) noisy clients
     drawn without replacement (FedNoRo's exact fraction), or with ``exact_count=False`` each client
     noisy with probability rho independently (FedCorr's own rule); noisy rates ~ U(tau, 1).
   - ``rho_range(rho, lo, hi)`` (FedNoRo): exactly floor(rho * K) noisy clients, rates
     ~ U(lo, hi).
   - ``bernoulli(p)`` (Fed-NCL): each client clean with probability p, else rate 1.0.
   - ``truncated_gaussian(mu, sigma)`` (Fed-NCL): N(mu, sigma^2) redrawn until it lies in [0, 1]
     (a truncated, not clipped, Gaussian; Fed-NCL's code neither truncates nor clips). No value
     sits exactly at 0 or 1 (a continuous draw hits them with probability 0).
   - ``clipped_gaussian(mu, sigma, lo=0, hi=1)``: N(mu, sigma^2) drawn once per client and clipped
     to [lo, hi]: a draw below ``lo`` becomes exactly ``lo``, one above ``hi`` exactly ``hi``, so
     the mass of the tails accumulates at the bounds (with lo = 0, a share of the clients is
     exactly clean) instead of being spread over the interval as truncation does.
   - ``uniform_all(eps)`` (RoFL): every client has rate eps.

   ``rho_tau``, ``rho_range`` and ``bernoulli`` also take ``noisy_clients=N`` instead of ``rho``
   (resp. ``p``): exactly N noisy clients, drawn without replacement from the seed (the same draw
   as floor(rho * K) = N would use); their rates as the protocol draws them (U(tau, 1),
   U(lo, hi), 1.0). N must lie in [0, K].

   Every count floor(r * n) in this module is taken as floor(r * n + 1e-9), so that a product
   such as 0.29 * 100 = 28.999999999999996 counts as 29, not 28.

2. :func:`flip_labels` flips one client's labels; :func:`inject_noise` applies it to every client
   of a partition and records, per client, the target rate, the realised rate (fraction of the
   client's labels that changed), the ground-truth noisy flag and the flipped mask. Flip types:

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

Ground-truth noisy flags come from the *realised* flips, never from the target rate alone: for
the two-group protocols (``none``, ``rho_tau``, ``rho_range``, ``bernoulli``, ``uniform_all``) a
client is noisy iff at least one of its labels changed (realised rate > 0); for the continuous ones
(``linear``, ``truncated_gaussian``, ``clipped_gaussian``) iff its realised rate is > 0 and >=
``threshold`` (default 0.1). A client with a positive target rate whose flips realise nothing (an
asymmetric class map whose source classes the client does not hold, or floor(rate * n) = 0) is
clean.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import KFold, StratifiedKFold
from threadpoolctl import threadpool_limits

from fedaudit_sim.partition import RngLike, as_generator

__all__ = [
    "CONTINUOUS_PROTOCOLS",
    "FLIP_TYPES",
    "NOISE_PROTOCOLS",
    "TWO_GROUP_PROTOCOLS",
    "InstanceProbabilities",
    "NoiseError",
    "NoiseReport",
    "flip_labels",
    "inject_noise",
    "instance_probabilities",
    "noise_levels",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

TWO_GROUP_PROTOCOLS: Final = frozenset({"none", "rho_tau", "rho_range", "bernoulli", "uniform_all"})
CONTINUOUS_PROTOCOLS: Final = frozenset({"linear", "truncated_gaussian", "clipped_gaussian"})
FLIP_TYPES: Final[tuple[str, ...]] = (
    "symmetric",
    "symmetric_any",
    "pairflip",
    "asymmetric",
    "instance",
)

_COUNT_EPS: Final = 1e-9
_MIN_TRUNCATION_MASS: Final = 1e-6
_MAX_REJECTION_ROUNDS: Final = 100_000


class NoiseError(ValueError):
    """A noise protocol or label flip was asked for with invalid arguments."""


def _floor_count(value: float) -> int:
    return int(math.floor(value + _COUNT_EPS))


def _check_rate(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
        raise NoiseError(f"{name}={value!r} must be a number in [0, 1]")
    if not 0.0 <= float(value) <= 1.0:
        raise NoiseError(f"{name}={value!r} must lie in [0, 1]")
    return float(value)


def _check_range(lo: float, hi: float) -> tuple[float, float]:
    lo_f, hi_f = _check_rate("lo", lo), _check_rate("hi", hi)
    if lo_f > hi_f:
        raise NoiseError(f"lo={lo} must not exceed hi={hi}")
    return lo_f, hi_f


# --------------------------------------------------------------------------------------------
# client noise levels


def _levels_none(k: int, gen: np.random.Generator) -> FloatArray:
    return np.zeros(k)


def _levels_linear(
    k: int, gen: np.random.Generator, *, lo: float = 0.0, hi: float = 0.4
) -> FloatArray:
    lo_f, hi_f = _check_range(lo, hi)
    return lo_f + np.arange(k, dtype=np.float64) * (hi_f - lo_f) / k


def _exact_subset(k: int, count: int, gen: np.random.Generator) -> IntArray:
    """``count`` of the ``k`` clients, drawn without replacement, in index order."""
    return np.sort(gen.permutation(k)[:count]).astype(np.int64)


def _check_count(k: int, noisy_clients: Any, rate_name: str, rate_given: bool) -> int:
    """Validate ``noisy_clients`` (an exact count of noisy clients) against ``k``."""
    if rate_given:
        raise NoiseError(f"give {rate_name} or noisy_clients, not both")
    if isinstance(noisy_clients, bool) or not isinstance(noisy_clients, int | np.integer):
        raise NoiseError(f"noisy_clients={noisy_clients!r} must be an int")
    if not 0 <= int(noisy_clients) <= k:
        raise NoiseError(f"noisy_clients={noisy_clients} must lie in [0, {k}] (the clients)")
    return int(noisy_clients)


def _noisy_subset(k: int, rho: float, gen: np.random.Generator, exact_count: bool) -> IntArray:
    if exact_count:
        return _exact_subset(k, _floor_count(rho * k), gen)
    return np.flatnonzero(gen.random(k) < rho).astype(np.int64)


def _levels_rho_tau(
    k: int,
    gen: np.random.Generator,
    *,
    rho: float | None = None,
    tau: float = 0.5,
    exact_count: bool = True,
    noisy_clients: int | None = None,
) -> FloatArray:
    tau_f = _check_rate("tau", tau)
    if not isinstance(exact_count, bool):
        raise NoiseError(f"exact_count={exact_count!r} must be a bool")
    if noisy_clients is not None:
        count = _check_count(k, noisy_clients, "rho", rho is not None)
        if not exact_count:
            raise NoiseError("noisy_clients is an exact count: it cannot go with exact_count=false")
        noisy = _exact_subset(k, count, gen)
    else:
        rho_f = _check_rate("rho", 0.4 if rho is None else rho)
        noisy = _noisy_subset(k, rho_f, gen, exact_count)
    rates = np.zeros(k)
    rates[noisy] = tau_f + (1.0 - tau_f) * gen.random(noisy.size)
    return rates


def _levels_rho_range(
    k: int,
    gen: np.random.Generator,
    *,
    rho: float | None = None,
    lo: float = 0.5,
    hi: float = 0.7,
    noisy_clients: int | None = None,
) -> FloatArray:
    lo_f, hi_f = _check_range(lo, hi)
    if noisy_clients is not None:
        noisy = _exact_subset(k, _check_count(k, noisy_clients, "rho", rho is not None), gen)
    else:
        rho_f = _check_rate("rho", 0.4 if rho is None else rho)
        noisy = _noisy_subset(k, rho_f, gen, exact_count=True)
    rates = np.zeros(k)
    rates[noisy] = gen.uniform(lo_f, hi_f, size=noisy.size)
    return rates


def _levels_bernoulli(
    k: int, gen: np.random.Generator, *, p: float | None = None, noisy_clients: int | None = None
) -> FloatArray:
    if noisy_clients is not None:
        noisy = _exact_subset(k, _check_count(k, noisy_clients, "p", p is not None), gen)
        rates = np.zeros(k)
        rates[noisy] = 1.0
        return rates
    p_f = _check_rate("p", 0.7 if p is None else p)
    clean = gen.random(k) < p_f
    return np.where(clean, 0.0, 1.0)


def _normal_cdf(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def _levels_truncated_gaussian(
    k: int, gen: np.random.Generator, *, mu: float = 0.3, sigma: float = 0.4
) -> FloatArray:
    if isinstance(mu, bool) or not math.isfinite(mu):
        raise NoiseError(f"mu={mu!r} must be a finite number")
    if isinstance(sigma, bool) or not math.isfinite(sigma) or sigma <= 0:
        raise NoiseError(f"sigma={sigma!r} must be a finite number > 0")
    mass = _normal_cdf((1.0 - mu) / sigma) - _normal_cdf((0.0 - mu) / sigma)
    if mass < _MIN_TRUNCATION_MASS:
        raise NoiseError(
            f"N(mu={mu}, sigma={sigma}) puts only {mass:.2e} of its mass in [0, 1]; redrawing "
            "until a value lands there would not finish"
        )
    rates = np.empty(k)
    todo = np.arange(k)
    for _ in range(_MAX_REJECTION_ROUNDS):
        if todo.size == 0:
            break
        draws = gen.normal(mu, sigma, size=todo.size)
        accepted = (draws >= 0.0) & (draws <= 1.0)
        rates[todo[accepted]] = draws[accepted]
        todo = todo[~accepted]
    else:  # pragma: no cover - needs an acceptance probability the guard above refuses
        raise NoiseError("truncated Gaussian rejection sampling did not finish")
    return rates


def _levels_clipped_gaussian(
    k: int,
    gen: np.random.Generator,
    *,
    mu: float = 0.3,
    sigma: float = 0.4,
    lo: float = 0.0,
    hi: float = 1.0,
) -> FloatArray:
    if isinstance(mu, bool) or not isinstance(mu, int | float) or not math.isfinite(mu):
        raise NoiseError(f"mu={mu!r} must be a finite number")
    if (
        isinstance(sigma, bool)
        or not isinstance(sigma, int | float)
        or not math.isfinite(sigma)
        or sigma <= 0
    ):
        raise NoiseError(f"sigma={sigma!r} must be a finite number > 0")
    lo_f, hi_f = _check_range(lo, hi)
    clipped: FloatArray = np.clip(gen.normal(mu, sigma, size=k), lo_f, hi_f)
    return clipped


def _levels_uniform_all(k: int, gen: np.random.Generator, *, eps: float = 0.2) -> FloatArray:
    return np.full(k, _check_rate("eps", eps))


_PROTOCOLS: Final[dict[str, tuple[Callable[..., FloatArray], frozenset[str]]]] = {
    "none": (_levels_none, frozenset()),
    "linear": (_levels_linear, frozenset({"lo", "hi"})),
    "rho_tau": (_levels_rho_tau, frozenset({"rho", "tau", "exact_count", "noisy_clients"})),
    "rho_range": (_levels_rho_range, frozenset({"rho", "lo", "hi", "noisy_clients"})),
    "bernoulli": (_levels_bernoulli, frozenset({"p", "noisy_clients"})),
    "truncated_gaussian": (_levels_truncated_gaussian, frozenset({"mu", "sigma"})),
    "clipped_gaussian": (_levels_clipped_gaussian, frozenset({"mu", "sigma", "lo", "hi"})),
    "uniform_all": (_levels_uniform_all, frozenset({"eps"})),
}
NOISE_PROTOCOLS: Final[tuple[str, ...]] = tuple(_PROTOCOLS)


def noise_levels(num_clients: int, protocol: str, rng: RngLike, **params: Any) -> FloatArray:
    """Draw each client's target noise rate.

    Parameters
    ----------
    num_clients : int
        Number of clients K >= 1.
    protocol : str
        One of :data:`NOISE_PROTOCOLS` (see the module docstring for each definition).
    rng : numpy.random.Generator or int
        Random source or seed.
    **params
        The protocol's parameters. Defaults are the papers' values: ``linear`` lo=0.0, hi=0.4
        (FedRN); ``rho_tau`` rho=0.4, tau=0.5, exact_count=True (FedCorr); ``rho_range`` rho=0.4,
        lo=0.5, hi=0.7 (FedNoRo); ``bernoulli`` p=0.7 and ``truncated_gaussian`` mu=0.3,
        sigma=0.4 (Fed-NCL); ``clipped_gaussian`` mu=0.3, sigma=0.4, lo=0.0,
        hi=1.0; ``uniform_all`` eps=0.2 (RoFL). ``noisy_clients=N`` replaces ``rho``
        (``rho_tau``, ``rho_range``) or ``p`` (``bernoulli``) by an exact count of noisy clients.

    Returns
    -------
    numpy.ndarray
        float64 rates in [0, 1], shape (K,).

    Raises
    ------
    NoiseError
        Unknown protocol or parameter, or an invalid value.
    """
    if protocol not in _PROTOCOLS:
        raise NoiseError(
            f"protocol={protocol!r} is not a noise protocol; choose one of "
            f"{', '.join(NOISE_PROTOCOLS)}"
        )
    if isinstance(num_clients, bool) or not isinstance(num_clients, int | np.integer):
        raise NoiseError(f"num_clients={num_clients!r} must be an int")
    if num_clients < 1:
        raise NoiseError(f"num_clients={num_clients} must be at least 1")
    func, allowed = _PROTOCOLS[protocol]
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise NoiseError(
            f"noise protocol {protocol!r} has no parameter(s) {unknown}; "
            f"it accepts {sorted(allowed) or 'none'}"
        )
    rates = func(int(num_clients), as_generator(rng), **params)
    return np.asarray(rates, dtype=np.float64)


# --------------------------------------------------------------------------------------------
# label flips


def _check_labels(labels: npt.ArrayLike, num_classes: int) -> IntArray:
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


def _check_instance_probs(probs: npt.ArrayLike | None, n: int, num_classes: int) -> FloatArray:
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
    y = _check_labels(labels, num_classes)
    r = _check_rate("rate", rate)
    if flip not in FLIP_TYPES:
        raise NoiseError(f"flip={flip!r} is not a flip type; choose one of {', '.join(FLIP_TYPES)}")
    gen = as_generator(rng)
    n = y.size
    noisy = y.copy()
    if flip == "asymmetric":
        mapping = _check_class_map(class_map, num_classes)
        for src in sorted(mapping):
            members = np.flatnonzero(y == src)
            chosen = gen.choice(members, size=_floor_count(r * members.size), replace=False)
            noisy[chosen] = mapping[src]
        return noisy, noisy != y

    count = _floor_count(r * n)
    if flip == "instance":
        probs = _check_instance_probs(instance_probs, n, num_classes)
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
    labels = _check_labels(y, num_classes)
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


# --------------------------------------------------------------------------------------------
# whole-federation injection


# eq=False: the fields hold numpy arrays, whose == is elementwise (no usable equality/hash).
@dataclass(frozen=True, eq=False)
class NoiseReport:
    """Noisy labels of a federation and the per-client ground truth.

    Attributes
    ----------
    noisy_labels : numpy.ndarray
        int64 (N,): the labels clients train on.
    flipped : numpy.ndarray
        bool (N,): True where the noisy label differs from the true one.
    target_rates : numpy.ndarray
        float64 (K,): the rates the protocol asked for.
    realised_rates : numpy.ndarray
        float64 (K,): fraction of each client's samples whose label changed.
    noisy_clients : numpy.ndarray
        bool (K,): ground-truth noisy flag, from the realised rates (rule in the module
        docstring).
    client_flipped : tuple of numpy.ndarray
        Per client, the flipped mask aligned with that client's index array.
    protocol, flip : str
        The client-level protocol and the flip type.
    threshold : float
        Realised-rate threshold used for the continuous protocols.
    notes : tuple of str
        Fallbacks taken (empty clients, non-converged instance models, ...).
    """

    noisy_labels: IntArray
    flipped: BoolArray
    target_rates: FloatArray
    realised_rates: FloatArray
    noisy_clients: BoolArray
    client_flipped: tuple[BoolArray, ...]
    protocol: str
    flip: str
    threshold: float
    notes: tuple[str, ...] = ()


def _check_partition(client_indices: Sequence[npt.ArrayLike], n: int) -> list[IntArray]:
    parts: list[IntArray] = []
    seen = np.zeros(n, dtype=bool)
    for k, idx in enumerate(client_indices):
        arr = np.asarray(idx)
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise NoiseError(f"client_indices[{k}] must be a 1-D integer array")
        arr = arr.astype(np.int64)
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= n):
            raise NoiseError(f"client_indices[{k}] has indices outside [0, {n})")
        if np.unique(arr).size != arr.size or np.any(seen[arr]):
            raise NoiseError(f"client_indices[{k}] repeats a sample: clients must be disjoint")
        seen[arr] = True
        parts.append(arr)
    return parts


def inject_noise(
    labels: npt.ArrayLike,
    client_indices: Sequence[npt.ArrayLike],
    levels: npt.ArrayLike,
    num_classes: int,
    flip: str,
    rng: RngLike,
    *,
    protocol: str,
    threshold: float = 0.1,
    class_map: Mapping[int, int] | None = None,
    instance_probs: npt.ArrayLike | None = None,
    x: npt.ArrayLike | None = None,
) -> NoiseReport:
    """Flip every client's labels at its target rate and record the ground truth.

    Parameters
    ----------
    labels : array_like of int, shape (N,)
        True labels of all samples.
    client_indices : sequence of array_like of int
        Disjoint sample indices of each client (a partition); samples of no client keep their
        labels.
    levels : array_like of float, shape (K,)
        Target rate of each client (from :func:`noise_levels`).
    num_classes : int
        Number of classes C.
    flip : str
        One of :data:`FLIP_TYPES`.
    rng : numpy.random.Generator or int
        Random source or seed. Clients are processed in index order; a client with rate 0 draws
        nothing.
    protocol : str
        The protocol that produced ``levels``; it decides the ground-truth rule (a realised rate
        > 0, and >= ``threshold`` for a continuous protocol).
    threshold : float
        Realised rate at and above which a client counts as noisy under a continuous protocol.
    class_map : mapping, optional
        For ``asymmetric``.
    instance_probs : array_like, shape (N, C), optional
        For ``instance``: per-sample class probabilities. When omitted, ``x`` must be given and
        :func:`instance_probabilities` is fitted on each noisy client's own clean data.
    x : array_like, shape (N, ...), optional
        Features, used only for ``instance`` without ``instance_probs``.

    Returns
    -------
    NoiseReport
    """
    y = _check_labels(labels, num_classes)
    parts = _check_partition(client_indices, y.size)
    rates = np.asarray(levels, dtype=np.float64)
    if rates.shape != (len(parts),):
        raise NoiseError(
            f"levels has shape {rates.shape}, expected ({len(parts)},): one per client"
        )
    if not np.all(np.isfinite(rates)) or np.any(rates < 0) or np.any(rates > 1):
        raise NoiseError("levels must be rates in [0, 1]")
    if protocol not in _PROTOCOLS:
        raise NoiseError(
            f"protocol={protocol!r} is not a noise protocol; choose one of "
            f"{', '.join(NOISE_PROTOCOLS)}"
        )
    thr = _check_rate("threshold", threshold)
    if flip not in FLIP_TYPES:
        raise NoiseError(f"flip={flip!r} is not a flip type; choose one of {', '.join(FLIP_TYPES)}")
    global_probs: FloatArray | None = None
    feats: npt.NDArray[Any] | None = None
    if flip == "instance":
        if instance_probs is not None:
            global_probs = _check_instance_probs(instance_probs, y.size, num_classes)
        elif x is not None:
            feats = np.asarray(x)
            if feats.shape[0] != y.size:
                raise NoiseError(f"x has {feats.shape[0]} rows, labels have {y.size}")
        else:
            raise NoiseError("flip='instance' needs instance_probs or x")
    gen = as_generator(rng)
    noisy = y.copy()
    realised = np.zeros(len(parts))
    client_flipped: list[BoolArray] = []
    notes: list[str] = []
    for k, idx in enumerate(parts):
        if idx.size == 0:
            notes.append(f"client {k} has no samples: realised rate reported as 0")
            client_flipped.append(np.zeros(0, dtype=bool))
            continue
        if rates[k] == 0.0:
            client_flipped.append(np.zeros(idx.size, dtype=bool))
            continue
        probs: FloatArray | None = None
        if flip == "instance":
            if global_probs is not None:
                probs = global_probs[idx]
            else:
                assert feats is not None  # checked above
                fitted = instance_probabilities(feats[idx], y[idx], num_classes, gen)
                probs = fitted.probs
                if not fitted.converged:
                    notes.append(f"client {k}: instance model did not converge (max_iter reached)")
                if fitted.note is not None:
                    notes.append(f"client {k}: {fitted.note}")
        client_noisy, mask = flip_labels(
            y[idx],
            float(rates[k]),
            num_classes,
            flip,
            gen,
            class_map=class_map,
            instance_probs=probs,
        )
        noisy[idx] = client_noisy
        realised[k] = float(mask.sum()) / idx.size
        client_flipped.append(mask)
    # The truth is what was realised (module docstring): a positive target rate that flipped
    # nothing leaves the client clean.
    noisy_clients = realised > 0
    if protocol not in TWO_GROUP_PROTOCOLS:
        # Tolerance so that a realised 3/30 counts as >= 0.1 whatever the float rounding.
        noisy_clients &= realised >= thr - 1e-12
    return NoiseReport(
        noisy_labels=noisy,
        flipped=noisy != y,
        target_rates=rates.copy(),
        realised_rates=realised,
        noisy_clients=noisy_clients,
        client_flipped=tuple(client_flipped),
        protocol=protocol,
        flip=flip,
        threshold=thr,
        notes=tuple(notes),
    )
