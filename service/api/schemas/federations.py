"""Federations, clients and model versions on the wire."""

from __future__ import annotations

import math
import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.coordinator.federation_config import FederationConfigInput
from service.coordinator.signal_policy import SignalPolicy
from service.inputs import INT32_MAX, NAME_RULES, TEXT_RULES, Name, PositiveInt32, Text

MAX_INPUT_ELEMENTS = INT32_MAX
"""The most elements one input sample may have (the product of input_shape)."""


class TaskSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    num_classes: int = Field(ge=2, le=100_000)
    input_shape: list[PositiveInt32] = Field(
        min_length=1,
        max_length=8,
        description=f"Positive dimensions whose product is at most {MAX_INPUT_ELEMENTS}",
    )
    class_names: list[Annotated[Name, Field(min_length=1, max_length=200)]] | None = Field(
        default=None, max_length=100_000, description=f"One per class. {NAME_RULES}"
    )

    @field_validator("input_shape")
    @classmethod
    def _sample_size(cls, shape: list[int]) -> list[int]:
        if math.prod(shape) > MAX_INPUT_ELEMENTS:
            raise ValueError(f"has more than {MAX_INPUT_ELEMENTS} elements per sample")
        return shape


class SiteTask(TaskSpec):
    """The task as a site reads it: with the privacy policy its join and updates must obey."""

    privacy: SignalPolicy = Field(
        default_factory=SignalPolicy,
        description="The federation's signal privacy policy (config.privacy): how coarse the "
        "counts and per-class signals the site sends must be",
    )


class PlanSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rounds: int = Field(ge=1, le=100_000)
    min_clients: int = Field(default=1, ge=1, le=INT32_MAX)
    max_clients: int | None = Field(default=None, ge=1, le=INT32_MAX)
    round_deadline_s: float = Field(default=600.0, gt=0, le=7 * 24 * 3600)


class FederationCreate(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "chest-xray",
                    "task": {
                        "num_classes": 2,
                        "input_shape": [1, 28, 28],
                        "class_names": ["normal", "pneumonia"],
                    },
                    "plan": {"rounds": 50, "min_clients": 3, "round_deadline_s": 1800},
                    "config": {
                        "method": "fednoro",
                        "hyperparameters": {"lr": 0.01, "local_epochs": 2},
                    },
                }
            ]
        },
    )

    name: Name = Field(min_length=1, max_length=200, description=NAME_RULES)
    task: TaskSpec
    plan: PlanSpec
    config: FederationConfigInput = Field(default_factory=FederationConfigInput)
    seed: int | None = Field(default=None, ge=0, lt=2**31)


class FederationRead(BaseModel):
    id: uuid.UUID
    name: str
    status: str
    status_reason: str | None
    task: TaskSpec
    plan: PlanSpec
    config: dict[str, Any]
    seed: int
    current_model_id: uuid.UUID | None
    clients: int
    joined_clients: int
    rounds_started: int
    created_at: datetime


class FederationPage(BaseModel):
    items: list[FederationRead]
    total: int


class ModelRead(BaseModel):
    id: uuid.UUID
    federation_id: uuid.UUID
    version: int
    round_index: int | None
    sha256: str
    size_bytes: int
    manifest: dict[str, Any]
    created_at: datetime


class FederationStop(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"reason": "the study ended"}]}
    )

    reason: Text = Field(
        min_length=1,
        max_length=500,
        description="Why: recorded in the event trail and told to every site that asks for work. "
        + TEXT_RULES,
    )


class PruneRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"keep_rounds": 5, "dry_run": True}]}
    )

    keep_rounds: int | None = Field(
        default=None,
        ge=0,
        le=INT32_MAX,
        description="Keep the model updates of the last N finished rounds; older ones lose "
        "their blob and their probe softmax and centroids. Default: the coordinator's "
        "retention_rounds setting (400 when it has none).",
    )
    dry_run: bool = Field(default=False, description="Answer what would be pruned; change nothing.")


class PrunedPart(BaseModel):
    rounds: list[int] = Field(description="The rounds whose updates were pruned now")
    updates: int = Field(description="Model updates pruned now (row kept, blob removed)")
    blobs: int = Field(description="Blobs removed (an update's content kept by another row stays)")
    bytes: int = Field(description="The bytes of the blobs removed")
    signals: list[str] = Field(description="The signals removed from each pruned update")


class KeptPart(BaseModel):
    rounds: list[int] = Field(description="The finished rounds whose updates are kept")
    latest_updates: int = Field(
        description="Older updates kept as a site's latest local model (FedRN's neighbours)"
    )
    neighbor_updates: int = Field(
        description="Older updates kept as neighbour models assigned in an open round"
    )
    global_models: int = Field(description="Global model versions, all kept")
    already_pruned: int = Field(description="Updates pruned before this request")


class PruneReport(BaseModel):
    federation_id: uuid.UUID
    keep_rounds: int
    dry_run: bool
    pruned: PrunedPart
    kept: KeptPart


class ClientCreate(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"name": "hospital-a"}]}
    )

    name: Name = Field(min_length=1, max_length=200, description=NAME_RULES)


class ClientRead(BaseModel):
    id: uuid.UUID
    federation_id: uuid.UUID
    name: str
    status: str
    pinned_status: str | None
    pin_reason: str | None
    anchor: bool = False
    anchor_reason: str | None = None
    num_samples: int | None
    class_counts: list[int | None] | None = Field(
        description="As the site declared them at join; null for a class the federation's "
        "privacy policy suppresses (fewer than min_class_count samples)"
    )
    joined_at: datetime | None
    last_seen_at: datetime | None
    attendance: Literal["not_joined", "present", "absent", "suspended", "token_revoked"] = Field(
        default="not_joined",
        description=(
            "Whether the site takes part in the next rounds: not_joined (never joined), present, "
            "absent (it missed absent_after_missed rounds in a row; present again at its next "
            "poll), suspended (by an admin), token_revoked"
        ),
    )
    suspended_at: datetime | None = None
    suspend_reason: str | None = None
    missed_rounds: int = Field(
        default=0, description="Rounds in a row it was selected for without sending its update"
    )
    absent_since: datetime | None = None


class ClientCreated(ClientRead):
    token: str = Field(description="The client's bearer token. Shown once; only a hash is kept.")


class EventRead(BaseModel):
    id: int
    kind: str
    actor: str
    message: str
    round_id: uuid.UUID | None
    client_id: uuid.UUID | None
    data: dict[str, Any]
    created_at: datetime


class EventPage(BaseModel):
    items: list[EventRead]
