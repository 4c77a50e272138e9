"""Trust anchors: an admin may mark a site whose labels are curated (service.audit.evidence).

Revision ID: b7e2c4d91a35
Revises: a4d81f3c6b20
Create Date: 2026-11-25 11:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b7e2c4d91a35"
down_revision: str | None = "a4d81f3c6b20"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("client") as batch:
        batch.add_column(
            sa.Column("anchor", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("anchor_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("client") as batch:
        batch.drop_column("anchor_reason")
        batch.drop_column("anchor")
