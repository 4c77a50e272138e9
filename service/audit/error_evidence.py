"""Evidence from the global model's errors on each site's own labels: counts, not loss sizes.

The per-class loss evidence (:mod:`service.audit.evidence`) compares mean losses. A wrong label
costs the global model several nats, but so does one hard sample of a clean site, and the mean
of a handful of very skewed losses is far from normal: the loss evidence must therefore take a
site's own spread where it is larger (Welch's standard error), and that spread is large exactly
where labels are wrong. Its power is then bounded by about sqrt(n r / (1 - r)) per class for a
fraction r of wrong labels among n samples, however wrong they are (measured on 20 digit sites with
10-30 % symmetric noise: a site whose mean loss was 2.0 against a consensus of 0.15 reached a
Stouffer z of 3.5 only).

This module counts instead. With the per-class loss the SDK sends ``per_class_errors``: of the
site's ``n[k, c]`` samples labelled c, the number ``e[k, c]`` the global model (the model received
this round, before local training) assigns to another class (argmax). A wrong label the model has
learned to contradict is one error, and so is a clean site's hard sample; each counts once,
whatever its loss.

**Null model, class by class.** A clean holder's errors are binomial with the class's error rate
``p_c``, shared by the clean holders. ``p_c`` is not known: it is estimated from the *other*
holders of the class (the fit set: every holder, or those not flagged by a first pass), and its
uncertainty is carried into the test by the beta-binomial posterior predictive distribution
(Jeffreys prior Beta(1/2, 1/2) on ``p_c``, updated by the other holders' ``T`` errors in ``N``
samples): ``e[k, c] ~ BetaBinomial(n[k, c], T + 1/2, N - T + 1/2)``. Classes held by fewer than
``min_holders`` sites of the fit set do not enter.

**One p-value per site.** The site's total ``E_k = sum_c e[k, c]`` over its entered classes is a
sum of independent beta-binomials; its exact distribution is their convolution (computed up to
the observed total, which is all the upper tail needs). The **mid-p** value
``P(E > e) + P(E = e) / 2`` (Lancaster, "Significance tests in discrete distributions", JASA 1961)
is used so that a site with no errors has p near one half rather than one, and a site with one
error in a class where errors are rare is not called significant on that single sample.
Like the loss evidence, the site's p-value also has a per-class part (the smallest per-class
mid-p times the number of entered classes, Bonferroni: noise in one class), and the two parts are
combined by Bonferroni: ``p_k = min(1, 2 min(p_total, m min_c p_c))``.

**Between-site heterogeneity.** Real clean sites differ in how hard their data are (another
scanner, other patients), which the binomial null does not allow for. The statistics are deflated
by **genomic control** (Devlin and Roeder, "Genomic control for association studies", Biometrics
1999, section 2): ``lambda = median(z_k^2) / 0.4549`` over the sites of the fit set (0.4549 the
median of chi-square with one degree of freedom, ``z_k`` the normal quantile of the site's total
mid-p), and when ``lambda > 1`` every z is divided by sqrt(lambda). The median is moved by a
minority of noisy sites no more than by one site, so that a noisy minority does not hide itself.

**Limits.** Discrete counts with an estimated rate are exact only in the limit; the mid-p is
slightly liberal on average and the genomic-control factor is estimated from the round's sites
(noisy with 5 of them). A global model that has learned a site's wrong labels (memorised by the
aggregate) does not contradict them, and the counts stay low; the loss evidence then sees no more.
A site that reports false counts is not caught here (issue 20's lying site: the accuracy evidence
of :mod:`service.audit.accuracy_evidence`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import betaln, gammaln, ndtr, ndtri

from service.audit._typing import BoolArray, FloatArray, IntArray

__all__ = ["CHI2_1_MEDIAN", "ErrorEvidence", "beta_binomial_pmf", "error_evidence"]

CHI2_1_MEDIAN = 0.454936423119572
"""Median of the chi-square distribution with one degree of freedom (Devlin and Roeder's 0.456)."""

_MAX_TRIMS = 10
"""Most trimming passes of the fit set (it stops earlier when nothing changes)."""

_P_FLOOR = 1e-300
"""Smallest p-value reported (the tails are computed as one minus a CDF, exact down to about
1e-16; a smaller true p-value is reported as 1e-16 or less and the site is flagged either way)."""


@dataclass(frozen=True)
class ErrorEvidence:
    """Per-site error-count evidence of one round (module docstring)."""

    p_value: FloatArray
    """(K,) one-sided p-value per site; 1.0 for a site with no entered class."""
    z: FloatArray
    """(K,) normal quantile of the site's total mid-p after genomic control; 0.0 likewise."""
    expected: FloatArray
    """(K,) expected errors of the site over its entered classes under the null."""
    observed: IntArray
    """(K,) the site's errors over its entered classes."""
    class_rate: FloatArray
    """(C,) the fit set's pooled error rate per class; NaN for a class that did not enter."""
    inflation: float
    """Genomic control's lambda (>= 1.0: the factor the z^2 were divided by)."""


def beta_binomial_pmf(x: IntArray, n: IntArray, a: FloatArray, b: FloatArray) -> FloatArray:
    """P(X = x) for X ~ BetaBinomial(n, a, b), elementwise; 0 outside 0 <= x <= n."""
    x = np.asarray(x)
    n = np.asarray(n)
    inside = (x >= 0) & (x <= n)
    xs = np.where(inside, x, 0)
    log_choose = gammaln(n + 1.0) - gammaln(xs + 1.0) - gammaln(n - xs + 1.0)
    log_p = log_choose + betaln(xs + a, n - xs + b) - betaln(a, b)
    return np.where(inside, np.exp(log_p), 0.0)


def _mid_p(pmfs: FloatArray, observed: int) -> float:
    """Mid-p of the sum of independent counts whose pmfs (rows, on 0..observed) are given."""
    total = np.ones(1)
    for row in pmfs:
        total = np.convolve(total, row)[: observed + 1]
    below = float(total[:observed].sum()) if observed > 0 else 0.0
    return min(1.0, max(1.0 - below - 0.5 * float(total[observed]), _P_FLOOR))


def _class_fits(
    errors: IntArray, counts: IntArray, exclude: BoolArray | None, min_holders: int
) -> tuple[FloatArray, FloatArray, FloatArray, BoolArray]:
    """Per site and class the predictive's (a, b), the pooled rate per class, and the fit set.

    A holder in the fit set is compared with the fit set without itself (leave-one-out)."""
    k, c_count = counts.shape
    held = counts > 0
    a = np.full((k, c_count), np.nan)
    b = np.full((k, c_count), np.nan)
    rate = np.full(c_count, np.nan)
    in_fit = np.zeros((k, c_count), dtype=bool)
    for c in range(c_count):
        rows = held[:, c]
        fit = rows if exclude is None else rows & ~exclude
        if int(fit.sum()) < min_holders:
            fit = rows
        if int(fit.sum()) < min_holders:
            continue
        t_all = float(errors[fit, c].sum())
        n_all = float(counts[fit, c].sum())
        t = np.where(fit, t_all - errors[:, c], t_all)
        n = np.where(fit, n_all - counts[:, c], n_all)
        a[rows, c] = t[rows] + 0.5
        b[rows, c] = n[rows] - t[rows] + 0.5
        rate[c] = t_all / n_all
        in_fit[:, c] = fit
    return a, b, rate, in_fit


def _tails(
    errors: IntArray, counts: IntArray, a: FloatArray, b: FloatArray, per_class: bool
) -> tuple[FloatArray, FloatArray]:
    """Per site the mid-p of its total, and (when ``per_class``) per entered class the mid-p of
    that class's count (NaN where the class did not enter)."""
    k = counts.shape[0]
    entered = np.isfinite(a)
    observed = np.where(entered, errors, 0).sum(axis=1)
    p_total = np.ones(k)
    p_class = np.full(counts.shape, np.nan)
    for i in range(k):
        classes = np.flatnonzero(entered[i])
        if classes.size == 0:
            continue
        grid = np.arange(observed[i] + 1)[None, :]
        n = counts[i, classes][:, None]
        pmfs = beta_binomial_pmf(grid, n, a[i, classes][:, None], b[i, classes][:, None])
        p_total[i] = _mid_p(pmfs, int(observed[i]))
        if per_class:
            for j, c in enumerate(classes):
                p_class[i, c] = _mid_p(pmfs[j : j + 1, : errors[i, c] + 1], int(errors[i, c]))
    return p_total, p_class


def error_evidence(
    errors: IntArray,
    counts: IntArray,
    *,
    min_holders: int = 3,
    exclude: BoolArray | None = None,
    trim: float = 0.01,
    min_excess: float = 0.05,
) -> ErrorEvidence:
    """The error-count evidence of one round (module docstring).

    Parameters
    ----------
    errors, counts : ndarray of int of shape (K, C)
        ``errors[k, c]``: site k's samples labelled c that the global model assigns to another
        class; 0 <= errors <= counts (checked by the caller).
    min_holders : int
        Sites of the fit set that must hold a class for it to enter.
    exclude : ndarray of bool of shape (K,), optional
        Sites left out of the fits from the start (their p-values are still computed).
    trim : float
        The fit set is then trimmed, until it no longer changes, of the sites whose total's
        mid-p against the others is below ``trim`` (module docstring, "Null model"), as long as
        more than half of the sites remain.
    """
    k = counts.shape[0]
    given = np.ones(k, dtype=bool) if exclude is None else ~np.asarray(exclude, dtype=bool)
    fit_sites = given
    for _ in range(_MAX_TRIMS):
        a, b, _, _ = _class_fits(errors, counts, ~fit_sites, min_holders)
        p_raw, _ = _tails(errors, counts, a, b, per_class=False)
        trimmed = fit_sites & (p_raw >= trim)
        if 2 * int(trimmed.sum()) <= k or bool((trimmed == fit_sites).all()):
            break
        fit_sites = trimmed
    a, b, rate, _ = _class_fits(errors, counts, ~fit_sites, min_holders)
    entered = np.isfinite(a)
    has = entered.any(axis=1)
    mean = np.where(entered, a / (a + b), 0.0)
    n_in = np.where(entered, counts, 0)
    observed = np.where(entered, errors, 0).sum(axis=1).astype(np.int64)
    expected = (n_in * mean).sum(axis=1)
    p_total, p_class = _tails(errors, counts, a, b, per_class=True)
    # Genomic control from every site's total (before the floor) outside the given exclusion.
    z_total = -ndtri(p_total)
    gc = has & given if (has & given).any() else has
    inflation = 1.0
    if gc.any():
        inflation = max(1.0, float(np.median(np.square(z_total[gc]))) / CHI2_1_MEDIAN)
    scale = float(np.sqrt(inflation))
    z = np.where(has, z_total / scale, 0.0)
    # The practical-significance floor: only an error rate at least min_excess above the
    # expected one is evidence (per site for the total, per class for the per-class part).
    total_ok = (observed - expected) >= min_excess * np.maximum(n_in.sum(axis=1), 1)
    class_ok = entered & (errors - counts * mean >= min_excess * counts)
    p_one = np.where(class_ok, p_class, 1.0).min(axis=1) * entered.sum(axis=1)
    z_one = -ndtri(np.clip(p_one, _P_FLOOR, 1.0 - 1e-16)) / scale
    p_site = np.minimum(1.0, 2.0 * np.minimum(np.where(total_ok, ndtr(-z), 1.0), ndtr(-z_one)))
    p_site = np.where(has, p_site, 1.0)
    return ErrorEvidence(
        p_value=np.asarray(p_site, dtype=np.float64),
        z=np.asarray(z, dtype=np.float64),
        expected=np.asarray(expected, dtype=np.float64),
        observed=observed,
        class_rate=rate,
        inflation=inflation,
    )
