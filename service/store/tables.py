"""Tables of the coordinator (SQLAlchemy 2.0 typed ORM).

Model states are never rows of weights: a model version or an update points at a
content-addressed safetensors blob (``blob_key`` = sha256) and keeps its tensor manifest.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from service.store.base import Base, UTCDateTime, new_id, utcnow

FEDERATION_STATUSES = ("created", "waiting", "running", "finished", "failed", "stopped")
ENDED_STATUSES = ("finished", "failed", "stopped")
"""A federation in one of these runs no more rounds (stopped: by an admin)."""
CLIENT_STATUSES = ("trusted", "suspect", "noisy")
ROUND_STATES = ("open", "aggregating", "closed", "failed")


class Federation(Base):
    __tablename__ = "federation"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    num_classes: Mapped[int] = mapped_column(Integer)
    input_shape: Mapped[list[Any]] = mapped_column(JSON)
    class_names: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    rounds: Mapped[int] = mapped_column(Integer)
    min_clients: Mapped[int] = mapped_column(Integer)
    max_clients: Mapped[int | None] = mapped_column(Integer, nullable=True)
    round_deadline_s: Mapped[float]
    seed: Mapped[int] = mapped_column(BigInteger)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(20), default="created")
    status_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # No foreign key: model_version already references federation, and a cycle would need
    # deferred constraints on PostgreSQL for no real gain.
    current_model_id: Mapped[uuid.UUID | None] = mapped_column(nullable=True)
    centroids: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)


class Client(Base):
    __tablename__ = "client"
    __table_args__ = (UniqueConstraint("federation_id", "name"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    federation_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("federation.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    status: Mapped[str] = mapped_column(String(20), default="trusted")
    pinned_status: Mapped[str | None] = mapped_column(String(20), nullable=True)
    pin_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    pinned_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
    pinned_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # A trust anchor: a site whose labels an admin vouches for (service.audit.evidence).
    anchor: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    anchor_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    num_samples: Mapped[int | None] = mapped_column(Integer, nullable=True)
    class_counts: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    # Set when an admin revokes the site's token; a rotation gives a new token and clears it.
    token_revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    joined_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_seen_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # Attendance (service.coordinator.attendance): an admin's suspension, with its reason, and
    # the rounds in a row the site was selected for without sending an update; at the
    # federation's limit it is absent (not selected) until it polls again.
    suspended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    suspend_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    missed_rounds: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    absent_since: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    flag_history: Mapped[list[Any]] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ModelVersion(Base):
    __tablename__ = "model_version"
    __table_args__ = (UniqueConstraint("federation_id", "version"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    federation_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("federation.id"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    round_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    blob_key: Mapped[str] = mapped_column(String(64))
    manifest: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Round(Base):
    __tablename__ = "round"
    __table_args__ = (UniqueConstraint("federation_id", "index"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    federation_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("federation.id"), index=True)
    index: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(20), default="open")
    state_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    opened_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    deadline_at: Mapped[datetime] = mapped_column(UTCDateTime())
    deadline_extensions: Mapped[int] = mapped_column(Integer, default=0)
    closed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    model_in_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("model_version.id"))
    model_out_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("model_version.id"), nullable=True
    )
    probe_seed: Mapped[int] = mapped_column(BigInteger)
    aggregation_rule: Mapped[str | None] = mapped_column(String(40), nullable=True)
    aggregation_weights: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    coordinator_seconds: Mapped[float | None] = mapped_column(nullable=True)


class RoundParticipant(Base):
    """A client selected for a round, with the instructions computed when the round opened."""

    __tablename__ = "round_participant"

    round_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("round.id"), primary_key=True)
    client_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("client.id"), primary_key=True)
    instructions: Mapped[dict[str, Any]] = mapped_column(JSON)


class ModelUpdate(Base):
    __tablename__ = "model_update"
    __table_args__ = (
        UniqueConstraint("round_id", "client_id"),
        UniqueConstraint("client_id", "idempotency_key"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    federation_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("federation.id"), index=True)
    round_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("round.id"), index=True)
    client_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("client.id"), index=True)
    round_index: Mapped[int] = mapped_column(Integer)
    blob_key: Mapped[str] = mapped_column(String(64))
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    num_samples: Mapped[int] = mapped_column(Integer)
    signals: Mapped[dict[str, Any]] = mapped_column(JSON)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    idempotency_key: Mapped[str] = mapped_column(String(200))
    request_hash: Mapped[str] = mapped_column(String(64))
    received_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # Set when retention removed the update's blob and its large signals (probe softmax,
    # centroids); the row, its sha256 and the signals the reports read stay
    # (service.coordinator.retention). A pruned update's blob_key is no reference.
    pruned_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class AuditResult(Base):
    __tablename__ = "audit_result"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    federation_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("federation.id"), index=True)
    round_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("round.id"), unique=True)
    round_index: Mapped[int] = mapped_column(Integer)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    result: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Event(Base):
    """Append-only audit trail."""

    __tablename__ = "event"
    __table_args__ = (
        Index("ix_event_federation_id_id", "federation_id", "id"),
        # /metrics counts events per kind on every scrape: a covering index instead of the table.
        Index("ix_event_kind", "kind"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    federation_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("federation.id"), nullable=True
    )
    round_id: Mapped[uuid.UUID | None] = mapped_column(nullable=True)
    client_id: Mapped[uuid.UUID | None] = mapped_column(nullable=True)
    kind: Mapped[str] = mapped_column(String(60))
    actor: Mapped[str] = mapped_column(String(200))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Blob(Base):
    """Blob bytes for the ``database`` blob backend (several replicas without a shared disk)."""

    __tablename__ = "blob"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class AdminSession(Base):
    """A dashboard session: the browser holds a random value, the row its sha256.

    Valid while not revoked, not expired, and opened with the admin token in force now
    (``credential_hash``), so changing the admin token ends every session.
    """

    __tablename__ = "admin_session"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    credential_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_from: Mapped[str | None] = mapped_column(String(200), nullable=True)


class AdminToken(Base):
    """An admin token set with ``fedaudit admin rotate-token`` (its sha256; the newest row not
    revoked is the admin token, and it replaces ``FEDAUDIT_ADMIN_TOKEN``)."""

    __tablename__ = "admin_token"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    created_by: Mapped[str] = mapped_column(String(200))
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
