"""The evidence detector's parts around the statistics: its checked inputs, one pass's result,
and what each site's verdict shows.

:class:`~service.audit.evidence.EvidenceDetector` (module docstring there) runs the passes and
decides; this module holds what it reads in and writes out, so that the detector's module reads
as the decision.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.special import ndtr

from service.audit._typing import BoolArray, FloatArray, IntArray
from service.audit._validation import (
    MAX_LOSS,
    InvalidInputError,
    as_float_array,
    as_int_array,
)
from service.audit.class_null import ClassEvidence
from service.audit.detection import ClientVerdict
from service.audit.error_evidence import ErrorEvidence
from service.audit.site_factor import SiteFactor
from service.audit.verdict_types import (
    ABSENT,
    Absent,
    EvidenceSummary,
    EvidenceVerdictEvidence,
)

if TYPE_CHECKING:
    from service.audit.accuracy_evidence import AccuracyEvidence

__all__ = [
    "EvidencePass",
    "checked_inputs",
    "noisy_classes",
    "pass_summary",
    "site_verdicts",
]


@dataclass(frozen=True)
class EvidencePass:
    """One pass of the detector over a round, in one direction (the detector's ``_pass``)."""

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
    find_low: Callable[[], BoolArray]
    """Computes :attr:`low` when it is first read: a first pass that flagged sites is followed
    by a second, and only the chosen pass's lower tail is looked at."""
    p_loss: FloatArray
    score: FloatArray
    """(K,) the site z, or the z-equivalent of its per-class part where that is larger."""
    errors: ErrorEvidence | None = None
    confident: ErrorEvidence | None = None
    """The confident errors' evidence (:mod:`service.audit.confident_errors`), where counted."""

    @cached_property
    def low(self) -> BoolArray:
        """(K,) the sites significantly *below* the consensus (the same rule in the other
        direction)."""
        return self.find_low()


def checked_inputs(
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
    if (loss[held] > MAX_LOSS).any():
        raise InvalidInputError(f"per_class_loss: a loss above {MAX_LOSS:g} (nats)")
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


def noisy_classes(
    z: FloatArray, counts: IntArray, q: float, min_class_count: int
) -> list[list[int]]:
    """Per site (rows of ``z`` and ``counts``) the classes whose loss alone is significantly
    above the class consensus (one-sided normal p times the number of classes the site holds
    ``min_class_count`` samples of, doubled, at most q), highest z first: where the wrong labels
    are."""
    tested = np.isfinite(z) & (counts >= min_class_count)
    m = np.maximum(tested.sum(axis=1), 1)
    with np.errstate(invalid="ignore"):
        noisy = tested & (2.0 * ndtr(-z) * m[:, None] <= q)
    out: list[list[int]] = [[] for _ in range(z.shape[0])]
    for i in np.flatnonzero(noisy.any(axis=1)):
        order = np.argsort(-np.nan_to_num(z[i], nan=-np.inf), kind="stable")
        out[i] = [int(c) for c in order if noisy[i, c]]
    return out


class _ErrorEntries:
    """The error-count evidence's part of each site's verdict (absent when it was not used):
    the values of ``errors``, ``errors_expected``, ``errors_z`` and ``errors_p_value`` (or of
    ``confident_errors`` and its like); the arrays are read once as Python numbers (a verdict
    per site of a 10,000-site round: indexing numpy arrays entry by entry took a tenth of a
    second)."""

    def __init__(self, counted: ErrorEvidence | None) -> None:
        self.used = counted is not None
        if counted is None:
            return
        self.reported = None if counted.reported is None else counted.reported.tolist()
        self.columns = (
            counted.observed.astype(np.int64).tolist(),
            counted.expected.astype(np.float64).tolist(),
            counted.z.astype(np.float64).tolist(),
            counted.p_value.astype(np.float64).tolist(),
        )

    def entry(self, i: int) -> _CountEntry:
        """Site ``i``'s part: the count, its expectation, z and p-value; None each where the
        site sent no counts, absent each where the counts were not used."""
        if not self.used:
            return (ABSENT, ABSENT, ABSENT, ABSENT)
        if self.reported is not None and not self.reported[i]:
            return (None, None, None, None)
        observed, expected, z, p = (column[i] for column in self.columns)
        return (observed, expected, z, p)


_CountEntry = tuple[
    int | None | Absent, float | None | Absent, float | None | Absent, float | None | Absent
]
"""A site's error-count evidence: count, expected count, z, p-value."""


def accuracy_entry(accuracy: AccuracyEvidence | None, i: int, added: bool) -> _AccuracyEntry:
    """The accuracy evidence's part of a site's verdict: ``accuracy_z``, ``accuracy_p_value``,
    ``accuracy_gap`` and ``flagged_by_accuracy`` (absent each when it was not used)."""
    if accuracy is None:
        return (ABSENT, ABSENT, ABSENT, ABSENT)
    return (float(accuracy.z[i]), float(accuracy.p_value[i]), float(accuracy.gap[i]), added)


_AccuracyEntry = tuple[float | Absent, float | Absent, float | Absent, bool | Absent]
"""A site's accuracy evidence: z, p-value, gap, and whether it alone added the flag."""


def _floats_or_none(values: FloatArray) -> list[Any]:
    """``values`` (any shape) as nested lists of Python floats, None where not finite."""
    finite = np.isfinite(values)
    as_list: list[Any] = np.where(finite, values, 0.0).astype(np.float64).tolist()
    if finite.all():
        return as_list
    mask = finite.tolist()

    def fill(v: Any, ok: Any) -> Any:
        if isinstance(v, list):
            return [fill(a, b) for a, b in zip(v, ok, strict=True)]
        return v if ok else None

    return [fill(v, ok) for v, ok in zip(as_list, mask, strict=True)]


def site_verdicts(
    chosen: EvidencePass,
    direction: float,
    flags: BoolArray | None,
    counts: IntArray,
    site_loss: FloatArray,
    anchor: BoolArray,
    accuracy: AccuracyEvidence | None,
    accuracy_flags: BoolArray,
    *,
    q: float,
    min_class_count: int,
) -> list[ClientVerdict[EvidenceVerdictEvidence] | None]:
    """One verdict per site; ``flags`` None: the round abstained (every flag None, so that
    the status rule does not count an inconclusive round as a clean one)."""
    # The loss evidence's score, or a count's z where that is larger.
    score = chosen.score
    for counted in (chosen.errors, chosen.confident):
        score = score if counted is None else np.maximum(score, counted.z)
    if accuracy is not None:
        # Flagged by its accuracy alone: its loss score is, by construction, unremarkable.
        score = np.where(accuracy_flags, np.maximum(score, accuracy.z), score)
    site = chosen.site
    relative = None if site is None else np.exp(site.x - site.centre)
    # Shown: each class against its consensus, as reported (where the site's loss is high);
    # the per-class test itself reads the class z given the site's difficulty.
    z_shown = direction * chosen.evidence.z
    where_noisy = noisy_classes(z_shown, counts, q, min_class_count)
    # Read once as Python values: one verdict per site of a 10,000-site round.
    k = counts.shape[0]
    scores = np.asarray(score, dtype=np.float64).tolist()
    flag_list = None if flags is None else flags.tolist()
    p_high = chosen.p_high.astype(np.float64).tolist()
    q_values = chosen.q_values.astype(np.float64).tolist()
    # + 0.0: no -0.0 in the JSON of an inverted pass.
    site_z = [None] * k if site is None else (chosen.z_high.astype(np.float64) + 0.0).tolist()
    factors = [None] * k if relative is None else _floats_or_none(relative)
    stouffer = chosen.stouffer.astype(np.float64).tolist()
    class_z = _floats_or_none(z_shown)
    mean_loss = np.asarray(site_loss, dtype=np.float64).tolist()
    anchors, significant = anchor.tolist(), chosen.flags.tolist()
    added = accuracy_flags.tolist()
    errors = _ErrorEntries(chosen.errors)
    confident = _ErrorEntries(chosen.confident)
    verdicts: list[ClientVerdict[EvidenceVerdictEvidence] | None] = []
    for i in range(k):
        err, err_expected, err_z, err_p = errors.entry(i)
        sure, sure_expected, sure_z, sure_p = confident.entry(i)
        acc_z, acc_p, acc_gap, by_accuracy = accuracy_entry(accuracy, i, bool(added[i]))
        evidence = EvidenceVerdictEvidence(
            p_value=p_high[i],
            q_value=q_values[i],
            site_z=site_z[i],
            site_factor=factors[i],
            stouffer_z=stouffer[i],
            class_z=class_z[i],
            noisy_classes=where_noisy[i],
            mean_loss=mean_loss[i],
            anchor=bool(anchors[i]),
            significant=bool(significant[i]),
            errors=err,
            errors_expected=err_expected,
            errors_z=err_z,
            errors_p_value=err_p,
            confident_errors=sure,
            confident_errors_expected=sure_expected,
            confident_errors_z=sure_z,
            confident_errors_p_value=sure_p,
            accuracy_z=acc_z,
            accuracy_p_value=acc_p,
            accuracy_gap=acc_gap,
            flagged_by_accuracy=by_accuracy,
        )
        flag = None if flag_list is None else bool(flag_list[i])
        verdicts.append(ClientVerdict(score=scores[i], flag=flag, evidence=evidence))
    return verdicts


def pass_summary(chosen: EvidencePass) -> EvidenceSummary:
    """The round summary's part that describes the chosen pass (its fields from
    ``significant_high`` to ``site_df``; the detector fills the others): how many sites it found
    significantly above and below, whether the error counts entered, each class's fitted centre
    and spread, and the site-level spread and degrees of freedom (None where not used)."""
    site = chosen.site
    return EvidenceSummary(
        significant_high=int(chosen.flags.sum()),
        significant_low=int(chosen.low.sum()),
        errors_counted=chosen.errors is not None,
        errors_dispersion=None if chosen.errors is None else chosen.errors.dispersion,
        confident_errors_counted=chosen.confident is not None,
        class_centre=[None if not np.isfinite(v) else float(v) for v in chosen.evidence.mu],
        class_tau=[None if not np.isfinite(v) else float(v) for v in chosen.evidence.tau],
        site_tau=None if site is None else math.sqrt(site.tau2),
        site_df=None if site is None or math.isinf(site.df) else site.df,
    )
