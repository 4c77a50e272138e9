"""Attendance: a site an admin suspended, and a site that stopped answering (absent), are left
out of the rounds' selection (``service.coordinator.attendance``).

Revision ID: e9b4c2a7f531
Revises: d8a3f6b1c947
Create Date: 2026-11-29 18:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "e9b4c2a7f531"
down_revision: str | None = "d8a3f6b1c947"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("client") as batch:
        batch.add_column(sa.Column("suspended_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("suspend_reason", sa.Text(), nullable=True))
        batch.add_column(
            sa.Column("missed_rounds", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("absent_since", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("client") as batch:
        batch.drop_column("absent_since")
        batch.drop_column("missed_rounds")
        batch.drop_column("suspend_reason")
        batch.drop_column("suspended_at")
