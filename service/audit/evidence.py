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

**Null model, class by class** (:mod:`service.audit.class_null`): for the clean holders of
class c, ``L[k, c] = mu_c + u_kc + e_kc`` (a random-effects meta-analysis model, DerSimonian and
Laird, 1986, eq. 1) with a between-site spread ``tau_c`` and each site's sampling variance,
``mu_c`` and ``tau_c`` fitted robustly, and the standardised excess ``z[k, c]``, about N(0, 1)
for a clean site. The fit runs twice: the second pass leaves out of each class's fit the sites
the first pass flagged (where enough holders remain), so that a class held mostly by noisy sites
does not make its clean holders look wrong.

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
* The classes are then judged *given the site's difficulty*: each class of a harder site
  divided by the shrunken factor of the site's other classes (:meth:`SiteFactor.class_shift`;
  the lower tail adjusts easier sites alike) and the class fit repeated; in the second pass a
  site the first flagged keeps its own losses (docs/algorithms.md, "classes given the site").
  ``p_stouffer``: Stouffer's combination of those class z, weights sqrt(n[k, c]) (dense noise:
  every class a little; a class held fewer than ``min_class_count`` times enters with its z
  capped at +-3, :data:`SMALL_CLASS_Z_CAP`: on clean digit federations one hard sample of a
  class a site held once gave z = 30). ``m * min_c p_c`` is the smallest per-class p times the
  number of classes (noise in one class; classes of which the site holds ``min_class_count``
  samples or more).

The verdict shows ``site_z`` (the score, or the per-class part's z-equivalent where larger),
``site_factor`` (the site's loss over what its class mix predicts), the Stouffer z, and the class
z *as reported* (against each class's consensus, not adjusted for the site).

**Flags.** Benjamini and Hochberg's step-up rule ("Controlling the false discovery rate", JRSS-B
1995, section 3) at level ``q`` over the sites of the round. With exact p-values, when no site is
noisy it flags somebody in a round with probability at most ``q`` (family-wise error under the
global null): at most ``q * R`` rounds with a false alarm in R (0.3 for ``q = 0.01`` and 30
rounds); with noisy sites, at most a fraction ``q`` of the flags wrong. Close to exact when the
spreads are reported and the sites differ only by sampling (``tests/audit/test_evidence.py``:
at most 3 % of rounds with a flag, 5 to 50 sites); **not** when ``tau_c`` comes from a few
holders, the spreads are missing, or sites differ in difficulty (docs/algorithms.md,
"Calibrated evidence"). The status rule (:func:`~service.audit.detection.next_status`) then needs
several flagged rounds before the aggregation treats a site as noisy.

**Error counts** (:mod:`service.audit.error_evidence`, from ``min_error_sites`` reporting sites):
``p_k = min(1, 2 min(p_loss, p_errors))``, with the confident errors too
(:mod:`service.audit.confident_errors`) ``min(1, 3 min(p_loss, p_errors, p_confident))``; phi at
least the site-level spread's (:meth:`SiteFactor.count_dispersion`), and ``min_error_dispersion``
below ``SITE_LEVEL_MIN_SITES`` sites.

**Abstention** (``status="inconclusive"``, nobody flagged, the reason stated) when the consensus
is suspect: too few sites, a model that does not beat the label prior, sites that disagree far
beyond sampling error, a flagged group that is not a clear minority (by the evidence or by
FedNoRo's loss mixture); sites far *below* it are only counted (:mod:`.evidence_abstention`).

**Trust anchors** (beyond the papers): sites an admin marks as curated, never flagged. When the
consensus is inconclusive or the anchors look noisy against it, the anchors become the reference
(anchored mode), with the error counts measured against the anchors' rates; a corrupted
consensus hands the aggregation to the anchors. Both, with their limits:
:mod:`service.audit.anchor_mode`.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np
from scipy.special import ndtr, ndtri

from service.audit._typing import BoolArray, FloatArray, IntArray
from service.audit._validation import InvalidInputError, check_bool, check_float, check_int
from service.audit.anchor_mode import (
    ANCHORED_MIN_ERROR_EXCESS,
    anchored_error_evidence,
    anchored_pass,
)
from service.audit.class_null import (
    benjamini_hochberg,
    class_evidence,
    class_p_values,
    site_p_values,
)
from service.audit.confident_errors import CountTests, RoundCounts, round_counts
from service.audit.detection import DetectionResult, EvidenceResult, FedNoRoResult
from service.audit.error_evidence import counted_on, error_evidence
from service.audit.evidence_abstention import (
    Informativeness,
    class_heterogeneity,
    consensus_reason,
    disagreeing_classes,
    mixture_split,
    model_informativeness,
    share_if_learned,
)
from service.audit.evidence_verdicts import (
    EvidencePass,
    checked_inputs,
    pass_summary,
    site_verdicts,
)
from service.audit.pooling import capped_sizes
from service.audit.site_factor import site_factor
from service.audit.small_federation import worse_than_prior
from service.audit.verdict_types import EvidenceSummary

if TYPE_CHECKING:
    from service.audit.accuracy_evidence import AccuracyEvidence

__all__ = ["FLAGGED_OWN_LOSSES", "SITE_LEVEL_MIN_SITES", "EvidenceDetector"]

FLAGGED_OWN_LOSSES = True
"""The second pass judges the sites the first flagged on their own losses, not given their
difficulty (module docstring); ``docs/eval/given_site_whatif.py`` turns it off to compare."""

SITE_LEVEL_MIN_SITES = 10
"""Sites a round needs for the site-level part (:mod:`service.audit.site_factor`) to enter the
p-value (consensus mode only): with 5 to 8 sites its Student's t tail is so wide that noisy sites
went unfound (stress matrix: m07's F1 mean 0.98 -> 0.80, m12's 0.91 -> 0.62), and that few sites
cannot tell a harder site from a noisy one anyway. Below it: the module docstring's 2-part p."""


class _Decision(NamedTuple):
    """What :meth:`EvidenceDetector._decide` settled (the pass, mode, direction, reason...)."""

    chosen: EvidencePass
    mode: Literal["consensus", "anchored"]
    direction: float
    reason: str | None
    heterogeneity: float
    split: BoolArray | None
    anchor_inverted: bool


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
        of the site's p-value); fewer still count in Stouffer's part (the normal tail is wrong
        for the mean of a few samples of a skewed loss: a class held *once* gave z 4-5).
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
    error_check : bool, default=True
        Where ``min_error_sites`` sites or more sent ``per_class_errors`` (a NaN row: one that
        did not, judged on its losses alone), combine the loss evidence with the error counts'
        (:mod:`service.audit.error_evidence`; consensus mode; Bonferroni over the two).
    min_error_excess : float, default=0.05
        The error-count test's practical-significance floor: a site's error rate must be at
        least this far above the expected one (over its entered classes).
    min_error_sites : int, default=5
        Sites a round needs for the error counts to enter.
    min_error_dispersion : float, default=0.5
        phi's floor below ``SITE_LEVEL_MIN_SITES`` sites: a handful of sites' lower tail cannot
        tell how much clean sites differ (docs/algorithms.md, "Error counts", measured); in
        anchored mode phi itself.
    anchored_min_error_excess : float, default=0.10
        The floor on a site's error rate above the anchors' in anchored mode
        (:mod:`service.audit.anchor_mode`: the generalisation gap allowed).
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
        error_check: bool = True,
        min_error_excess: float = 0.05,
        min_error_sites: int = 5,
        min_error_dispersion: float = 0.5,
        anchored_min_error_excess: float = ANCHORED_MIN_ERROR_EXCESS,
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
        self.min_error_dispersion = check_float(
            "min_error_dispersion", min_error_dispersion, min_value=0.0, max_value=1.0
        )
        anchored_excess = check_float(
            "anchored_min_error_excess", anchored_min_error_excess, min_value=0.0, max_value=1.0
        )
        self._counts = CountTests(
            counted=partial(
                counted_on,
                evidence=partial(
                    error_evidence,
                    min_holders=self.min_holders,
                    min_excess=self.min_error_excess,
                    min_class_count=self.min_class_count,
                ),
            ),
            anchor_counted=partial(
                counted_on,
                evidence=partial(
                    anchored_error_evidence,
                    min_excess=anchored_excess,
                    min_dispersion=self.min_error_dispersion,
                ),
            ),
            floor=self.min_error_dispersion,
            min_excess=self.min_error_excess,
            anchored_min_excess=anchored_excess,
        )
        self.anchored_min_error_excess = anchored_excess

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
        wrong: RoundCounts | None = None,
    ) -> EvidencePass:
        """One fit and its flags (module docstring, "One p-value per site"); with ``wrong`` a
        site's p is the Bonferroni combination of the loss and the error-count evidence (in
        anchored mode the counts against the anchors' rates: :mod:`service.audit.anchor_mode`)."""
        # the class fits rest on the holders of min_class_count samples or more (class_null)
        fit = partial(
            class_evidence,
            min_holders=self.min_holders,
            exclude=exclude,
            min_fit_count=self.min_class_count,
        )
        ev = fit(loss, counts, sd, reference=reference)
        # Consensus mode only: in anchored mode tau would come from the few anchors, and with
        # 0.37 (anchors - 1) degrees of freedom the site part's tail is too wide to find anyone.
        site = (
            site_factor(loss, counts, sd, ev.mu, exclude=exclude)
            if reference is None and loss.shape[0] >= SITE_LEVEL_MIN_SITES
            else None
        )

        def given_site(d: float) -> FloatArray:
            """The class z given each site's difficulty, in direction d only (not for the
            sites the first pass flagged: ``exclude``)."""
            shift = None if site is None else site.class_shift(d)
            if shift is not None and exclude is not None and FLAGGED_OWN_LOSSES:
                shift = np.where(exclude[:, None], 0.0, shift)
            if shift is None or not np.any(shift != 0.0):
                return ev.z
            scale = np.exp(-shift)
            scaled = None if sd is None else sd * scale  # (no site part with a reference)
            return fit(loss * scale, counts, scaled).z

        class_z = given_site(direction)

        def loss_p(d: float) -> tuple[FloatArray, FloatArray, FloatArray]:
            """(the site's loss p-value, its Stouffer z, its per-class part) in direction d."""
            z = class_z if d == direction else given_site(d)
            stouffer = site_p_values(z, counts, d, self.min_class_count)[1]
            p_class = class_p_values(z, counts, d, self.min_class_count)
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
        floor = None if site is None else site.count_dispersion()  # the spread of difficulty
        p_high, counted, confident = self._counts.p_values(
            p_loss, wrong, counts, exclude, reference, direction, floor
        )
        p_high = np.where(never, 1.0, p_high)
        flags, q_values = benjamini_hochberg(p_high, self.q)
        return EvidencePass(
            ev,
            class_z,
            site,
            p_high,
            z_high,
            stouffer,
            flags,
            q_values,
            lambda: benjamini_hochberg(np.where(never, 1.0, loss_p(-direction)[0]), self.q)[0],
            p_loss,
            score,
            counted,
            confident,
        )

    def _too_few_sites(
        self, loss: FloatArray, counts: IntArray, sd: FloatArray | None, anchor: BoolArray
    ) -> EvidenceResult:
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
            summary=EvidenceSummary(verdict="undetermined", q=self.q),
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

    def _add_accuracy(
        self, flags: BoolArray, accuracy: AccuracyEvidence, sizes: FloatArray
    ) -> tuple[BoolArray, BoolArray, str | None]:
        """The flags with the accuracy evidence's added, the sites it added, and a note when it
        was set aside (it would have flagged ``max_flagged_fraction`` of the sites or samples,
        a site's capped as :mod:`service.audit.pooling` says)."""
        k = flags.size
        union = flags | accuracy.flags
        share = float(np.average(union, weights=capped_sizes(sizes))) if sizes.sum() > 0 else 0.0
        if union.sum() >= self.max_flagged_fraction * k or share >= self.max_flagged_fraction:
            note = (
                f"accuracy evidence set aside: with it {int(union.sum())} of {k} sites "
                f"holding {share:.0%} of the samples would be flagged"
            )
            return flags, np.zeros(k, dtype=bool), note
        return union, accuracy.flags & ~flags, None

    def _decide(
        self,
        loss: FloatArray,
        counts: IntArray,
        sd: FloatArray | None,
        anchor: BoolArray,
        wrong: RoundCounts | None,
        sizes: FloatArray,
        entropy: float,
        informativeness: Informativeness,
        mixture: FedNoRoResult | None,
        anchor_led: bool = False,
    ) -> _Decision:
        """The consensus passes, the abstention rules, then anchored mode where it applies."""
        first = self._pass(loss, counts, sd, None, None, 1.0, anchor, wrong)
        second = first  # without flags, a second pass would refit on the same sites
        if first.flags.any():
            second = self._pass(loss, counts, sd, first.flags, None, 1.0, anchor, wrong)
        heterogeneity = class_heterogeneity(second.evidence, counts)
        split = mixture_split(loss, counts, mixture) if self.mixture_check else None
        reason = consensus_reason(
            second,
            sizes,
            entropy,
            informativeness,
            heterogeneity,
            split,
            min_informativeness=self.min_informativeness,
            max_heterogeneity=self.max_heterogeneity,
            max_flagged_fraction=self.max_flagged_fraction,
        )
        if not (anchor.any() and entropy > 0):
            return _Decision(second, "consensus", 1.0, reason, heterogeneity, split, False)
        anchored, inverted, reason = anchored_pass(
            partial(self._pass, loss, counts, sd, None, wrong=wrong),
            sd,
            anchor,
            second,
            reason or ("the aggregate is led by the trust anchors" if anchor_led else None),
            self.q,
        )
        if anchored is None:
            return _Decision(second, "consensus", 1.0, reason, heterogeneity, split, inverted)
        direction = -1.0 if inverted else 1.0
        return _Decision(anchored, "anchored", direction, reason, heterogeneity, split, inverted)

    def _error_counts(
        self, per_class_errors: Any, confident: Any, counts: IntArray
    ) -> RoundCounts | None:
        """The checked counts where ``error_check`` is on and ``min_error_sites`` sites sent
        them (to estimate their spread), else None (:func:`round_counts`)."""
        if not self.error_check or per_class_errors is None:
            return None
        return round_counts(per_class_errors, confident, counts, self.min_error_sites)

    def fit(
        self,
        per_class_loss: Any,
        class_counts: Any,
        per_class_loss_sd: Any = None,
        anchors: Any = None,
        mixture: FedNoRoResult | None = None,
        train_accuracy: Any = None,
        num_samples: Any = None,
        per_class_errors: Any = None,
        anchor_led: bool = False,
        per_class_confident_errors: Any = None,
    ) -> EvidenceResult:
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
        anchor_led : bool, default=False
            The federation's aggregate is led by the anchors: anchored mode whenever an anchor
            takes part (:mod:`service.audit.anchor_mode`).
        per_class_confident_errors : array-like of int of shape (K, C), optional
            Of those errors, the confident ones (:mod:`service.audit.confident_errors`).

        Returns
        -------
        DetectionResult
            Method ``"evidence"``; status ``"ok"``, ``"inconclusive"`` (every verdict present,
            every flag None, the reason stated) or ``"undetermined"`` (no verdicts).
        """
        loss, counts, sd, anchor = checked_inputs(
            per_class_loss, class_counts, per_class_loss_sd, anchors
        )
        k = loss.shape[0]
        if k < self.min_clients:
            return self._too_few_sites(loss, counts, sd, anchor)
        loss = np.where(counts > 0, loss, np.nan)
        sizes = counts.sum(axis=1).astype(np.float64)
        wrong = self._error_counts(per_class_errors, per_class_confident_errors, counts)
        entropy, site_loss, informativeness = model_informativeness(
            loss, counts, sizes, None if wrong is None else wrong.errors
        )
        wrong = share_if_learned(wrong, informativeness)
        decision = self._decide(
            loss, counts, sd, anchor, wrong, sizes, entropy, informativeness, mixture, anchor_led
        )
        chosen, mode, reason = decision.chosen, decision.mode, decision.reason
        status: Literal["ok", "inconclusive"] = "ok" if reason is None else "inconclusive"
        flags = chosen.flags & (status == "ok")
        accuracy, accuracy_note = self._accuracy(train_accuracy, num_samples, k, anchor, mode)
        accuracy_flags = np.zeros(k, dtype=bool)
        if accuracy is not None and status == "ok":
            flags, accuracy_flags, accuracy_note = self._add_accuracy(flags, accuracy, sizes)
        verdicts = site_verdicts(
            chosen,
            decision.direction,
            flags if status == "ok" else None,
            counts,
            site_loss,
            anchor,
            accuracy,
            accuracy_flags,
            q=self.q,
            min_class_count=self.min_class_count,
        )
        summary = replace(
            pass_summary(chosen),
            verdict=status,
            reason=reason,
            mode=mode,
            q=self.q,
            flagged=int(flags.sum()),
            informativeness=informativeness.loss,
            accuracy_informativeness=informativeness.accuracy,
            heterogeneity=decision.heterogeneity,
            disagreeing_classes=disagreeing_classes(chosen.evidence, flags, status, mode),
            mixture_flagged=None if decision.split is None else int(decision.split.sum()),
            label_entropy=entropy,
            anchors=int(anchor.sum()),
            anchor_orientation="inverted" if decision.anchor_inverted else "consensus",
            spreads_reported=sd is not None,
            accuracy_flagged=int(accuracy_flags.sum()),
            accuracy_note=accuracy_note,
            accuracy_centre=None if accuracy is None else 1.0 - accuracy.centre,
        )
        return DetectionResult(self.method, status, reason, verdicts, summary)
