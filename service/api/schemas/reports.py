"""Reports, pins and recomputations on the wire."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.api.schemas.audits import AuditRecord
from service.api.schemas.evidence import ClassEvidence, DetectorEvidence
from service.audit import ClientStatus
from service.audit_records.detection_summaries import PrimarySummary, read_summary
from service.inputs import TEXT_RULES, BoundedJson, Text

DetectorStatus = Literal["ok", "undetermined", "inconclusive"]
"""What a detector answered in a round: ok; undetermined (too few sites or signals to decide);
inconclusive (it computed the evidence but abstained: the consensus was suspect)."""

STATUS_WORDS = (
    "ok; undetermined (too few sites or signals to decide); inconclusive (the evidence "
    "computed, the detector abstained: the consensus was suspect)"
)


class DetectorOutcome(BaseModel):
    """What one detector answered in an audit, and why when it did not answer ok."""

    status: DetectorStatus = Field(description=STATUS_WORDS)
    reason: str | None = Field(default=None, description="Why, when not ok")


class PinRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"status": "noisy", "reason": "labels re-read by hand"}]},
    )

    status: ClientStatus
    reason: Text = Field(min_length=1, max_length=2000, description=TEXT_RULES)


class AnchorRequest(BaseModel):
    """Mark a site as a trust anchor: its labels are curated (why, for the event trail)."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"reason": "labels curated twice"}]}
    )

    reason: Text = Field(min_length=1, max_length=2000, description=TEXT_RULES)


class SuspendRequest(BaseModel):
    """Suspend a site: it is not selected for rounds until resumed (why, for the event trail)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"reason": "site offline for maintenance until Monday"}]},
    )

    reason: Text = Field(min_length=1, max_length=2000, description=TEXT_RULES)


class RecomputeRequest(BaseModel):
    """Re-run a past round's audit with other settings, or a what-if aggregation."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"audit": {"aggregation": "median"}}]},
    )

    audit: BoundedJson = Field(
        default_factory=dict,
        description="Audit settings to change, e.g. {'aggregation': 'median'} or "
        "{'fednoro_require_separation': false}",
    )
    exclude_clients: list[uuid.UUID] = Field(default_factory=list, max_length=100_000)


class NeighborWeight(BaseModel):
    client_id: str
    weight: float = Field(description="Normalised ensemble weight R'(c, n) of this neighbor")


class ReportNeighbor(NeighborWeight):
    name: str


FlagBasis = Literal["losses", "update_direction", "accuracy"]
"""What a primary flag rests on (``service.coordinator.reports``)."""

FLAG_BASIS_WORDS = (
    "losses (the reported per-class losses and error counts), update_direction (the update "
    "geometry: the site's update against its peers', computed by the coordinator), accuracy "
    "(its model's accuracy on its own labels); null when not flagged"
)


class ReportFlagRound(BaseModel):
    """One audited round of a client's flag history; one more key per detector that ran
    (``fednoro``, ``fedncl``, ``expertise``: its flag, or null)."""

    model_config = ConfigDict(extra="allow")

    round: int | None
    in_warmup: bool
    primary: bool | None = Field(description="The primary detector's flag (null: no verdict)")
    verdict: Literal["ok", "inconclusive", "undetermined"] | None = Field(
        default=None,
        description=(
            "The primary detector's status that round: ok; inconclusive (the audit abstained: "
            "the consensus was suspect, nobody flagged); undetermined (too few sites or "
            "signals). Null for rounds closed before it was recorded."
        ),
    )


class ReportClient(BaseModel):
    client_id: uuid.UUID
    name: str
    status: ClientStatus = Field(
        description="Effective status: the pin if any, else the detected one"
    )
    detected_status: ClientStatus
    pinned_status: ClientStatus | None
    pin_reason: str | None
    anchor: bool = Field(
        default=False,
        description="A trust anchor: an admin marked its labels as curated (never flagged)",
    )
    anchor_reason: str | None = Field(default=None, description="Why it was marked an anchor")
    num_samples: int | None
    times_flagged: int = Field(description="Audited rounds after the warm-up with a primary flag")
    rounds_audited: int = Field(description="Audited rounds after the warm-up")
    flag_history: list[ReportFlagRound]
    latest_round: int | None
    latest_flags: dict[str, bool | None] | None = Field(
        description="Each detector's flag in the client's latest audited round"
    )
    latest_scores: dict[str, float | None] | None = Field(
        description=(
            "Each detector's graded score in the client's latest audited round: higher = "
            "noisier (FedNoRo: its separation statistic, by default the class-standardised "
            "loss excess in standard errors, about N(0, 1) for a clean client; Fed-NCL: q); "
            "expertise is higher = more reliable"
        )
    )
    latest_statuses: dict[str, DetectorStatus] | None = Field(
        default=None,
        description=(
            "Each detector's status in the client's latest audited round: "
            + STATUS_WORDS
            + ". A score and a flag are null where the detector did not answer ok; a detector "
            "that did not run is absent"
        ),
    )
    flag_basis: FlagBasis | None = Field(
        default=None, description="What the latest primary flag rests on: " + FLAG_BASIS_WORDS
    )
    noisy_classes: list[str] = Field(
        description=(
            "The primary detector's noisy classes, worst first (the evidence detector: classes "
            "significant alone; FedNoRo: classes whose loss puts the client on its noisy side; "
            "FedNoRo's when the primary judges sites only; none when the primary abstained)"
        )
    )
    classes_by_detector: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Each per-class detector's noisy classes for the client, worst first",
    )
    latest_detector_evidence: DetectorEvidence | None = Field(
        default=None,
        description=(
            "Each detector's evidence beside the verdict in the client's latest audited round "
            "(shown whatever the detector's status); null before the client's first audit"
        ),
    )
    latest_class_evidence: list[ClassEvidence] = Field(
        default_factory=list,
        description=(
            "Per class, in the client's latest audited round: the evidence detector's class z, "
            "FedNoRo's normalised loss, the detectors naming it noisy (classes of which no "
            "detector says anything are left out)"
        ),
    )
    reliability: float | None = Field(description="FedRN expertise (normalised training accuracy)")
    neighbors: list[ReportNeighbor] | None
    last_weight: float | None = Field(description="Aggregation weight in the latest audit")
    inconsistent_updates: int = Field(
        default=0,
        description=(
            "Updates refused because their num_samples / class_counts left the drift the "
            "federation allows from the site's join (/problems/update-inconsistent): evidence "
            "that the site misstates its data"
        ),
    )
    last_inconsistent_at: datetime | None = Field(
        default=None, description="When the last of those updates was refused"
    )
    epsilon_round: float | None = Field(
        default=None,
        description=(
            "Under the Gaussian mechanism: the epsilon (at the federation's dp_delta) of the "
            "site's update in its latest audited round; null without it"
        ),
    )
    epsilon_total: float | None = Field(
        default=None,
        description="Under the Gaussian mechanism: the epsilon of all the site's updates up to "
        "its latest audited round, composed by the accountant; null without it",
    )
    attendance: Literal["not_joined", "present", "absent", "suspended", "token_revoked"] = Field(
        default="present",
        description=(
            "Whether the site takes part in the next rounds: not_joined, present, absent (it "
            "missed the federation's absent_after_missed rounds in a row), suspended (by an "
            "admin), token_revoked"
        ),
    )
    suspend_reason: str | None = Field(default=None, description="Why an admin suspended it")


class ReportLatest(BaseModel):
    """The federation's latest audit; every field is absent before the first audit."""

    @model_validator(mode="before")
    @classmethod
    def _summary_of_the_primary(cls, data: Any) -> Any:
        """Read ``primary_summary`` as its detector's record (not whichever model fits first)."""
        if not isinstance(data, dict):
            return data
        primary = data.get("primary_detector")
        if "primary_summary" not in data or not isinstance(primary, str):
            return data
        return {**data, "primary_summary": read_summary(primary, data["primary_summary"])}

    round: int | None = None
    primary_detector: str | None = None
    primary_status: Literal["ok", "undetermined", "inconclusive"] | None = None
    primary_reason: str | None = None
    primary_summary: PrimarySummary | None = Field(
        default=None,
        description=(
            "The primary detector's round summary, the record of its kind (the evidence "
            "detector's, FedNoRo's, Fed-NCL's or FedRN's expertise), as in the round's audit"
        ),
    )
    aggregation_rule: str | None = None
    fallback_reason: str | None = None
    in_warmup: bool | None = None
    detectors: dict[str, DetectorOutcome] = Field(
        default_factory=dict,
        description="Each detector that ran in the latest audit: its status and, when not ok, why",
    )
    warnings: list[str] = Field(
        default_factory=list,
        description=(
            "What to check before trusting the latest audit's flags, e.g. that most of the "
            "clients, holding most of the round's samples, are flagged (the flags may then be "
            "inverted)"
        ),
    )


class SiteErrorView(BaseModel):
    """A round a site could not do, in its own words."""

    at: datetime
    client_id: uuid.UUID | None
    name: str | None
    round: int | None
    stage: str | None
    error_type: str | None
    message: str


class ReportPrivacy(BaseModel):
    """The federation's Gaussian mechanism and its budget (docs/what-leaves-the-site.md)."""

    noise_multiplier: float = Field(description="sigma: noise sd / L2 sensitivity")
    clip_loss: float = Field(description="B: per-sample losses clipped to [0, B]")
    clip_probe: float | None = Field(
        description="R: probe softmax rows clipped to L2 distance R from uniform (null: none)"
    )
    delta: float
    accountant: str = Field(description="What computes the epsilons (dp-accounting's RDP)")
    releases_per_update: int = Field(description="Noised signals per update")
    epsilon_per_round: float = Field(description="The epsilon of one site's update in a round")


class NoisyClientReport(BaseModel):
    """Per client: status, flag history, latest scores per detector, noisy classes, weights."""

    federation_id: uuid.UUID
    federation: str
    status: str
    status_reason: str | None = Field(
        default=None, description="Why a failed federation failed (or who stopped it, and why)"
    )
    rounds_audited: int = Field(
        description="Audited rounds of the federation, the warm-up included (each client's "
        "rounds_audited counts those after the warm-up)"
    )
    warmup_rounds: int
    primary_detector: str
    latest: ReportLatest
    clients: list[ReportClient]
    site_errors: list[SiteErrorView] = Field(
        default_factory=list,
        description="The latest errors the sites reported (site.error events), newest first",
    )
    privacy: ReportPrivacy | None = Field(
        default=None,
        description="The Gaussian mechanism on the signals; null when the federation has none "
        "(each client's epsilon_round and epsilon_total give its budget)",
    )


class ClientRoundView(BaseModel):
    """What one stored audit said about one client."""

    round: int
    primary_flag: bool | None
    flags: dict[str, bool | None] = Field(
        description="Each detector's flag (null: no verdict, undetermined or inconclusive)"
    )
    scores: dict[str, float | None] = Field(
        description="Each detector's graded score (see NoisyClientReport's latest_scores)"
    )
    statuses: dict[str, DetectorStatus] = Field(
        default_factory=dict,
        description="Each detector's status that round (see NoisyClientReport's latest_statuses)",
    )
    flag_basis: FlagBasis | None = Field(
        default=None, description="What the primary flag rests on: " + FLAG_BASIS_WORDS
    )
    noisy_classes: list[str] = Field(description="As in the report: the primary's classes")
    classes_by_detector: dict[str, list[str]] = Field(
        default_factory=dict, description="Each per-class detector's noisy classes"
    )
    detector_evidence: DetectorEvidence | None = Field(
        default=None,
        description="Each detector's evidence beside the verdict that round (as in the report)",
    )
    class_evidence: list[ClassEvidence] = Field(
        default_factory=list, description="Per class, that round (as in the report)"
    )
    reliability: float | None
    neighbors: list[NeighborWeight] | None
    weight: float | None = Field(description="Aggregation weight in that round")
    epsilon_round: float | None = Field(
        default=None,
        description=(
            "Under the Gaussian mechanism: the epsilon (at the federation's dp_delta) of the "
            "site's update in that round; null without it"
        ),
    )
    epsilon_total: float | None = Field(
        default=None,
        description="Under the Gaussian mechanism: the epsilon of all the site's updates up to "
        "that round, composed by the accountant; null without it",
    )


class ClientHistory(BaseModel):
    client_id: uuid.UUID
    name: str
    status: ClientStatus
    detected_status: ClientStatus
    pinned_status: ClientStatus | None
    pin_reason: str | None
    pinned_by: str | None
    rounds: list[ClientRoundView]


class ClientDiagnostics(BaseModel):
    """What a client may learn about itself."""

    client_id: uuid.UUID
    name: str
    status: ClientStatus
    latest_round: int | None
    flagged_rounds: list[int] = Field(
        description=(
            "Audited rounds after the warm-up in which the primary detector flagged the client "
            "(flags in the warm-up count toward no status, so they are left out)"
        )
    )
    rounds_audited: int = Field(description="Audited rounds after the warm-up")
    noisy_classes: list[str]
    flag_basis: FlagBasis | None = Field(
        default=None, description="What the latest flag rests on: " + FLAG_BASIS_WORDS
    )
    scores: dict[str, float | None] | None
    advice: str


class ModelDistance(BaseModel):
    total: float = Field(description="Euclidean distance over every tensor")
    per_tensor: dict[str, float]


class RecomputeResult(BaseModel):
    """A past round's audit re-run with other settings; nothing is stored."""

    round: int
    audit_settings: dict[str, Any] = Field(description="The audit configuration that was run")
    excluded_clients: list[str]
    aggregation_rule: str = Field(description="The rule applied (after any fallback)")
    fallback_reason: str | None
    weights: dict[str, float] = Field(description="Aggregation weight per client id")
    flags: dict[str, dict[str, bool | None]] = Field(
        description="Per client id: the primary flag, the effective one (pins) and each detector's"
    )
    audit: AuditRecord = Field(
        description="The full audit result, shaped as a round's stored audit (see RoundDetail)"
    )
    distance_to_actual_model: ModelDistance = Field(
        description="How far the recomputed global model is from the one the round produced"
    )
