"""The SQL side of the change signals between coordinator processes on PostgreSQL.

A process that commits a change other processes wait on (a round opened or closed, a federation
started, stopped or finished) sends ``pg_notify(channel, payload)`` in the committing
transaction itself: PostgreSQL delivers a notification to the channel's listeners if and when
that transaction commits, and drops it if the transaction rolls back, so the signal can neither
come before the change is visible nor announce a change that never happened, and it needs no
connection of its own. Notifications with the same channel and payload sent in one transaction
are delivered once. PostgreSQL serialises the commits of transactions that notify (they queue
their notifications in commit order); only the commits that open or close a round or change a
federation's status notify, a few per round.

The listening side (``LISTEN`` on a dedicated connection) is the coordinator's
`service.coordinator.pg_notify`: it reads notifications through psycopg's own API on a
connection outside SQLAlchemy's pool, and psycopg (the optional extra ``postgres``) is imported
by that module only.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.orm import Session

CHANNEL = "fedaudit_changes"
"""The channel every coordinator process on one database sends and listens on."""

_NOTIFY = text("SELECT pg_notify(:channel, :payload)")


def send_in_transaction(session: Session, payload: str, *, channel: str = CHANNEL) -> None:
    """Queue a notification in the session's current transaction (PostgreSQL only).

    Delivered to the channel's listeners when the transaction commits, never if it rolls back.
    The payload must stay under 8,000 bytes.
    """
    session.execute(_NOTIFY, {"channel": channel, "payload": payload})
