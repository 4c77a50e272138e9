"""A federation an admin stopped is ``stopped``, no longer ``failed``: the federations stopped
before this revision (``failed`` with a reason that begins "stopped by the admin:") become
``stopped``; a downgrade turns them back.

Revision ID: f2c8d5a9b614
Revises: e9b4c2a7f531
Create Date: 2026-11-29 19:00:00+00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "f2c8d5a9b614"
down_revision: str | None = "e9b4c2a7f531"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STOPPED = "status_reason LIKE 'stopped by the admin:%'"


def upgrade() -> None:
    op.execute(f"UPDATE federation SET status = 'stopped' WHERE status = 'failed' AND {STOPPED}")


def downgrade() -> None:
    op.execute(f"UPDATE federation SET status = 'failed' WHERE status = 'stopped' AND {STOPPED}")
