"""Admin sessions stored server-side, admin tokens rotated in the database, site tokens revoked.

Revision ID: c5f1a7d3e2b8
Revises: b7e2c4d91a35
Create Date: 2026-11-26 09:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c5f1a7d3e2b8"
down_revision: str | None = "b7e2c4d91a35"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "admin_session",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("credential_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_from", sa.String(length=200), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_admin_session")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_admin_session_token_hash")),
    )
    op.create_table(
        "admin_token",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=200), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_admin_token")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_admin_token_token_hash")),
    )
    with op.batch_alter_table("client") as batch:
        batch.add_column(sa.Column("token_revoked_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("client") as batch:
        batch.drop_column("token_revoked_at")
    op.drop_table("admin_token")
    op.drop_table("admin_session")
