"""When the evidence detector abstains instead of accusing.

The detector (:class:`~service.audit.evidence.EvidenceDetector`) abstains with
``status="inconclusive"``: nobody flagged (every flag None), the scores and evidence kept, the
reason stated. The evidence is only as good as the consensus it is measured against. The audit
abstains when

* (``undetermined``, no verdicts) fewer than ``min_clients`` sites reported;
* the global model does not beat the label prior on the median site's own data: the weighted
  median over sites of 1 - L_k / H (L_k the site's mean loss, H the entropy of the federation's
  label histogram, the loss of a model that predicts the prior) is below ``min_informativeness``,
  and, where the sites sent their error counts, the pooled 1 - sum_k E_k / sum_k E0_k over
  the sites that sent them (E_k the site's errors, E0_k those of always answering the
  federation's most common label) is below :data:`ACCURACY_INFORMATIVENESS`; the model has not
  learned yet, or it learned the labels' noise. The loss alone misjudged an *underconfident*
  model: 50 digit sites of 29 samples (the stress matrix's m02, seed 0) had a global model right
  on 41-59 % of the samples in rounds 7-11 (the prior: 10 %) whose mean loss was still within
  2-5 % of H, so the audit abstained there, while the evidence without the rule flagged exactly
  the one noisy site from round 7, when the errors' informativeness crossed 0.25. Pooled, not a
  median over sites: a model that sides with an inverted majority by a hair is right on every
  sample of the median site (its ratio 1) and wrong on every sample of the clean sites, and a
  model that always answers one label is right on every site holding only that label; summed
  over the sites both are below 0.25 (an independent review's counter-examples, in the tests);
* the sites disagree far beyond sampling error (only with reported spreads; without them the
  fitted scale absorbs the spread and I^2 is 0): Higgins and Thompson's I^2 ("Quantifying
  heterogeneity in a meta-analysis", Statistics in Medicine 2002, eq. 9, here tau^2 over tau^2
  plus the median sampling variance), weighted over the classes by their samples, above
  ``max_heterogeneity`` (0.9): two camps of equal size, or a spread of noise rates with no clean
  core, leave no consensus (the robust fit then takes the gap for heterogeneity and flags
  nobody, and saying "ok" would hide that);
* the sites that would be flagged are not a clear minority: ``max_flagged_fraction`` (one half) or
  more of the sites or of the samples (a site's samples counted up to
  :func:`~service.audit.pooling.sample_factor` times the median site's: one site that claims
  most of the federation's samples cannot make every verdict on it abstain);
* FedNoRo's two-component loss mixture (the FedNoRo paper, section 4.1, with our calibrated
  separation guard: :class:`~service.audit.detectors.fednoro.FedNoRoDetector`), run as a
  cross-check, splits the sites into two separated groups and the higher-loss group is not a
  clear minority (``max_flagged_fraction`` of the sites or of the samples). A noisy majority
  whose rates vary (6 of 10 breast-cancer sites at 30-50 %) moves the robust centre into the
  noisy group and widens ``tau_c``, so that no site is significantly above or below it, while
  the clean minority stays a tight group below the others: the mixture sees the two groups, and
  the evidence alone would have said "ok".

The lower tail is not a reason to abstain. Sites significantly *below* the consensus while
others are flagged above it ("the evidence points both ways") may mean that the consensus is
noisy (clean sites are not cleaner than clean), or that those sites misreport: a site can lie
(issue 20). This rule abstained once: one accomplice reporting a near-perfect model (loss 0.02,
no error) then made every round of a simulated federation abstain and so hid a noisy site in 20
of 20 rounds; from two sites up (:data:`MIN_LOWER_TAIL`) two colluders still did, in 32 of the
240 reports of ``docs/eval/one_site_attacks.py --liars 2``. Replayed on the signals stored by
403 federations (the held-out draws 1-7 and the stress matrix, m09 and m10 included: 11,601
audited rounds), it never changed a verdict. So the flags stand, the summary counts the sites
below (``significant_low``), and the report warns from :data:`MIN_LOWER_TAIL` of them
(``service.coordinator.report_warnings``). A flagged site may have classes below the consensus:
a pair flip c -> c + 1 leaves a site's class c + 1 full of class-c samples the model has partly
learned to call c + 1.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from service.audit._typing import BoolArray, FloatArray, IntArray
from service.audit.class_null import ClassEvidence, weighted_median
from service.audit.confident_errors import RoundCounts
from service.audit.detection import DetectionResult
from service.audit.detectors.fednoro import FedNoRoDetector
from service.audit.error_evidence import ReportedCounts
from service.audit.evidence_verdicts import EvidencePass
from service.audit.pooling import capped_sizes, sample_weights

__all__ = [
    "ACCURACY_INFORMATIVENESS",
    "MIN_LOWER_TAIL",
    "Informativeness",
    "class_heterogeneity",
    "consensus_reason",
    "is_majority_reason",
    "mixture_split",
    "model_informativeness",
    "share_if_learned",
]


MIN_LOWER_TAIL = 2
"""Sites significantly below the consensus, in a round that flags others, from which the report
warns that the evidence points both ways (module docstring); one such site is one site's word."""

ACCURACY_INFORMATIVENESS = 0.25
"""The pooled 1 - sum E_k / sum E0_k at which the model beats the label prior by its errors
(module docstring): its errors at most three quarters of always answering the most common
label's. Fixed: ``evidence_min_informativeness`` sets the loss's bar only."""


class Informativeness(NamedTuple):
    """How much the consensus model beats the label prior (module docstring): by the median
    site's loss, and by the pooled errors where the sites sent them (else None)."""

    loss: float
    accuracy: float | None = None

    def learned(self, min_loss: float) -> bool:
        """Whether either measure says the model has learned."""
        return self.loss >= min_loss or (
            self.accuracy is not None and self.accuracy >= ACCURACY_INFORMATIVENESS
        )


def model_informativeness(
    loss: FloatArray, counts: IntArray, sizes: FloatArray, errors: ReportedCounts | None = None
) -> tuple[float, FloatArray, Informativeness]:
    """(entropy H of the label histogram, each site's mean loss, the informativeness: the
    weighted median over sites of 1 - L_k / H and, with ``errors``, the pooled 1 - sum E_k /
    sum E0_k over the sites that sent them): how much the consensus model beats the prior.
    A site weighs at most :func:`~service.audit.pooling.sample_factor` times the median site's
    size in the histogram, the median and the pooled errors."""
    weight = sample_weights(sizes)
    totals = (counts * weight[:, None]).sum(axis=0)
    prior = totals[totals > 0] / totals.sum()
    entropy = float(-(prior * np.log(prior)).sum())
    held = counts > 0
    site_loss = np.nansum(np.where(held, loss * counts, 0.0), axis=1) / np.maximum(sizes, 1)
    by_loss = (
        weighted_median(1.0 - site_loss / entropy, sizes * weight) if entropy > 0 else -math.inf
    )
    if errors is None:
        return entropy, site_loss, Informativeness(by_loss)
    rows = errors.reporting
    # always answering the most common label errs on every other sample
    top = counts[rows, int(np.argmax(totals))]
    baseline = float((weight[rows] * (sizes[rows] - top)).sum())
    if baseline <= 0:
        return entropy, site_loss, Informativeness(by_loss)
    made = float((weight[rows] * errors.errors[rows].sum(axis=1)).sum())
    return entropy, site_loss, Informativeness(by_loss, 1.0 - made / baseline)


def share_if_learned(
    counts: RoundCounts | None, informativeness: Informativeness
) -> RoundCounts | None:
    """The round's counts, without the confident errors where the model does not beat always
    answering the federation's most common label by :data:`ACCURACY_INFORMATIVENESS` of its
    errors. Such a model contradicts labels with confidence class by class, not site by site: in
    a held-out federation of 10 BreastMNIST sites at Dirichlet(0.1) whose model flipped between
    the two labels from round to round, the three sites holding class 0 alone had 41-50 % of
    their errors confident against 12-26 % elsewhere, and two clean ones were flagged on their
    share at ``accuracy`` 0.06 and 0.21 (docs/evaluation.md, "Held-out scenarios")."""
    if (
        counts is None
        or counts.confident is None
        or informativeness.accuracy is None
        or informativeness.accuracy >= ACCURACY_INFORMATIVENESS
    ):
        return counts
    return RoundCounts(counts.errors)


def class_heterogeneity(evidence: ClassEvidence, counts: IntArray) -> float:
    """I^2 of the classes that entered, weighted by their samples (0.0: none entered), a site's
    counted up to :func:`~service.audit.pooling.sample_factor` times the median site's."""
    sizes = counts.sum(axis=1).astype(np.float64)
    class_weight = (counts * sample_weights(sizes)[:, None]).sum(axis=0)
    entered = np.isfinite(evidence.heterogeneity)
    if not entered.any():
        return 0.0
    weighted = evidence.heterogeneity[entered] * class_weight[entered]
    return float(weighted.sum() / class_weight[entered].sum())


MAX_CLASS_HETEROGENEITY = 0.9
"""A class's I^2 above which, in a round that flags nobody, the summary names the class
(``disagreeing_classes``) and the report warns: the sites disagree there far beyond sampling
error and none stands out. On the stored signals of 2,939 audited rounds of clean federations
(the held-out draws 1-7 and the stress matrix) the largest class I^2 was 0.85 (21 MNIST sites
holding two digits each); in 2,522 rounds of noisy federations that flagged nobody it passed 0.9
in 153, in 8 scenarios, mostly small wine and BreastMNIST federations whose noisy sites the
audit misses (6 wine sites, 2 with pair flips: 26 of 27 rounds)."""


def disagreeing_classes(
    evidence: ClassEvidence, flags: BoolArray, status: str, mode: str
) -> list[int]:
    """The classes whose I^2 is above :data:`MAX_CLASS_HETEROGENEITY` in a consensus round that
    flags nobody (empty otherwise): the round's "ok" does not mean the labels agree there."""
    if status != "ok" or mode != "consensus" or flags.any():
        return []
    entered = np.nan_to_num(evidence.heterogeneity, nan=0.0)
    return [int(c) for c in np.flatnonzero(entered > MAX_CLASS_HETEROGENEITY)]


def mixture_split(
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


_MIXTURE_MAJORITY = (
    "FedNoRo's loss mixture splits the sites into two separated groups and the higher-loss "
    "group is not a clear minority"
)
_FLAGGED_MAJORITY = "the sites that would be flagged are not a clear minority"


def is_majority_reason(reason: str | None) -> bool:
    """Whether a consensus abstention's ``reason`` is that the group the audit would flag (or
    the loss mixture's higher-loss group) is not a clear minority."""
    return reason is not None and reason.startswith((_MIXTURE_MAJORITY, _FLAGGED_MAJORITY))


def consensus_reason(
    result: EvidencePass,
    sizes: FloatArray,
    entropy: float,
    informativeness: Informativeness,
    heterogeneity: float,
    mixture: BoolArray | None,
    *,
    min_informativeness: float,
    max_heterogeneity: float,
    max_flagged_fraction: float,
) -> str | None:
    """Why the consensus verdict abstains (module docstring); None: it holds.

    ``mixture``: the sites FedNoRo's loss mixture flags (None: not run or undetermined).
    """
    k = sizes.size
    sizes = capped_sizes(sizes)  # a site and one other: < half (pooling)
    n_flag = int(result.flags.sum())
    share = float(sizes[result.flags].sum() / sizes.sum())
    if entropy <= 0:
        return "every label belongs to one class: nothing to compare"
    if not informativeness.learned(min_informativeness):
        by_errors = (
            ""
            if informativeness.accuracy is None
            else f", 1 - errors/prior's = {informativeness.accuracy:.3f} < "
            f"{ACCURACY_INFORMATIVENESS}"
        )
        return (
            f"the global model does not beat the label prior on the median site's data "
            f"(1 - loss/H = {informativeness.loss:.3f} < {min_informativeness}{by_errors}): "
            "it has not learned yet, or it learned the noise"
        )
    if heterogeneity > max_heterogeneity:
        return (
            f"the sites disagree far beyond sampling error (I^2 = {heterogeneity:.2f} > "
            f"{max_heterogeneity}): no consensus to measure against"
        )
    if mixture is not None and mixture.any():
        n_mix = int(mixture.sum())
        mix_share = float(sizes[mixture].sum() / sizes.sum())
        if n_mix >= max_flagged_fraction * k or mix_share >= max_flagged_fraction:
            return (
                f"{_MIXTURE_MAJORITY} ({n_mix} of {k} sites, "
                f"{mix_share:.0%} of the samples): the consensus may be the noisy side"
            )
    if n_flag >= max_flagged_fraction * k or share >= max_flagged_fraction:
        return f"{_FLAGGED_MAJORITY} ({n_flag} of {k} sites, {share:.0%} of the samples)"
    return None
