"""A verdict for federations too small for the calibrated evidence: worse than the label prior.

The calibrated evidence (:mod:`service.audit.evidence`) needs at least five sites, because it
estimates how much clean sites differ (``tau_c``) from the sites themselves. Two to four sites
cannot estimate that. They can still answer a narrower question that needs no between-site
model: *does the global model do worse on this site's own labels than a model that only knows
the label frequencies?*

**The prior's loss.** A model that predicts the federation's label histogram ``pi`` loses
``H = -sum_c pi_c log pi_c`` nats per sample on average (the entropy; on the samples labelled c
it loses ``-log pi_c``). A clean site's loss under a global model that has learned anything is
far below ``H``. A site whose labels are shuffled or systematically wrong loses more than ``H``:
the model is confident, and confidently wrong, on most of its samples.

**Test per site.** ``L_k`` is the site's sample-weighted mean loss. Its standard error comes
from the per-sample spreads the SDK reports: the variance of one sample's loss is
``V_k = sum_c n_kc (s_kc^2 + (L_kc - L_k)^2) / n_k`` (within- plus between-class). The site's
statistic is ``z_k = (L_k - H) / sqrt(V_k / n_k)``, and its p-value ``1 - Phi(z_k)`` (one-sided,
a mean of many samples; the central limit theorem). Flags come from Benjamini and Hochberg's
rule at level ``q`` over the sites (as the calibrated evidence).

**Abstention.** The rule stays ``inconclusive`` (nobody flagged) when the sites that would be
flagged are half of the sites or of the samples or more, and when the global model does not beat
the prior clearly on the *other* sites (the sample-weighted median of ``1 - L_j / H`` over the
sites not significant is below ``min_other_informativeness``): then "worse than the prior"
describes the model, not the site. The second rule holds when no site would be flagged too (the
other sites are then all of them): a model that knows little is above the prior nowhere, a site
with wrong labels included, so "nobody is worse than the prior" says nothing about the sites
either, and the round says that the model does not beat the prior yet instead of ``ok``.

**What it does not see.** Mild noise: a site with 10-30 % wrong labels usually stays below
``H``. The flag means "the global model does worse than guessing on this site's labels"; a site
whose inputs differ so much that the model is useless there is flagged too, and the reason says
what was measured. Without reported spreads there is no standard error, and the verdict is
``undetermined``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import numpy as np
from scipy.special import ndtr

from service.audit._typing import BoolArray, FloatArray, IntArray
from service.audit.detection import ClientVerdict, DetectionResult, EvidenceResult
from service.audit.pooling import sample_weights
from service.audit.verdict_types import EvidenceSummary, EvidenceVerdictEvidence

__all__ = ["worse_than_prior"]


def _weighted_median(values: FloatArray, weights: FloatArray) -> float:
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    return float(values[order][int(np.searchsorted(cum, 0.5 * cum[-1], side="left"))])


def worse_than_prior(
    loss: FloatArray,
    counts: IntArray,
    sd: FloatArray,
    *,
    q: float,
    max_flagged_fraction: float,
    min_other_informativeness: float,
    adjust: Callable[[FloatArray, float], tuple[BoolArray, FloatArray]],
    never: BoolArray | None = None,
) -> EvidenceResult:
    """Judge a federation of 2-4 sites (module docstring).

    Parameters
    ----------
    loss, counts, sd : ndarray of shape (K, C)
        Per-class mean loss (NaN where not held), counts and per-sample spreads.
    q : float
        Benjamini-Hochberg level.
    max_flagged_fraction : float
        Flagging this fraction of the sites or of the samples, or more, is inconclusive.
    min_other_informativeness : float
        The median ``1 - L / H`` the sites not flagged must reach.
    adjust : callable
        ``adjust(p, q) -> (rejected, q_values)``: the multiple-testing rule.
    never : ndarray of bool of shape (K,), optional
        Sites never flagged (trust anchors): their p-value is taken as 1.
    """
    k = loss.shape[0]
    held = counts > 0
    n_kc = counts.astype(np.float64)
    sizes = n_kc.sum(axis=1)
    # pooled (the label histogram, the median, the share): each site at most the median site
    weight = sample_weights(sizes)
    pooled = sizes * weight
    prior = (n_kc * weight[:, None]).sum(axis=0)
    prior = prior / prior.sum()
    present = prior > 0
    entropy = float(-(prior[present] * np.log(prior[present])).sum())
    class_prior_loss = np.where(present, -np.log(np.where(present, prior, 1.0)), np.nan)
    filled = np.where(held, loss, 0.0)
    spread = np.where(held, sd, 0.0)
    site_loss = (n_kc * filled).sum(axis=1) / sizes
    variance = (n_kc * (spread**2 + (filled - site_loss[:, None]) ** 2)).sum(axis=1) / sizes
    se = np.sqrt(np.maximum(variance, 1e-12) / sizes)
    z = (site_loss - entropy) / se if entropy > 0 else np.full(k, -np.inf)
    p = np.asarray(ndtr(-z), dtype=np.float64)
    if never is not None:
        p = np.where(never, 1.0, p)
    significant, q_values = adjust(p, q)
    informativeness = 1.0 - site_loss / entropy if entropy > 0 else np.full(k, -np.inf)

    n_flag = int(significant.sum())
    reason = _abstention_reason(
        entropy,
        significant,
        pooled,
        informativeness,
        max_flagged_fraction=max_flagged_fraction,
        min_other_informativeness=min_other_informativeness,
    )
    status: Literal["ok", "inconclusive"] = "ok" if reason is None else "inconclusive"

    verdicts: list[ClientVerdict[EvidenceVerdictEvidence] | None] = [
        _verdict(
            i, loss, held, class_prior_loss, z, p, q_values, site_loss, entropy, significant, status
        )
        for i in range(k)
    ]
    return DetectionResult(
        method="evidence",
        status=status,
        reason=reason,
        verdicts=verdicts,
        summary=EvidenceSummary(
            verdict=status,
            reason=reason,
            mode="small federation: worse than the label prior",
            q=q,
            flagged=n_flag if status == "ok" else 0,
            label_entropy=entropy,
            informativeness=(
                _weighted_median(informativeness, pooled) if math.isfinite(entropy) else None
            ),
        ),
    )


def _abstention_reason(
    entropy: float,
    significant: BoolArray,
    sizes: FloatArray,
    informativeness: FloatArray,
    *,
    max_flagged_fraction: float,
    min_other_informativeness: float,
) -> str | None:
    """Why the small-federation verdict abstains (None: it does not): one label class only, the
    sites worse than the prior are not a clear minority, or the model does not clearly beat the
    prior on the other sites (all of them when none is worse than the prior)."""
    k = significant.size
    n_flag = int(significant.sum())
    share = float(sizes[significant].sum() / sizes.sum())
    others = ~significant
    if entropy <= 0:
        return "every label belongs to one class: nothing to compare"
    if n_flag >= max_flagged_fraction * k or share >= max_flagged_fraction:
        return (
            f"the sites worse than the label prior are not a clear minority ({n_flag} of {k} "
            f"sites, {share:.0%} of the samples)"
        )
    median = _weighted_median(informativeness[others], sizes[others])
    if median >= min_other_informativeness:
        return None
    if n_flag:
        return (
            f"the global model does not clearly beat the label prior on the other sites either "
            f"(median 1 - loss/H = {median:.3f} < {min_other_informativeness})"
        )
    return (
        f"the global model does not clearly beat the label prior yet (median 1 - loss/H over the "
        f"sites = {median:.3f} < {min_other_informativeness}): a site with wrong labels would "
        "not stand out"
    )


def _verdict(
    i: int,
    loss: FloatArray,
    held: BoolArray,
    class_prior_loss: FloatArray,
    z: FloatArray,
    p: FloatArray,
    q_values: FloatArray,
    site_loss: FloatArray,
    entropy: float,
    significant: BoolArray,
    status: str,
) -> ClientVerdict[EvidenceVerdictEvidence]:
    """Site ``i``'s verdict; its noisy classes (where flagged) are those whose loss exceeds the
    prior's, largest excess first."""
    excess = np.where(held[i], loss[i] - class_prior_loss, -np.inf)
    worse = [int(c) for c in np.argsort(-excess, kind="stable") if excess[c] > 0]
    return ClientVerdict(
        score=float(z[i]),
        flag=bool(significant[i]) if status == "ok" else None,
        evidence=EvidenceVerdictEvidence(
            p_value=float(p[i]),
            q_value=float(q_values[i]),
            mean_loss=float(site_loss[i]),
            prior_loss=entropy,
            loss_over_prior=float(site_loss[i] / entropy) if entropy > 0 else None,
            noisy_classes=worse if significant[i] else [],
            significant=bool(significant[i]),
        ),
    )
