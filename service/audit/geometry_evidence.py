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

**Who is judged, against whom.** A site's update depends on more than its labels: on its class mix
(under label skew clean sites move in different directions because their data differ; on Dirichlet
federations a clean site stood up to 6.5 robust deviations out) and on its size (a site of 27
samples among sites of 100-400 takes fewer, noisier steps: a clean one stood 8.8 out). So a site is
judged only against its **peers**: sites whose class mix is the federation's up to sampling (per
site, Pearson's chi-square test of its declared counts against the pooled mix, p >=
``min_homogeneity_p``; classes nobody holds left out; and 80 % of the sites must pass,
:data:`HOMOGENEOUS_SHARE`, else the federation is skewed and nobody is judged) and whose size is
within the same power of two (``floor(log2 n_k)``). A group of fewer than ``min_sites`` peers is
not judged (the MAD of 5 or 6 cosines is too unstable: a clean site of 6 stood 10.7 out). A site
that trained in the noisy role this round (its status before the round was noisy: FedNoRo's
distillation, another objective) is neither judged nor part of its peers' null: distilled updates
lie close together and shrank the MAD until a clean site stood 6.0 out. The consensus ``S`` itself
is every site's. The test runs only in consensus mode, when the loss evidence reached a verdict.

**Null model.** Clean peers' cosines scatter around a common centre. The centre is the group's
median and the scale ``1.4826 MAD`` (the normal-consistent median absolute deviation, Hampel
1974), so a minority of low sites moves neither; ``z_k = (median - c_k) / (1.4826 MAD)``,
one-sided ``p_k = 1 - Phi(z_k)``. The normal tail is an approximation (the cosines are bounded
and their spread is estimated from the sites themselves); what keeps clean sites unflagged is
the floor below, part measured, part the simulated null of the statistic itself.

**Flags.** Benjamini-Hochberg at the loss evidence's ``q`` over the judged sites, and ``z_k >=
max(min_z, critical_z(n))`` with ``n`` the size of the site's group. ``min_z`` (default 10) is
measured, not derived: over the stored rounds of the matrix and the liar federations, clean sites
judged among their peers reached z 7.8 (20 IID digit sites, the 6 noisy ones out of the null) and
7.9 (a clean minority under a noisy majority, where the loss evidence abstained), while the liars
stood at 10-70 from round 3 (docs/evaluation.md). ``critical_z``
(:mod:`service.audit.geometry_null`) is derived: among few peers the MAD itself is unstable, and a
clean site of a 9-site group stood 12.7 out when five of the nine cosines happened to lie together;
the group's size sets how far out chance can put a clean site (one round in 10,000 under a normal
null: 24.9 for 9 peers, 16.9 for 10, 13.8 for 12, 10.5 for 16, the 10 of ``min_z`` from 18 on; at
one in 1,000 a clean site of a 10-site group stood out twice in 27 rounds). At these floors BH
changes nothing in practice; it is there for a lower floor. Added to the loss evidence's flags
unless together they would flag ``max_flagged_fraction`` of the sites or samples (then set aside,
as the accuracy evidence's). Anchors are never flagged.

**Carried flags.** Once flagged, a site trains in the noisy role (FedNoRo's distillation pulls its
model towards the global model's predictions), so its update moves with the others' whatever its
labels, and after ``status_w`` such rounds the status rule would trust it again; the liars of the
evaluation were caught, released and caught again. A site that is noisy, whose latest flag was the
geometry's alone, keeps its flag while the loss evidence reaches a verdict in consensus mode
(``geometry_carried`` in its verdict; :func:`carry_flags`; never to ``max_flagged_fraction``):
its update in the noisy role cannot clear it. A flag of the loss evidence ends it (the status
then rests on the losses); so does an admin's pin to ``trusted`` (the coordinator's status
history: a pinned site is not carried, and a flag a pin overrode is not the geometry's).

**Limits.** A site can shape its update too (train on its true labels' direction, or scale a chosen
update): what this test sees is a site that trains on what it holds. A site whose mix is not the
federation's (label skew, or an asymmetric noise that moves its declared counts) or whose size has
fewer than ``min_sites - 1`` peers is not judged (8 by default: with 10 sites and one liar in the
noisy role, 9 remain), and the summary counts who was (``geometry_judged``). A site whose data are
unlike the others' for another reason (a scanner) is what the peer groups and the floor are for;
they are measured, not proved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.stats import chi2, norm

from service.audit._typing import BoolArray, FloatArray, IntArray
from service.audit._validation import InvalidInputError, as_float_array
from service.audit.class_null import benjamini_hochberg
from service.audit.detection import ClientVerdict, EvidenceResult
from service.audit.geometry_null import critical_z, mad_z
from service.audit.verdict_types import EvidenceVerdictEvidence, or_none

__all__ = [
    "GeometryEvidence",
    "add_geometry",
    "carry_flags",
    "geometry_evidence",
    "leave_one_out_cosines",
    "peer_groups",
    "raised_by_geometry",
    "site_mix_p_values",
]


HOMOGENEOUS_SHARE = 0.8
"""The share of the sites that must hold the federation's class mix for any update to be judged:
under label skew a few sites pass the per-site test by chance (small ones above all, where it has
little power) and are still unlike each other (a clean site of a 50-site Dirichlet(0.5)
federation stood 8.1 out among such peers)."""


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
    judged : ndarray of bool of shape (K,)
        The sites whose update was judged (in a group of peers; z and p are NaN elsewhere).
    note : str or None
    """

    applies: bool
    cosine: FloatArray
    z: FloatArray
    p_value: FloatArray
    flags: BoolArray
    judged: BoolArray
    note: str | None

    @classmethod
    def not_made(cls, k: int, note: str) -> GeometryEvidence:
        """The evidence of a round whose updates were not judged, and why."""
        empty = np.full(k, np.nan)
        nobody = np.zeros(k, dtype=bool)
        return cls(False, empty, empty.copy(), empty.copy(), nobody, nobody.copy(), note)


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


def site_mix_p_values(class_counts: Any) -> FloatArray:
    """Per site, Pearson's chi-square test that its class mix is the federation's; p-values.

    Parameters
    ----------
    class_counts : array-like of shape (K, C)
        Declared counts; classes nobody holds are left out (C' classes remain).

    Returns
    -------
    ndarray of shape (K,)
        The upper tail of chi-square with C' - 1 degrees of freedom at ``sum_c (O - E)^2 / E``,
        ``E = n_k p_c`` with ``p`` the pooled mix of every site. 1.0 where fewer than two
        classes are held (nothing can differ); NaN for a site without samples.
    """
    table = as_float_array("class_counts", class_counts, ndim=2, min_value=0.0)
    table = table[:, table.sum(axis=0) > 0]
    k, c = table.shape
    if c < 2:
        return np.ones(k)
    sizes = table.sum(axis=1)
    expected = sizes[:, None] * (table.sum(axis=0) / table.sum())[None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        statistic = ((table - expected) ** 2 / expected).sum(axis=1)
    result: FloatArray = np.where(sizes > 0, chi2.sf(statistic, c - 1), np.nan)
    return result


def peer_groups(
    class_counts: Any,
    num_samples: Any,
    *,
    min_sites: int = 8,
    min_homogeneity_p: float = 0.01,
    exclude: BoolArray | None = None,
) -> IntArray:
    """The group each site's update is judged in, or -1 (module docstring, "Who is judged").

    A site enters when its class mix is the federation's up to sampling
    (:func:`site_mix_p_values` >= ``min_homogeneity_p``); the entered sites are grouped by size,
    ``floor(log2 n_k)`` (sites within a factor of two of each other), and a group of fewer than
    ``min_sites`` sites is not judged, and nobody is when fewer than ``HOMOGENEOUS_SHARE`` of
    the sites hold the federation's mix. ``exclude``: sites that enter no group (those that
    trained in the noisy role this round: their update follows another objective).
    """
    counts = as_float_array("class_counts", class_counts, ndim=2, min_value=0.0)
    sizes = as_float_array("num_samples", num_samples, ndim=1, min_value=0.0)
    if sizes.size != counts.shape[0]:
        raise InvalidInputError(f"num_samples: {sizes.size} entries for {counts.shape[0]} sites")
    mix_p = site_mix_p_values(counts)
    entered = (mix_p >= min_homogeneity_p) & (sizes >= 1.0)
    if int(entered.sum()) < HOMOGENEOUS_SHARE * sizes.size:  # a skewed federation
        return np.full(sizes.size, -1, dtype=np.int64)
    if exclude is not None:
        entered &= ~np.asarray(exclude, dtype=bool)
    bins = np.where(entered, np.floor(np.log2(np.maximum(sizes, 1.0))), -1.0).astype(np.int64)
    groups = np.full(sizes.size, -1, dtype=np.int64)
    for value in np.unique(bins[entered]):
        members = entered & (bins == value)
        if int(members.sum()) >= min_sites:
            groups[members] = value
    return groups


def geometry_evidence(
    cosines: Any,
    class_counts: Any,
    num_samples: Any,
    *,
    q: float,
    min_z: float = 10.0,
    min_sites: int = 8,
    min_homogeneity_p: float = 0.01,
    never: BoolArray | None = None,
    exclude: BoolArray | None = None,
) -> GeometryEvidence:
    """Judge each site's update direction against its peers' (module docstring).

    Parameters
    ----------
    cosines : array-like of shape (K,)
        :func:`leave_one_out_cosines`; NaN for a site without a direction (never flagged).
    class_counts : array-like of shape (K, C)
    num_samples : array-like of shape (K,)
    q : float
        Benjamini-Hochberg level.
    min_z : float, default=10.0
        The floor on the robust z; a group of few peers has a higher one,
        :func:`~service.audit.geometry_null.critical_z` of its size.
    min_sites : int, default=8
        The smallest group of peers (:func:`peer_groups`).
    min_homogeneity_p : float, default=0.01
    never : ndarray of bool of shape (K,), optional
        Sites never flagged (anchors).
    exclude : ndarray of bool of shape (K,), optional
        Sites neither judged nor part of their peers' null (:func:`peer_groups`).

    Returns
    -------
    GeometryEvidence
    """
    cos = as_float_array("cosines", cosines, ndim=1, allow_nan=True)
    k = cos.size
    counts = as_float_array("class_counts", class_counts, ndim=2, min_value=0.0)
    if counts.shape[0] != k:
        raise InvalidInputError(f"class_counts: {counts.shape[0]} rows for {k} cosines")
    groups = peer_groups(
        counts,
        num_samples,
        min_sites=min_sites,
        min_homogeneity_p=min_homogeneity_p,
        exclude=exclude,
    )
    groups = np.where(np.isfinite(cos), groups, -1)
    z = np.full(k, np.nan)
    floor = np.full(k, np.inf)  # the z each judged site must reach: its group's
    for value in np.unique(groups[groups >= 0]):
        members = groups == value
        n = int(members.sum())
        if n < min_sites:  # peers without a direction left too few
            continue
        group_z, scale = mad_z(cos[members])
        if float(scale) > 0.0:
            z[members] = group_z
            floor[members] = max(min_z, critical_z(n))
    judged = np.isfinite(z)
    if not judged.any():
        return GeometryEvidence.not_made(k, _why_nobody(counts, min_sites, min_homogeneity_p))
    p = norm.sf(z)  # NaN where not judged
    significant, _ = benjamini_hochberg(p[judged], q)
    flags = np.zeros(k, dtype=bool)
    flags[judged] = significant & (z[judged] >= floor[judged])
    if never is not None:
        flags &= ~np.asarray(never, dtype=bool)
    return GeometryEvidence(True, cos, z, p, flags, judged, None)


def _why_nobody(counts: FloatArray, min_sites: int, min_p: float) -> str:
    """Why no site's update was judged (the summary's ``geometry_note``)."""
    mix_p = site_mix_p_values(counts)
    same_mix, k = int((mix_p >= min_p).sum()), mix_p.size
    if same_mix < min_sites:
        differ = "class mixes differ: " if same_mix < k else ""
        return (
            f"{differ}{same_mix} of {k} sites hold the federation's class mix (needs "
            f"{min_sites} of similar size)"
        )
    if same_mix < HOMOGENEOUS_SHARE * k:
        return (
            f"class mixes differ: {same_mix} of {k} sites hold the federation's mix (needs "
            f"{HOMOGENEOUS_SHARE:.0%}): updates not comparable"
        )
    return (
        f"no {min_sites} sites of the federation's class mix within a factor of two in size, "
        "or their updates point the same way"
    )


def add_geometry(
    result: EvidenceResult,
    geometry: GeometryEvidence,
    sizes: FloatArray,
    max_flagged_fraction: float,
) -> EvidenceResult:
    """The evidence detector's result with the geometry's flags added and its facts shown.

    Each verdict gains ``geometry_cosine``, ``geometry_z``, ``geometry_p_value`` and
    ``flagged_by_geometry`` (its score becomes ``max(score, geometry_z)`` where the geometry
    alone flagged it); the summary gains ``geometry_flagged``, ``geometry_note`` and
    ``geometry_judged`` (how many sites were judged). Nothing is added unless the result is
    ``"ok"`` in consensus mode, and the added flags are set aside (the note says so) when the
    union would reach ``max_flagged_fraction`` of the sites or of the samples.
    """
    usable = result.status == "ok" and result.summary.mode == "consensus"
    flags = np.asarray([bool(v is not None and v.flag) for v in result.verdicts])
    added = geometry.flags & ~flags if usable and geometry.applies else np.zeros_like(flags)
    note = geometry.note
    if not usable and geometry.applies:
        note = f"geometry not used: the loss evidence is {result.status}"
        if result.status == "ok":
            note += f" in {or_none(result.summary.mode)} mode"
    if added.any():
        cap = _over_cap(flags | added, sizes, max_flagged_fraction)
        if cap is not None:
            note = f"geometry evidence set aside: with it {cap}"
            added = np.zeros_like(flags)
    verdicts: list[ClientVerdict[EvidenceVerdictEvidence] | None] = []
    for i, verdict in enumerate(result.verdicts):
        if verdict is None:
            verdicts.append(None)
            continue
        evidence = replace(
            verdict.evidence,
            geometry_cosine=_number(geometry.cosine[i]),
            geometry_z=_number(geometry.z[i]),
            geometry_p_value=_number(geometry.p_value[i]),
            flagged_by_geometry=bool(added[i]),
        )
        score = verdict.score
        if added[i] and score is not None:
            score = max(score, float(geometry.z[i]))
        verdicts.append(
            replace(
                verdict,
                score=score,
                flag=True if added[i] else verdict.flag,
                evidence=evidence,
            )
        )
    summary = replace(
        result.summary,
        geometry_judged=int(geometry.judged.sum()),
        geometry_flagged=int(added.sum()),
        geometry_note=note,
    )
    if added.any():
        summary = replace(summary, flagged=int((flags | added).sum()))
    return replace(result, verdicts=verdicts, summary=summary)


def _over_cap(union: BoolArray, sizes: FloatArray, fraction: float) -> str | None:
    """Why flagging ``union`` reaches ``fraction`` of the sites or the samples, or None."""
    share = float(sizes[union].sum() / sizes.sum()) if sizes.sum() > 0 else 0.0
    if union.sum() >= fraction * union.size or share >= fraction:
        sites = f"{int(union.sum())} of {union.size} sites"
        return f"{sites} holding {share:.0%} of the samples would be flagged"
    return None


def raised_by_geometry(verdict: ClientVerdict) -> bool:
    """Whether the evidence detector's flag on this verdict is the update geometry's alone
    (added by :func:`add_geometry` or carried by :func:`carry_flags`)."""
    evidence = verdict.evidence
    if not verdict.flag or not isinstance(evidence, EvidenceVerdictEvidence):
        return False
    return evidence.flagged_by_geometry is True or evidence.geometry_carried is True


def _number(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def carry_flags(
    result: EvidenceResult, carried: BoolArray, sizes: FloatArray, max_flagged_fraction: float
) -> EvidenceResult:
    """The result with the ``carried`` sites flagged (module docstring, "Carried flags").

    Only an ``"ok"`` result in consensus mode changes; a carried site that is flagged anyway
    keeps its verdict. Each carried verdict gains ``geometry_carried`` (True) and the summary
    ``geometry_carried`` (their number). Nothing is carried when the flags with the carried ones
    would reach ``max_flagged_fraction`` of the sites or samples (``geometry_carry_note`` says so).
    """
    carried = np.asarray(carried, dtype=bool)
    if result.status != "ok" or result.summary.mode != "consensus" or not carried.any():
        return result
    flags = np.asarray([bool(v is not None and v.flag) for v in result.verdicts])
    cap = _over_cap(flags | carried, sizes, max_flagged_fraction)
    if cap is not None:
        note = f"not carried: {cap}"
        return replace(result, summary=replace(result.summary, geometry_carry_note=note))
    verdicts: list[ClientVerdict[EvidenceVerdictEvidence] | None] = []
    count = 0
    for i, verdict in enumerate(result.verdicts):
        if verdict is None or verdict.flag or not carried[i]:
            verdicts.append(verdict)
            continue
        count += 1
        evidence = replace(verdict.evidence, geometry_carried=True)
        verdicts.append(replace(verdict, flag=True, evidence=evidence))
    flagged = sum(1 for v in verdicts if v is not None and v.flag)
    summary = replace(result.summary, geometry_carried=count, flagged=flagged)
    return replace(result, verdicts=verdicts, summary=summary)
