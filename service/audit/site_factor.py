"""A site's overall loss against what its class mix predicts: the site-level part of the evidence.

Clean sites differ in difficulty as a whole: another scanner, sicker patients, a harder
population make *every* class of a site harder at once. A test that treats a site's classes as
independent (Stouffer's sum of per-class z) counts that one site-wide difference once per class:
with 1,000 samples per site and clean sites whose error rates differ by a log-normal factor of
spread 0.3, a clean site was flagged in 77 % of the rounds
(``docs/eval/error_counts_simulation.py --large``). This module tests the site as a whole
against a between-site spread it estimates. The evidence detector uses it from 10 sites on, in
consensus mode (:data:`service.audit.evidence.SITE_LEVEL_MIN_SITES`).

**Signal.** The site's observed total loss ``O_k = sum_c n[k, c] L[k, c]`` against the total
expected from its class mix and the classes' consensus losses, ``E_k = sum_c n[k, c] mu_c`` (the
classes that entered the class-level fit); ``x_k = log(O_k / E_k)`` (indirect standardisation,
the standardised mortality ratio of hospital comparisons).

**Null model** (a random-effects model on the log ratio, as in the funnel plots for comparing
institutions with over-dispersion: Spiegelhalter, "Funnel plots for comparing institutional
performance", Statistics in Medicine 2005, section 3.2, additive random effect on the log scale):

    x_k = m + a_k + e_k,   a_k ~ N(0, tau^2),   e_k ~ N(0, V_k / E_k^2),

``a_k`` the site's difficulty and ``e_k`` its sampling error, ``V_k = sum_c n[k, c] sigma_c^2``
(the pooled per-sample variances of the classes over the sites of the fit): the delta method's
variance of ``log O_k`` for a site at the consensus, the null the site is tested against. (The
classes' own between-site spreads tau_c are not added: tau absorbs what the sites' spread
needs.) (Each site's own variance is not used: a noisy site's is large *because* of its wrong
labels, which would hide them, and on sites of 30-70 samples it is a handful of hard samples.
Nor the variance at the observed ``O_k``, ``V_k / (O_k E_k)``: a clean site that drew twice its
share of hard samples then looked precise and far: z 3.7, where the Poisson tail of 10 or more
hard samples against 4.8 expected is 0.025.)
An error of the class centres ``mu_c``
shifts every site's ``x`` alike, and the median below absorbs it. (Consensus mode only: the
evidence detector's anchored mode does not use this test.)

**Fit, robust to a noisy minority.** A first centre and spread come from the shortest interval
holding just over half of the sites' ``x`` (:func:`shortest_half`). Then, on the sites with
``z < 2.5`` (:data:`TRIM_Z`; noisy sites only go up), ``m`` is their plain median (every site one
vote: inverse-variance weights would hand the median to the noisy sites, whose large loss is
measured *more* precisely on the log scale) and ``tau^2`` the smallest value at which their
median absolute standardised residual reaches its normal value (the Paule-Mandel estimator with
the median, as :func:`service.audit.class_null.fit_class_null`), corrected for the truncation (the
median of ``|Z|`` for a normal cut above 2.5 is 0.6696); repeated until that set is stable (all
sites when it would keep half of them or fewer; the larger of two sets the loop alternates
between). The cut is 2.5 rather than 2: when the first scale comes out small, clean sites fall
beyond the cut, the refit on fewer sites gives a smaller tau still, and the loop settled there
(an independent review: on 20 clean sites of 1,000 samples, the rounds that kept 16 sites or
fewer had a mean tau of 0.065 against 0.26 with 19-20, and a third of them a false flag).

**p-value.** ``z_k = (x_k - m) / sqrt(tau^2 + var(e_k) + var(m))`` against Student's t with
``0.37 (m_fit - 1)`` degrees of freedom (``m_fit`` the sites of the final fit; 0.37 the efficiency
of a median-based scale, :data:`MEDIAN_SCALE_EFFICIENCY`), because tau is estimated from a few
sites and by medians: on 20 clean sites of 1,000 samples (spread 0.3) its estimate varied with a
coefficient of variation of 0.47 from round to round, and with ``m_fit - 1`` degrees of freedom
3.2 % of the clean sites had p < 0.01 (1.5 % with the efficiency factor; an independent
review's simulation). Also where the estimate is tau = 0: on
digits sites holding two classes each, a clean site whose one class was persistently harder
than its three other holders (tau_c estimated 0 from them) stood at z 3.3 among 15 clean sites
in five rounds running.

**The classes given the site.** The class-level test then compares each class with what is expected
*of this site*: its losses divided by a shrunken factor, ``exp((x - m) tau^2 / (tau^2 + var(e)))``
(the best linear predictor of its difficulty, so that a small site's noisy ratio moves it little and
a federation without between-site spread is left as it is), with ``x`` and ``var(e)`` taken over
the site's *other* classes where they carry at least the class's own expected loss
(:meth:`SiteFactor.class_shift`), else over all its classes. A site whose every class is harder is
then not flagged class by class, and a site with wrong labels in one class is not excused by them:
taken over all its classes, that class's own excess raised the factor it was divided by (in a
held-out federation of 29 MNIST sites at Dirichlet(0.1), 11 with 10-30 % of their labels mapped to
other classes, a noisy site's class stood at z 11.5 as reported and lost most of it to the
adjustment). The other classes must weigh at least as much as the class: from one small class the
factor is a noisy estimate, whose error the class test does not know of (20 clean binary sites of
300 samples, difficulty spread 0.5, 60 rounds: a clean site flagged in 16 with any other class, 6
with the condition, 6 over all classes).

Only a site harder than the centre is adjusted for the test of high losses, only an easier one for
the lower tail (the direction the evidence looks in): the adjustment takes away evidence a site's
difficulty makes, and the other way it makes evidence. A site easier than the centre in every
class, multiplied up to the centre, has its sampling noise and the centre's own contamination
multiplied too: in a held-out 43-site digits federation with 20 sites at 50-80 % wrong labels, a
clean site at 0.40 of the centre was multiplied by 2.5 and flagged on one class at z 7, in 6 of 27
rounds (``docs/eval/holdout.py --draw 2``, h2-01); adjusted one way only, in none. The price: an
easier site with wrong labels in one class is judged against the class's centre, not against what
its other classes predict (an independent review's example: 12 sites of 4 x 150 samples, the noisy
one at 0.55 of the centre with 15 % wrong labels in one class, flagged at score 3.5 adjusted both
ways, not flagged at 2.5 one way and by the other classes).

Without the SDK's spreads ``V_k`` is unknown: ``var(e_k)`` is taken as 0, tau absorbs the
sampling spread too (the median and the median-based tau of all sites, without the shortest half
and the trimming: with nothing but the sites' spread to go by, trimming its tail shrank tau
round after round), and the classes are not adjusted (the site's ratio cannot be told from its
sampling error).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.optimize import brentq
from scipy.special import ndtr
from scipy.stats import norm
from scipy.stats import t as student_t

from service.audit._typing import BoolArray, FloatArray, IntArray

__all__ = ["TRIM_Z", "SiteFactor", "fit_site_null", "site_factor", "truncated_mad_target"]

TRIM_Z = 2.5
"""Sites at ``z >= TRIM_Z`` leave the fit of the between-site spread (noisy sites only go up)."""

MAD_NORMAL = 0.6744897501960817
MEDIAN_SCALE_EFFICIENCY = 0.37
"""Asymptotic efficiency of a median-based scale at the normal (the MAD's is 37 %: Rousseeuw and
Croux, "Alternatives to the median absolute deviation", JASA 1993, section 2): tau's t reference
gets this fraction of the m - 1 degrees of freedom a sum of squares would have."""
_BISECTIONS = 60
_MAX_TRIMS = 20


@lru_cache(maxsize=8)
def truncated_mad_target(cut: float) -> float:
    """Median of |Z| for Z ~ N(0, 1) conditioned on Z < ``cut`` (0.6745 for an infinite cut)."""
    if not math.isfinite(cut):
        return MAD_NORMAL
    kept = float(norm.cdf(cut))

    def excess(m: float) -> float:
        return float((norm.cdf(min(m, cut)) - norm.cdf(-m)) / kept - 0.5)

    return float(brentq(excess, 1e-6, 10.0))


def shortest_half(values: FloatArray) -> tuple[float, float]:
    """(centre, scale) from the shortest interval holding ``m // 2 + 1`` of the values (the
    shorth: Rousseeuw, "Least median of squares regression", JASA 1984): its midpoint, and its
    half-length over the normal's 0.6745. A minority on one side, however far, moves neither."""
    v = np.sort(values)
    h = v.size // 2 + 1
    widths = v[h - 1 :] - v[: v.size - h + 1]
    i = int(np.argmin(widths))
    return float(0.5 * (v[i] + v[i + h - 1])), float(0.5 * widths[i] / MAD_NORMAL)


def fit_site_null(
    values: FloatArray, within: FloatArray, target: float = MAD_NORMAL
) -> tuple[float, float, float]:
    """(centre, tau^2, variance of the centre) of the sites' log ratios (module docstring).

    The centre is the plain median; tau^2 the smallest value at which the median of
    ``|x - centre| / sqrt(within + tau^2)`` is at most ``target``; 0 with fewer than 3 values.
    """
    centre = float(np.median(values))
    resid = np.abs(values - centre)

    def median_z(tau2: float) -> float:
        scale = np.sqrt(within + tau2)
        fallback = np.where(resid > 0, np.inf, 0.0)  # no variance: any residual is infinite
        return float(np.median(np.divide(resid, scale, out=fallback, where=scale > 0)))

    tau2 = 0.0
    if values.size >= 3 and median_z(0.0) > target:
        lo, hi = 0.0, float(np.square(resid).max()) / target**2 + 1e-300
        for _ in range(_BISECTIONS):
            mid = 0.5 * (lo + hi)
            if median_z(mid) > target:
                lo = mid
            else:
                hi = mid
        tau2 = hi
    var_centre = math.pi / 2.0 * float((within + tau2).sum()) / values.size**2
    return centre, tau2, var_centre


@dataclass(frozen=True)
class SiteFactor:
    """Each site's log ratio of observed to expected loss and its standardised excess."""

    x: FloatArray
    """(K,) log(O_k / E_k); NaN for a site with no class in the fit."""
    within: FloatArray
    """(K,) sampling variance of x (0 without spreads)."""
    centre: float
    tau2: float
    var_centre: float
    df: float
    """Degrees of freedom of the t reference (inf, the normal, only when no site has a ratio)."""
    z: FloatArray
    """(K,) standardised excess; NaN where x is NaN."""
    fitted: BoolArray
    """(K,) the sites the final fit of centre and tau used."""
    cells: tuple[FloatArray, FloatArray, FloatArray] | None = None
    """(K, C) each class's share of ``O_k``, ``E_k`` and ``V_k`` (0 where it did not enter), for
    :meth:`class_shift`; None: only the site's total is known."""

    def p_values(self, direction: float = 1.0) -> FloatArray:
        """One-sided p per site (1: a higher loss than the null; -1: lower); 1.0 where no x."""
        ok = np.isfinite(self.z)
        zd = np.where(ok, direction * self.z, 0.0)
        p = ndtr(-zd) if math.isinf(self.df) else student_t.sf(zd, self.df)
        return np.asarray(np.where(ok, p, 1.0), dtype=np.float64)

    def count_dispersion(self) -> float:
        """The dispersion of error counts this spread of difficulty implies: a log-normal factor
        of variance tau^2 has squared coefficient of variation exp(tau^2) - 1 (the floor of
        :mod:`service.audit.error_evidence`'s phi), at most 1. 0 without sampling variances
        (no spreads): tau then holds the sampling spread too, not only the difficulty."""
        if not np.any(np.nan_to_num(self.within) > 0) or not math.isfinite(self.tau2):
            return 0.0
        return float(min(np.expm1(self.tau2), 1.0))

    def shrunken_shift(self, direction: float = 1.0) -> FloatArray:
        """(x - centre) tau^2 / (tau^2 + within): each site's predicted difficulty (log scale),
        kept only where it lies in ``direction`` (1: a harder site, whose losses are divided
        down; -1: an easier one) and 0 elsewhere (module docstring, "The classes given the
        site"); zeros without a between-site spread or without sampling variances (no
        spreads)."""
        if not self._adjusts():
            return np.zeros(self.x.size)
        ok = np.isfinite(self.x)
        shift = np.where(ok, self._shrunk(self.x, np.where(ok, self.within, 0.0)), 0.0)
        return _one_way(shift, direction)

    def class_shift(self, direction: float = 1.0) -> FloatArray:
        """(K, C): for each class of a site, :meth:`shrunken_shift` computed over the site's
        *other* classes (module docstring, "The classes given the site"); over all its classes
        where it holds no other ((K, 1) where the classes are not known: without spreads)."""
        whole = self.shrunken_shift(direction)
        if self.cells is None or not self._adjusts():
            return whole[:, None] if self.cells is None else np.zeros(self.cells[0].shape)
        observed, expected, variance = self.cells
        rest_o = observed.sum(axis=1, keepdims=True) - observed
        rest_e = expected.sum(axis=1, keepdims=True) - expected
        rest_v = variance.sum(axis=1, keepdims=True) - variance
        # The other classes judge a class only where they carry at least its expected loss:
        # one small class cannot set a binary site's factor (module docstring).
        ok = (rest_o > 0) & (rest_e >= expected) & (rest_e > 0) & np.isfinite(self.x)[:, None]
        safe_o, safe_e = np.where(ok, rest_o, 1.0), np.where(ok, rest_e, 1.0)
        shift = self._shrunk(np.log(safe_o / safe_e), rest_v / np.square(safe_e))
        return _one_way(np.where(ok, shift, whole[:, None]), direction)

    def _adjusts(self) -> bool:
        """Whether any site is adjusted: a between-site spread and sampling variances."""
        return self.tau2 > 0.0 and bool(np.any(np.nan_to_num(self.within) > 0))

    def _shrunk(self, x: FloatArray, within: FloatArray) -> FloatArray:
        """The best linear predictor of the difficulty of log ratios ``x`` of variance
        ``within``: ``(x - centre) tau^2 / (tau^2 + within)``."""
        return np.asarray((x - self.centre) * (self.tau2 / (self.tau2 + within)), dtype=np.float64)


def _one_way(shift: FloatArray, direction: float) -> FloatArray:
    """``shift`` where it lies in ``direction``, 0 elsewhere."""
    return np.asarray(np.where(direction * shift > 0.0, shift, 0.0), dtype=np.float64)


def _pooled_sample_variance(counts: IntArray, sd: FloatArray, rows: BoolArray) -> FloatArray:
    """Per class, the pooled per-sample variance (ddof 1) of the sites in ``rows`` holding it."""
    n = counts.astype(np.float64)
    use = rows[:, None] & (counts > 0)
    num = np.where(use, n * np.square(np.nan_to_num(sd)), 0.0).sum(axis=0)
    dof = np.where(use, np.maximum(n - 1.0, 0.0), 0.0).sum(axis=0)
    return np.asarray(np.divide(num, dof, out=np.zeros(n.shape[1]), where=dof > 0))


def site_factor(
    loss: FloatArray,
    counts: IntArray,
    sd: FloatArray | None,
    centres: FloatArray,
    *,
    exclude: BoolArray | None = None,
) -> SiteFactor:
    """The site-level test of the module docstring.

    Parameters
    ----------
    loss, counts : ndarray of shape (K, C)
        Per-class mean losses (NaN where not held) and counts.
    sd : ndarray of shape (K, C) or None
        Reported per-sample spreads; None: no sampling variance (module docstring, last
        paragraph).
    centres : ndarray of shape (C,)
        The class-level fit's consensus loss per class; NaN for a class that did not enter.
    exclude : ndarray of bool of shape (K,), optional
        Sites left out of the fit (their z is still computed), unless fewer than 3 would remain.
    """
    k = loss.shape[0]
    n = counts.astype(np.float64)
    entered = (counts > 0) & np.isfinite(centres)[None, :]
    mu = np.where(np.isfinite(centres), centres, 0.0)
    observed = np.where(entered, n * np.nan_to_num(loss), 0.0).sum(axis=1)
    expected = np.where(entered, n * mu[None, :], 0.0).sum(axis=1)
    ok = entered.any(axis=1) & (observed > 0) & (expected > 0)
    safe_o, safe_e = np.where(ok, observed, 1.0), np.where(ok, expected, 1.0)
    x = np.where(ok, np.log(safe_o / safe_e), np.nan)

    fit_rows = ok if exclude is None else ok & ~exclude
    if int(fit_rows.sum()) < 3:
        fit_rows = ok
    cells = None
    if sd is None:
        within = np.zeros(k)
    else:
        pooled = _pooled_sample_variance(counts, sd, fit_rows)
        v_cells = np.where(entered, n * pooled[None, :], 0.0)
        within = np.where(ok, v_cells.sum(axis=1) / np.square(safe_e), np.nan)
        cells = (
            np.where(entered, n * np.nan_to_num(loss), 0.0),
            np.where(entered, n * mu[None, :], 0.0),
            v_cells,
        )

    if not fit_rows.any():
        nan = np.full(k, np.nan)
        return SiteFactor(x, within, math.nan, 0.0, 0.0, math.inf, nan, fit_rows, cells)

    def standardised(centre: float, tau2: float, var_centre: float) -> FloatArray:
        scale = np.sqrt(tau2 + within + var_centre)
        return np.asarray(
            np.divide(x - centre, scale, out=np.full(k, np.nan), where=ok & (scale > 0))
        )

    fitted = fit_rows.copy()
    trim = sd is not None
    if trim and int(fit_rows.sum()) >= 3:
        # Start from the shortest half: a noisy minority (40 % of the sites far above) bends
        # the median and the MAD so far that the noisy sites stay inside z < 2.
        centre, scale = shortest_half(x[fit_rows])
        tau2 = max(scale**2 - float(np.median(within[fit_rows])), 0.0)
        var_centre = math.pi / 2.0 * float((within[fit_rows] + tau2).sum()) / fit_rows.sum() ** 2
        fitted = np.zeros(k, dtype=bool)  # nothing fitted by the median yet
    else:
        centre, tau2, var_centre = fit_site_null(x[fitted], within[fitted])
    z = standardised(centre, tau2, var_centre)
    if trim:
        target = truncated_mad_target(TRIM_Z)
        seen: list[BoolArray] = []
        for _ in range(_MAX_TRIMS):
            kept = fit_rows & (np.nan_to_num(z, nan=np.inf) < TRIM_Z)
            if int(kept.sum()) <= int(fit_rows.sum()) // 2:
                kept = fit_rows  # the trim would keep half or fewer: fit them all
            if np.array_equal(kept, fitted):
                break
            if any(np.array_equal(kept, earlier) for earlier in seen):
                # A cycle (a site's z alternating about the cut): fit the larger of the two sets.
                kept = kept | fitted
                if np.array_equal(kept, fitted):
                    break
            seen.append(kept)
            fitted = kept
            trimmed = not np.array_equal(kept, fit_rows)
            centre, tau2, var_centre = fit_site_null(
                x[fitted], within[fitted], target if trimmed else MAD_NORMAL
            )
            z = standardised(centre, tau2, var_centre)
    df = max(MEDIAN_SCALE_EFFICIENCY * (int(fitted.sum()) - 1), 1.0)
    return SiteFactor(x, within, centre, tau2, var_centre, df, z, fitted, cells)
