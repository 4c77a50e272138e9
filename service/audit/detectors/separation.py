"""Statistics of FedNoRo's separation guard (beyond the paper; docs/algorithms.md, "Detectors").

The guard of :class:`~service.audit.detectors.fednoro.FedNoRoDetector` (step 5) asks whether
the mixture's noisy group is separated from the others:

* :func:`ashman_d` -- Ashman's D between two groups (Ashman, Bird and Zepf, 1994);
* :func:`null_separation_threshold` -- the quantile of D for a split of one normal population
  (a parametric bootstrap), below which a clean federation produces D by chance;
* :func:`class_standardised_excess` -- the class-standardised loss excess the guard computes D
  on by default (each client's loss over the federation's, class by class, in standard errors,
  combined with Stouffer's weights), instead of the unnormalised per-client mean loss of the
  plain guard.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from service.audit._typing import FloatArray, IntArray
from service.audit._validation import check_float, check_int
from service.audit.detection import RANGE_EPS

__all__ = [
    "MIN_CLASS_HOLDERS",
    "ashman_d",
    "class_standardised_excess",
    "null_draws",
    "null_separation_threshold",
]

MIN_CLASS_HOLDERS = 3
"""A class enters :func:`class_standardised_excess` only when at least this many clients hold it
(two values give no usable spread estimate)."""


def ashman_d(group_a: FloatArray, group_b: FloatArray) -> float | None:
    """Ashman's D between two groups of values.

    D = sqrt(2) * |m_a - m_b| / sqrt(s_a^2 + s_b^2) with population standard deviations
    (ddof 0, so a one-member group has spread 0 instead of an undefined one).

    Parameters
    ----------
    group_a, group_b : ndarray of shape (n_a,), (n_b,)
        The values of each group.

    Returns
    -------
    float or None
        None when a group is empty (no split). ``inf`` when both spreads are 0 and the means
        differ; 0.0 when both spreads are 0 and the means are equal.

    References
    ----------
    Ashman, Bird and Zepf (1994), "Detecting bimodality in astronomical datasets".
    """
    a = np.asarray(group_a, dtype=np.float64)
    b = np.asarray(group_b, dtype=np.float64)
    if a.size == 0 or b.size == 0:
        return None
    gap = abs(float(a.mean()) - float(b.mean()))
    spread = float(a.var()) + float(b.var())
    if spread == 0.0:
        return 0.0 if gap == 0.0 else math.inf
    return math.sqrt(2.0) * gap / math.sqrt(spread)


NULL_DRAWS = 100_000
"""Most draws of the parametric bootstrap behind :func:`null_separation_threshold` (small
federations, where D's null distribution has a long tail and its 99th percentile needs many)."""

NULL_VALUES = 10_000_000
"""Budget of normal values per threshold: ``NULL_VALUES // n_clients`` draws, between
``NULL_DRAWS_MIN`` and ``NULL_DRAWS`` (D is concentrated for large federations, so fewer draws
give the same precision there)."""

NULL_DRAWS_MIN = 2000
"""Fewest draws (federations of 5,000 clients and more)."""


def null_draws(n_clients: int) -> int:
    """How many federations of ``n_clients`` :func:`null_separation_threshold` simulates."""
    return max(NULL_DRAWS_MIN, min(NULL_DRAWS, NULL_VALUES // max(n_clients, 1)))


@functools.lru_cache(maxsize=512)
def null_separation_threshold(
    n_clients: int, n_flagged: int, quantile: float = 0.99, random_state: int = 0
) -> float:
    """The ``quantile`` of Ashman's D for a split of one normal population.

    Draws ``n_clients`` values from N(0, 1) (:func:`null_draws` times: 100,000 for up to 100
    clients; seeded, so the answer is deterministic) and computes D (population spreads, as
    :func:`ashman_d`) between the ``n_flagged`` largest values and the others: the most
    separated split of that size a single population offers. A D below this quantile is what a
    federation with no noisy client produces by chance when its mixture happens to split along
    the statistic (D is scale-free, so N(0, 1) stands for any normal population).

    Parameters
    ----------
    n_clients : int
        Clients in the federation (>= 2).
    n_flagged : int
        Size of the flagged group (1 .. n_clients - 1).
    quantile : float, default=0.99
        In (0, 1).
    random_state : int, default=0

    Returns
    -------
    float
        E.g. 7.1 for a single client among 10, 5.2 for 4 of 10, 5.8 for 1 of 20, 4.0 for 8 of
        20. The Monte Carlo error is about 1 % for up to 100 clients (it was up to 11 % with the
        2,000 draws used before: 6.3 instead of 7.1 for 1 of 10).
    """
    k = check_int("n_clients", n_clients, min_value=2)
    n = check_int("n_flagged", n_flagged, min_value=1, max_value=k - 1)
    q = check_float("quantile", quantile, min_value=0.0, max_value=1.0)
    rng = np.random.default_rng(random_state)
    draws = null_draws(k)
    # Blocks of draws keep memory near 16 MB even for 10,000 clients.
    block = max(1, 2_000_000 // k)
    values: list[FloatArray] = []
    for start in range(0, draws, block):
        rows = min(block, draws - start)
        x = rng.standard_normal((rows, k))
        top = np.partition(x, k - n, axis=1)[:, k - n :]
        total, total_sq = x.sum(axis=1), np.square(x).sum(axis=1)
        top_sum, top_sq = top.sum(axis=1), np.square(top).sum(axis=1)
        m_top, m_rest = top_sum / n, (total - top_sum) / (k - n)
        v_top = np.maximum(top_sq / n - m_top**2, 0.0)
        v_rest = np.maximum((total_sq - top_sq) / (k - n) - m_rest**2, 0.0)
        values.append(np.sqrt(2.0) * np.abs(m_top - m_rest) / np.sqrt(v_top + v_rest))
    return float(np.quantile(np.concatenate(values), q))


def class_standardised_excess(
    per_class_loss: FloatArray,
    class_counts: IntArray,
    min_holders: int = MIN_CLASS_HOLDERS,
    clip: float | None = None,
) -> tuple[FloatArray, IntArray]:
    """Each client's loss excess over the federation, class by class, in standard errors.

    For every class c held (count > 0) by at least ``min_holders`` clients:

    * mu_c = sum_k n_kc L_kc / sum_k n_kc, the federation's mean loss on class c;
    * sigma_c^2 = mean over the holders of n_kc (L_kc - mu_c)^2, the per-sample spread implied
      by the clients' class means (Var(L_kc) = sigma_c^2 / n_kc when all clients are alike);
    * z_kc = sqrt(n_kc) (L_kc - mu_c) / sigma_c.

    A client's statistic combines its classes with Stouffer's weights sqrt(n_kc):
    Z_k = sum_c sqrt(n_kc) z_kc / sqrt(sum_c n_kc), the sum over the classes that entered. When
    no client is noisy, each z_kc and so each Z_k is roughly standard normal *whatever the
    client's class mix and size*; the mean loss is not: under label skew it is high for a client
    holding hard classes and low for one holding easy classes.

    Parameters
    ----------
    per_class_loss : ndarray of shape (n_clients, n_classes)
        Mean loss per client and class; ignored (may be NaN) where the count is 0.
    class_counts : ndarray of int of shape (n_clients, n_classes)
    min_holders : int, default=3
    clip : float or None, default=None
        Clip each z_kc to [-clip, clip] before combining (bounds one class's influence); None,
        the detector's setting, clips nothing. Used by ``docs/eval/guard_whatif.py``.

    Returns
    -------
    excess : ndarray of shape (n_clients,)
        Z_k; 0.0 for a client none of whose classes entered (no evidence either way).
    classes : ndarray of int
        The classes that entered (held by ``min_holders`` or more clients with sigma_c > 0).
    """
    n_clients, n_classes = per_class_loss.shape
    numerator = np.zeros(n_clients)
    weight = np.zeros(n_clients)
    used: list[int] = []
    for c in range(n_classes):
        held = class_counts[:, c] > 0
        if int(held.sum()) < min_holders:
            continue
        n = class_counts[held, c].astype(np.float64)
        values = per_class_loss[held, c]
        mu = float((n * values).sum() / n.sum())
        sigma = math.sqrt(float((n * np.square(values - mu)).mean()))
        if sigma <= RANGE_EPS:
            continue
        z = np.sqrt(n) * (values - mu) / sigma
        if clip is not None:
            z = np.clip(z, -clip, clip)
        numerator[held] += np.sqrt(n) * z
        weight[held] += n
        used.append(c)
    excess = np.divide(numerator, np.sqrt(weight), out=np.zeros(n_clients), where=weight > 0)
    return excess, np.asarray(used, dtype=np.int64)
