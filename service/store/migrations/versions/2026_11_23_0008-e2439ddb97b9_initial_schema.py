"""Initial schema: federations, clients, model versions, rounds, updates, audits, events, blobs.

Revision ID: e2439ddb97b9
Revises:
Create Date: 2026-11-23 00:08:49.568782+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = "e2439ddb97b9"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "blob",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_blob")),
    )
    op.create_table(
        "federation",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("num_classes", sa.Integer(), nullable=False),
        sa.Column("input_shape", sa.JSON(), nullable=False),
        sa.Column("class_names", sa.JSON(), nullable=True),
        sa.Column("rounds", sa.Integer(), nullable=False),
        sa.Column("min_clients", sa.Integer(), nullable=False),
        sa.Column("max_clients", sa.Integer(), nullable=True),
        sa.Column("round_deadline_s", sa.Double(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("status_reason", sa.Text(), nullable=True),
        sa.Column("current_model_id", sa.Uuid(), nullable=True),
        sa.Column("centroids", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_federation")),
        sa.UniqueConstraint("name", name=op.f("uq_federation_name")),
    )
    op.create_table(
        "client",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("federation_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("pinned_status", sa.String(length=20), nullable=True),
        sa.Column("pin_reason", sa.Text(), nullable=True),
        sa.Column("pinned_by", sa.String(length=200), nullable=True),
        sa.Column("pinned_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("num_samples", sa.Integer(), nullable=True),
        sa.Column("class_counts", sa.JSON(), nullable=True),
        sa.Column("joined_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("flag_history", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["federation_id"], ["federation.id"], name=op.f("fk_client_federation_id_federation")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_client")),
        sa.UniqueConstraint("federation_id", "name", name=op.f("uq_client_federation_id_name")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_client_token_hash")),
    )
    with op.batch_alter_table("client", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_client_federation_id"), ["federation_id"], unique=False
        )

    op.create_table(
        "event",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("federation_id", sa.Uuid(), nullable=True),
        sa.Column("round_id", sa.Uuid(), nullable=True),
        sa.Column("client_id", sa.Uuid(), nullable=True),
        sa.Column("kind", sa.String(length=60), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["federation_id"], ["federation.id"], name=op.f("fk_event_federation_id_federation")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_event")),
    )
    with op.batch_alter_table("event", schema=None) as batch_op:
        batch_op.create_index("ix_event_federation_id_id", ["federation_id", "id"], unique=False)

    op.create_table(
        "model_version",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("federation_id", sa.Uuid(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("round_index", sa.Integer(), nullable=True),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("blob_key", sa.String(length=64), nullable=False),
        sa.Column("manifest", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["federation_id"],
            ["federation.id"],
            name=op.f("fk_model_version_federation_id_federation"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_version")),
        sa.UniqueConstraint(
            "federation_id", "version", name=op.f("uq_model_version_federation_id_version")
        ),
    )
    with op.batch_alter_table("model_version", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_model_version_federation_id"), ["federation_id"], unique=False
        )

    op.create_table(
        "round",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("federation_id", sa.Uuid(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("state_reason", sa.Text(), nullable=True),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deadline_extensions", sa.Integer(), nullable=False),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("model_in_id", sa.Uuid(), nullable=False),
        sa.Column("model_out_id", sa.Uuid(), nullable=True),
        sa.Column("probe_seed", sa.BigInteger(), nullable=False),
        sa.Column("aggregation_rule", sa.String(length=40), nullable=True),
        sa.Column("aggregation_weights", sa.JSON(), nullable=True),
        sa.Column("coordinator_seconds", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["federation_id"], ["federation.id"], name=op.f("fk_round_federation_id_federation")
        ),
        sa.ForeignKeyConstraint(
            ["model_in_id"], ["model_version.id"], name=op.f("fk_round_model_in_id_model_version")
        ),
        sa.ForeignKeyConstraint(
            ["model_out_id"], ["model_version.id"], name=op.f("fk_round_model_out_id_model_version")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_round")),
        sa.UniqueConstraint("federation_id", "index", name=op.f("uq_round_federation_id_index")),
    )
    with op.batch_alter_table("round", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_round_federation_id"), ["federation_id"], unique=False)

    op.create_table(
        "audit_result",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("federation_id", sa.Uuid(), nullable=False),
        sa.Column("round_id", sa.Uuid(), nullable=False),
        sa.Column("round_index", sa.Integer(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["federation_id"],
            ["federation.id"],
            name=op.f("fk_audit_result_federation_id_federation"),
        ),
        sa.ForeignKeyConstraint(
            ["round_id"], ["round.id"], name=op.f("fk_audit_result_round_id_round")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_result")),
        sa.UniqueConstraint("round_id", name=op.f("uq_audit_result_round_id")),
    )
    with op.batch_alter_table("audit_result", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_audit_result_federation_id"), ["federation_id"], unique=False
        )

    op.create_table(
        "model_update",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("federation_id", sa.Uuid(), nullable=False),
        sa.Column("round_id", sa.Uuid(), nullable=False),
        sa.Column("client_id", sa.Uuid(), nullable=False),
        sa.Column("round_index", sa.Integer(), nullable=False),
        sa.Column("blob_key", sa.String(length=64), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("num_samples", sa.Integer(), nullable=False),
        sa.Column("signals", sa.JSON(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["client_id"], ["client.id"], name=op.f("fk_model_update_client_id_client")
        ),
        sa.ForeignKeyConstraint(
            ["federation_id"],
            ["federation.id"],
            name=op.f("fk_model_update_federation_id_federation"),
        ),
        sa.ForeignKeyConstraint(
            ["round_id"], ["round.id"], name=op.f("fk_model_update_round_id_round")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_update")),
        sa.UniqueConstraint(
            "client_id", "idempotency_key", name=op.f("uq_model_update_client_id_idempotency_key")
        ),
        sa.UniqueConstraint(
            "round_id", "client_id", name=op.f("uq_model_update_round_id_client_id")
        ),
    )
    with op.batch_alter_table("model_update", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_model_update_client_id"), ["client_id"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_model_update_federation_id"), ["federation_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_model_update_round_id"), ["round_id"], unique=False)

    op.create_table(
        "round_participant",
        sa.Column("round_id", sa.Uuid(), nullable=False),
        sa.Column("client_id", sa.Uuid(), nullable=False),
        sa.Column("instructions", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["client_id"], ["client.id"], name=op.f("fk_round_participant_client_id_client")
        ),
        sa.ForeignKeyConstraint(
            ["round_id"], ["round.id"], name=op.f("fk_round_participant_round_id_round")
        ),
        sa.PrimaryKeyConstraint("round_id", "client_id", name=op.f("pk_round_participant")),
    )


def downgrade() -> None:
    op.drop_table("round_participant")
    with op.batch_alter_table("model_update", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_model_update_round_id"))
        batch_op.drop_index(batch_op.f("ix_model_update_federation_id"))
        batch_op.drop_index(batch_op.f("ix_model_update_client_id"))

    op.drop_table("model_update")
    with op.batch_alter_table("audit_result", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_audit_result_federation_id"))

    op.drop_table("audit_result")
    with op.batch_alter_table("round", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_round_federation_id"))

    op.drop_table("round")
    with op.batch_alter_table("model_version", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_model_version_federation_id"))

    op.drop_table("model_version")
    with op.batch_alter_table("event", schema=None) as batch_op:
        batch_op.drop_index("ix_event_federation_id_id")

    op.drop_table("event")
    with op.batch_alter_table("client", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_client_federation_id"))

    op.drop_table("client")
    op.drop_table("federation")
    op.drop_table("blob")
