"""Typed responses of the coordinator (mirrors `openapi/openapi.json`; a test checks them)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, with_config
from typing_extensions import TypedDict

from client_sdk._detection_responses import _KEEP_NEW_KEYS, AnyAuditDetection
from client_sdk._detection_responses import AuditDetection as AuditDetection  # re-exported
from client_sdk._detection_responses import AuditVerdict as AuditVerdict  # re-exported


class _Model(BaseModel):
    # Unknown fields are ignored so an older SDK keeps working with a newer coordinator.
    model_config = ConfigDict(extra="ignore")


class ProblemDetails(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str = "about:blank"
    title: str = ""
    status: int = 0
    detail: str | None = None
    instance: str | None = None


class SignalPolicy(_Model):
    """A federation's signal privacy policy (``config.privacy``): how coarse the counts and
    per-class signals a site sends must be (``client_sdk.privacy`` applies it)."""

    min_class_count: int = 0
    count_bucket: int = 1
    # The Gaussian mechanism on the per-class loss and the probe softmax (0: off).
    dp_noise_multiplier: float = 0.0
    dp_clip_loss: float | None = None
    dp_clip_probe: float | None = None
    dp_delta: float | None = None

    @property
    def dp_active(self) -> bool:
        return self.dp_noise_multiplier > 0.0


class TaskSpec(_Model):
    num_classes: int
    input_shape: list[int]
    class_names: list[str] | None = None


class SiteTask(TaskSpec):
    """The task as a site reads it (``GET .../task``), with the privacy policy its join and
    updates must obey (absent from a coordinator older than the policy: no policy)."""

    privacy: SignalPolicy = Field(default_factory=SignalPolicy)


class PlanSpec(_Model):
    rounds: int
    min_clients: int = 1
    max_clients: int | None = None
    round_deadline_s: float = 600.0


class Federation(_Model):
    id: uuid.UUID
    name: str
    status: str
    status_reason: str | None = None
    task: TaskSpec
    plan: PlanSpec
    config: dict[str, Any]
    seed: int
    current_model_id: uuid.UUID | None
    clients: int
    joined_clients: int
    rounds_started: int
    created_at: datetime


class ModelInfo(_Model):
    id: uuid.UUID
    federation_id: uuid.UUID
    version: int
    round_index: int | None
    sha256: str
    size_bytes: int
    manifest: dict[str, Any]
    created_at: datetime


class ClientInfo(_Model):
    id: uuid.UUID
    federation_id: uuid.UUID
    name: str
    status: str
    pinned_status: str | None = None
    pin_reason: str | None = None
    anchor: bool = False
    anchor_reason: str | None = None
    num_samples: int | None = None
    class_counts: list[int | None] | None = None
    joined_at: datetime | None = None
    last_seen_at: datetime | None = None
    attendance: str = "not_joined"
    """not_joined, present, absent (missed rounds in a row), suspended, token_revoked."""
    suspended_at: datetime | None = None
    suspend_reason: str | None = None
    missed_rounds: int = 0
    absent_since: datetime | None = None


class ClientCreated(ClientInfo):
    token: str


class JoinInfo(_Model):
    client_id: uuid.UUID
    federation_id: uuid.UUID
    name: str
    federation_status: str
    num_classes: int
    input_shape: list[int]
    privacy: SignalPolicy = Field(default_factory=SignalPolicy)


class Diagnostics(_Model):
    """What a site may learn about itself (``GET .../diagnostics``): its status, the rounds after
    the warm-up in which it was flagged (``flagged_rounds``; ``rounds_audited`` also leaves the
    warm-up out), which of its classes look noisy, and advice in words."""

    client_id: uuid.UUID
    name: str
    status: str
    latest_round: int | None = None
    flagged_rounds: list[int]
    rounds_audited: int
    noisy_classes: list[str]
    flag_basis: str | None = None
    """What the latest flag rests on: ``losses``, ``update_direction`` (the site's model updates
    move away from the others' while its reported losses look clean), ``accuracy``; None."""
    scores: dict[str, float | None] | None = None
    advice: str


class Neighbor(_Model):
    client_id: uuid.UUID
    model_id: uuid.UUID
    model_sha256: str
    weight: float


class Probe(_Model):
    seed: int
    size: int


class Instructions(_Model):
    recipe: str
    hyperparameters: dict[str, Any]
    global_model_id: uuid.UUID
    global_model_sha256: str
    round_index: int
    total_rounds: int
    num_classes: int
    input_shape: list[int]
    signals: list[str]
    probe: Probe | None = None
    centroids: list[list[float]] | None = None
    deadline_at: datetime
    seed: int
    role: Literal["clean", "noisy"] = "clean"
    distil_classes: list[int] | None = None
    label_correction: bool = False
    neighbors: list[Neighbor] = []
    self_weight: float | None = None
    privacy: SignalPolicy = Field(default_factory=SignalPolicy)


class RoundRef(_Model):
    id: uuid.UUID
    index: int
    deadline_at: datetime


class CurrentRound(_Model):
    status: Literal["train", "wait", "finished"]
    round: RoundRef | None = None
    instructions: Instructions | None = None
    retry_after_s: float | None = None
    reason: str | None = None
    final_model_id: uuid.UUID | None = None
    sites_selected: int | None = None
    sites_submitted: int | None = None


class UpdateReceipt(_Model):
    id: uuid.UUID
    round_id: uuid.UUID
    round_index: int
    client_id: uuid.UUID
    sha256: str
    size_bytes: int
    num_samples: int
    received_at: datetime
    replayed: bool


class AuditCappedWeight(_Model):
    """One client whose aggregation weight the cap lowered (``index``: its position)."""

    index: int
    client_id: str | None = None
    before: float
    after: float
    layers: int | None = None


class AuditWeightCap(_Model):
    """The cap on a single client's aggregation weight, min(1, f / K), and what it did."""

    factor: float
    cap: float
    capped: list[AuditCappedWeight]
    note: str | None = None


class AuditNeighbor(_Model):
    """One of a client's reliable neighbors (FedRN) and its weight R'."""

    client_id: str
    weight: float


@with_config(_KEEP_NEW_KEYS)
class AuditAnchorLead(TypedDict, total=False):
    """The anchors led the round's aggregate: which round of the lead, over how many sites."""

    round: int | None
    sites: int | None


@with_config(_KEEP_NEW_KEYS)
class AuditAggregationDetails(TypedDict, total=False):
    """What the aggregation rule reports of itself (the fields' meaning: the OpenAPI spec's
    ``AggregationDetails``): a dict of the keys the coordinator sent."""

    variant: str | None
    noisy: list[bool] | None
    nearest_clean: dict[str, int] | None
    note: str | None
    distances: list[float] | None
    normalised_distances: list[float] | None
    penalty: list[float] | None
    T: int | None
    tau: float | None
    t_k: int | None
    trim_fraction: float | None
    trimmed_per_side: int | None
    kept_per_coordinate: int | None
    weights_note: str | None
    noisy_probability: list[float] | None
    anchor_led: AuditAnchorLead | None


class AuditAggregation(_Model):
    """How a round's updates were aggregated; ``weights`` aligned with client_ids."""

    rule: str
    requested_rule: str | None = None
    fallback_reason: str | None = None
    weights: list[float] | None = None
    layer_weights: dict[str, list[float]] | None = None
    details: AuditAggregationDetails | None = None
    weight_cap: AuditWeightCap | None = None


class AuditClient(_Model):
    """A client of the audited round, in the audit's order."""

    client_id: str
    name: str
    num_samples: int
    update_id: str
    pinned_status: str | None = None


class AuditRecord(_Model):
    """The audit a round stored when it closed (``GET .../rounds/{index}``)."""

    client_ids: list[str]
    detections: dict[str, AnyAuditDetection]
    primary: str
    primary_flags: list[bool | None]
    expertise: list[float | None] | None = None
    neighbors: dict[str, list[AuditNeighbor]] | None = None
    self_weights: dict[str, float] | None = None
    aggregation: AuditAggregation
    centroids: list[list[float]] | None = None
    centroid_weights: list[list[float]] | None = None
    effective_flags: list[bool | None] | None = None
    aggregation_flags: list[bool | None] | None = None
    round_index: int | None = None
    in_warmup: bool | None = None
    clients: list[AuditClient] | None = None


class RoundInfo(_Model):
    id: uuid.UUID
    federation_id: uuid.UUID
    index: int
    state: str
    state_reason: str | None = None
    opened_at: datetime
    deadline_at: datetime
    deadline_extensions: int
    closed_at: datetime | None = None
    model_in_id: uuid.UUID
    model_out_id: uuid.UUID | None = None
    selected_clients: list[uuid.UUID]
    submitted_clients: list[uuid.UUID]
    aggregation_rule: str | None = None
    aggregation_weights: dict[str, Any] | None = None
    coordinator_seconds: float | None = None
    pruned_clients: list[uuid.UUID] = Field(default_factory=list)
    audit: AuditRecord | None = None


class PrunedPart(_Model):
    rounds: list[int]
    updates: int
    blobs: int
    bytes: int
    signals: list[str]


class KeptPart(_Model):
    rounds: list[int]
    latest_updates: int
    neighbor_updates: int
    global_models: int
    already_pruned: int


class PruneReport(_Model):
    """What a prune removed (or, with ``dry_run``, would remove) and what it kept."""

    federation_id: uuid.UUID
    keep_rounds: int
    dry_run: bool
    pruned: PrunedPart
    kept: KeptPart


class Event(_Model):
    id: int
    kind: str
    actor: str
    message: str
    round_id: uuid.UUID | None = None
    client_id: uuid.UUID | None = None
    data: dict[str, Any]
    created_at: datetime
