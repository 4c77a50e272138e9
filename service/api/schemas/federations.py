"""Federations, clients and model versions on the wire."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.coordinator.federation_config import FederationConfigInput


class TaskSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    num_classes: int = Field(ge=2, le=100_000)
    input_shape: list[int] = Field(min_length=1, max_length=8)
    class_names: list[str] | None = None


class PlanSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rounds: int = Field(ge=1, le=100_000)
    min_clients: int = Field(default=1, ge=1)
    max_clients: int | None = Field(default=None, ge=1)
    round_deadline_s: float = Field(default=600.0, gt=0, le=7 * 24 * 3600)


class FederationCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
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
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(
        min_length=1,
        max_length=500,
        description="Why: recorded in the event trail and told to every site that asks for work",
    )


class ClientCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)


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
    class_counts: list[int] | None
    joined_at: datetime | None
    last_seen_at: datetime | None


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
