"""Federations created before bounded influence keep uncapped weights and get the drift check.

A federation's configuration is resolved once, at creation, and stored whole. Two settings came
later:

* ``audit.max_client_weight_factor`` (default 4: no client weighs more than min(1, 4 / K)). A
  stored audit configuration without it would take that default on upgrade and change how a
  running federation aggregates; this writes ``null`` (no cap, as those federations ran) into
  it. An operator who wants the cap creates the federation anew.
* ``max_sample_drift`` (default 0.1): how far an update's num_samples and class_counts may
  drift from what the site declared at join. It is written with its default: a site that sends
  the counts it joined with (as the SDK does) is not affected, and a size claim out of all
  proportion to the join is refused from now on.

Downgrade removes both keys again (older code refuses unknown audit keys).

Revision ID: a4d81f3c6b20
Revises: 7c3e5a2b9d14
Create Date: 2026-11-25 09:00:00+00:00
"""

from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "a4d81f3c6b20"
down_revision: str | None = "7c3e5a2b9d14"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CAP_KEY = "max_client_weight_factor"
DRIFT_KEY = "max_sample_drift"
DRIFT_DEFAULT = 0.1

federation = sa.table("federation", sa.column("id", sa.Uuid()), sa.column("config", sa.JSON()))


def _rewrite(change: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Apply ``change`` to the stored configuration of every federation that has an audit one."""
    connection = op.get_bind()
    rows = connection.execute(sa.select(federation.c.id, federation.c.config)).all()
    for row_id, config in rows:
        if not isinstance((config or {}).get("audit"), dict):
            continue
        new_config = change({**config, "audit": dict(config["audit"])})
        if new_config != config:
            connection.execute(
                federation.update().where(federation.c.id == row_id).values(config=new_config)
            )


def _add(config: dict[str, Any]) -> dict[str, Any]:
    config["audit"].setdefault(CAP_KEY, None)
    config.setdefault(DRIFT_KEY, DRIFT_DEFAULT)
    return config


def _remove(config: dict[str, Any]) -> dict[str, Any]:
    config["audit"].pop(CAP_KEY, None)
    config.pop(DRIFT_KEY, None)
    return config


def upgrade() -> None:
    _rewrite(_add)


def downgrade() -> None:
    _rewrite(_remove)
