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

**Null model.** A clean site's errors in class c have mean ``n[k, c] p_c``, ``p_c`` the class's
error rate shared by the clean holders; real clean sites also differ in how hard their data are
(another scanner, other patients), so the site's rates are ``m_k p_c`` with a site factor
``m_k ~ Gamma(1/phi, phi)`` (mean 1, variance ``phi``). A count is then negative binomial, mean
``mu`` and variance ``mu + phi mu^2`` (the gamma-Poisson mixture, Greenwood and Yule, "An inquiry
into the nature of frequency distributions", JRSS 1920; Poisson at ``phi = 0``), and so, to the
same approximation, is the site's total ``E_k = sum_c e[k, c]`` with mean
``lambda_k = sum_c n[k, c] p_c``. ``p_c`` is estimated from the *other* sites of the fit set that
hold the class (leave-one-out: ``(T + 1/2) / (N + 1)`` for their ``T`` errors in ``N`` samples,
never 0); the estimate's own sampling variance is added to the count's variance (as a dispersion
``Var(sum_c n p_hat) / lambda^2``). Classes held by fewer than ``min_holders`` sites of the fit
set do not enter.

**The fit set and phi.** The fit set starts as every site (or those the caller does not exclude:
the detector's first pass's flags) and is trimmed, until it no longer changes, of the sites whose
total is significant at ``trim`` (:data:`FIT_TRIM`, 0.05) with ``phi = 0``: a noisy minority
leaves it. Then ``phi``
is fitted on the fit set and the fit set is recomputed from every site at the same level with that
``phi`` (sites the spread explains come back), until it no longer changes. ``phi`` is fitted from
the **lower tail** only (:func:`fit_dispersion`): the smallest ``phi`` at which as many sites
have too few errors (mid-CDF below 1/4) as the model expects. Clean sites that differ spread both
ways, noisy sites have only too many errors, so counting the sites with too few measures the spread
without the noisy ones. Trimming stops (and phi is fitted on the fit set as it is) when it would
leave half of the sites or fewer. The level is looser than the flagging one on purpose: a mildly
noisy site that is not yet significant would otherwise stay in the fit set, raise the pooled
rates the clean sites are compared with, push the clean sites into the lower tail, and so inflate
``phi``, which in turn kept the noisy site unflagged (measured on the stress matrix's mild-noise
row m06, seed 2: ``phi`` fitted at 0.2-0.46 in most rounds where the same partition without
noise fits 0-0.27; :data:`FIT_TRIM` explains what it costs).

**phi's floor.** The caller may pass a floor (``min_dispersion``): the evidence detector passes
the dispersion the loss evidence's between-site spread of difficulty implies, ``exp(tau^2) - 1``
(:meth:`service.audit.site_factor.SiteFactor.count_dispersion`, at most 1): the same harder data
raise a site's losses and its errors, and 20 sites' lower tail alone gave phi from 0 to 0.64
round to round where the truth was 0.28 (simulated binary sites of 300 samples, log-normal
difficulty of spread 0.5, 100 rounds: 24 % of rounds with a false flag, 11 % with the floor, 7 %
for the losses alone).

**One p-value per site.** The exact upper tail of the total, ``P(E >= e)``, 1 unless the site's
error rate over its entered classes is at least ``min_excess`` (0.05) above the expected one (a
practical-significance floor). The mid-p value (Lancaster, "Significance tests in discrete
distributions", JASA 1961: ``P(E > e) + P(E = e) / 2``) was used first and dropped: about half the
exact tail at a small expected count, it flagged a clean PneumoniaMNIST site of 25 samples for 2
errors where 0.05 were expected (m11 seed 0, two rounds); the exact tail costs little power in
simulation (a single noisy site among 50 found in 88 % of rounds instead of 90 %).

**Classes of a site.** A clean site's samples of one class can be harder than its other classes
(a sub-population the model has not learned). On top of ``phi`` a class-level dispersion
``psi`` models it: the count ``e[k, c]`` is negative binomial with dispersion ``phi + psi`` (plus
its estimated rate's own variance), ``psi`` fitted like ``phi`` from the lower tail of the counts
of the fit set's sites in the classes they hold at least ``min_class_count`` (5) samples of; the
class-level factors being independent across classes, the total's dispersion grows by
``psi * sum_c mu_c^2 / (sum_c mu_c)^2``.

**The per-class part** (``class_part``, off): the smallest per-class p-value times the number of
classes the site holds at least ``min_class_count`` samples of (Bonferroni: noise in one class),
combined with the total by Bonferroni, ``p_k = min(1, 2 min(p_total, m min_c p_c))``, each part
with the floor on its own rate. It is off because a clean site's hard class looks like a noisy
one to it and ``psi`` does not see enough of it: in README's demo (20 digit sites), a clean site
held 22 samples of one class of which the global model got 8-9 wrong against about 2 expected,
round after round, ``psi`` was fitted at 0-0.14, and the site was flagged in 2 of 36 rounds
(never by its total, 13-17 errors against 9-11 expected). Its mean loss in that class was
close to the other sites' (its errors were low-confidence ones, a noisy site's are confident),
so the loss evidence did not flag it.

**Limits.** ``phi`` is treated as known; the negative binomial of a total over classes of
different rates is an approximation. Counts cannot tell a clean site whose data are much harder
from a noisy one: in simulation (``tests/audit/test_error_evidence.py``), with clean sites' error
rates spread by a log-normal factor of standard deviation 0.3, rounds with a false flag stay
at the null's level; at 0.6 they do not (the loss evidence alone fares no better there:
docs/algorithms.md, "Error counts"). A global model that has learned a site's wrong labels
(memorised by the aggregate) does not contradict them, and the counts stay low; the loss evidence
then sees no more. A site that reports false counts is not caught here (issue 20's lying site:
the accuracy evidence of :mod:`service.audit.accuracy_evidence`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import betainc, ndtri
from scipy.stats import nbinom, poisson

from service.audit._typing import BoolArray, FloatArray, IntArray
from service.audit._validation import InvalidInputError, as_float_array
from service.audit.pooling import RATE_CAP, pool_weights

__all__ = [
    "FIT_TRIM",
    "ErrorEvidence",
    "ReportedCounts",
    "counted_on",
    "reported_counts",
    "checked_error_counts",
    "error_evidence",
    "fit_dispersion",
    "rate_dispersion",
    "upper_p",
    "ndtri_clipped",
]

FIT_TRIM = 0.05
"""The level at which a site leaves the fit set (was 0.01, the flagging level, until 27 November
2026). Measured with ``docs/eval/error_counts_simulation.py 100`` (100 rounds a row) against
0.01: the share of rounds a mildly noisy site is flagged rose from 0.09-0.84 to 0.11-0.88 (rates
0.10-0.30; 0.31 to 0.41 at 0.18); the share of clean rounds with a false flag rose where clean
sites differ in difficulty (log-normal spread 0.3: 0.01 to 0.02; binary sites of 300 samples,
spread 0.5: 0.11-0.13 to 0.14-0.15; unchanged without spread). Replays of kept runs: no false
flag on the clean controls at hand (m06's partition without noise, m14, m17: 0 of 252 rounds),
m06's F1 mean after the warm-up 0.69 -> 0.74 and 0.66 -> 0.83 (seeds 1 and 2). At 0.1 the
power rose a little more and the false alarms with spread 0.5 doubled (0.11 -> 0.21)."""

_MAX_TRIMS = 10
"""Most trimming passes of the fit set (it stops earlier when nothing changes)."""

LOWER_TAIL = 0.25
"""The lower tail :func:`fit_dispersion` counts sites in (mid-CDF below a quarter)."""

_MAX_PHI = 1.0
"""Largest dispersion fitted (and the cap of the floor the evidence detector passes): clean
sites' error rates spread with a coefficient of variation of 1. Few sites with few errors each
give the lower tail little to count, and the fit stops here."""

_PHI_TOLERANCE = 1e-4
"""phi's bisection stops at this width (14 steps from [0, ``_MAX_PHI``])."""

DISPERSION_FIT_COUNTS = 2048
"""At most this many counts enter :func:`fit_dispersion` (10,000 sites of 10 classes give
100,000): beyond it, evenly spaced ones in the order of (mean, count, extra), a sample
stratified by the mean and the same whatever the order of the sites. phi is one number; the
share of counts in the lower tail it matches is then known to about +-1 percentage point
(binomial standard error at 0.25 over 2,048), where a K = 10,000 round took 18 s with all of
them (a negative binomial quantile per count and bisection step). No federation of the stress
matrix reaches it (100 sites of 10 classes: 1,000 counts)."""


@dataclass(frozen=True)
class ErrorEvidence:
    """Per-site error-count evidence of one round (module docstring)."""

    p_value: FloatArray
    """(K,) one-sided p-value per site; 1.0 for a site with no entered class."""
    z: FloatArray
    """(K,) the site's p-value as a normal quantile (after the floor); 0.0 likewise."""
    expected: FloatArray
    """(K,) expected errors of the site over its entered classes under the null."""
    observed: IntArray
    """(K,) the site's errors over its entered classes."""
    class_rate: FloatArray
    """(C,) the fit set's pooled error rate per class; NaN for a class that did not enter."""
    dispersion: float
    """phi, the squared coefficient of variation of the clean sites' error rates (fitted, or
    the caller's floor ``min_dispersion`` where that is larger)."""
    class_dispersion: float
    """psi, the same for a site's classes given the site (a site whose samples of one class are
    harder than its other classes); 0 when the lower tail of the per-class counts shows none."""
    fit_set: BoolArray
    """(K,) the sites the rates and ``dispersion`` were fitted on."""
    reported: BoolArray | None = None
    """(K,) the sites that sent their counts (None: all of them); the others' p-value is 1 and
    their counts 0 (:func:`counted_on`)."""


def checked_error_counts(name: str, value: Any, counts: IntArray) -> IntArray:
    """Error counts of the shape of ``counts`` (one site's row or the round's matrix), checked:
    an integer from 0 to the class's count wherever the class is held; anything (NaN, None)
    where it is not, stored as 0. Raises :class:`InvalidInputError` otherwise."""
    array = as_float_array(name, value, ndim=counts.ndim, allow_nan=True)
    if array.shape != counts.shape:
        raise InvalidInputError(
            f"{name}: shape {array.shape} differs from class_counts {counts.shape}"
        )
    held = counts > 0
    got = array[held]
    if not np.isfinite(got).all() or (got != np.round(got)).any():
        raise InvalidInputError(f"{name}: expected an integer for every held class")
    if (got < 0).any() or (got > counts[held]).any():
        raise InvalidInputError(f"{name}: a count is negative or exceeds the class's count")
    return np.where(held, np.nan_to_num(array), 0).astype(np.int64)


def upper_p(
    observed: FloatArray | IntArray, mean: FloatArray, phi: FloatArray | float
) -> FloatArray:
    """P(X >= x) for X negative binomial with this mean and dispersion phi (variance
    mean + phi mean^2; Poisson where phi = 0), elementwise."""
    x = np.asarray(observed, dtype=np.float64)
    mu = np.asarray(mean, dtype=np.float64)
    shape = np.broadcast(x, mu, np.asarray(phi)).shape
    x, mu = np.broadcast_to(x, shape), np.broadcast_to(mu, shape)
    phi_a = np.broadcast_to(np.asarray(phi, dtype=np.float64), shape)
    out = np.empty(shape)
    nb = phi_a > 0  # each tail only where it applies
    r = 1.0 / np.maximum(phi_a[nb], 1e-12)
    out[nb] = nbinom.sf(x[nb] - 1.0, r, r / (r + mu[nb]))
    out[~nb] = poisson.sf(x[~nb] - 1.0, mu[~nb])
    return out


def _nb_cdf(k: FloatArray, r: FloatArray, p: FloatArray) -> FloatArray:
    """P(X <= k) for X negative binomial (r, p), k integer: the regularised incomplete beta
    I_p(r, k + 1) (the identity scipy's ``nbinom.cdf`` evaluates; 0 for k < 0)."""
    return np.where(k >= 0.0, betainc(r, np.maximum(k, 0.0) + 1.0, p), 0.0)


def nb_quantile(
    level: float, r: FloatArray, p: FloatArray, start: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """The smallest integer q >= 0 with P(X <= q) >= ``level`` (scipy's ``nbinom.ppf``, for a
    level strictly between 0 and 1), with P(X <= q) and P(X <= q - 1), for X negative binomial
    (r, p). Found by stepping from ``start`` (rounded down; a non-finite or negative start
    counts as 0: the closer, the fewer steps); each step evaluates only the entries that still move,
    and reuses the CDF the step before evaluated; after ``_MAX_STEPS`` steps scipy's own search
    finds the entries still moving."""
    start = np.asarray(start, dtype=np.float64)
    q = np.where(np.isfinite(start), np.maximum(np.floor(start), 0.0), 0.0)
    at = _nb_cdf(q, r, p)
    below = np.full(q.shape, np.nan)  # P(X <= q - 1) where known
    moving = np.flatnonzero(at < level)
    steps = 0
    while moving.size:  # up while P(X <= q) < level
        if steps == _MAX_STEPS:  # far from the start: scipy's own search for the rest
            _scipy_quantile(level, r, p, q, at, below, moving)  # their ``below`` now known
            break
        steps += 1
        q[moving] += 1.0
        below[moving] = at[moving]
        at[moving] = _nb_cdf(q[moving], r[moving], p[moving])
        moving = moving[at[moving] < level]
    moving = np.flatnonzero(np.isnan(below) & (q > 0.0))
    below[q <= 0.0] = 0.0
    steps = 0
    while moving.size:  # down while P(X <= q - 1) >= level
        if steps == _MAX_STEPS:
            return _scipy_quantile(level, r, p, q, at, below, moving)
        steps += 1
        below[moving] = _nb_cdf(q[moving] - 1.0, r[moving], p[moving])
        moving = moving[below[moving] >= level]
        q[moving] -= 1.0
        at[moving] = below[moving]
        below[moving[q[moving] <= 0.0]] = 0.0
        moving = moving[q[moving] > 0.0]
    return q, at, below


_MAX_STEPS = 64
"""Steps :func:`nb_quantile` takes from its start before handing the entries still moving to
scipy's ``nbinom.ppf`` (a start far from the quantile: a gamma shape below one at a large mean)."""


def _scipy_quantile(
    level: float,
    r: FloatArray,
    p: FloatArray,
    q: FloatArray,
    at: FloatArray,
    below: FloatArray,
    rest: IntArray,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """:func:`nb_quantile`'s result with the entries ``rest`` found by scipy instead."""
    q[rest] = nbinom.ppf(level, r[rest], p[rest])
    at[rest] = _nb_cdf(q[rest], r[rest], p[rest])
    below[rest] = _nb_cdf(q[rest] - 1.0, r[rest], p[rest])
    return q, at, below


def _gamma_guess(level: float, mu: FloatArray, phi: FloatArray) -> FloatArray:
    """A start for :func:`nb_quantile`: the ``level`` quantile of the gamma distribution with
    the count's mean and variance, by Wilson and Hilferty's cube-root normal approximation
    ("The distribution of chi-square", PNAS 1931), rounded down (usually within a few steps of
    the negative binomial's quantile; far from it for a shape below one at a large mean)."""
    mean = np.maximum(mu, 1e-12)
    shape = mean / (1.0 + phi * mean)  # mean^2 / variance
    w = 1.0 / (9.0 * shape)
    root = np.maximum(1.0 - w + float(ndtri(level)) * np.sqrt(w), 0.0)
    guess: FloatArray = np.floor(mean * root**3)
    return guess


def _lower_tail(x: FloatArray, mu: FloatArray, phi: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Per count: whether its mid-CDF P(X < x) + P(X = x) / 2 is below ``LOWER_TAIL``, and the
    probability of that event under the model (negative binomial, mean mu, dispersion phi).

    The mid-CDF grows with x, so the event is x <= t for the largest such t: with q the
    ``LOWER_TAIL`` quantile (the smallest x with P(X <= x) >= ``LOWER_TAIL``), every x < q
    qualifies and no x > q does; t is q when q itself qualifies, else q - 1, and the event's
    probability is P(X <= t) (0 when t < 0)."""
    r = 1.0 / np.maximum(phi, 1e-12)
    p = r / (r + mu)
    q, at_q, below_q = nb_quantile(LOWER_TAIL, r, p, _gamma_guess(LOWER_TAIL, mu, phi))
    qualifies = 0.5 * (at_q + below_q) < LOWER_TAIL
    t = np.where(qualifies, q, q - 1.0)
    chance = np.where(qualifies, at_q, below_q)
    return (x <= t).astype(np.float64), np.asarray(chance, dtype=np.float64)


def rate_dispersion(n_in: Any, rates: Any, support: Any) -> FloatArray:
    """Per site, the estimated rates' own variance as a dispersion on its total:
    ``Var(sum_c n p_hat_c) / (sum_c n p_c)^2``, each rate estimated from ``support`` samples
    (``n_in`` 0 where a class does not enter)."""
    expected = (n_in * rates).sum(axis=1)
    variance = (n_in**2 * rates / support).sum(axis=1)
    return np.asarray(variance / np.maximum(expected, 1e-12) ** 2, dtype=np.float64)


def fit_dispersion(observed: FloatArray, mean: FloatArray, extra: FloatArray) -> float:
    """The site factor's dispersion phi, from the **lower tail** only: the smallest phi in
    [0, ``_MAX_PHI``] at which as many sites are in their lower tail (mid-CDF below
    ``LOWER_TAIL``) as the model expects (negative binomial, dispersions ``phi + extra``;
    ``extra`` the part the estimated means contribute). Clean sites that differ spread both ways;
    noisy sites only have too many errors, so counting the sites with too few leaves them out:
    a noisy minority does not widen phi, and the rest of the sites' spread does."""
    x = np.asarray(observed, dtype=np.float64)
    mu = np.asarray(mean, dtype=np.float64)
    ex = np.asarray(extra, dtype=np.float64)
    keep = mu > 0
    x, mu, ex = x[keep], mu[keep], ex[keep]
    if x.size < 2:
        return 0.0
    if x.size > DISPERSION_FIT_COUNTS:  # a stratified sample, whatever the sites' order
        ranked = np.lexsort((ex, x, mu))
        spaced = np.linspace(0, x.size - 1, DISPERSION_FIT_COUNTS).round().astype(np.int64)
        x, mu, ex = x[ranked[spaced]], mu[ranked[spaced]], ex[ranked[spaced]]

    def surplus(phi: float) -> float:
        seen, expected = _lower_tail(x, mu, phi + ex)
        return float(seen.sum() - expected.sum())

    if surplus(0.0) <= 0.0:
        return 0.0
    if surplus(_MAX_PHI) > 0.0:
        return _MAX_PHI
    lo, hi = 0.0, _MAX_PHI
    while hi - lo > _PHI_TOLERANCE:
        mid = 0.5 * (lo + hi)
        if surplus(mid) > 0.0:
            lo = mid
        else:
            hi = mid
    return hi


def _class_rates(
    errors: IntArray, counts: IntArray, fit_sites: BoolArray, min_holders: int
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Per site and class the expected rate (NaN where the class does not enter) and the
    samples it was estimated from, and the fit set's pooled rate per class. A holder in the fit
    set is compared with the fit set without itself (leave-one-out); the rate is
    (T + 1/2) / (N + 1), never 0, each holder capped as :mod:`service.audit.pooling` says."""
    k, c_count = counts.shape
    sizes = counts.sum(axis=1).astype(np.float64)
    held = counts > 0
    expected = np.full((k, c_count), np.nan)
    support = np.full((k, c_count), np.nan)
    rate = np.full(c_count, np.nan)
    for c in range(c_count):
        rows = held[:, c]
        fit = rows & fit_sites
        if int(fit.sum()) < min_holders:
            fit = rows
        if int(fit.sum()) < min_holders:
            continue
        # a holder: at most the median holder's size, and 4x the median holder's class count
        weight = np.minimum(pool_weights(sizes, fit, RATE_CAP), pool_weights(counts[:, c], fit))
        t_all = float((weight * errors[:, c]).sum())
        n_all = float((weight * counts[:, c]).sum())
        t = t_all - weight * errors[:, c]
        n = n_all - weight * counts[:, c]
        expected[rows, c] = (t[rows] + 0.5) / (n[rows] + 1.0)
        support[rows, c] = n[rows] + 1.0
        rate[c] = t_all / n_all
    return expected, support, rate


def error_evidence(
    errors: IntArray,
    counts: IntArray,
    *,
    min_holders: int = 3,
    exclude: BoolArray | None = None,
    trim: float = FIT_TRIM,
    min_excess: float = 0.05,
    min_class_count: int = 5,
    class_part: bool = False,
    min_dispersion: float = 0.0,
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
        Sites left out of the fit set from the start (their p-values are still computed).
    trim : float
        The level at which a site leaves the fit set (module docstring, "The fit set").
    min_excess : float
        The practical-significance floor on the error rate's excess (module docstring).
    min_class_count : int
        Samples a site must hold of a class for that class alone to count (the per-class part,
        and the cells ``psi`` is fitted on).
    min_dispersion, class_part : float, bool
        A floor on phi; the per-class part combined with the total (module docstring).
    """
    k = counts.shape[0]
    given = np.ones(k, dtype=bool) if exclude is None else ~np.asarray(exclude, dtype=bool)
    fit_sites = given
    phi = 0.0
    # Stage "poisson": trim with phi = 0 until nothing changes (a noisy minority leaves the fit);
    # stage "dispersion": fit phi on what stays, let back the sites it explains, and again.
    stage = "poisson"
    seen: list[BoolArray] = []
    for _ in range(2 * _MAX_TRIMS):
        rates, support, class_rate = _class_rates(errors, counts, fit_sites, min_holders)
        entered = np.isfinite(rates)
        has = entered.any(axis=1)
        n_in = np.where(entered, counts, 0)
        mean = n_in * np.nan_to_num(rates)
        observed = np.where(entered, errors, 0).sum(axis=1)
        expected = mean.sum(axis=1)
        extra = rate_dispersion(n_in, np.nan_to_num(rates), np.nan_to_num(support, nan=1.0))
        if stage == "dispersion":
            fit = fit_sites & has
            phi = max(fit_dispersion(observed[fit], expected[fit], extra[fit]), min_dispersion)
        p_total = np.where(has, upper_p(observed, np.maximum(expected, 1e-12), phi + extra), 1.0)
        trimmed = given & (p_total >= trim)
        # Stop trimming when it is stable, cycles, or would leave half of the sites or fewer:
        # in the first stage that means going on to fit phi on the current fit set (sites that
        # differ in difficulty make the phi = 0 trim remove many clean sites; phi is for them).
        if (
            2 * int(trimmed.sum()) <= k
            or any(bool((trimmed == f).all()) for f in seen)
            or bool((trimmed == fit_sites).all())
        ):
            if stage == "dispersion":
                break
            stage, seen = "dispersion", []
            continue
        seen.append(fit_sites)
        fit_sites = trimmed
    else:
        # Out of iterations: the rates and p-values above belong to the previous fit set.
        fit_sites = seen[-1] if seen else fit_sites
    psi, p_one = _class_level(
        errors, counts, mean, rates, support, fit_sites, phi, min_class_count, min_excess
    )
    if psi > 0.0:
        # The class-level factors are independent across classes: the total's dispersion grows
        # by psi * sum_c mu_c^2 / (sum_c mu_c)^2.
        share = (mean**2).sum(axis=1) / np.maximum(expected, 1e-12) ** 2
        p_total = np.where(
            has, upper_p(observed, np.maximum(expected, 1e-12), phi + extra + psi * share), 1.0
        )
    # The floor: an error rate at least min_excess above the expected one.
    total_ok = observed - expected >= min_excess * np.maximum(n_in.sum(axis=1), 1)
    p_site = np.where(total_ok, p_total, 1.0)
    if class_part:
        p_site = np.minimum(1.0, 2.0 * np.minimum(p_site, p_one))
    return ErrorEvidence(
        p_value=np.asarray(np.where(has, p_site, 1.0), dtype=np.float64),
        z=np.asarray(np.where(has, -ndtri_clipped(np.where(has, p_site, 1.0)), 0.0)),
        expected=np.asarray(expected, dtype=np.float64),
        observed=np.asarray(observed, dtype=np.int64),
        class_rate=class_rate,
        dispersion=phi,
        class_dispersion=psi,
        fit_set=fit_sites,
    )


def _class_level(
    errors: IntArray,
    counts: IntArray,
    mean: FloatArray,
    rates: FloatArray,
    support: FloatArray,
    fit_sites: BoolArray,
    phi: float,
    min_class_count: int,
    min_excess: float,
) -> tuple[float, FloatArray]:
    """(psi, the per-class part's p-value per site) of :func:`error_evidence`.

    psi (module docstring, "Classes of a site") is fitted like phi from the lower tail, over
    the per-class counts of the fit set, on top of phi. The per-class part: the smallest
    per-class p-value among the classes of at least ``min_class_count`` samples whose error rate
    clears the floor, times the number of such classes the site holds (1 where none)."""
    entered = np.isfinite(rates)
    # Per class the estimated rate's variance as a dispersion: 1 / (rate * samples behind it).
    behind = np.nan_to_num(support, nan=1.0) * np.nan_to_num(rates)
    class_extra = np.where(entered, 1.0 / np.maximum(behind, 1e-12), 0.0)
    # Only classes of at least min_class_count samples (as in the loss evidence: one error among
    # a handful of samples clears any floor on the rate).
    per_class = entered & (counts >= min_class_count)
    cells = per_class & fit_sites[:, None]
    psi = fit_dispersion(errors[cells].astype(np.float64), mean[cells], (phi + class_extra)[cells])
    class_ok = per_class & (errors - mean >= min_excess * counts)
    p_class = np.ones(errors.shape)  # the tail only where the floor is cleared, else 1
    ok_mean, ok_phi = np.maximum(mean[class_ok], 1e-12), (phi + psi + class_extra)[class_ok]
    p_class[class_ok] = upper_p(errors[class_ok], ok_mean, ok_phi)
    p_one = p_class.min(axis=1) * np.maximum(per_class.sum(axis=1), 1)
    return psi, np.asarray(p_one, dtype=np.float64)


@dataclass(frozen=True)
class ReportedCounts:
    """A round's error counts: every site's row (0 where the site did not send them) and which
    sites sent them."""

    errors: IntArray
    """(K, C) checked counts; a row of zeros for a site that did not send them."""
    reporting: BoolArray
    """(K,) the sites that sent their counts."""


def reported_counts(
    value: Any, counts: IntArray, min_sites: int, name: str = "per_class_errors"
) -> ReportedCounts | None:
    """The round's error counts (K, C), NaN (or None) everywhere in a held class's place for a
    site that did not send them; None when fewer than ``min_sites`` sites did. A site that sent
    some held classes' counts and not others' is refused (:func:`checked_error_counts`).

    A site that leaves its counts out is judged on its losses alone (its p-value is the loss
    evidence's, without the factor of two): leaving them out gains it nothing, and the other
    sites are still judged on both."""
    array = as_float_array(name, value, ndim=2, allow_nan=True)
    if array.shape != counts.shape:
        raise InvalidInputError(f"{name}: shape {array.shape}, class_counts {counts.shape}")
    held = counts > 0
    absent: BoolArray = np.asarray((~np.isfinite(array) | ~held).all(axis=1) & held.any(axis=1))
    if int((~absent).sum()) < min_sites:
        return None
    errors = checked_error_counts(name, np.where(absent[:, None], 0.0, array), counts)
    return ReportedCounts(errors, ~absent)


def counted_on(
    reported: ReportedCounts,
    counts: IntArray,
    exclude: BoolArray | None,
    evidence: Any = None,
    **options: Any,
) -> ErrorEvidence:
    """:func:`error_evidence` (or ``evidence``, called the same way) fitted on the sites that
    sent their counts only, its arrays expanded to every site (p-value 1, z 0, no errors, no
    expectation, not in the fit set for the others)."""
    rows = reported.reporting
    run = error_evidence if evidence is None else evidence
    ev: ErrorEvidence = run(
        reported.errors[rows],
        counts[rows],
        exclude=None if exclude is None else np.asarray(exclude, dtype=bool)[rows],
        **options,
    )
    if bool(rows.all()):
        return ev

    def full(values: Any, fill: float) -> Any:
        out = np.full(rows.size, fill, dtype=np.asarray(values).dtype)
        out[rows] = values
        return out

    return ErrorEvidence(
        p_value=full(ev.p_value, 1.0),
        z=full(ev.z, 0.0),
        expected=full(ev.expected, 0.0),
        observed=full(ev.observed, 0),
        class_rate=ev.class_rate,
        dispersion=ev.dispersion,
        class_dispersion=ev.class_dispersion,
        fit_set=full(ev.fit_set, False),
        reported=rows,
    )


def ndtri_clipped(p: FloatArray) -> FloatArray:
    """The standard normal quantile of p, with p kept in [1e-300, 1 - 1e-16]."""
    return np.asarray(ndtri(np.clip(p, 1e-300, 1.0 - 1e-16)), dtype=np.float64)
