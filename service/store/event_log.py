"""One log line per audit-trail event, written when the transaction that recorded it commits.

:func:`remember_event` (called by the repositories when they add an event) keeps the event's
message and fields in the session; :func:`log_committed_events` installs the listeners that log
them at INFO on the logger :data:`EVENT_LOGGER` after COMMIT, and drop them when the outermost
transaction ends without one (rolled back, or the session closed): a rolled-back event leaves no
line. The format is :mod:`service.logs`'s.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import event as sa_event
from sqlalchemy.orm import Session, SessionTransaction

__all__ = ["EVENT_LOGGER", "log_committed_events", "remember_event"]

EVENT_LOGGER = "fedaudit.events"
_PENDING = "fedaudit_pending_event_logs"


def remember_event(session: Session, event: Any) -> None:
    """Keep an event added in this transaction, to be logged when it commits (its fields are
    copied now: after the commit the row's attributes are expired and cannot be loaded)."""
    fields = {
        "event": event.kind,
        "federation_id": None if event.federation_id is None else str(event.federation_id),
        "round_id": None if event.round_id is None else str(event.round_id),
        "client_id": None if event.client_id is None else str(event.client_id),
    }
    session.info.setdefault(_PENDING, []).append((str(event.message), fields))


def log_committed_events() -> None:
    """Log the remembered events of every session's transaction once it commits (idempotent)."""
    if sa_event.contains(Session, "after_commit", _after_commit):
        return
    sa_event.listen(Session, "after_commit", _after_commit)
    sa_event.listen(Session, "after_transaction_end", _after_transaction_end)


def _after_commit(session: Session) -> None:
    pending = session.info.pop(_PENDING, None)
    if not pending:
        return
    log = logging.getLogger(EVENT_LOGGER)
    for message, fields in pending:
        log.info("%s: %s", fields["event"], message, extra=fields)


def _after_transaction_end(session: Session, transaction: SessionTransaction) -> None:
    # The outermost transaction ended: committed (its events were logged by _after_commit, which
    # runs first), rolled back, or closed with the session; what is left was never committed. A
    # savepoint's end leaves the outer transaction's events pending.
    if transaction.parent is None:
        session.info.pop(_PENDING, None)
