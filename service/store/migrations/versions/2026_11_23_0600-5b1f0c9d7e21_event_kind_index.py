"""Index event.kind: /metrics counts events per kind on every scrape.

Revision ID: 5b1f0c9d7e21
Revises: e2439ddb97b9
Create Date: 2026-11-23 06:00:00+00:00
"""

from collections.abc import Sequence

from alembic import op


revision: str = "5b1f0c9d7e21"
down_revision: str | None = "e2439ddb97b9"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_event_kind", "event", ["kind"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_event_kind", table_name="event")
