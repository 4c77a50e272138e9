"""Federations created before the FedNoRo guard judged every fit's group keep the majority rule.

A federation's audit configuration is resolved once, at creation, and stored whole. The
``fednoro_separation_groups`` setting came later with the default ``"all_fits"``; a stored
configuration without it would take that default on upgrade and change how a running
federation flags its sites. This writes the rule those federations ran with, ``"majority"``,
into their stored configuration. Downgrade removes the key again (older code refuses unknown
configuration keys).

Revision ID: 7c3e5a2b9d14
Revises: 5b1f0c9d7e21
Create Date: 2026-11-24 04:00:00+00:00
"""

from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "7c3e5a2b9d14"
down_revision: str | None = "5b1f0c9d7e21"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KEY = "fednoro_separation_groups"

federation = sa.table("federation", sa.column("id", sa.Uuid()), sa.column("config", sa.JSON()))


def _rewrite(change: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Apply ``change`` to the stored audit configuration of every federation that has one."""
    connection = op.get_bind()
    rows = connection.execute(sa.select(federation.c.id, federation.c.config)).all()
    for row_id, config in rows:
        audit = (config or {}).get("audit")
        if not isinstance(audit, dict):
            continue
        new_audit = change(dict(audit))
        if new_audit != audit:
            connection.execute(
                federation.update()
                .where(federation.c.id == row_id)
                .values(config={**config, "audit": new_audit})
            )


def _add(audit: dict[str, Any]) -> dict[str, Any]:
    audit.setdefault(KEY, "majority")
    return audit


def _remove(audit: dict[str, Any]) -> dict[str, Any]:
    audit.pop(KEY, None)
    return audit


def upgrade() -> None:
    _rewrite(_add)


def downgrade() -> None:
    _rewrite(_remove)
