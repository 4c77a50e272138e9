"""A round's stored audit on the wire: what ``service.audit.run_audit`` returned at the close.

The envelope is typed (detectors, verdicts, flags, aggregation, the clients in order), and so is
each verdict's ``evidence`` and each detection's ``summary`` for the detectors of the registry
(``evidence``, ``fednoro``, ``fedncl``, ``expertise``:
:mod:`service.audit_records.verdict_evidence`, :mod:`service.audit_records.detection_summaries`),
chosen by the detection's ``method``; a detector
this version does not know keeps plain objects (``DetectionRecord``). Audits stored by older
versions may lack the fields added since, so those are optional; a field this version does not
know is kept (``extra="allow"``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, JsonValue, Tag

from service.audit_records.aggregation_details import AggregationDetails
from service.audit_records.detection_summaries import (
    EvidenceSummary,
    ExpertiseSummary,
    FedNCLSummary,
    FedNoRoSummary,
)
from service.audit_records.verdict_evidence import (
    EvidenceVerdictEvidence,
    ExpertiseVerdictEvidence,
    FedNCLVerdictEvidence,
    FedNoRoVerdictEvidence,
)


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow")


_TYPED_DETECTORS = frozenset({"evidence", "fednoro", "fedncl", "expertise"})
"""The methods with a record of their own (``DetectionRecord``'s schema excludes them)."""
_TYPED_NAMES: list[JsonValue] = [*sorted(_TYPED_DETECTORS)]


class _VerdictBase(_Record):
    score: float | None = Field(
        description="Graded, ranks the sites (higher = noisier; expertise: more reliable)"
    )
    probability: float | None = Field(
        None, description="A noisy probability in [0, 1] where the detector has one"
    )
    flag: bool | None = Field(description="True: noisy; null: the detector did not decide")


class VerdictRecord(_VerdictBase):
    """One verdict of a detector this version does not know: its evidence as stored."""

    evidence: dict[str, Any] = Field(
        default_factory=dict, description="The detector's own evidence (docs/algorithms.md)"
    )


class EvidenceVerdictRecord(_VerdictBase):
    """The evidence detector's verdict on one site."""

    evidence: EvidenceVerdictEvidence = Field(default_factory=EvidenceVerdictEvidence)


class FedNoRoVerdictRecord(_VerdictBase):
    """FedNoRo's verdict on one site."""

    evidence: FedNoRoVerdictEvidence = Field(default_factory=FedNoRoVerdictEvidence)


class FedNCLVerdictRecord(_VerdictBase):
    """Fed-NCL's verdict on one site."""

    evidence: FedNCLVerdictEvidence = Field(default_factory=FedNCLVerdictEvidence)


class ExpertiseVerdictRecord(_VerdictBase):
    """FedRN's expertise of one site (a reliability signal: it never flags)."""

    evidence: ExpertiseVerdictEvidence = Field(default_factory=ExpertiseVerdictEvidence)


_VERDICTS = "Aligned with the audit's client_ids; null where undetermined"


_STATUS = Literal["ok", "undetermined", "inconclusive"]

# Each record declares its fields in the stored order (method, status, reason, verdicts,
# summary): the JSON keeps it.


class DetectionRecord(_Record):
    """The result of a detector this version does not know, as stored."""

    method: str = Field(
        description="A detector other than the typed ones",
        # so that a typed detector's record matches exactly one member of the union
        json_schema_extra={"not": {"enum": _TYPED_NAMES}},
    )
    status: _STATUS
    reason: str | None = None
    verdicts: list[VerdictRecord | None] = Field(description=_VERDICTS)
    summary: dict[str, Any] = Field(default_factory=dict)


class EvidenceDetectionRecord(_Record):
    """The evidence detector's result for the round (the default primary detector)."""

    method: Literal["evidence"]
    status: _STATUS
    reason: str | None = None
    verdicts: list[EvidenceVerdictRecord | None] = Field(description=_VERDICTS)
    summary: EvidenceSummary = Field(default_factory=EvidenceSummary)


class FedNoRoDetectionRecord(_Record):
    """FedNoRo's result for the round."""

    method: Literal["fednoro"]
    status: _STATUS
    reason: str | None = None
    verdicts: list[FedNoRoVerdictRecord | None] = Field(description=_VERDICTS)
    summary: FedNoRoSummary = Field(default_factory=FedNoRoSummary)


class FedNCLDetectionRecord(_Record):
    """Fed-NCL's result for the round."""

    method: Literal["fedncl"]
    status: _STATUS
    reason: str | None = None
    verdicts: list[FedNCLVerdictRecord | None] = Field(description=_VERDICTS)
    summary: FedNCLSummary = Field(default_factory=FedNCLSummary)


class ExpertiseDetectionRecord(_Record):
    """FedRN's expertise for the round."""

    method: Literal["expertise"]
    status: _STATUS
    reason: str | None = None
    verdicts: list[ExpertiseVerdictRecord | None] = Field(description=_VERDICTS)
    summary: ExpertiseSummary = Field(default_factory=ExpertiseSummary)


def _detector_tag(value: Any) -> str:
    """The union member a detection validates as: its method where the method is one of the
    typed detectors, else ``other`` (kept as stored)."""
    method = value.get("method") if isinstance(value, dict) else getattr(value, "method", None)
    return method if isinstance(method, str) and method in _TYPED_DETECTORS else "other"


AnyDetectionRecord = Annotated[
    Annotated[EvidenceDetectionRecord, Tag("evidence")]
    | Annotated[FedNoRoDetectionRecord, Tag("fednoro")]
    | Annotated[FedNCLDetectionRecord, Tag("fedncl")]
    | Annotated[ExpertiseDetectionRecord, Tag("expertise")]
    | Annotated[DetectionRecord, Tag("other")],
    Discriminator(_detector_tag),
]
"""One detector's result, typed by its ``method``."""


class CappedWeightRecord(_Record):
    """One client whose aggregation weight the cap lowered."""

    index: int = Field(description="The client's position in client_ids")
    client_id: str | None = Field(
        None, description="The client (absent from audits stored before it was recorded)"
    )
    before: float = Field(description="Its weight before the cap")
    after: float = Field(description="Its weight after the cap")
    layers: int | None = Field(
        None,
        description="fedncl_layerwise only: in how many float tensors it was capped (before and "
        "after are then its mean weights over the tensors)",
    )


class WeightCapRecord(_Record):
    """The cap on a single client's aggregation weight, min(1, f / K), and what it did."""

    factor: float = Field(description="f")
    cap: float = Field(
        description="The cap applied: min(1, f / K), or 1 / m where only m < 1 / cap clients "
        "have a positive weight (note says so)"
    )
    capped: list[CappedWeightRecord] = Field(description="The clients whose weight it lowered")
    note: str | None = None


class NeighborRecord(_Record):
    """One of a client's reliable neighbors (FedRN)."""

    client_id: str
    weight: float = Field(description="R'(c, n), FedRN eq. 7")


class AggregationRecord(_Record):
    """How the round's updates were aggregated."""

    rule: str = Field(description="The rule applied (after any fallback)")
    requested_rule: str | None = None
    fallback_reason: str | None = None
    weights: list[float] | None = Field(
        None, description="Each client's weight, aligned with client_ids"
    )
    layer_weights: dict[str, list[float]] | None = None
    details: AggregationDetails | None = Field(None, description="What the rule reports of itself")
    weight_cap: WeightCapRecord | None = Field(
        None, description="The cap on one client's weight and the clients it held back"
    )


class AuditClient(_Record):
    """A client of the audited round, in the audit's order."""

    client_id: str
    name: str
    num_samples: int
    update_id: str
    pinned_status: str | None = None


class PrivacyRecord(_Record):
    """The Gaussian mechanism's privacy budget at the round (docs/what-leaves-the-site.md)."""

    mechanism: Literal["gaussian"]
    accountant: str = Field(description="What computed the epsilons (dp-accounting's RDP)")
    noise_multiplier: float = Field(description="sigma: noise sd / L2 sensitivity")
    delta: float = Field(description="The delta every epsilon is at")
    releases_per_update: int = Field(
        description="Noised signals per update (per_class_loss, probe_softmax): each is one "
        "Gaussian mechanism"
    )
    epsilon_round: float = Field(description="The epsilon of one site's update of this round")
    releases_total: list[int] = Field(
        description="Per client (aligned with client_ids): its releases up to this round"
    )
    epsilon_total: list[float] = Field(
        description="Per client: the epsilon of all its updates up to this round, composed"
    )


class AuditRecord(_Record):
    """The audit stored when a round closed."""

    client_ids: list[str]
    detections: dict[str, AnyDetectionRecord] = Field(description="By detector name")
    primary: str = Field(description="The primary detector")
    primary_flags: list[bool | None] = Field(description="The primary detector's flags")
    expertise: list[float | None] | None = None
    neighbors: dict[str, list[NeighborRecord]] | None = Field(
        None, description="Client id -> its reliable neighbors, best first"
    )
    self_weights: dict[str, float] | None = None
    aggregation: AggregationRecord
    centroids: list[list[float]] | None = None
    centroid_weights: list[list[float]] | None = None
    effective_flags: list[bool | None] | None = Field(
        None, description="The flags after an admin's pins, where any applied"
    )
    aggregation_flags: list[bool | None] | None = Field(
        None,
        description="The clients the aggregation rule treated as noisy (null for rules "
        "without a noisy set)",
    )
    round_index: int | None = None
    in_warmup: bool | None = None
    clients: list[AuditClient] | None = None
    privacy: PrivacyRecord | None = Field(
        None, description="The Gaussian mechanism's budget; absent when the federation has none"
    )
