"""What each detector says of a site (its verdict's evidence) and of the round (its summary), typed.

A :class:`~service.audit.detection.ClientVerdict` carries its detector's evidence and a
:class:`~service.audit.detection.DetectionResult` its detector's summary, one frozen dataclass per
detector:

* ``evidence``: :class:`EvidenceVerdictEvidence` and :class:`EvidenceSummary`;
* ``fednoro``: :class:`FedNoRoVerdictEvidence` and :class:`FedNoRoSummary`;
* ``fedncl``: :class:`FedNCLVerdictEvidence` and :class:`FedNCLSummary`;
* ``expertise``: :class:`ExpertiseVerdictEvidence` and :class:`ExpertiseSummary`.

The field names are the JSON keys, the same as the API's models of a stored audit
(``service.audit_records.verdict_evidence`` and ``service.audit_records.detection_summaries``, which
this package may not import). Which keys a record holds depends on the path the detector took
(an undetermined round says little; the error counts enter only where the sites sent them; the
update geometry only where it was judged): such a field defaults to :data:`ABSENT` and is left out
of :meth:`JsonRecord.to_json`, whereas ``None`` is written as a JSON null. The fields a detector
always fills (Fed-NCL's and FedRN's verdicts, FedNoRo's) have no default.

Adding a detector: give it its two records here (:class:`JsonRecord` subclasses), add them to
:data:`VerdictEvidence` and :data:`DetectionSummary`, and its API models beside the others'.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar

from service.audit._json import to_jsonable

__all__ = [
    "ABSENT",
    "Absent",
    "DetectionSummary",
    "EmptySummary",
    "EvidenceSummary",
    "EvidenceVerdictEvidence",
    "ExpertiseSummary",
    "ExpertiseVerdictEvidence",
    "FedNCLSummary",
    "FedNCLVerdictEvidence",
    "FedNoRoSummary",
    "FedNoRoVerdictEvidence",
    "GroupMeans",
    "JsonRecord",
    "VerdictEvidence",
    "or_none",
]


T = TypeVar("T")


class Absent(enum.Enum):
    """The type of :data:`ABSENT`: a key the record does not hold (not a JSON null)."""

    ABSENT = "absent"

    def __bool__(self) -> Literal[False]:
        """Falsy, as a missing key's ``dict.get`` was."""
        return False

    def __repr__(self) -> str:
        """``ABSENT``, as the constant is named."""
        return "ABSENT"


ABSENT: Final = Absent.ABSENT
"""A field left out of the JSON (the key is absent); ``None`` is written as null."""


def or_none(value: T | Absent) -> T | None:
    """A record's field, None where it is :data:`ABSENT` (for a reader to whom a missing key
    and a null mean the same)."""
    return None if value is ABSENT else value


@dataclass(frozen=True)
class JsonRecord:
    """A frozen record whose fields are JSON keys; an :data:`ABSENT` field has no key."""

    def to_json(self, path: str = "$") -> dict[str, Any]:
        """Return the record as plain JSON values, without its absent fields.

        Parameters
        ----------
        path : str, default="$"
            The record's JSON path, named in the error on a non-finite float.

        Raises
        ------
        ValueError
            If a float is NaN or infinite (:func:`~service.audit._json.to_jsonable`).
        """
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if value is ABSENT:
                continue
            where = f"{path}.{name}"
            out[name] = (
                value.to_json(where)
                if isinstance(value, JsonRecord)
                else (to_jsonable(value, where))
            )
        return out


# --------------------------------------------------------------------------------------------
# Verdict evidence
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvidenceVerdictEvidence(JsonRecord):
    """The evidence detector's facts on one site (docs/algorithms.md, "The verdict: which
    evidence decides"; :mod:`service.audit.evidence_verdicts`).

    The loss evidence fills ``p_value`` to ``significant``; the error counts (``errors*``,
    ``confident_errors*``), the accuracy evidence (``accuracy_*``, ``flagged_by_accuracy``) and
    the update geometry (``geometry_*``, ``flagged_by_geometry``, ``geometry_carried``) add
    theirs where they were used. Below ``min_clients`` sites the small-federation test
    (:mod:`service.audit.small_federation`) answers with ``p_value``, ``q_value``,
    ``mean_loss``, ``prior_loss``, ``loss_over_prior``, ``noisy_classes`` and ``significant``.
    """

    p_value: float | None | Absent = ABSENT
    q_value: float | None | Absent = ABSENT
    site_z: float | None | Absent = ABSENT
    site_factor: float | None | Absent = ABSENT
    stouffer_z: float | None | Absent = ABSENT
    class_z: list[float | None] | Absent = ABSENT
    noisy_classes: list[int] | Absent = ABSENT
    mean_loss: float | None | Absent = ABSENT
    anchor: bool | Absent = ABSENT
    significant: bool | Absent = ABSENT
    errors: int | None | Absent = ABSENT
    errors_expected: float | None | Absent = ABSENT
    errors_z: float | None | Absent = ABSENT
    errors_p_value: float | None | Absent = ABSENT
    confident_errors: int | None | Absent = ABSENT
    confident_errors_expected: float | None | Absent = ABSENT
    confident_errors_z: float | None | Absent = ABSENT
    confident_errors_p_value: float | None | Absent = ABSENT
    accuracy_z: float | None | Absent = ABSENT
    accuracy_p_value: float | None | Absent = ABSENT
    accuracy_gap: float | None | Absent = ABSENT
    flagged_by_accuracy: bool | Absent = ABSENT
    geometry_cosine: float | None | Absent = ABSENT
    geometry_z: float | None | Absent = ABSENT
    geometry_p_value: float | None | Absent = ABSENT
    flagged_by_geometry: bool | Absent = ABSENT
    geometry_carried: bool | Absent = ABSENT
    prior_loss: float | None | Absent = ABSENT
    loss_over_prior: float | None | Absent = ABSENT


@dataclass(frozen=True)
class FedNoRoVerdictEvidence(JsonRecord):
    """FedNoRo's facts on one site (FedNoRo, stage 1: the per-class losses' mixture).

    Attributes
    ----------
    normalised_loss : list of float or None
        Per class, the site's loss min-max normalised over the sites (None: a class no site
        holds, or that is constant).
    noisy_classes : list of int
        The classes on the noisy component's side of the mixture, largest excess first.
    mean_loss : float
        The site's mean loss over its own samples.
    class_z : float
        The class-standardised loss excess, in standard errors.
    gmm_noisy_probability : float
        The mixture's noisy-component posterior, averaged over its fits, before the guard.
    noisy_votes : int
        In how many mixture fits the site fell in the noisy component.
    """

    normalised_loss: list[float | None]
    noisy_classes: list[int]
    mean_loss: float
    class_z: float
    gmm_noisy_probability: float
    noisy_votes: int


@dataclass(frozen=True)
class FedNCLVerdictEvidence(JsonRecord):
    """Fed-NCL's facts on one site: the terms of q = e * h / n (Fed-NCL, eq. 9).

    Attributes
    ----------
    divergence : float
        e, the squared distance of the site's model from the global model (eq. 7).
    data_quality : float
        h, the site's training loss summed over its samples (``loss_mode="sum"``) or its mean.
    deviation : float
        q minus the round's mean q, in the round's standard deviation of q.
    """

    divergence: float
    data_quality: float
    deviation: float


@dataclass(frozen=True)
class ExpertiseVerdictEvidence(JsonRecord):
    """FedRN's expertise input on one site (FedRN, eq. 4).

    Attributes
    ----------
    train_accuracy : float
        The local model's accuracy on the site's own labels.
    """

    train_accuracy: float


VerdictEvidence = (
    EvidenceVerdictEvidence
    | FedNoRoVerdictEvidence
    | FedNCLVerdictEvidence
    | ExpertiseVerdictEvidence
)
"""Any detector's verdict evidence."""


# --------------------------------------------------------------------------------------------
# Round summaries
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EmptySummary(JsonRecord):
    """The summary of a detector that did not run (an input was missing): ``{}``."""


@dataclass(frozen=True)
class EvidenceSummary(JsonRecord):
    """The evidence detector's round (docs/algorithms.md, "Calibrated evidence").

    An undetermined round holds ``verdict`` and ``q``; a small federation's test adds
    ``reason``, ``mode``, ``flagged``, ``label_entropy`` and ``informativeness``; the consensus
    and anchored passes fill the rest up to ``site_df``; the majority memory
    (:mod:`service.audit.majority_memory`) adds ``majority_*`` and the update geometry
    (:mod:`service.audit.geometry_evidence`) ``geometry_*``.
    """

    verdict: str | Absent = ABSENT
    reason: str | None | Absent = ABSENT
    mode: str | Absent = ABSENT
    q: float | Absent = ABSENT
    flagged: int | Absent = ABSENT
    informativeness: float | None | Absent = ABSENT
    accuracy_informativeness: float | None | Absent = ABSENT
    heterogeneity: float | None | Absent = ABSENT
    mixture_flagged: int | None | Absent = ABSENT
    label_entropy: float | None | Absent = ABSENT
    anchors: int | Absent = ABSENT
    anchor_orientation: str | Absent = ABSENT
    spreads_reported: bool | Absent = ABSENT
    accuracy_flagged: int | Absent = ABSENT
    accuracy_note: str | None | Absent = ABSENT
    accuracy_centre: float | None | Absent = ABSENT
    significant_high: int | Absent = ABSENT
    significant_low: int | Absent = ABSENT
    errors_counted: bool | Absent = ABSENT
    errors_dispersion: float | None | Absent = ABSENT
    confident_errors_counted: bool | Absent = ABSENT
    class_centre: list[float | None] | Absent = ABSENT
    class_tau: list[float | None] | Absent = ABSENT
    site_tau: float | None | Absent = ABSENT
    site_df: float | None | Absent = ABSENT
    majority_suspected: bool | Absent = ABSENT
    majority_rounds: int | Absent = ABSENT
    geometry_judged: int | Absent = ABSENT
    geometry_flagged: int | Absent = ABSENT
    geometry_note: str | None | Absent = ABSENT
    geometry_carried: int | Absent = ABSENT
    geometry_carry_note: str | None | Absent = ABSENT
    disagreeing_classes: list[int] | Absent = ABSENT


@dataclass(frozen=True)
class GroupMeans(JsonRecord):
    """A statistic's mean over the noisy group and over the others (None: the group is empty).

    Attributes
    ----------
    noisy, clean : float or None
    """

    noisy: float | None
    clean: float | None


@dataclass(frozen=True)
class FedNoRoSummary(JsonRecord):
    """FedNoRo's round: the mixture vote and its separation guard (docs/algorithms.md).

    An undetermined round holds at most the ``columns_*`` (nothing when too few clients
    reported); a fitted one every field.
    """

    columns_used: list[int] | Absent = ABSENT
    columns_dropped_missing: list[int] | Absent = ABSENT
    columns_dropped_constant: list[int] | Absent = ABSENT
    n_fits: int | Absent = ABSENT
    vote_count: int | Absent = ABSENT
    separation_groups: str | Absent = ABSENT
    groups_tested: int | Absent = ABSENT
    group_rank: int | Absent = ABSENT
    separation_quantile_judged: float | None | Absent = ABSENT
    fits_converged: list[bool] | Absent = ABSENT
    ashman_d: float | None | Absent = ABSENT
    ashman_d_infinite: bool | Absent = ABSENT
    separation_required: bool | Absent = ABSENT
    separation_threshold: float | None | Absent = ABSENT
    separation_null_threshold: float | None | Absent = ABSENT
    separation_passed: bool | None | Absent = ABSENT
    separation_confirmed_group: bool | None | Absent = ABSENT
    separation_statistic: str | Absent = ABSENT
    class_z_classes: list[int] | Absent = ABSENT
    guard: str | None | Absent = ABSENT
    mixture_noisy_count: int | Absent = ABSENT
    n_flagged: int | Absent = ABSENT
    group_mean_loss: GroupMeans | Absent = ABSENT
    group_mean_statistic: GroupMeans | Absent = ABSENT


@dataclass(frozen=True)
class FedNCLSummary(JsonRecord):
    """Fed-NCL's round: the sigma rule on q (Fed-NCL, eq. 9-10); empty when undetermined."""

    mean: float | Absent = ABSENT
    std: float | Absent = ABSENT
    std_ddof: int | Absent = ABSENT
    beta: float | Absent = ABSENT
    two_sided: bool | Absent = ABSENT
    loss_mode: str | Absent = ABSENT
    threshold: float | Absent = ABSENT
    lower_threshold: float | None | Absent = ABSENT
    n_flagged: int | Absent = ABSENT


@dataclass(frozen=True)
class ExpertiseSummary(JsonRecord):
    """FedRN's expertise over the round; empty when undetermined (no client)."""

    min_accuracy: float | Absent = ABSENT
    max_accuracy: float | Absent = ABSENT
    note: str | Absent = ABSENT


DetectionSummary = (
    EvidenceSummary | FedNoRoSummary | FedNCLSummary | ExpertiseSummary | EmptySummary
)
"""Any detector's round summary."""
