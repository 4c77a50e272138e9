r"""A stored audit's detections in the SDK: each verdict's evidence and each round's summary typed
by the detector.

Mirrors ``DetectionRecord`` and the per-detector records of ``openapi/openapi.json`` (a test
checks the fields). ``AuditRecord.detections[name]`` is an :class:`AuditEvidenceDetection`,
:class:`AuditFedNoRoDetection`, :class:`AuditFedNCLDetection` or :class:`AuditExpertiseDetection`
by its ``method`` (each an :class:`AuditDetection`, the record of a detector this SDK does not
know). A verdict's ``evidence`` and a detection's ``summary`` are plain dicts, as they always
were, typed as ``TypedDict``\ s: the keys the coordinator sent, and only those (a key a newer
coordinator adds is kept), so ``"p_value" in evidence``, ``evidence.get("site_z", 0.0)`` and
``json.dumps(summary)`` behave as before, and a type checker knows each key's type.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, with_config
from typing_extensions import TypedDict

__all__ = [
    "AnyAuditDetection",
    "AuditDetection",
    "AuditEvidenceDetails",
    "AuditEvidenceDetection",
    "AuditEvidenceSummary",
    "AuditEvidenceVerdict",
    "AuditExpertiseDetails",
    "AuditExpertiseDetection",
    "AuditExpertiseSummary",
    "AuditExpertiseVerdict",
    "AuditFedNCLDetails",
    "AuditFedNCLDetection",
    "AuditFedNCLSummary",
    "AuditFedNCLVerdict",
    "AuditFedNoRoDetails",
    "AuditFedNoRoDetection",
    "AuditFedNoRoSummary",
    "AuditFedNoRoVerdict",
    "AuditGroupMeans",
    "AuditVerdict",
]


class _Model(BaseModel):
    # Unknown fields are ignored so an older SDK keeps working with a newer coordinator.
    model_config = ConfigDict(extra="ignore")


_KEEP_NEW_KEYS = ConfigDict(extra="allow")


@with_config(_KEEP_NEW_KEYS)
class AuditEvidenceDetails(TypedDict, total=False):
    """The evidence detector's facts on one site (docs/algorithms.md, "The verdict: which
    evidence decides"; the fields' meaning: the OpenAPI spec's ``EvidenceVerdictEvidence``)."""

    p_value: float | None
    q_value: float | None
    site_z: float | None
    site_factor: float | None
    stouffer_z: float | None
    class_z: list[float | None] | None
    noisy_classes: list[int] | None
    mean_loss: float | None
    anchor: bool | None
    significant: bool | None
    errors: int | None
    errors_expected: float | None
    errors_z: float | None
    errors_p_value: float | None
    confident_errors: int | None
    confident_errors_expected: float | None
    confident_errors_z: float | None
    confident_errors_p_value: float | None
    accuracy_z: float | None
    accuracy_p_value: float | None
    accuracy_gap: float | None
    flagged_by_accuracy: bool | None
    geometry_cosine: float | None
    geometry_z: float | None
    geometry_p_value: float | None
    flagged_by_geometry: bool | None
    geometry_carried: bool | None
    prior_loss: float | None
    loss_over_prior: float | None


@with_config(_KEEP_NEW_KEYS)
class AuditFedNoRoDetails(TypedDict, total=False):
    """FedNoRo's facts on one site (the per-class losses' mixture)."""

    normalised_loss: list[float | None] | None
    noisy_classes: list[int] | None
    mean_loss: float | None
    class_z: float | None
    gmm_noisy_probability: float | None
    noisy_votes: int | None


@with_config(_KEEP_NEW_KEYS)
class AuditFedNCLDetails(TypedDict, total=False):
    """Fed-NCL's facts on one site: the terms of q = e * h / n (eq. 9)."""

    divergence: float | None
    data_quality: float | None
    deviation: float | None


@with_config(_KEEP_NEW_KEYS)
class AuditExpertiseDetails(TypedDict, total=False):
    """FedRN's expertise input on one site."""

    train_accuracy: float | None


@with_config(_KEEP_NEW_KEYS)
class AuditEvidenceSummary(TypedDict, total=False):
    """The evidence detector's round (the fields' meaning: the OpenAPI spec's
    ``EvidenceSummary``)."""

    verdict: str | None
    reason: str | None
    mode: str | None
    q: float | None
    flagged: int | None
    informativeness: float | None
    accuracy_informativeness: float | None
    heterogeneity: float | None
    mixture_flagged: int | None
    label_entropy: float | None
    anchors: int | None
    anchor_orientation: str | None
    spreads_reported: bool | None
    accuracy_flagged: int | None
    accuracy_note: str | None
    accuracy_centre: float | None
    significant_high: int | None
    significant_low: int | None
    errors_counted: bool | None
    errors_dispersion: float | None
    confident_errors_counted: bool | None
    class_centre: list[float | None] | None
    class_tau: list[float | None] | None
    site_tau: float | None
    site_df: float | None
    majority_suspected: bool | None
    majority_rounds: int | None
    geometry_judged: int | None
    geometry_flagged: int | None
    geometry_note: str | None
    geometry_carried: int | None
    geometry_carry_note: str | None
    disagreeing_classes: list[int]


@with_config(_KEEP_NEW_KEYS)
class AuditGroupMeans(TypedDict, total=False):
    """A statistic's mean over FedNoRo's noisy group and over the others."""

    noisy: float | None
    clean: float | None


@with_config(_KEEP_NEW_KEYS)
class AuditFedNoRoSummary(TypedDict, total=False):
    """FedNoRo's round: the mixture vote and its separation guard."""

    columns_used: list[int] | None
    columns_dropped_missing: list[int] | None
    columns_dropped_constant: list[int] | None
    n_fits: int | None
    vote_count: int | None
    separation_groups: str | None
    groups_tested: int | None
    group_rank: int | None
    separation_quantile_judged: float | None
    fits_converged: list[bool] | None
    ashman_d: float | None
    ashman_d_infinite: bool | None
    separation_required: bool | None
    separation_threshold: float | None
    separation_null_threshold: float | None
    separation_passed: bool | None
    separation_confirmed_group: bool | None
    separation_statistic: str | None
    class_z_classes: list[int] | None
    guard: str | None
    mixture_noisy_count: int | None
    n_flagged: int | None
    group_mean_loss: AuditGroupMeans | None
    group_mean_statistic: AuditGroupMeans | None


@with_config(_KEEP_NEW_KEYS)
class AuditFedNCLSummary(TypedDict, total=False):
    """Fed-NCL's round: the sigma rule on q."""

    mean: float | None
    std: float | None
    std_ddof: int | None
    beta: float | None
    two_sided: bool | None
    loss_mode: str | None
    threshold: float | None
    lower_threshold: float | None
    n_flagged: int | None


@with_config(_KEEP_NEW_KEYS)
class AuditExpertiseSummary(TypedDict, total=False):
    """FedRN's expertise over the round."""

    min_accuracy: float | None
    max_accuracy: float | None
    note: str | None


class AuditVerdict(_Model):
    """One detector's verdict on one site; ``evidence``: the detector's own facts (a dict)."""

    score: float | None
    probability: float | None = None
    flag: bool | None
    evidence: Mapping[str, Any] = Field(default_factory=dict)


class AuditEvidenceVerdict(AuditVerdict):
    """The evidence detector's verdict on one site."""

    evidence: AuditEvidenceDetails = Field(default_factory=lambda: AuditEvidenceDetails())


class AuditFedNoRoVerdict(AuditVerdict):
    """FedNoRo's verdict on one site."""

    evidence: AuditFedNoRoDetails = Field(default_factory=lambda: AuditFedNoRoDetails())


class AuditFedNCLVerdict(AuditVerdict):
    """Fed-NCL's verdict on one site."""

    evidence: AuditFedNCLDetails = Field(default_factory=lambda: AuditFedNCLDetails())


class AuditExpertiseVerdict(AuditVerdict):
    """FedRN's expertise of one site (it never flags)."""

    evidence: AuditExpertiseDetails = Field(default_factory=lambda: AuditExpertiseDetails())


class AuditDetection(_Model):
    """One detector's result for a round; ``verdicts`` aligned with the audit's client_ids. A
    detector this SDK does not know comes as this class itself (plain dicts inside)."""

    method: str
    status: str
    """``ok``, ``undetermined`` or ``inconclusive`` today; a plain string so that a status a
    newer coordinator adds does not break this SDK."""
    reason: str | None = None
    verdicts: Sequence[AuditVerdict | None]
    summary: Mapping[str, Any] = Field(default_factory=dict)


class AuditEvidenceDetection(AuditDetection):
    """The evidence detector's result for a round (the default primary detector)."""

    method: Literal["evidence"]
    verdicts: list[AuditEvidenceVerdict | None]
    summary: AuditEvidenceSummary = Field(default_factory=lambda: AuditEvidenceSummary())


class AuditFedNoRoDetection(AuditDetection):
    """FedNoRo's result for a round."""

    method: Literal["fednoro"]
    verdicts: list[AuditFedNoRoVerdict | None]
    summary: AuditFedNoRoSummary = Field(default_factory=lambda: AuditFedNoRoSummary())


class AuditFedNCLDetection(AuditDetection):
    """Fed-NCL's result for a round."""

    method: Literal["fedncl"]
    verdicts: list[AuditFedNCLVerdict | None]
    summary: AuditFedNCLSummary = Field(default_factory=lambda: AuditFedNCLSummary())


class AuditExpertiseDetection(AuditDetection):
    """FedRN's expertise for a round."""

    method: Literal["expertise"]
    verdicts: list[AuditExpertiseVerdict | None]
    summary: AuditExpertiseSummary = Field(default_factory=lambda: AuditExpertiseSummary())


_TYPED = frozenset({"evidence", "fednoro", "fedncl", "expertise"})


def _tag(value: Any) -> str:
    method = value.get("method") if isinstance(value, dict) else getattr(value, "method", None)
    return method if isinstance(method, str) and method in _TYPED else "other"


AnyAuditDetection = Annotated[
    Annotated[AuditEvidenceDetection, Tag("evidence")]
    | Annotated[AuditFedNoRoDetection, Tag("fednoro")]
    | Annotated[AuditFedNCLDetection, Tag("fedncl")]
    | Annotated[AuditExpertiseDetection, Tag("expertise")]
    | Annotated[AuditDetection, Tag("other")],
    Discriminator(_tag),
]
"""One detector's result, typed by its ``method``."""
