"""The class-level null model of the evidence detector, its per-site p-values and the flag rule.

Pure statistics over arrays, used by :class:`~service.audit.evidence.EvidenceDetector` (and the
accuracy evidence, :mod:`service.audit.accuracy_evidence`); the detector's module docstring says
how they combine into a verdict.

**Null model, class by class** (a random-effects meta-analysis model, DerSimonian and Laird,
"Meta-analysis in clinical trials", 1986, eq. 1): for the clean holders of class c,

    L[k, c] = mu_c + u_kc + e_kc,   u_kc ~ N(0, tau_c^2),   e_kc ~ N(0, sigma_c^2 / n[k, c]),

``sigma_c^2 / n[k, c]`` being the site's sampling variance: the pooled sample variance of the
holders' per-sample losses, or the site's own where larger (:func:`_within_variance`; without
``s``, 1 / n[k, c] times a scale fitted from the holders' spread, :func:`class_evidence`) and
``tau_c`` the between-site spread that real sites have even with clean
labels (other scanners, other patients). ``mu_c`` and ``tau_c`` are fitted **robustly**: ``mu_c``
is the weighted median, and ``tau_c^2`` the smallest value at which the median absolute
standardised residual reaches the normal's 0.6745 (the Paule-Mandel estimator, Paule and Mandel,
"Consensus values and weighting factors", 1982, with the median in place of the sum of squares), so
that a minority of noisy sites moves neither. The fit rests on the holders of ``min_fit_count``
samples or more (the evidence detector's ``min_class_count``, 5) where at least ``min_holders``
of them hold the class: a holder of one or two samples says nothing about ``tau_c`` (its
sampling variance is most of its spread) and its small standardised residual pulled the median
down; in six clean BreastMNIST sites of 1-376 samples (the fourth held-out draw's h4-08) the
holders of 1 and 2 malignant images made ``tau_c`` 0 where the four others put it at 0.25, and
a clean site holding 88 of the 168 malignant images got z 3.4 (2.0 with the rule;
``tests/audit/test_skewed_clean_sites.py``). The standardised excess is

    z[k, c] = (L[k, c] - mu_c) / sqrt(tau_c^2 + sigma_c^2 / n[k, c] + var(mu_c)),

about N(0, 1) for a clean site (``var(mu_c)`` is the median's sampling variance,
pi / 2 / sum_k w_kc with w the inverse variances).

**Per-site p-values** (:func:`site_p_values`, :func:`class_p_values`): Stouffer's combination of
a site's class z with weights sqrt(n[k, c]) (a class held fewer than ``min_class_count`` times
enters with its z capped at +-3, :data:`SMALL_CLASS_Z_CAP`), and the smallest per-class p times
the number of classes (Bonferroni).

**Flags**: Benjamini and Hochberg's step-up rule ("Controlling the false discovery rate", JRSS-B
1995, section 3), :func:`benjamini_hochberg`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr

from service.audit._typing import BoolArray, FloatArray, IntArray
from service.audit.pooling import POOL_CAP, RATE_CAP, pool_weights

__all__ = [
    "MAD_NORMAL",
    "SMALL_CLASS_Z_CAP",
    "ClassEvidence",
    "ClassNull",
    "benjamini_hochberg",
    "class_evidence",
    "class_p_values",
    "fit_class_null",
    "site_p_values",
    "weighted_median",
]


MAD_NORMAL = 0.6744897501960817
"""Median of |Z| for Z ~ N(0, 1): the target of the robust tau fit."""

MEDIAN_EFFICIENCY = math.pi / 2.0
"""Asymptotic variance of a normal sample's median over that of its mean."""

_TAU_BISECTIONS = 60


def weighted_median(values: FloatArray, weights: FloatArray) -> float:
    """The lower weighted median: the smallest value whose cumulative weight reaches half.

    Values of zero weight are left out (at least one weight must be positive). Ties in the
    cumulative weight at exactly one half take the midpoint of the two values, so that two equal
    weights give the ordinary median.
    """
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    order = np.argsort(values, kind="stable")
    return _sorted_weighted_median(values[order], weights[order])


def _sorted_weighted_median(v: FloatArray, w: FloatArray) -> float:
    """:func:`weighted_median` of values already in stable ascending order, weights positive."""
    cum = np.cumsum(w)
    half = 0.5 * cum[-1]
    i = int(np.searchsorted(cum, half, side="left"))
    if i + 1 < v.size and math.isclose(cum[i], half, rel_tol=1e-12, abs_tol=0.0):
        return float(0.5 * (v[i] + v[i + 1]))
    return float(v[i])


def _median_above(x: FloatArray, t: float) -> bool:
    """Whether ``np.median(x)`` (``x`` finite, 1-D, not empty) is above ``t``, by counting
    instead of partitioning: the bisection of :func:`fit_class_null` asks only that, some 60
    times a class. The same answer to the bit: where the two middle values straddle ``t``,
    their mean is computed as numpy computes it.

    >>> _median_above(np.array([3.0, 1.0, 2.0]), 1.9), _median_above(np.array([4.0, 1.0]), 2.5)
    (True, False)
    """
    n, half = x.size, x.size // 2
    above = int(np.count_nonzero(x > t))
    if n % 2:  # the median is the (half + 1)-th smallest: above t iff n - half values are
        return above >= n - half
    if above != n - half:  # both middle values on one side of t, and so is their mean
        return above > n - half
    low = float(np.max(x, where=x <= t, initial=-math.inf))  # the half-th smallest
    high = float(np.min(x, where=x > t, initial=math.inf))  # the (half + 1)-th
    return bool((low + high) / 2.0 > t)


@dataclass(frozen=True)
class ClassNull:
    """The fitted null of one class: centre, between-site variance, the centre's variance."""

    mu: float
    tau2: float
    var_mu: float
    """Sampling variance of the weighted median: pi / 2 / sum of the inverse variances."""


def fit_class_null(values: FloatArray, within: FloatArray) -> ClassNull:
    """Robust random-effects fit of one class (module docstring, "Null model").

    Parameters
    ----------
    values : ndarray of shape (m,)
        The holders' mean losses, m >= 1.
    within : ndarray of shape (m,)
        Each holder's sampling variance sigma^2 / n (> 0). Without the SDK's spreads the caller
        passes 1 / n and uses only the centre: :func:`class_evidence` then fits a common scale
        instead of ``tau2``.

    Returns
    -------
    ClassNull
        ``tau2`` is 0 when the within variances already explain the spread (median absolute
        standardised residual <= 0.6745).
    """

    # Sorted once: the bisection below changes the weights (all positive), not the values.
    order = np.argsort(values, kind="stable")
    values, within = values[order], within[order]

    def residuals(tau2: float) -> tuple[FloatArray, float, FloatArray]:
        w = 1.0 / (within + tau2)
        mu = _sorted_weighted_median(values, w)
        return np.abs(values - mu) * np.sqrt(w), mu, w

    res, mu, w = residuals(0.0)
    tau2 = 0.0
    if _median_above(res, MAD_NORMAL) and values.size >= 3:
        lo, hi = 0.0, float(np.square(values - np.median(values)).max()) / MAD_NORMAL**2 + 1e-300
        for _ in range(_TAU_BISECTIONS):
            mid = 0.5 * (lo + hi)
            if not lo < mid < hi:  # adjacent floats: the remaining steps change nothing
                break
            if _median_above(residuals(mid)[0], MAD_NORMAL):
                lo = mid
            else:
                hi = mid
        tau2 = hi
        _, mu, w = residuals(tau2)
    return ClassNull(mu=mu, tau2=tau2, var_mu=MEDIAN_EFFICIENCY / float(w.sum()))


@dataclass(frozen=True)
class ClassEvidence:
    """Per-site, per-class standardised excess and what produced it."""

    z: FloatArray
    """(K, C); NaN where the site does not hold the class or the class did not enter."""
    mu: FloatArray
    """(C,) fitted centres; NaN for a class that did not enter."""
    tau: FloatArray
    """(C,) fitted between-site spreads; NaN for a class that did not enter."""
    heterogeneity: FloatArray
    """(C,) I^2 = tau^2 / (tau^2 + median sampling variance of the holders); NaN likewise."""


def _within_variance(counts: IntArray, sd: FloatArray | None, held: BoolArray) -> FloatArray:
    """The sampling variance of L[k, c] per holder: max(s_kc^2, sigma_c^2) / n[k, c].

    sigma_c^2 is the pooled sample variance (ddof 1, weights n - 1) of every holder of the
    class: the mean of the variances, not their median, and each site's own variance (ddof 1)
    is used where it is larger (Welch's unequal-variance standard error, "The generalization of
    Student's problem when several different population variances are involved", Biometrika
    1947). The per-sample loss is very skewed (most samples near 0, a few hard ones at several
    nats), so a site's mean loss moves with how many hard samples it happens to hold, and so does
    its own variance; with the median site's variance, two clean sites of a six-site
    BreastMNIST federation holding three hard samples each instead of one got z of 4-5.
    Without reported spreads: 1 / n[k, c] (the scale is fitted by :func:`class_evidence`).
    In sigma_c^2 a holder's samples count up to :data:`~service.audit.pooling.POOL_CAP` times the
    median holder's and its variance up to POOL_CAP times the pooled variance of the other
    holders (:func:`_clip_to_the_others`): one site reporting a spread of 5 (or claiming 20,000
    samples) otherwise raised every site's standard error and hid a noisy site
    (``tests/audit/test_pooling.py``). Not the median holder's variance: the variances are as
    skewed as the losses (a site of one or two samples reports about 0), and capping at 4 times
    their median flagged clean sites in 18-33 of 36 rounds of the stress matrix's 50-site and
    one-class-per-site clean rows.
    """
    n = counts.astype(np.float64)
    if sd is None:
        return np.where(held, 1.0 / np.maximum(n, 1.0), np.nan)
    out = np.full(counts.shape, np.nan)
    for c in range(counts.shape[1]):
        rows = held[:, c]
        if not rows.any():
            continue
        nk = n[rows, c]
        var = np.square(np.minimum(sd[rows, c], _MAX_SPREAD))  # finite sums: no inf - inf
        own = var * nk / np.maximum(nk - 1.0, 1.0)
        dof_k = np.maximum(nk - 1.0, 0.0)
        w, w1 = pool_weights(nk), pool_weights(nk, factor=RATE_CAP)
        var = _clip_to_the_others(var, w1 * dof_k, w1 * var * nk)
        # correctly rounded sums (fsum): the same in any order of the sites
        dof = math.fsum((w * dof_k).tolist())  # tolist: fsum reads Python floats fastest
        pooled = math.fsum((w * var * nk).tolist()) / dof if dof > 0 else 0.0
        out[rows, c] = np.maximum(np.maximum(own, pooled), 1e-12) / nk
    return out


_MAX_SPREAD = 1e100
"""A reported per-sample spread enters the pooled variance as at most this (its square stays
finite in every sum); a site reporting more still gets an infinite standard error of its own."""


def _clip_to_the_others(var: FloatArray, dofs: FloatArray, squares: FloatArray) -> FloatArray:
    """Each holder's variance, at most POOL_CAP times the pooled variance of the other holders
    (their ``squares`` over their ``dofs``, each holder counted up to the median holder's
    samples: one site claiming many samples of spread 0 does not pull the reference down),
    where those rest on enough degrees of freedom: at
    least the holder's own or (holders - 1) times the median holder's. Otherwise it is not
    clipped: tiny holders report a variance of about 0, and one site of 14 samples among sites
    of 1 and 2 would be clipped to nothing (an independent review's counter-example).
    The others' sums leave out the largest term and add it back, so that one huge report does
    not cancel the others' digits; the sums are correctly rounded (fsum), so that the result
    does not depend on the order of the sites."""
    if var.size < 2:
        return var
    top = int(np.argmax(squares))
    rest_squares = math.fsum(np.delete(squares, top).tolist())
    others = np.where(
        np.arange(var.size) == top, rest_squares, rest_squares - squares + squares[top]
    )
    others_dof = math.fsum(dofs.tolist()) - dofs
    enough = others_dof >= np.minimum(dofs, (var.size - 1) * float(np.median(dofs)))
    enough &= others_dof > 0
    reference = np.maximum(others, 0.0) / np.where(enough, others_dof, 1.0)
    return np.where(enough, np.minimum(var, POOL_CAP * reference), var)


def class_evidence(
    per_class_loss: FloatArray,
    counts: IntArray,
    sd: FloatArray | None = None,
    *,
    min_holders: int = 3,
    exclude: BoolArray | None = None,
    reference: BoolArray | None = None,
    min_fit_count: int = 1,
) -> ClassEvidence:
    """z[k, c] for every site and held class (module docstring, "Null model").

    Parameters
    ----------
    per_class_loss, counts : ndarray of shape (K, C)
    sd : ndarray of shape (K, C), optional
        Reported per-sample spreads; None fits sigma_c from the sites' spread instead.
    min_holders : int
        A class enters when at least this many sites hold it (in the fit's reference set).
    exclude : ndarray of bool of shape (K,), optional
        Sites left out of the fits (their z is still computed); ignored for a class where fewer
        than ``min_holders`` would remain.
    reference : ndarray of bool of shape (K,), optional
        Anchor mode: each class's centre is the precision-weighted mean of these sites' losses
        (a class none of them holds does not enter), and tau_c is fitted among them when at least
        three hold the class, else taken as 0.
    min_fit_count : int, default=1
        Consensus mode: the fits rest on the holders of at least this many samples of the class
        where ``min_holders`` of them remain (module docstring); every holder still gets its z.
    """
    k, c_count = per_class_loss.shape
    held = counts > 0
    within = _within_variance(counts, sd, held)
    z = np.full((k, c_count), np.nan)
    mu_out = np.full(c_count, np.nan)
    tau_out = np.full(c_count, np.nan)
    i2_out = np.full(c_count, np.nan)
    for c in range(c_count):
        rows = held[:, c]
        if reference is not None:
            ref = rows & reference
            if not ref.any():
                continue
            if int(ref.sum()) >= 3:
                fit = fit_class_null(per_class_loss[ref, c], within[ref, c])
                tau2 = fit.tau2
            else:
                tau2 = 0.0
            w = 1.0 / (within[ref, c] + tau2)
            mu = float((w * per_class_loss[ref, c]).sum() / w.sum())
            var_mu = 1.0 / float(w.sum())
            variance = within[rows, c] + tau2 + var_mu
        else:
            fit_rows = rows if exclude is None else rows & ~exclude
            informative = fit_rows & (counts[:, c] >= min_fit_count)
            if int(informative.sum()) >= min_holders:
                fit_rows = informative
            elif int(fit_rows.sum()) < min_holders:
                fit_rows = rows
            if int(fit_rows.sum()) < min_holders:
                continue
            fit = fit_class_null(per_class_loss[fit_rows, c], within[fit_rows, c])
            mu, tau2, var_mu = fit.mu, fit.tau2, fit.var_mu
            variance = within[rows, c] + tau2 + var_mu
        if sd is None and reference is None:
            # No reported spreads: 1 / n carries the shape of the variance only; its scale is the
            # robust spread of sqrt(n) * (L - mu) over the holders.
            resid = (per_class_loss[rows, c] - mu) / np.sqrt(within[rows, c])
            scale2 = float(np.median(np.abs(resid)) / MAD_NORMAL) ** 2
            if scale2 <= 0.0:
                continue
            variance = within[rows, c] * scale2 + var_mu * scale2
            tau2 = 0.0
        z[rows, c] = (per_class_loss[rows, c] - mu) / np.sqrt(variance)
        mu_out[c] = mu
        tau_out[c] = math.sqrt(tau2)
        i2_out[c] = tau2 / (tau2 + float(np.median(within[rows, c])))
    return ClassEvidence(z=z, mu=mu_out, tau=tau_out, heterogeneity=i2_out)


SMALL_CLASS_Z_CAP = 3.0
"""Largest |z| a class held fewer than ``min_class_count`` times brings into Stouffer's part.

The normal tail is wrong for the mean of a handful of samples of a very skewed loss: on clean
digit federations one hard sample of a class a site held once gave that class z = 10-30 (a
normal p of 1e-23 to 1e-197, where one hard sample among a few is a matter of a few percent)
and flagged the site through Stouffer. Capping such a class at 3 keeps the normal in the bulk,
where it is fair (P(Z > 3) = 0.13 %), and refuses to trust its extreme tail. Cantelli's
distribution-free bound was tried first and dropped: it turns a z of 1.5-3 into 0.6-1.3, and a
small site whose every class is a little noisy (29 samples over 10 classes, 50-70 % wrong) was
then never flagged."""


def site_p_values(
    z: FloatArray, counts: IntArray, direction: float = 1.0, min_class_count: int = 1
) -> tuple[FloatArray, FloatArray]:
    """One-sided p-value and Stouffer statistic per site.

    How they enter a verdict: :mod:`service.audit.evidence`, "One p-value per site".

    Parameters
    ----------
    z : ndarray of shape (K, C)
        NaN where the class does not count for the site.
    counts : ndarray of shape (K, C)
        Stouffer's weights are sqrt(counts).
    direction : {1.0, -1.0}
        1: evidence of a *higher* loss than the null; -1: of a lower one.
    min_class_count : int, default=1
        A class enters the per-class (Bonferroni) part only where the site holds at least this
        many samples of it. Every class enters Stouffer's part, a class with fewer samples with
        its z capped at +-``SMALL_CLASS_Z_CAP`` (3).

    Returns
    -------
    p : ndarray of shape (K,)
        1.0 for a site with no class that counts.
    stouffer : ndarray of shape (K,)
        Signed Stouffer statistic (in the direction given); 0.0 for such a site.
    """
    valid = np.isfinite(z)
    zd = np.where(valid, direction * z, 0.0)
    few = valid & (counts < min_class_count)
    zs = np.where(few, np.clip(zd, -SMALL_CLASS_Z_CAP, SMALL_CLASS_Z_CAP), zd)
    w = np.where(valid, np.sqrt(counts.astype(np.float64)), 0.0)
    norm = np.sqrt(np.square(w).sum(axis=1))
    stouffer = np.divide((w * zs).sum(axis=1), norm, out=np.zeros(z.shape[0]), where=norm > 0)
    p_stouffer = ndtr(-stouffer)
    m = valid.sum(axis=1)
    p_min = class_p_values(z, counts, direction, min_class_count)
    p = np.minimum(1.0, 2.0 * np.minimum(p_stouffer, p_min))
    p = np.where(m > 0, p, 1.0)
    return np.asarray(p, dtype=np.float64), np.asarray(stouffer, dtype=np.float64)


def class_p_values(
    z: FloatArray, counts: IntArray, direction: float = 1.0, min_class_count: int = 1
) -> FloatArray:
    """Per site, the Bonferroni part of the class evidence: the smallest one-sided normal p of
    the classes it holds at least ``min_class_count`` samples of, times their number (at most 1;
    1.0 for a site with no such class)."""
    valid = np.isfinite(z)
    single = valid & (counts >= min_class_count)
    per_class_p = np.where(single, ndtr(-np.where(valid, direction * z, 0.0)), 1.0)
    p_min = np.minimum(1.0, per_class_p.min(axis=1) * np.maximum(single.sum(axis=1), 1))
    return np.asarray(p_min, dtype=np.float64)


def benjamini_hochberg(p_values: FloatArray, q: float) -> tuple[BoolArray, FloatArray]:
    """Benjamini-Hochberg step-up rule at level q (1995, section 3).

    Returns the rejections and the adjusted p-values (q-values): reject i iff q_i <= q.
    """
    p = np.asarray(p_values, dtype=np.float64)
    m = p.size
    if m == 0:
        return np.zeros(0, dtype=bool), np.zeros(0)
    order = np.argsort(p, kind="stable")
    ranked = p[order] * m / np.arange(1, m + 1)
    adjusted_sorted = np.minimum.accumulate(ranked[::-1])[::-1]
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(adjusted_sorted, 1.0)
    return adjusted <= q, adjusted
