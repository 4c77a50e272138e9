"""Rounds, instructions and updates on the wire."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.api.schemas.audits import AuditRecord
from service.coordinator.signal_policy import SignalPolicy
from service.inputs import NAME_RULES, TEXT_RULES, Int32, Name, PositiveInt32, Text


class RoundRead(BaseModel):
    id: uuid.UUID
    federation_id: uuid.UUID
    index: int
    state: str
    state_reason: str | None
    opened_at: datetime
    deadline_at: datetime
    deadline_extensions: int
    closed_at: datetime | None
    model_in_id: uuid.UUID
    model_out_id: uuid.UUID | None
    selected_clients: list[uuid.UUID]
    submitted_clients: list[uuid.UUID]
    aggregation_rule: str | None
    aggregation_weights: dict[str, Any] | None
    coordinator_seconds: float | None
    pruned_clients: list[uuid.UUID] = Field(
        default_factory=list,
        description="The sites whose update of this round retention pruned (its blob, probe "
        "softmax and centroids are gone; a what-if of the round needs them left out)",
    )


class RoundClose(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"reason": "site c is down; the others should go on"}]},
    )

    reason: Text = Field(
        min_length=1,
        max_length=500,
        description="Why the round closes before its deadline: recorded in the event trail and "
        "in the round's state_reason. " + TEXT_RULES,
    )


class RoundDetail(RoundRead):
    audit: AuditRecord | None = Field(
        default=None,
        description=(
            "The audit stored when the round closed. `detections.<detector>.verdicts` is "
            "aligned with `client_ids`; each verdict is null (undetermined) or "
            "{score, probability, flag, evidence}: `score` is graded and ranks the clients "
            "(higher = noisier; FedNoRo's is its separation statistic, by default the "
            "class-standardised loss excess in standard errors; expertise is higher = more "
            "reliable), `probability` a noisy probability in [0, 1] where the detector has one "
            "(FedNoRo's GMM posterior, 0 when the separation guard withheld the flags; audits "
            "stored before this field existed lack it), `flag` true = noisy. "
            "`primary_flags` are the primary detector's flags; `aggregation_flags` the clients "
            "the aggregation rule treated as noisy (by default those whose status after this "
            "round is noisy, pins applied; null for rules without a noisy set; absent from "
            "audits stored before it existed)."
        ),
    )


class RoundPage(BaseModel):
    items: list[RoundRead]
    total: int


class JoinRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"num_samples": 10, "class_counts": [5, 5]}]},
    )

    num_samples: PositiveInt32 = Field(
        description="The site's training samples; under the federation's privacy policy "
        "(config.privacy) rounded up to a multiple of count_bucket"
    )
    class_counts: list[Int32 | None] = Field(
        min_length=1,
        max_length=100_000,
        description="Samples per class, summing to num_samples. Under the federation's privacy "
        "policy: null for a suppressed class (the site holds 1 to min_class_count - 1 samples "
        "of it: 'fewer than min_class_count'), every other count rounded up to a multiple of "
        "count_bucket (0 stays 0), and the sum only consistent with num_samples",
    )


class JoinRead(BaseModel):
    client_id: uuid.UUID
    federation_id: uuid.UUID
    name: str
    federation_status: str
    num_classes: int
    input_shape: list[int]
    privacy: SignalPolicy = Field(
        default_factory=SignalPolicy,
        description="The federation's signal privacy policy, which every count and per-class "
        "signal the site sends must obey",
    )


class Neighbor(BaseModel):
    client_id: uuid.UUID
    model_id: uuid.UUID
    model_sha256: str
    weight: float


class Probe(BaseModel):
    seed: int
    size: int


class Instructions(BaseModel):
    recipe: str
    hyperparameters: dict[str, Any]
    global_model_id: uuid.UUID
    global_model_sha256: str
    round_index: int
    total_rounds: int
    num_classes: int
    input_shape: list[int]
    signals: list[str]
    probe: Probe | None
    centroids: list[list[float]] | None
    deadline_at: datetime
    seed: int
    role: Literal["clean", "noisy"]
    distil_classes: list[Annotated[int, Field(ge=0)]] | None = Field(
        None,
        description="For a site in the noisy role under FedNoRo's kd_scope 'classes': the "
        "classes whose samples it distils (every class but those it holds a large share of "
        "and the previous audit does not name noisy there); null: every class",
    )
    label_correction: bool
    neighbors: list[Neighbor]
    privacy: SignalPolicy = Field(
        default_factory=SignalPolicy,
        description="The federation's signal privacy policy, which the update must obey "
        "(off for a round opened before the federation had one)",
    )
    self_weight: float | None


class RoundRef(BaseModel):
    id: uuid.UUID
    index: int
    deadline_at: datetime


class CurrentRound(BaseModel):
    """What a client should do now."""

    status: Literal["train", "wait", "finished"]
    round: RoundRef | None = None
    instructions: Instructions | None = None
    retry_after_s: float | None = None
    reason: str | None = None
    final_model_id: uuid.UUID | None = None
    sites_selected: int | None = Field(
        None,
        description="While this site waits for the others of a round it sent its update to: "
        "how many sites the round selected (counts only; no site learns another's name)",
    )
    sites_submitted: int | None = Field(
        None,
        description="While this site waits for the others of a round it sent its update to: "
        "how many of the round's selected sites have sent their update, this one included",
    )


class UpdateRead(BaseModel):
    id: uuid.UUID
    round_id: uuid.UUID
    round_index: int
    client_id: uuid.UUID
    sha256: str
    size_bytes: int
    num_samples: int
    received_at: datetime
    replayed: bool = Field(description="True when this answers a retried identical upload")


SITE_ERROR_STAGES = ("load", "train", "signals", "upload", "other")
"""Where a site's round failed: loading the global model into its module, training, computing
the signals, uploading, or elsewhere."""
MAX_SITE_ERROR_CHARS = 2000


class SiteErrorReport(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "stage": "load",
                    "error_type": "RuntimeError",
                    "message": "Error(s) in loading state_dict for Net: size mismatch for "
                    "fc.weight: copying a param with shape torch.Size([2, 784]) from checkpoint, "
                    "the shape in current model is torch.Size([10, 64]).",
                }
            ]
        },
    )

    stage: Literal["load", "train", "signals", "upload", "other"]
    error_type: Name = Field(
        min_length=1, max_length=200, description="The exception's class name. " + NAME_RULES
    )
    message: Text = Field(
        min_length=1,
        max_length=MAX_SITE_ERROR_CHARS,
        description="What went wrong (the SDK sends the exception's text, cut to "
        f"{MAX_SITE_ERROR_CHARS} characters). " + TEXT_RULES,
    )


class SiteErrorRead(BaseModel):
    recorded: bool = Field(
        description="False when this site already reported its most errors for the round "
        "(the report is then counted nowhere)"
    )
    event_id: int | None
