"""A round's stored audit on the wire: what ``service.audit.run_audit`` returned at the close.

The envelope is typed (detectors, verdicts, flags, aggregation, the clients in order); each
detector's ``evidence`` and ``summary`` stay objects because their fields are the detector's
own (docs/algorithms.md lists them). Audits stored by older versions may lack the fields added
since, so those are optional; a field this version does not know is kept (``extra="allow"``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow")


class VerdictRecord(_Record):
    """One detector's verdict on one site."""

    score: float | None = Field(
        description="Graded, ranks the sites (higher = noisier; expertise: more reliable)"
    )
    probability: float | None = Field(
        None, description="A noisy probability in [0, 1] where the detector has one"
    )
    flag: bool | None = Field(description="True: noisy; null: the detector did not decide")
    evidence: dict[str, Any] = Field(
        default_factory=dict, description="The detector's own evidence (docs/algorithms.md)"
    )


class DetectionRecord(_Record):
    """One detector's result for the round."""

    method: str
    status: Literal["ok", "undetermined", "inconclusive"]
    reason: str | None = None
    verdicts: list[VerdictRecord | None] = Field(
        description="Aligned with the audit's client_ids; null where undetermined"
    )
    summary: dict[str, Any] = Field(default_factory=dict)


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
    details: dict[str, Any] | None = None
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
    detections: dict[str, DetectionRecord] = Field(description="By detector name")
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
