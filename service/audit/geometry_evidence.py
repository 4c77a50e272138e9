"""Evidence from the update's geometry: what a site that lies about every number it reports still
gives away (beyond the papers; docs/algorithms.md, "Update geometry").

The per-class losses, the error counts and the accuracy are all reported by the site; a site
that trains on wrong labels and reports a clean site's numbers (issue 20's attack;
``fedaudit_sim.lying``) is invisible to them. Its update is not: the coordinator computes it
from the uploaded model. A site fitting wrong labels moves its model in another direction than
the sites fitting right ones, so the cosine between its update ``d_k = theta_k - theta_G`` and
the sum of the *other* sites' updates,

    c_k = d_k . (S - w_k d_k) / (||d_k|| ||S - w_k d_k||),    S = sum_j w_j d_j,  w_j = n_j,

(the leave-one-out consensus, :func:`leave_one_out_cosines`; Fed-NCL's divergence, Tam et al.,
eq. 7, is the length of ``d_k``, this is its direction) is low for it. Under FedAvg on 20 IID
digit sites with 40-50 % symmetric noise, the noisy sites' cosines stood 3.6-4.3 robust standard
deviations below the clean sites' median, and a liar's 7.5-14 (docs/evaluation.md).

**Null model.** Clean sites' cosines scatter around a common centre. The centre is the median
and the scale ``1.4826 MAD`` (the normal-consistent median absolute deviation, Hampel 1974), so
a minority of low sites moves neither; ``z_k = (median - c_k) / (1.4826 MAD)``, one-sided
``p_k = 1 - Phi(z_k)``. The normal tail is an approximation (the cosines are bounded and their
spread is estimated from the sites themselves); what keeps clean sites unflagged is the floor
below, set from measurement, not the tail.

**When it applies.** Only where the sites' updates are comparable, i.e. where they hold the same
class mix up to sampling: Pearson's chi-square test of homogeneity of the K x C table of declared
class counts (classes nobody holds left out) must not reject at ``min_homogeneity_p``. Under
label skew clean sites move in different directions because their data differ (on Dirichlet
federations a clean site stood up to 6.5 robust deviations out), and the test is not made.
It also needs ``min_sites`` sites (the MAD of 5 or 6 cosines is too unstable: a clean site of 6
stood 10.7 out), and it runs only in consensus mode when the loss evidence reached a verdict.

**Flags.** Benjamini-Hochberg at the loss evidence's ``q`` over the sites, and ``z_k >= min_z``
(default 6: the largest z of a clean site over the stored rounds of the homogeneous matrix
scenarios of 10 sites and more was 4.1). Added to the loss evidence's flags unless together they
would flag ``max_flagged_fraction`` of the sites or samples (then set aside, as the accuracy
evidence's). Anchors are never flagged.

**Carried flags.** Once flagged, a site trains in the noisy role (FedNoRo's distillation pulls its
model towards the global model's predictions), so its update moves with the others' whatever its
labels, and after ``status_w`` such rounds the status rule would trust it again; the liars of the
evaluation were caught, released and caught again. A site that is noisy, whose latest flag was the
geometry's alone, keeps its flag while the loss evidence reaches a verdict (``geometry_carried``
in its verdict; :func:`carry_flags`): its update in the noisy role cannot clear it. An admin pin
("trusted") ends it; so does a flag of the loss evidence (the status then rests on the losses).

**Limits.** A site can shape its update too (train on its true labels' direction, or scale a
chosen update): what this test sees is a site that trains on what it holds. Under label skew it
does not apply, and says so. A site whose data are unlike the others' for another reason (a
scanner) is what the homogeneity gate and the floor are for; they are measured, not proved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.stats import chi2, norm

from service.audit._typing import BoolArray, FloatArray
from service.audit._validation import InvalidInputError, as_float_array
from service.audit.class_null import benjamini_hochberg
from service.audit.detection import ClientVerdict, DetectionResult

__all__ = [
    "GeometryEvidence",
    "add_geometry",
    "carry_flags",
    "class_mix_homogeneity",
    "geometry_evidence",
    "leave_one_out_cosines",
]

MAD_TO_SD = 1.4826
"""The median absolute deviation times this estimates a normal standard deviation."""


@dataclass(frozen=True)
class GeometryEvidence:
    """Per-site update-geometry evidence of one round (module docstring).

    Attributes
    ----------
    applies : bool
        False when the test was not made (``note`` says why; every array is then all-NaN and
        ``flags`` all False).
    cosine, z, p_value : ndarray of shape (K,)
        The leave-one-out cosines, their robust z (high = far from the others) and p-values.
    flags : ndarray of bool of shape (K,)
    homogeneity_p : float or None
        The chi-square test's p-value of the class mixes (None when not computed).
    note : str or None
    """

    applies: bool
    cosine: FloatArray
    z: FloatArray
    p_value: FloatArray
    flags: BoolArray
    homogeneity_p: float | None
    note: str | None


def leave_one_out_cosines(
    squared: Any, dots: Any, total_squared: float, weights: Any
) -> FloatArray:
    """Cosine of each update with the weighted sum of the others', from pass totals.

    With ``d_k`` the updates, ``S = sum_j w_j d_j``: ``d_k . (S - w_k d_k) = dots_k - w_k sq_k``
    and ``||S - w_k d_k||^2 = ||S||^2 - 2 w_k dots_k + w_k^2 sq_k``.

    Parameters
    ----------
    squared : array-like of shape (K,)
        ``||d_k||^2``.
    dots : array-like of shape (K,)
        ``d_k . S``.
    total_squared : float
        ``||S||^2``.
    weights : array-like of shape (K,)
        ``w``, non-negative.

    Returns
    -------
    ndarray of shape (K,)
        In [-1, 1]; NaN where ``d_k`` or the others' sum is zero (no direction).
    """
    sq = as_float_array("squared", squared, ndim=1, min_value=0.0)
    dot = as_float_array("dots", dots, ndim=1)
    w = as_float_array("weights", weights, ndim=1, min_value=0.0)
    if not sq.size == dot.size == w.size:
        raise InvalidInputError(f"squared, dots, weights: {sq.size}, {dot.size}, {w.size} entries")
    if not math.isfinite(total_squared) or total_squared < 0.0:
        raise InvalidInputError(f"total_squared: expected a finite value >= 0, got {total_squared}")
    others = np.maximum(total_squared - 2.0 * w * dot + w * w * sq, 0.0)
    denominator = np.sqrt(sq * others)
    with np.errstate(invalid="ignore", divide="ignore"):
        cosine = np.where(denominator > 0.0, (dot - w * sq) / denominator, np.nan)
    result: FloatArray = np.clip(cosine, -1.0, 1.0)
    return result


def class_mix_homogeneity(class_counts: Any) -> float:
    """Pearson's chi-square test that every site holds the same class mix; its p-value.

    Parameters
    ----------
    class_counts : array-like of shape (K, C)
        Declared counts; classes nobody holds are left out.

    Returns
    -------
    float
        The upper tail of chi-square with (K - 1)(C' - 1) degrees of freedom at
        ``sum (O - E)^2 / E`` (``E`` from the row and column totals; C' classes held). 1.0 when
        fewer than two classes are held (nothing can differ).
    """
    table = as_float_array("class_counts", class_counts, ndim=2, min_value=0.0)
    table = table[:, table.sum(axis=0) > 0]
    table = table[table.sum(axis=1) > 0]
    k, c = table.shape
    if k < 2 or c < 2:
        return 1.0
    expected = table.sum(axis=1, keepdims=True) * table.sum(axis=0, keepdims=True) / table.sum()
    statistic = float(((table - expected) ** 2 / expected).sum())
    return float(chi2.sf(statistic, (k - 1) * (c - 1)))


def _not_applied(k: int, note: str, homogeneity_p: float | None) -> GeometryEvidence:
    empty = np.full(k, np.nan)
    return GeometryEvidence(
        False, empty, empty.copy(), empty.copy(), np.zeros(k, dtype=bool), homogeneity_p, note
    )


def geometry_evidence(
    cosines: Any,
    class_counts: Any,
    *,
    q: float,
    min_z: float = 6.0,
    min_sites: int = 10,
    min_homogeneity_p: float = 0.01,
    never: BoolArray | None = None,
) -> GeometryEvidence:
    """Judge each site's update direction against the others' (module docstring).

    Parameters
    ----------
    cosines : array-like of shape (K,)
        :func:`leave_one_out_cosines`; NaN for a site without a direction (never flagged).
    class_counts : array-like of shape (K, C)
    q : float
        Benjamini-Hochberg level.
    min_z : float, default=6.0
        The floor on the robust z.
    min_sites : int, default=10
    min_homogeneity_p : float, default=0.01
    never : ndarray of bool of shape (K,), optional
        Sites never flagged (anchors).

    Returns
    -------
    GeometryEvidence
    """
    cos = as_float_array("cosines", cosines, ndim=1, allow_nan=True)
    k = cos.size
    counts = as_float_array("class_counts", class_counts, ndim=2, min_value=0.0)
    if counts.shape[0] != k:
        raise InvalidInputError(f"class_counts: {counts.shape[0]} rows for {k} cosines")
    finite = np.isfinite(cos)
    if int(finite.sum()) < min_sites:
        note = f"{int(finite.sum())} sites with an update (needs {min_sites})"
        return _not_applied(k, note, None)
    homogeneity = class_mix_homogeneity(counts)
    if homogeneity < min_homogeneity_p:
        note = f"class mixes differ (chi-square p = {homogeneity:.2g}): updates not comparable"
        return _not_applied(k, note, homogeneity)
    centre = float(np.median(cos[finite]))
    scale = MAD_TO_SD * float(np.median(np.abs(cos[finite] - centre)))
    if scale <= 0.0:
        return _not_applied(k, "every update points the same way (no spread)", homogeneity)
    z = np.where(finite, (centre - cos) / scale, np.nan)
    p = np.where(finite, norm.sf(z), 1.0)
    significant, _ = benjamini_hochberg(p, q)
    flags = significant & finite & (z >= min_z)
    if never is not None:
        flags &= ~np.asarray(never, dtype=bool)
    return GeometryEvidence(True, cos, z, p, flags, homogeneity, None)


def add_geometry(
    result: DetectionResult,
    geometry: GeometryEvidence,
    sizes: FloatArray,
    max_flagged_fraction: float,
) -> DetectionResult:
    """The evidence detector's result with the geometry's flags added and its facts shown.

    Each verdict gains ``geometry_cosine``, ``geometry_z``, ``geometry_p_value`` and
    ``flagged_by_geometry`` (its score becomes ``max(score, geometry_z)`` where the geometry
    alone flagged it); the summary gains ``geometry_flagged``, ``geometry_note`` and
    ``geometry_homogeneity_p``. Nothing is added unless the result is ``"ok"`` in consensus
    mode, and the added flags are set aside (the note says so) when the union would reach
    ``max_flagged_fraction`` of the sites or of the samples.
    """
    summary = {**result.summary, "geometry_homogeneity_p": geometry.homogeneity_p}
    usable = result.status == "ok" and result.summary.get("mode") == "consensus"
    flags = np.asarray([bool(v is not None and v.flag) for v in result.verdicts])
    added = geometry.flags & ~flags if usable and geometry.applies else np.zeros_like(flags)
    note = geometry.note
    if not usable and geometry.applies:
        note = f"geometry not used: the loss evidence is {result.status}"
    union = flags | added
    share = float(sizes[union].sum() / sizes.sum()) if sizes.sum() > 0 else 0.0
    if added.any() and (
        union.sum() >= max_flagged_fraction * flags.size or share >= max_flagged_fraction
    ):
        note = (
            f"geometry evidence set aside: with it {int(union.sum())} of {flags.size} sites "
            f"holding {share:.0%} of the samples would be flagged"
        )
        added = np.zeros_like(flags)
    verdicts: list[ClientVerdict | None] = []
    for i, verdict in enumerate(result.verdicts):
        if verdict is None:
            verdicts.append(None)
            continue
        facts = {
            "geometry_cosine": _number(geometry.cosine[i]),
            "geometry_z": _number(geometry.z[i]),
            "geometry_p_value": _number(geometry.p_value[i]),
            "flagged_by_geometry": bool(added[i]),
        }
        score = verdict.score
        if added[i] and score is not None:
            score = max(score, float(geometry.z[i]))
        verdicts.append(
            replace(
                verdict,
                score=score,
                flag=True if added[i] else verdict.flag,
                evidence={**verdict.evidence, **facts},
            )
        )
    summary["geometry_flagged"] = int(added.sum())
    summary["geometry_note"] = note
    if added.any():
        summary["flagged"] = int((flags | added).sum())
    return replace(result, verdicts=verdicts, summary=summary)


def _number(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def carry_flags(result: DetectionResult, carried: BoolArray) -> DetectionResult:
    """The result with the ``carried`` sites flagged (module docstring, "Carried flags").

    Only an ``"ok"`` result in consensus mode changes; a carried site that is flagged anyway
    keeps its verdict. Each carried verdict gains ``geometry_carried`` (True) and the summary
    ``geometry_carried`` (their number).
    """
    carried = np.asarray(carried, dtype=bool)
    if result.status != "ok" or result.summary.get("mode") != "consensus" or not carried.any():
        return result
    verdicts: list[ClientVerdict | None] = []
    count = 0
    for i, verdict in enumerate(result.verdicts):
        if verdict is None or verdict.flag or not carried[i]:
            verdicts.append(verdict)
            continue
        count += 1
        evidence = {**verdict.evidence, "geometry_carried": True}
        verdicts.append(replace(verdict, flag=True, evidence=evidence))
    flagged = sum(1 for v in verdicts if v is not None and v.flag)
    summary = {**result.summary, "geometry_carried": count, "flagged": flagged}
    return replace(result, verdicts=verdicts, summary=summary)
