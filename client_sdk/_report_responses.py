"""Typed reports of the coordinator: the noisy-client report and a client's history, with each
detector's evidence beside the verdict, per site and per class (``AdminClient.get_report``,
``AdminClient.get_client_history``; mirrors `openapi/openapi.json`, a test checks them).

Statuses stay plain strings, so that a value a newer coordinator adds does not break this SDK;
an unknown field is ignored. Every evidence field is None where the coordinator's stored audit
holds no value (an audit stored by an older version, a part the detector did not use that round);
a detector that did not run, or gave the site no verdict, has no object at all.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from client_sdk._detection_responses import (
    AuditEvidenceSummary,
    AuditExpertiseSummary,
    AuditFedNCLSummary,
    AuditFedNoRoSummary,
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class EvidenceParts(_Model):
    """The evidence detector's verdict on a site, part by part: the losses' test (p- and
    q-value, the site-level z and factor, Stouffer's z), the error counts', the accuracy's and
    the update geometry's figures (docs/algorithms.md, "The verdict: which evidence decides")."""

    p_value: float | None = None
    q_value: float | None = None
    site_z: float | None = None
    site_factor: float | None = None
    stouffer_z: float | None = None
    mean_loss: float | None = None
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
    geometry_cosine: float | None = None
    geometry_z: float | None = None
    geometry_p_value: float | None = None


class FedNoRoParts(_Model):
    """FedNoRo's verdict on a site (its per-class normalised losses: ``ClassEvidence``)."""

    separation_score: float | None = None
    class_z: float | None = None
    mean_loss: float | None = None
    noisy_probability: float | None = None
    noisy_votes: int | None = None


class FedNCLParts(_Model):
    """Fed-NCL's verdict on a site: q = e * h / n and its terms."""

    q: float | None = None
    divergence: float | None = None
    data_quality: float | None = None
    deviation: float | None = None


class ExpertiseParts(_Model):
    """FedRN's expertise of a site and the accuracy it is normalised from."""

    expertise: float | None = None
    train_accuracy: float | None = None


class DetectorEvidence(_Model):
    """Each detector's evidence on one site (None: no verdict on it)."""

    evidence: EvidenceParts | None = None
    fednoro: FedNoRoParts | None = None
    fedncl: FedNCLParts | None = None
    expertise: ExpertiseParts | None = None


class ClassEvidence(_Model):
    """One class of a site: the evidence detector's class z, FedNoRo's normalised loss, and the
    detectors that name it noisy."""

    index: int
    label: str
    evidence_z: float | None = None
    fednoro_normalised_loss: float | None = None
    noisy_by: list[str] = Field(default_factory=list)


class ReportNeighbor(_Model):
    client_id: str
    name: str
    weight: float


class NeighborWeight(_Model):
    client_id: str
    weight: float


class ReportFlagRound(_Model):
    """One audited round of a client's flag history; each detector's flag under its name."""

    model_config = ConfigDict(extra="allow")

    round: int | None
    in_warmup: bool
    primary: bool | None
    verdict: str | None = None


class ReportClient(_Model):
    """One client of the noisy-client report (its latest audited round's verdicts)."""

    client_id: uuid.UUID
    name: str
    status: str
    detected_status: str
    pinned_status: str | None
    pin_reason: str | None
    anchor: bool = False
    anchor_reason: str | None = None
    num_samples: int | None
    times_flagged: int
    rounds_audited: int
    flag_history: list[ReportFlagRound]
    latest_round: int | None
    latest_flags: dict[str, bool | None] | None
    latest_scores: dict[str, float | None] | None
    latest_statuses: dict[str, str] | None = None
    flag_basis: str | None = None
    noisy_classes: list[str]
    classes_by_detector: dict[str, list[str]] = Field(default_factory=dict)
    latest_detector_evidence: DetectorEvidence | None = None
    latest_class_evidence: list[ClassEvidence] = Field(default_factory=list)
    reliability: float | None
    neighbors: list[ReportNeighbor] | None
    last_weight: float | None
    inconsistent_updates: int = 0
    last_inconsistent_at: datetime | None = None
    epsilon_round: float | None = None
    epsilon_total: float | None = None


class DetectorOutcome(_Model):
    status: str
    reason: str | None = None


_SUMMARIES: dict[str, Any] = {
    "evidence": TypeAdapter(AuditEvidenceSummary),
    "fednoro": TypeAdapter(AuditFedNoRoSummary),
    "fedncl": TypeAdapter(AuditFedNCLSummary),
    "expertise": TypeAdapter(AuditExpertiseSummary),
}


class ReportLatest(_Model):
    """The federation's latest audit (every field None before the first). ``primary_summary``
    is the primary detector's round summary, a dict typed by that detector (as a round's
    ``AuditRecord.detections[name].summary``)."""

    @model_validator(mode="before")
    @classmethod
    def _summary_of_the_primary(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        summary, primary = data.get("primary_summary"), data.get("primary_detector")
        adapter = _SUMMARIES.get(primary) if isinstance(primary, str) else None
        if isinstance(summary, dict) and adapter is not None:
            return {**data, "primary_summary": adapter.validate_python(summary)}
        return data

    round: int | None = None
    primary_detector: str | None = None
    primary_status: str | None = None
    primary_reason: str | None = None
    primary_summary: (
        AuditEvidenceSummary
        | AuditFedNoRoSummary
        | AuditFedNCLSummary
        | AuditExpertiseSummary
        | dict[str, Any]
        | None
    ) = None
    aggregation_rule: str | None = None
    fallback_reason: str | None = None
    in_warmup: bool | None = None
    detectors: dict[str, DetectorOutcome] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)


class SiteErrorView(_Model):
    at: datetime
    client_id: uuid.UUID | None
    name: str | None
    round: int | None
    stage: str | None
    error_type: str | None
    message: str


class ReportPrivacy(_Model):
    noise_multiplier: float
    clip_loss: float
    clip_probe: float | None
    delta: float
    accountant: str
    releases_per_update: int
    epsilon_per_round: float


class NoisyClientReport(_Model):
    """The noisy-client report (``GET .../report``)."""

    federation_id: uuid.UUID
    federation: str
    status: str
    status_reason: str | None = None
    rounds_audited: int
    warmup_rounds: int
    primary_detector: str
    latest: ReportLatest
    clients: list[ReportClient]
    site_errors: list[SiteErrorView] = Field(default_factory=list)
    privacy: ReportPrivacy | None = None


class ClientRoundView(_Model):
    """What one audited round said about one client."""

    round: int
    primary_flag: bool | None
    flags: dict[str, bool | None]
    scores: dict[str, float | None]
    statuses: dict[str, str] = Field(default_factory=dict)
    flag_basis: str | None = None
    noisy_classes: list[str]
    classes_by_detector: dict[str, list[str]] = Field(default_factory=dict)
    detector_evidence: DetectorEvidence | None = None
    class_evidence: list[ClassEvidence] = Field(default_factory=list)
    reliability: float | None
    neighbors: list[NeighborWeight] | None
    weight: float | None
    epsilon_round: float | None = None
    epsilon_total: float | None = None


class ClientHistory(_Model):
    """Round by round, what the audit said about one client (``GET .../clients/{id}/history``)."""

    client_id: uuid.UUID
    name: str
    status: str
    detected_status: str
    pinned_status: str | None
    pin_reason: str | None
    pinned_by: str | None
    rounds: list[ClientRoundView]
