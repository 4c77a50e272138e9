"""A stored audit's detections in the SDK: each verdict's evidence typed by the detector.

Mirrors ``DetectionRecord`` and the per-detector records of ``openapi/openapi.json`` (a test
checks the fields). ``AuditRecord.detections[name]`` is an :class:`AuditEvidenceDetection`,
:class:`AuditFedNoRoDetection`, :class:`AuditFedNCLDetection` or :class:`AuditExpertiseDetection`
by its ``method``, and an :class:`AuditDetection` (evidence as a plain dict) for a detector this
SDK does not know. A field the coordinator did not send is None. The evidence and summary
objects still answer ``evidence["p_value"]`` and ``summary.get("mode")`` as the dicts did
before, for their own fields and for fields a newer coordinator adds.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

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


class _Details(BaseModel):
    """A verdict's evidence or a round's summary: typed fields, unknown ones kept, readable as
    a mapping."""

    model_config = ConfigDict(extra="allow")

    def __getitem__(self, key: str) -> Any:
        """``evidence["p_value"]``: a field (None when not sent) or a field this SDK does not
        know; KeyError for neither."""
        if key in type(self).model_fields:
            return getattr(self, key)
        extra = self.model_extra or {}
        if key in extra:
            return extra[key]
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        """``evidence.get("p_value")``, as on the dict the evidence used to be."""
        try:
            value = self[key]
        except KeyError:
            return default
        return default if value is None else value


class AuditEvidenceDetails(_Details):
    """The evidence detector's facts on one site (docs/algorithms.md, "The verdict: which
    evidence decides"; the fields' meaning: the OpenAPI spec's ``EvidenceVerdictEvidence``)."""

    p_value: float | None = None
    q_value: float | None = None
    site_z: float | None = None
    site_factor: float | None = None
    stouffer_z: float | None = None
    class_z: list[float | None] | None = None
    noisy_classes: list[int] | None = None
    mean_loss: float | None = None
    anchor: bool | None = None
    significant: bool | None = None
    errors: int | None = None
    errors_expected: float | None = None
    errors_z: float | None = None
    errors_p_value: float | None = None
    confident_errors: int | None = None
    confident_errors_expected: float | None = None
    confident_errors_z: float | None = None
    confident_errors_p_value: float | None = None
    accuracy_z: float | None = None
    accuracy_p_value: float | None = None
    accuracy_gap: float | None = None
    flagged_by_accuracy: bool | None = None
    geometry_cosine: float | None = None
    geometry_z: float | None = None
    geometry_p_value: float | None = None
    flagged_by_geometry: bool | None = None
    geometry_carried: bool | None = None
    prior_loss: float | None = None
    loss_over_prior: float | None = None


class AuditFedNoRoDetails(_Details):
    """FedNoRo's facts on one site (the per-class losses' mixture)."""

    normalised_loss: list[float | None] | None = None
    noisy_classes: list[int] | None = None
    mean_loss: float | None = None
    class_z: float | None = None
    gmm_noisy_probability: float | None = None
    noisy_votes: int | None = None


class AuditFedNCLDetails(_Details):
    """Fed-NCL's facts on one site: the terms of q = e * h / n (eq. 9)."""

    divergence: float | None = None
    data_quality: float | None = None
    deviation: float | None = None


class AuditExpertiseDetails(_Details):
    """FedRN's expertise input on one site."""

    train_accuracy: float | None = None


class AuditEvidenceSummary(_Details):
    """The evidence detector's round (the fields' meaning: the OpenAPI spec's
    ``EvidenceSummary``)."""

    verdict: str | None = None
    reason: str | None = None
    mode: str | None = None
    q: float | None = None
    flagged: int | None = None
    informativeness: float | None = None
    accuracy_informativeness: float | None = None
    heterogeneity: float | None = None
    mixture_flagged: int | None = None
    label_entropy: float | None = None
    anchors: int | None = None
    anchor_orientation: str | None = None
    spreads_reported: bool | None = None
    accuracy_flagged: int | None = None
    accuracy_note: str | None = None
    accuracy_centre: float | None = None
    significant_high: int | None = None
    significant_low: int | None = None
    errors_counted: bool | None = None
    errors_dispersion: float | None = None
    confident_errors_counted: bool | None = None
    class_centre: list[float | None] | None = None
    class_tau: list[float | None] | None = None
    site_tau: float | None = None
    site_df: float | None = None
    majority_suspected: bool | None = None
    majority_rounds: int | None = None
    geometry_judged: int | None = None
    geometry_flagged: int | None = None
    geometry_note: str | None = None
    geometry_carried: int | None = None
    geometry_carry_note: str | None = None


class AuditGroupMeans(_Details):
    """A statistic's mean over FedNoRo's noisy group and over the others."""

    noisy: float | None = None
    clean: float | None = None


class AuditFedNoRoSummary(_Details):
    """FedNoRo's round: the mixture vote and its separation guard."""

    columns_used: list[int] | None = None
    columns_dropped_missing: list[int] | None = None
    columns_dropped_constant: list[int] | None = None
    n_fits: int | None = None
    vote_count: int | None = None
    separation_groups: str | None = None
    groups_tested: int | None = None
    group_rank: int | None = None
    separation_quantile_judged: float | None = None
    fits_converged: list[bool] | None = None
    ashman_d: float | None = None
    ashman_d_infinite: bool | None = None
    separation_required: bool | None = None
    separation_threshold: float | None = None
    separation_null_threshold: float | None = None
    separation_passed: bool | None = None
    separation_confirmed_group: bool | None = None
    separation_statistic: str | None = None
    class_z_classes: list[int] | None = None
    guard: str | None = None
    mixture_noisy_count: int | None = None
    n_flagged: int | None = None
    group_mean_loss: AuditGroupMeans | None = None
    group_mean_statistic: AuditGroupMeans | None = None


class AuditFedNCLSummary(_Details):
    """Fed-NCL's round: the sigma rule on q."""

    mean: float | None = None
    std: float | None = None
    std_ddof: int | None = None
    beta: float | None = None
    two_sided: bool | None = None
    loss_mode: str | None = None
    threshold: float | None = None
    lower_threshold: float | None = None
    n_flagged: int | None = None


class AuditExpertiseSummary(_Details):
    """FedRN's expertise over the round."""

    min_accuracy: float | None = None
    max_accuracy: float | None = None
    note: str | None = None


class AuditVerdict(_Model):
    """One verdict of a detector this SDK does not know (``evidence``: a plain dict)."""

    score: float | None
    probability: float | None = None
    flag: bool | None
    evidence: dict[str, Any] = Field(default_factory=dict)


class AuditEvidenceVerdict(_Model):
    """The evidence detector's verdict on one site."""

    score: float | None
    probability: float | None = None
    flag: bool | None
    evidence: AuditEvidenceDetails = Field(default_factory=AuditEvidenceDetails)


class AuditFedNoRoVerdict(_Model):
    """FedNoRo's verdict on one site."""

    score: float | None
    probability: float | None = None
    flag: bool | None
    evidence: AuditFedNoRoDetails = Field(default_factory=AuditFedNoRoDetails)


class AuditFedNCLVerdict(_Model):
    """Fed-NCL's verdict on one site."""

    score: float | None
    probability: float | None = None
    flag: bool | None
    evidence: AuditFedNCLDetails = Field(default_factory=AuditFedNCLDetails)


class AuditExpertiseVerdict(_Model):
    """FedRN's expertise of one site (it never flags)."""

    score: float | None
    probability: float | None = None
    flag: bool | None
    evidence: AuditExpertiseDetails = Field(default_factory=AuditExpertiseDetails)


class AuditDetection(_Model):
    """The result of a detector this SDK does not know; ``verdicts`` aligned with the audit's
    client_ids."""

    method: str
    status: str
    """``ok``, ``undetermined`` or ``inconclusive`` today; a plain string so that a status a
    newer coordinator adds does not break this SDK."""
    reason: str | None = None
    verdicts: list[AuditVerdict | None]
    summary: dict[str, Any] = Field(default_factory=dict)


class AuditEvidenceDetection(_Model):
    """The evidence detector's result for a round (the default primary detector)."""

    method: Literal["evidence"]
    status: str
    reason: str | None = None
    verdicts: list[AuditEvidenceVerdict | None]
    summary: AuditEvidenceSummary = Field(default_factory=AuditEvidenceSummary)


class AuditFedNoRoDetection(_Model):
    """FedNoRo's result for a round."""

    method: Literal["fednoro"]
    status: str
    reason: str | None = None
    verdicts: list[AuditFedNoRoVerdict | None]
    summary: AuditFedNoRoSummary = Field(default_factory=AuditFedNoRoSummary)


class AuditFedNCLDetection(_Model):
    """Fed-NCL's result for a round."""

    method: Literal["fedncl"]
    status: str
    reason: str | None = None
    verdicts: list[AuditFedNCLVerdict | None]
    summary: AuditFedNCLSummary = Field(default_factory=AuditFedNCLSummary)


class AuditExpertiseDetection(_Model):
    """FedRN's expertise for a round."""

    method: Literal["expertise"]
    status: str
    reason: str | None = None
    verdicts: list[AuditExpertiseVerdict | None]
    summary: AuditExpertiseSummary = Field(default_factory=AuditExpertiseSummary)


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
