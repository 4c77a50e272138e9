"""Calibrated evidence of label noise: one p-value per site, a stated false-alarm rate, abstention.

The mixture detectors of the papers (FedNoRo's two-component GMM on per-class losses, Fed-NCL's
mean + beta * sigma rule) split the federation into two groups every round and then need guards to
decide whether the split means anything. This module asks a different question, one site at a
time: *is this site's loss on its own labels higher than a clean site's would be, given how many
samples of each class it holds?* It answers with a p-value under a stated null model, and turns
the p-values of a round into flags with a multiple-testing rule whose false-alarm rate is a number.

**Signal.** FedNoRo's per-class loss vector (Wu et al., IJCAI 2023, section 4.1, eq. 3's input):
``L[k, c]``, the global model's mean cross-entropy on site k's samples labelled c, with the counts
``n[k, c]`` and, when the SDK sends it, the standard deviation ``s[k, c]`` of the same per-sample
losses. A wrong label on a sample the model has learned costs several nats, so label noise raises
``L[k, c]`` on the classes that received wrong labels; a site is compared **only on the classes it
holds** (label skew: a site with 2 of 10 classes is judged on those 2).

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
that a minority of noisy sites moves neither. The standardised excess is

    z[k, c] = (L[k, c] - mu_c) / sqrt(tau_c^2 + sigma_c^2 / n[k, c] + var(mu_c)),

about N(0, 1) for a clean site (``var(mu_c)`` is the median's sampling variance,
pi / 2 / sum_k w_kc with w the inverse variances). The fit runs twice: the second pass leaves
out of each class's fit the sites the first pass flagged (where enough holders remain), so that a
class held mostly by noisy sites does not make its clean holders look wrong.

**One p-value per site**, the smallest of three parts times three (Bonferroni, valid whatever
their dependence): ``p_k = min(1, 3 * min(p_site, p_stouffer, m * min_c p_c))``; in a round of
fewer than 10 sites (:data:`SITE_LEVEL_MIN_SITES`), and in anchored mode, without the site part
and the adjustment, ``min(1, 2 * min(p_stouffer, m * min_c p_c))``.

* ``p_site``: the site as a whole (:mod:`service.audit.site_factor`): its total loss against the
  total its class mix predicts, on the log scale, against a between-site spread of difficulty
  fitted robustly over the sites, with Student's t tail. Clean sites differ as a whole (another
  scanner makes every class harder); a test that adds up the classes as if independent counts
  that one difference once per class (with 1,000 samples per site and a log-normal spread of
  0.3 in difficulty, a clean site was flagged in 77 % of the rounds).
* The classes are then judged *given the site's difficulty*: each site's losses divided by its
  shrunken factor (the best linear predictor of its difficulty; nothing changes where no
  between-site spread is found) and the class fit repeated. ``p_stouffer`` is Stouffer's
  combination of those class z with weights sqrt(n[k, c]) (dense noise: every class a little;
  a class held fewer than ``min_class_count`` times enters with its z capped at +-3,
  :data:`SMALL_CLASS_Z_CAP`: the normal tail is wrong for the mean of a handful of samples of a
  very skewed loss, and on clean digit federations one hard sample of a class a site held once
  gave z = 30). ``m * min_c p_c`` is the smallest per-class p times the number of classes
  (noise in one class; only classes of which the site holds at least ``min_class_count``
  samples).

The verdict shows the site-level ``site_z`` (the score is it, or the per-class part's
z-equivalent where larger), ``site_factor`` (the site's loss over what its class mix predicts), the
Stouffer z, and the class z *as reported* (against each class's consensus, not adjusted for the
site: where the site's loss is high).

**Flags.** Benjamini and Hochberg's step-up rule ("Controlling the false discovery rate", JRSS-B
1995, section 3) at level ``q`` over the sites of the round. With exact p-values, when no site is
noisy it flags somebody in a round with probability at most ``q`` (the rule controls the
family-wise error under the global null), so the expected number of rounds with a false alarm
over R audited rounds is at most ``q * R`` (0.3 for the default ``q = 0.01`` and 30 rounds); with
noisy sites present, at most a fraction ``q`` of the flags are expected to be wrong. The
p-values are close to exact when the spreads are reported and the sites differ only by sampling
(``tests/audit/test_evidence.py`` simulates it: at most 3 % of rounds with a flag, 5 to 50
sites). They are **not** when ``tau_c`` must be estimated from a few holders or the spreads are
missing: the robust scale of five values is itself uncertain and the tails of z grow (an
independent check measured 8.7 % of rounds with a false flag for 5 sites with tau = 0.1, and
8-13 % for 5-10 sites without spreads, at q = 0.01); a small-sample correction is still to come.
The status rule across rounds (:func:`~service.audit.detection.next_status`) then needs several
flagged rounds before the aggregation treats a site as noisy. With sites that differ in
difficulty the site-level part brings the false alarms down but not to q: simulated, 20 clean
sites of 1,000 samples whose difficulty differs by a log-normal factor of spread 0.3 see a false
flag in 3 % of the rounds, 10 such sites in 17 % (``docs/eval/error_counts_simulation.py
--large``; 78 % and 53 % before the site-level part).

**Abstention** (``status="inconclusive"``, nobody flagged: every flag None, the scores and
evidence kept, the reason stated): the evidence is only
as good as the consensus it is measured against. The audit abstains when

* (``undetermined``, no verdicts) fewer than ``min_clients`` sites reported;
* the global model does not beat the label prior on the median site's own data: the weighted
  median over sites of 1 - L_k / H (L_k the site's mean loss, H the entropy of the federation's
  label histogram, the loss of a model that predicts the prior) is below ``min_informativeness``;
  the model has not learned yet, or it learned the labels' noise;
* the sites disagree far beyond sampling error (only with reported spreads; without them the
  fitted scale absorbs the spread and I^2 is 0): Higgins and Thompson's I^2 ("Quantifying
  heterogeneity in a meta-analysis", Statistics in Medicine 2002, eq. 9, here tau^2 over tau^2
  plus the median sampling variance), weighted over the classes by their samples, above
  ``max_heterogeneity`` (0.9): two camps of equal size, or a spread of noise rates with no clean
  core, leave no consensus (the robust fit then takes the gap for heterogeneity and flags
  nobody, and saying "ok" would hide that);
* the sites that would be flagged are not a clear minority: ``max_flagged_fraction`` (one half) or
  more of the sites or of the samples;
* FedNoRo's two-component loss mixture (the FedNoRo paper, section 4.1, with our calibrated
  separation guard: :class:`~service.audit.detectors.fednoro.FedNoRoDetector`), run as a
  cross-check, splits the sites into two separated groups and the higher-loss group is not a
  clear minority (``max_flagged_fraction`` of the sites or of the samples). A noisy majority
  whose rates vary (6 of 10 breast-cancer sites at 30-50 %) moves the robust centre into the
  noisy group and widens ``tau_c``, so that no site is significantly above or below it, while
  the clean minority stays a tight group below the others: the mixture sees the two groups, and
  the evidence alone would have said "ok";
* the evidence points both ways: some sites are significantly *above* the consensus and other
  sites significantly *below* it (the same rule on the lower tail). Clean sites are not cleaner
  than clean, so a significant lower tail among the unflagged means the consensus itself is
  noisy. (A flagged site may have classes below the consensus: a pair flip c -> c + 1 leaves a
  site's class c + 1 full of class-c samples the model has partly learned to call c + 1.)

**Trust anchors** (beyond the papers): sites an admin marks as curated. Anchors are never flagged.
When the consensus verdict is inconclusive, or the anchors look noisy against the consensus (each
anchor's site-level z (Stouffer's below 10 sites) positive and its site p-value passing BH at
``q`` among the anchors), the
anchors become the reference: each
class's centre is the anchors' precision-weighted mean loss, the noisy direction is away from the
anchors (*lower* loss than the anchors when the anchors look noisy to the consensus: the global
model learned inverted labels), and the sites significantly away from the anchors in that
direction are flagged by the same rule (no minority rule: with the orientation settled by the
anchors, a noisy majority can be flagged). The verdict stays inconclusive when some anchors look
noisy and others do not, when the spreads were not sent, or when no anchor holds a class. The
admin's word is the only thing that tells an inverted consensus from a noisy anchor (the labels
are the mirror image of each other): **a mistaken anchor, noisy itself, turns the audit upside
down** and flags the clean sites. Limits: with fewer than three anchors holding a class,
the between-site spread ``tau_c`` is not estimable from clean sites and is taken as 0, so sites
whose data differ from the anchors' (not only their labels) can look noisy; a class no anchor
holds gives no evidence in anchor mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from scipy.special import ndtr, ndtri

from service.audit._typing import BoolArray, FloatArray, IntArray
from service.audit._validation import (
    InvalidInputError,
    as_float_array,
    as_int_array,
    check_bool,
    check_float,
    check_int,
)
from service.audit.detection import ClientVerdict, DetectionResult
from service.audit.detectors.fednoro import FedNoRoDetector
from service.audit.error_evidence import ErrorEvidence, checked_error_counts, error_evidence
from service.audit.site_factor import SiteFactor, site_factor
from service.audit.small_federation import worse_than_prior

if TYPE_CHECKING:
    from service.audit.accuracy_evidence import AccuracyEvidence

__all__ = [
    "ClassNull",
    "EvidenceDetector",
    "benjamini_hochberg",
    "SITE_LEVEL_MIN_SITES",
    "SMALL_CLASS_Z_CAP",
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
    v, w = values[order], weights[order]
    cum = np.cumsum(w)
    half = 0.5 * cum[-1]
    i = int(np.searchsorted(cum, half, side="left"))
    if i + 1 < v.size and math.isclose(cum[i], half, rel_tol=1e-12, abs_tol=0.0):
        return float(0.5 * (v[i] + v[i + 1]))
    return float(v[i])


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

    def residual_median(tau2: float) -> tuple[float, float, FloatArray]:
        w = 1.0 / (within + tau2)
        mu = weighted_median(values, w)
        return float(np.median(np.abs(values - mu) * np.sqrt(w))), mu, w

    med, mu, w = residual_median(0.0)
    tau2 = 0.0
    if med > MAD_NORMAL and values.size >= 3:
        lo, hi = 0.0, float(np.square(values - np.median(values)).max()) / MAD_NORMAL**2 + 1e-300
        for _ in range(_TAU_BISECTIONS):
            mid = 0.5 * (lo + hi)
            if residual_median(mid)[0] > MAD_NORMAL:
                lo = mid
            else:
                hi = mid
        tau2 = hi
        _, mu, w = residual_median(tau2)
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
        own = np.square(sd[rows, c]) * nk / np.maximum(nk - 1.0, 1.0)
        dof = float(np.maximum(nk - 1.0, 0.0).sum())
        pooled = float((np.square(sd[rows, c]) * nk).sum() / dof) if dof > 0 else 0.0
        out[rows, c] = np.maximum(np.maximum(own, pooled), 1e-12) / nk
    return out


def class_evidence(
    per_class_loss: FloatArray,
    counts: IntArray,
    sd: FloatArray | None = None,
    *,
    min_holders: int = 3,
    exclude: BoolArray | None = None,
    reference: BoolArray | None = None,
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
            if int(fit_rows.sum()) < min_holders:
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


SITE_LEVEL_MIN_SITES = 10
"""Sites a round needs for the site-level part (:mod:`service.audit.site_factor`) to enter the
p-value (consensus mode only). Its between-site spread is fitted from the sites and judged with
Student's t on their number: with 5 to 8 sites the tail is so wide that noisy sites went unfound
(stress matrix, 3 seeds, measured with m - 1 degrees of freedom, more than the 0.37 (m - 1) used
now: m07's F1 mean 0.98 -> 0.80, m12's 0.91 -> 0.62), and that few sites cannot tell a harder
site from a noisy one anyway. Below it, and in anchored mode, the p-value is
``min(1, 2 min(p_stouffer, m min_c p_c))`` on the classes as reported."""

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
    """One-sided p-value and Stouffer statistic per site (module docstring, "One p-value").

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


@dataclass(frozen=True)
class _Pass:
    evidence: ClassEvidence
    """The class-level fit of the losses as reported (centres, spreads, I^2)."""
    class_z: FloatArray
    """(K, C) the class z given each site's difficulty (:mod:`service.audit.site_factor`)."""
    site: SiteFactor | None
    """The site-level test; None where it does not enter (below ``SITE_LEVEL_MIN_SITES`` sites,
    anchored mode)."""
    p_high: FloatArray
    z_high: FloatArray
    """(K,) in the pass's direction: the site-level z (0.0 for a site without one), or below
    ``SITE_LEVEL_MIN_SITES`` sites Stouffer's z; whether the site is above the consensus."""
    stouffer: FloatArray
    flags: BoolArray
    q_values: FloatArray
    low: BoolArray
    p_loss: FloatArray
    score: FloatArray
    """(K,) the site z, or the z-equivalent of its per-class part where that is larger."""
    errors: ErrorEvidence | None = None


def _checked_inputs(
    per_class_loss: Any, class_counts: Any, per_class_loss_sd: Any, anchors: Any
) -> tuple[FloatArray, IntArray, FloatArray | None, BoolArray]:
    """The round's arrays, checked: (loss, counts, spreads or None, anchors as booleans)."""
    loss = as_float_array("per_class_loss", per_class_loss, ndim=2, allow_nan=True)
    counts = as_int_array("class_counts", class_counts, ndim=2)
    if counts.shape != loss.shape:
        raise InvalidInputError(
            f"class_counts: shape {counts.shape} differs from per_class_loss {loss.shape}"
        )
    if (counts < 0).any():
        raise InvalidInputError("class_counts: negative count")
    held = counts > 0
    if (~np.isfinite(loss) & held).any():
        raise InvalidInputError("per_class_loss: missing or non-finite for a held class")
    if (loss[held] < 0).any():
        raise InvalidInputError("per_class_loss: negative loss")
    k = loss.shape[0]
    sd: FloatArray | None = None
    if per_class_loss_sd is not None:
        sd = as_float_array("per_class_loss_sd", per_class_loss_sd, ndim=2, allow_nan=True)
        if sd.shape != loss.shape:
            raise InvalidInputError(
                f"per_class_loss_sd: shape {sd.shape} differs from per_class_loss {loss.shape}"
            )
        if (~np.isfinite(sd) & held).any() or (sd[held] < 0).any():
            raise InvalidInputError("per_class_loss_sd: missing or negative for a held class")
    anchor = np.zeros(k, dtype=bool)
    if anchors is not None:
        raw = np.asarray(anchors).reshape(-1)
        if raw.size and raw.dtype.kind != "b":
            raise InvalidInputError("anchors: expected booleans")
        anchor = raw.astype(bool)
        if anchor.shape != (k,):
            raise InvalidInputError(f"anchors: {anchor.size} entries for {k} clients")
    return loss, counts, sd, anchor


class EvidenceDetector:
    """Calibrated per-site evidence with abstention and trust anchors (module docstring).

    Parameters
    ----------
    q : float, default=0.01
        Benjamini-Hochberg level per round.
    min_clients : int, default=5
        Fewer reporting sites: inconclusive.
    min_holders : int, default=3
        Sites that must hold a class for it to enter the consensus fit.
    min_informativeness : float, default=0.05
        1 - L / H the median site must reach (module docstring, "Abstention").
    max_flagged_fraction : float, default=0.5
        Flagging this fraction of the sites or of the samples, or more, is inconclusive.
    min_class_count : int, default=5
        Samples a site must hold of a class for that class alone to flag it (the per-class part
        of the site's p-value); fewer still count in Stouffer's part. The normal tail is wrong
        for the mean of one to a few samples of a very skewed loss: on clean Dirichlet
        federations of digits, a class a site held *once* gave that site z of 4-5 (one hard
        sample).
    max_heterogeneity : float, default=0.9
        The sites' disagreement beyond sampling error (I^2, sample-weighted over the classes)
        above which the consensus is inconclusive.
    mixture_check : bool, default=True
        Abstain when FedNoRo's loss mixture splits off a higher-loss group that is not a clear
        minority (module docstring, "Abstention").
    small_min_informativeness : float, default=0.5
        With 2 to ``min_clients - 1`` sites (and spreads), the narrower rule of
        :mod:`service.audit.small_federation` judges the round; this is the median ``1 - L/H``
        the sites it does not flag must reach.
    accuracy_check : bool, default=False
        When every site reported its local model's accuracy on its own labels, also flag the
        sites whose accuracy is significantly and at least ``min_accuracy_gap`` below the
        others' (:mod:`service.audit.accuracy_evidence`): a site that lies about its losses.
    min_accuracy_gap : float, default=0.25
        The accuracy test's practical-significance floor (absolute error above the centre).
    error_check : bool, default=False
        When every site reported ``per_class_errors``, combine the loss evidence with the
        error-count evidence of :mod:`service.audit.error_evidence` (consensus mode; Bonferroni
        over the two).
    min_error_excess : float, default=0.05
        The error-count test's practical-significance floor: a site's error rate must be at
        least this far above the expected one (its total, or one class's).
    min_error_sites : int, default=10
        Sites a round needs for the error counts to enter: their between-site spread is
        estimated from the sites' lower tail, which a handful of sites hardly has (8 clean-ish
        BreastMNIST sites: a clean site at 15 % errors against 5 % expected was flagged in one
        round, the spread estimated at 0).
    """

    method = "evidence"

    def __init__(
        self,
        q: float = 0.01,
        min_clients: int = 5,
        min_holders: int = 3,
        min_informativeness: float = 0.05,
        max_flagged_fraction: float = 0.5,
        max_heterogeneity: float = 0.9,
        min_class_count: int = 5,
        small_min_informativeness: float = 0.5,
        mixture_check: bool = True,
        accuracy_check: bool = False,
        min_accuracy_gap: float = 0.25,
        error_check: bool = False,
        min_error_excess: float = 0.05,
        min_error_sites: int = 10,
    ) -> None:
        self.q = check_float("q", q, min_value=0.0, max_value=0.5, min_inclusive=False)
        self.min_clients = check_int("min_clients", min_clients, min_value=2)
        self.min_holders = check_int("min_holders", min_holders, min_value=3)
        self.min_informativeness = check_float(
            "min_informativeness", min_informativeness, min_value=-1.0, max_value=1.0
        )
        self.max_flagged_fraction = check_float(
            "max_flagged_fraction",
            max_flagged_fraction,
            min_value=0.0,
            max_value=1.0,
            min_inclusive=False,
        )
        self.min_class_count = check_int("min_class_count", min_class_count, min_value=1)
        self.small_min_informativeness = check_float(
            "small_min_informativeness", small_min_informativeness, min_value=-1.0, max_value=1.0
        )
        self.max_heterogeneity = check_float(
            "max_heterogeneity", max_heterogeneity, min_value=0.0, max_value=1.0
        )
        self.mixture_check = check_bool("mixture_check", mixture_check)
        self.accuracy_check = check_bool("accuracy_check", accuracy_check)
        self.min_accuracy_gap = check_float(
            "min_accuracy_gap", min_accuracy_gap, min_value=0.0, max_value=1.0
        )
        self.error_check = check_bool("error_check", error_check)
        self.min_error_excess = check_float(
            "min_error_excess", min_error_excess, min_value=0.0, max_value=1.0
        )
        self.min_error_sites = check_int("min_error_sites", min_error_sites, min_value=3)

    # ----------------------------------------------------------------------------------------

    def _pass(
        self,
        loss: FloatArray,
        counts: IntArray,
        sd: FloatArray | None,
        exclude: BoolArray | None,
        reference: BoolArray | None,
        direction: float,
        never: BoolArray,
        wrong: IntArray | None = None,
    ) -> _Pass:
        """One fit and its flags (module docstring, "One p-value per site"); with ``wrong``
        (consensus mode only) the site's p-value is the Bonferroni combination of the loss and
        the error-count evidence."""
        ev = class_evidence(
            loss, counts, sd, min_holders=self.min_holders, exclude=exclude, reference=reference
        )
        # Consensus mode only: in anchored mode tau would come from the few anchors, and with
        # 0.37 (anchors - 1) degrees of freedom the site part's tail is too wide to find anyone.
        site = (
            site_factor(loss, counts, sd, ev.mu, exclude=exclude)
            if reference is None and loss.shape[0] >= SITE_LEVEL_MIN_SITES
            else None
        )
        class_z = ev.z
        shift = None if site is None else site.shrunken_shift()
        if shift is not None and np.any(shift != 0.0):
            scale = np.exp(-shift)[:, None]
            class_z = class_evidence(
                loss * scale,
                counts,
                None if sd is None else sd * scale,
                min_holders=self.min_holders,
                exclude=exclude,
                reference=reference,
            ).z

        def loss_p(d: float) -> tuple[FloatArray, FloatArray, FloatArray]:
            """(the site's loss p-value, its Stouffer z, its per-class part) in direction d."""
            stouffer = site_p_values(class_z, counts, d, self.min_class_count)[1]
            p_class = class_p_values(class_z, counts, d, self.min_class_count)
            if site is None:
                p = np.minimum(1.0, 2.0 * np.minimum(p_class, ndtr(-stouffer)))
            else:
                parts = np.minimum(np.minimum(site.p_values(d), p_class), ndtr(-stouffer))
                p = np.minimum(1.0, 3.0 * parts)
            return np.asarray(p), stouffer, p_class

        p_loss, stouffer, p_class = loss_p(direction)
        z_high = (
            stouffer if site is None else np.where(np.isfinite(site.z), direction * site.z, 0.0)
        )
        class_score = -ndtri(np.clip(2.0 * p_class, 1e-300, 1.0))  # -inf where p is 1
        score = np.maximum(z_high, class_score)
        counted: ErrorEvidence | None = None
        p_high = p_loss
        if wrong is not None and reference is None:
            counted = error_evidence(
                wrong,
                counts,
                min_holders=self.min_holders,
                exclude=exclude,
                min_excess=self.min_error_excess,
                min_class_count=self.min_class_count,
            )
            p_high = np.minimum(1.0, 2.0 * np.minimum(p_loss, counted.p_value))
        p_high = np.where(never, 1.0, p_high)
        flags, q_values = benjamini_hochberg(p_high, self.q)
        low, _ = benjamini_hochberg(np.where(never, 1.0, loss_p(-direction)[0]), self.q)
        return _Pass(
            ev,
            class_z,
            site,
            p_high,
            z_high,
            stouffer,
            flags,
            q_values,
            low,
            p_loss,
            score,
            counted,
        )

    def _consensus_reason(
        self,
        result: _Pass,
        sizes: FloatArray,
        entropy: float,
        informativeness: float,
        heterogeneity: float,
        mixture: BoolArray | None,
    ) -> str | None:
        """Why the consensus verdict abstains (module docstring, "Abstention"); None: it holds.

        ``mixture``: the sites FedNoRo's loss mixture flags (None: not run or undetermined).
        """
        k = sizes.size
        n_flag = int(result.flags.sum())
        share = float(sizes[result.flags].sum() / sizes.sum())
        below = int((result.low & ~result.flags).sum())
        if entropy <= 0:
            return "every label belongs to one class: nothing to compare"
        if informativeness < self.min_informativeness:
            return (
                f"the global model does not beat the label prior on the median site's data "
                f"(1 - loss/H = {informativeness:.3f} < {self.min_informativeness}): it has not "
                "learned yet, or it learned the noise"
            )
        if heterogeneity > self.max_heterogeneity:
            return (
                f"the sites disagree far beyond sampling error (I^2 = {heterogeneity:.2f} > "
                f"{self.max_heterogeneity}): no consensus to measure against"
            )
        if mixture is not None and mixture.any():
            n_mix = int(mixture.sum())
            mix_share = float(sizes[mixture].sum() / sizes.sum())
            if n_mix >= self.max_flagged_fraction * k or mix_share >= self.max_flagged_fraction:
                return (
                    f"FedNoRo's loss mixture splits the sites into two separated groups and the "
                    f"higher-loss group is not a clear minority ({n_mix} of {k} sites, "
                    f"{mix_share:.0%} of the samples): the consensus may be the noisy side"
                )
        if n_flag >= self.max_flagged_fraction * k or share >= self.max_flagged_fraction:
            return (
                f"the sites that would be flagged are not a clear minority ({n_flag} of {k} "
                f"sites, {share:.0%} of the samples)"
            )
        if n_flag > 0 and below > 0:
            return (
                f"the evidence points both ways: {n_flag} site(s) significantly above the "
                f"consensus and {below} other(s) significantly below it"
            )
        return None

    def _anchored(
        self,
        loss: FloatArray,
        counts: IntArray,
        sd: FloatArray | None,
        anchor: BoolArray,
        consensus: _Pass,
        reason: str | None,
    ) -> tuple[_Pass | None, bool, str | None]:
        """Anchor mode (module docstring, "Trust anchors"): the anchored pass when it replaces the
        consensus (else None), whether the anchors look noisy to the consensus, and the reason
        the verdict abstains (None: it does not)."""
        # An anchor "looks noisy" to the consensus when its z (site-level, or Stouffer's below
        # SITE_LEVEL_MIN_SITES sites) is positive and its
        # loss p-value passes BH among the anchors.
        anchor_p, anchor_z = consensus.p_loss[anchor], consensus.z_high[anchor]
        looks_noisy = benjamini_hochberg(anchor_p, self.q)[0] & (anchor_z > 0)
        inverted = bool(looks_noisy.any())
        if inverted and not looks_noisy.all():
            return (
                None,
                inverted,
                f"the trust anchors disagree: {int(looks_noisy.sum())} of {int(anchor.sum())} "
                "look noisy against the consensus, the others do not; check the anchors",
            )
        if reason is None and not inverted:
            return None, inverted, None
        anchored = self._pass(loss, counts, sd, None, anchor, -1.0 if inverted else 1.0, anchor)
        why = reason or "an anchor looks noisy against the consensus"
        if sd is None:
            return None, inverted, why + "; anchored mode needs the sites' per_class_loss_sd"
        if not np.isfinite(anchored.evidence.mu).any():
            return None, inverted, why + "; no anchor holds a class the others hold"
        return anchored, inverted, None

    @staticmethod
    def _mixture_split(
        loss: FloatArray, counts: IntArray, mixture: DetectionResult | None
    ) -> BoolArray | None:
        """The sites FedNoRo's detector flags (``mixture``, or a fit with its defaults and its
        calibrated separation guard); None when it is undetermined."""
        if mixture is None:
            if (counts.sum(axis=1) == 0).any():
                return None  # the mixture needs a sample from every site
            mixture = FedNoRoDetector().fit(loss, counts).result_
        if mixture.status != "ok" or len(mixture.verdicts) != loss.shape[0]:
            return None
        return np.asarray([v is not None and v.flag is True for v in mixture.verdicts], dtype=bool)

    def _too_few_sites(
        self, loss: FloatArray, counts: IntArray, sd: FloatArray | None, anchor: BoolArray
    ) -> DetectionResult:
        """Fewer than ``min_clients`` sites: the narrower question of
        :mod:`service.audit.small_federation` with spreads (it needs no between-site spread),
        else no verdict."""
        k = loss.shape[0]
        if k >= 2 and sd is not None:
            return worse_than_prior(
                np.where(counts > 0, loss, np.nan),
                counts,
                sd,
                q=self.q,
                max_flagged_fraction=self.max_flagged_fraction,
                min_other_informativeness=self.small_min_informativeness,
                adjust=benjamini_hochberg,
                never=anchor,
            )
        return DetectionResult(
            method=self.method,
            status="undetermined",
            reason=(
                f"{k} sites reported; the evidence needs at least {self.min_clients}"
                + ("" if k < 2 else " (or 2 with per_class_loss_sd)")
            ),
            verdicts=[None] * k,
            summary={"verdict": "undetermined", "q": self.q},
        )

    def _accuracy(
        self, train_accuracy: Any, num_samples: Any, k: int, anchor: BoolArray, mode: str
    ) -> tuple[AccuracyEvidence | None, str | None]:
        """The accuracy evidence of the round, or None with why it was not used."""
        if not self.accuracy_check:
            return None, None
        if train_accuracy is None or num_samples is None:
            return None, "no accuracy evidence: not every site reported train_accuracy"
        if mode != "consensus":
            return None, "no accuracy evidence: the anchors orient the loss evidence only"
        if k < 3:
            return None, f"no accuracy evidence: {k} sites (it needs 3)"
        # Imported here: that module builds on this one's null fit and step-up rule.
        from service.audit.accuracy_evidence import accuracy_evidence

        for name, values in (("train_accuracy", train_accuracy), ("num_samples", num_samples)):
            if np.asarray(values).reshape(-1).size != k:
                raise InvalidInputError(
                    f"{name}: {np.asarray(values).size} entries for {k} clients"
                )
        evidence = accuracy_evidence(
            train_accuracy, num_samples, q=self.q, min_gap=self.min_accuracy_gap, never=anchor
        )
        return evidence, None

    @staticmethod
    def _error_entry(counted: ErrorEvidence | None, i: int) -> dict[str, Any]:
        """The error-count evidence's part of a site's verdict (nothing when it was not used)."""
        if counted is None:
            return {}
        return {
            "errors": int(counted.observed[i]),
            "errors_expected": float(counted.expected[i]),
            "errors_z": float(counted.z[i]),
            "errors_p_value": float(counted.p_value[i]),
        }

    @staticmethod
    def _accuracy_entry(accuracy: AccuracyEvidence | None, i: int, added: bool) -> dict[str, Any]:
        """The accuracy evidence's part of a site's verdict (nothing when it was not used)."""
        if accuracy is None:
            return {}
        return {
            "accuracy_z": float(accuracy.z[i]),
            "accuracy_p_value": float(accuracy.p_value[i]),
            "accuracy_gap": float(accuracy.gap[i]),
            "flagged_by_accuracy": added,
        }

    def _noisy_classes(self, z: FloatArray, counts: IntArray) -> list[int]:
        """The site's classes whose loss alone is significantly above the class consensus
        (one-sided normal p times the number of classes it holds ``min_class_count`` samples
        of, doubled, at most q), highest z first: where the wrong labels are."""
        tested = np.isfinite(z) & (counts >= self.min_class_count)
        m = max(int(tested.sum()), 1)
        order = np.argsort(-np.nan_to_num(z, nan=-np.inf), kind="stable")
        return [int(c) for c in order if tested[c] and 2.0 * ndtr(-z[c]) * m <= self.q]

    @staticmethod
    def _informativeness(
        loss: FloatArray, counts: IntArray, sizes: FloatArray
    ) -> tuple[float, FloatArray, float]:
        """(entropy H of the label histogram, each site's mean loss, the weighted median over
        sites of 1 - L_k / H): how much the consensus model beats the label prior."""
        prior = counts.sum(axis=0).astype(np.float64)
        prior = prior[prior > 0] / prior.sum()
        entropy = float(-(prior * np.log(prior)).sum())
        held = counts > 0
        site_loss = np.nansum(np.where(held, loss * counts, 0.0), axis=1) / np.maximum(sizes, 1)
        informativeness = (
            weighted_median(1.0 - site_loss / entropy, sizes) if entropy > 0 else -math.inf
        )
        return entropy, site_loss, informativeness

    @staticmethod
    def _heterogeneity(evidence: ClassEvidence, counts: IntArray) -> float:
        """I^2 of the classes that entered, weighted by their samples (0.0: none entered)."""
        class_weight = counts.sum(axis=0).astype(np.float64)
        entered = np.isfinite(evidence.heterogeneity)
        if not entered.any():
            return 0.0
        weighted = evidence.heterogeneity[entered] * class_weight[entered]
        return float(weighted.sum() / class_weight[entered].sum())

    def _add_accuracy(
        self, flags: BoolArray, accuracy: AccuracyEvidence, sizes: FloatArray
    ) -> tuple[BoolArray, BoolArray, str | None]:
        """The flags with the accuracy evidence's added, the sites it added, and a note when it
        was set aside (it would have flagged ``max_flagged_fraction`` of the sites or samples)."""
        k = flags.size
        union = flags | accuracy.flags
        share = float(sizes[union].sum() / sizes.sum()) if sizes.sum() > 0 else 0.0
        if union.sum() >= self.max_flagged_fraction * k or share >= self.max_flagged_fraction:
            note = (
                f"accuracy evidence set aside: with it {int(union.sum())} of {k} sites "
                f"holding {share:.0%} of the samples would be flagged"
            )
            return flags, np.zeros(k, dtype=bool), note
        return union, accuracy.flags & ~flags, None

    def _verdicts(
        self,
        chosen: _Pass,
        direction: float,
        flags: BoolArray | None,
        counts: IntArray,
        site_loss: FloatArray,
        anchor: BoolArray,
        accuracy: AccuracyEvidence | None,
        accuracy_flags: BoolArray,
    ) -> list[ClientVerdict | None]:
        """One verdict per site; ``flags`` None: the round abstained (every flag None, so that
        the status rule does not count an inconclusive round as a clean one)."""
        # The loss evidence's score, or the error counts' z where that is larger.
        score = chosen.score if chosen.errors is None else np.maximum(chosen.score, chosen.errors.z)
        site = chosen.site
        relative = None if site is None else np.exp(site.x - site.centre)
        verdicts: list[ClientVerdict | None] = []
        for i in range(counts.shape[0]):
            # Shown: each class against its consensus, as reported (where the site's loss is
            # high); the per-class test itself reads the class z given the site's difficulty.
            zi = direction * chosen.evidence.z[i]
            if accuracy is not None and accuracy_flags[i]:
                # Flagged by its accuracy alone: its loss score is, by construction, unremarkable.
                score_i = max(score[i], accuracy.z[i])
            else:
                score_i = score[i]
            verdicts.append(
                ClientVerdict(
                    score=float(score_i),
                    flag=None if flags is None else bool(flags[i]),
                    evidence={
                        "p_value": float(chosen.p_high[i]),
                        "q_value": float(chosen.q_values[i]),
                        # + 0.0: no -0.0 in the JSON of an inverted pass.
                        "site_z": None if site is None else float(chosen.z_high[i]) + 0.0,
                        "site_factor": (
                            float(relative[i])
                            if relative is not None and np.isfinite(relative[i])
                            else None
                        ),
                        "stouffer_z": float(chosen.stouffer[i]),
                        "class_z": [None if not np.isfinite(v) else float(v) for v in zi],
                        "noisy_classes": self._noisy_classes(zi, counts[i]),
                        "mean_loss": float(site_loss[i]),
                        "anchor": bool(anchor[i]),
                        "significant": bool(chosen.flags[i]),
                        **self._error_entry(chosen.errors, i),
                        **self._accuracy_entry(accuracy, i, bool(accuracy_flags[i])),
                    },
                )
            )
        return verdicts

    def fit(
        self,
        per_class_loss: Any,
        class_counts: Any,
        per_class_loss_sd: Any = None,
        anchors: Any = None,
        mixture: DetectionResult | None = None,
        train_accuracy: Any = None,
        num_samples: Any = None,
        per_class_errors: Any = None,
    ) -> DetectionResult:
        """Judge one round.

        Parameters
        ----------
        per_class_loss : array-like of shape (K, C)
            NaN (or None) where the count is 0.
        class_counts : array-like of int of shape (K, C)
        per_class_loss_sd : array-like of shape (K, C), optional
            All sites' reported spreads, or None (a site without them makes the whole round use
            the fallback of :func:`class_evidence`).
        anchors : array-like of bool of shape (K,), optional
            Trust anchors.
        mixture : DetectionResult, optional
            FedNoRo's detector already fitted on this round (the pipeline's, as configured);
            None: fitted here with its defaults when ``mixture_check`` is on.
        train_accuracy, num_samples : array-like of shape (K,), optional
            Every site's local model's accuracy on its own labels and its sample count: with
            ``accuracy_check``, the accuracy evidence adds its flags in consensus mode.
        per_class_errors : array-like of int of shape (K, C), optional
            Every site's error counts of the global model per given label: with
            ``error_check``, the consensus pass combines them with the loss evidence.

        Returns
        -------
        DetectionResult
            Method ``"evidence"``; status ``"ok"``, ``"inconclusive"`` (every verdict present,
            every flag None, the reason stated) or ``"undetermined"`` (no verdicts).
        """
        loss, counts, sd, anchor = _checked_inputs(
            per_class_loss, class_counts, per_class_loss_sd, anchors
        )
        held = counts > 0
        k = loss.shape[0]
        if k < self.min_clients:
            return self._too_few_sites(loss, counts, sd, anchor)
        loss = np.where(held, loss, np.nan)
        sizes = counts.sum(axis=1).astype(np.float64)

        entropy, site_loss, informativeness = self._informativeness(loss, counts, sizes)

        wrong = (
            checked_error_counts("per_class_errors", per_class_errors, counts)
            if self.error_check and per_class_errors is not None
            else None
        )
        if wrong is not None and k < self.min_error_sites:
            wrong = None  # too few sites to estimate their spread (``min_error_sites``)
        first = self._pass(loss, counts, sd, None, None, 1.0, anchor, wrong)
        second = self._pass(loss, counts, sd, first.flags, None, 1.0, anchor, wrong)
        chosen, mode, direction = second, "consensus", 1.0
        heterogeneity = self._heterogeneity(second.evidence, counts)
        split = self._mixture_split(loss, counts, mixture) if self.mixture_check else None
        reason = self._consensus_reason(
            second, sizes, entropy, informativeness, heterogeneity, split
        )
        anchor_inverted = False
        if anchor.any() and entropy > 0:
            anchored, anchor_inverted, reason = self._anchored(
                loss, counts, sd, anchor, second, reason
            )
            if anchored is not None:
                chosen, mode = anchored, "anchored"
                direction = -1.0 if anchor_inverted else 1.0

        status: Literal["ok", "inconclusive"] = "ok" if reason is None else "inconclusive"
        flags = chosen.flags & (status == "ok")
        accuracy, accuracy_note = self._accuracy(train_accuracy, num_samples, k, anchor, mode)
        accuracy_flags = np.zeros(k, dtype=bool)
        if accuracy is not None and status == "ok":
            flags, accuracy_flags, accuracy_note = self._add_accuracy(flags, accuracy, sizes)
        verdicts = self._verdicts(
            chosen,
            direction,
            flags if status == "ok" else None,
            counts,
            site_loss,
            anchor,
            accuracy,
            accuracy_flags,
        )
        summary: dict[str, Any] = {
            "verdict": status,
            "reason": reason,
            "mode": mode,
            "q": self.q,
            "flagged": int(flags.sum()),
            "significant_high": int(chosen.flags.sum()),
            "significant_low": int(chosen.low.sum()),
            "informativeness": informativeness,
            "heterogeneity": heterogeneity,
            "mixture_flagged": None if split is None else int(split.sum()),
            "label_entropy": entropy,
            "anchors": int(anchor.sum()),
            "anchor_orientation": "inverted" if anchor_inverted else "consensus",
            "spreads_reported": sd is not None,
            "errors_counted": chosen.errors is not None,
            "errors_dispersion": None if chosen.errors is None else chosen.errors.dispersion,
            "accuracy_flagged": int(accuracy_flags.sum()),
            "accuracy_note": accuracy_note,
            "accuracy_centre": None if accuracy is None else 1.0 - accuracy.centre,
            "class_centre": [None if not np.isfinite(v) else float(v) for v in chosen.evidence.mu],
            "class_tau": [None if not np.isfinite(v) else float(v) for v in chosen.evidence.tau],
            "site_tau": None if chosen.site is None else math.sqrt(chosen.site.tau2),
            "site_df": (
                None if chosen.site is None or math.isinf(chosen.site.df) else chosen.site.df
            ),
        }
        return DetectionResult(
            method=self.method,
            status=status,
            reason=reason,
            verdicts=verdicts,
            summary=summary,
        )
