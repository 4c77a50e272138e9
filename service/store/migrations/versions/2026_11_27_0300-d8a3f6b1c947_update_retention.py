"""Retention: a model update whose blob was pruned keeps its row, marked with ``pruned_at``.

Revision ID: d8a3f6b1c947
Revises: c5f1a7d3e2b8
Create Date: 2026-11-27 03:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "d8a3f6b1c947"
down_revision: str | None = "c5f1a7d3e2b8"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("model_update") as batch:
        batch.add_column(sa.Column("pruned_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("model_update") as batch:
        batch.drop_column("pruned_at")
