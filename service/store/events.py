"""The audit trail's queries: recording an event (of a registered kind, text the databases can
store) and reading events back. Functions flush, never commit; ``service.store.repositories``
re-exports them beside the other queries."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.store.base import utcnow
from service.store.event_kinds import EVENT_KINDS
from service.store.event_log import remember_event
from service.store.tables import Event

__all__ = [
    "add_event",
    "count_events",
    "latest_client_events",
    "latest_events",
    "list_events",
    "recent_client_events",
    "rejections_by_client",
    "storable",
]


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(value: Any) -> Any:
    """`value` with NUL and unpaired surrogates replaced by U+FFFD, in strings and in the keys
    and items of JSON containers: an event quotes what a refused request carried (a path, a
    metadata key), and neither database can store those characters in text."""
    if isinstance(value, str):
        return _UNSTORABLE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable(v) for v in value]
    return value


def add_event(
    session: Session,
    *,
    kind: str,
    actor: str,
    message: str,
    federation_id: uuid.UUID | None = None,
    round_id: uuid.UUID | None = None,
    client_id: uuid.UUID | None = None,
    data: Mapping[str, object] | None = None,
) -> Event:
    """Record an audit-trail event; ``kind`` must be one of ``event_kinds.EVENT_KINDS``."""
    if kind not in EVENT_KINDS:
        raise ValueError(f"event kind {kind!r} is not in service.store.event_kinds")
    event = Event(
        kind=kind,
        actor=storable(actor),
        message=storable(message),
        federation_id=federation_id,
        round_id=round_id,
        client_id=client_id,
        data=storable(dict(data or {})),
        created_at=utcnow(),
    )
    session.add(event)
    session.flush()
    remember_event(session, event)
    return event


def list_events(
    session: Session,
    federation_id: uuid.UUID,
    *,
    kind: str | None = None,
    client_id: uuid.UUID | None = None,
    after_id: int = 0,
    limit: int = 1000,
) -> list[Event]:
    query = select(Event).where(Event.federation_id == federation_id, Event.id > after_id)
    if kind is not None:
        query = query.where(Event.kind == kind)
    if client_id is not None:
        query = query.where(Event.client_id == client_id)
    return list(session.scalars(query.order_by(Event.id).limit(limit)))


def count_events(session: Session, *, kind: str, round_id: uuid.UUID, client_id: uuid.UUID) -> int:
    """How many events of `kind` a client has in a round."""
    return int(
        session.scalar(
            select(func.count()).where(
                Event.kind == kind, Event.round_id == round_id, Event.client_id == client_id
            )
        )
        or 0
    )


def latest_events(
    session: Session, federation_id: uuid.UUID, *, kind: str, limit: int
) -> list[Event]:
    """The federation's last `limit` events of `kind`, newest first."""
    query = select(Event).where(Event.federation_id == federation_id, Event.kind == kind)
    return list(session.scalars(query.order_by(Event.id.desc()).limit(limit)))


def rejections_by_client(
    session: Session, federation_id: uuid.UUID, problem_type: str
) -> dict[uuid.UUID, tuple[int, datetime]]:
    """Per client: how many ``update.rejected`` events of ``problem_type`` it has, and the last."""
    rows = session.execute(
        select(Event.client_id, func.count(), func.max(Event.created_at))
        .where(
            Event.federation_id == federation_id,
            Event.kind == "update.rejected",
            Event.client_id.is_not(None),
            Event.data["type"].as_string() == problem_type,
        )
        .group_by(Event.client_id)
    ).all()
    return {client_id: (int(count), last) for client_id, count, last in rows if client_id}


def recent_client_events(
    session: Session, federation_id: uuid.UUID, client_id: uuid.UUID, *, kind: str, since: datetime
) -> int:
    """How many events of ``kind`` one client has in a federation since ``since``."""
    query = select(func.count()).where(
        Event.federation_id == federation_id,
        Event.client_id == client_id,
        Event.kind == kind,
        Event.created_at >= since,
    )
    return int(session.scalar(query) or 0)


def latest_client_events(
    session: Session, federation_id: uuid.UUID, client_id: uuid.UUID, *, kind: str, limit: int
) -> list[Event]:
    """One client's last ``limit`` events of ``kind`` in a federation, newest first."""
    query = select(Event).where(
        Event.federation_id == federation_id, Event.client_id == client_id, Event.kind == kind
    )
    return list(session.scalars(query.order_by(Event.id.desc()).limit(limit)))
