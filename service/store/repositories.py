"""Every query of the coordinator. Functions flush, never commit: the caller owns transactions."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import case, delete, func, select, update
from sqlalchemy.orm import Session

# The audit trail's queries live in service.store.events; callers reach them here with the rest.
from service.store.events import add_event as add_event
from service.store.events import count_events as count_events
from service.store.events import latest_client_events as latest_client_events
from service.store.events import latest_events as latest_events
from service.store.events import list_events as list_events
from service.store.events import recent_client_events as recent_client_events
from service.store.events import rejections_by_client as rejections_by_client
from service.store.events import storable as storable
from service.store.tables import (
    AuditResult,
    Client,
    Federation,
    ModelUpdate,
    ModelVersion,
    Round,
    RoundParticipant,
)

# --- federations -----------------------------------------------------------------------------


def add(session: Session, obj: Any) -> None:
    session.add(obj)
    session.flush()


def get_federation(session: Session, federation_id: uuid.UUID) -> Federation | None:
    return session.get(Federation, federation_id)


def get_federation_by_name(session: Session, name: str) -> Federation | None:
    return session.scalar(select(Federation).where(Federation.name == name))


def list_federations(
    session: Session, *, offset: int = 0, limit: int | None = 100
) -> list[Federation]:
    """Federations in creation order; ``limit=None`` returns all of them."""
    query = select(Federation).order_by(Federation.created_at, Federation.id)
    return list(session.scalars(query.offset(offset).limit(limit)))


def count_federations(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(Federation)) or 0


COUNT_KEYS = ("clients", "joined_clients", "rounds_started", "rounds_closed")
"""The per-federation counts of :func:`federation_counts`."""


def client_status_counts(
    session: Session, federation_ids: Sequence[uuid.UUID] | None = None
) -> dict[uuid.UUID, dict[str, int]]:
    """Per federation, how many clients have each status, a pinned status counting over the
    detected one (one GROUP BY query; a federation without clients is absent). ``federation_ids``:
    only these; None: every federation."""
    status = func.coalesce(Client.pinned_status, Client.status)
    query = select(Client.federation_id, status, func.count()).group_by(
        Client.federation_id, status
    )
    if federation_ids is not None:
        query = query.where(Client.federation_id.in_(list(federation_ids)))
    result: dict[uuid.UUID, dict[str, int]] = {}
    for fid, name, n in session.execute(query).all():
        result.setdefault(fid, {})[str(name)] = int(n)
    return result


def federation_counts(
    session: Session, federation_ids: Sequence[uuid.UUID] | None = None
) -> dict[uuid.UUID, dict[str, int]]:
    """Clients, joined clients, rounds started and rounds closed per federation, in two GROUP BY
    queries. ``federation_ids``: only these (each gets an entry, zeros included); None: every
    federation that has a client or a round (absent means zero)."""
    ids = None if federation_ids is None else list(federation_ids)
    result: dict[uuid.UUID, dict[str, int]] = {}
    if ids is not None:
        result = {fid: dict.fromkeys(COUNT_KEYS, 0) for fid in ids}
        if not ids:
            return result

    def entry(fid: uuid.UUID) -> dict[str, int]:
        return result.setdefault(fid, dict.fromkeys(COUNT_KEYS, 0))

    clients = select(Client.federation_id, func.count(), func.count(Client.joined_at))
    rounds = select(
        Round.federation_id,
        func.count(),
        func.coalesce(func.sum(case((Round.state == "closed", 1), else_=0)), 0),
    )
    if ids is not None:
        clients = clients.where(Client.federation_id.in_(ids))
        rounds = rounds.where(Round.federation_id.in_(ids))
    # COUNT(joined_at) skips NULLs: the clients that joined.
    for fid, n, joined in session.execute(clients.group_by(Client.federation_id)).all():
        entry(fid).update(clients=int(n), joined_clients=int(joined))
    for fid, n, closed in session.execute(rounds.group_by(Round.federation_id)).all():
        entry(fid).update(rounds_started=int(n), rounds_closed=int(closed))
    return result


def lock_federation(session: Session, federation_id: uuid.UUID) -> Federation | None:
    """The federation row, locked for update on PostgreSQL (a no-op on SQLite)."""
    return session.scalar(
        select(Federation).where(Federation.id == federation_id).with_for_update()
    )


def lock_federation_for_write(session: Session, federation_id: uuid.UUID) -> Federation | None:
    """The federation row, locked against every other writer on both databases: a no-op UPDATE
    first (on SQLite a transaction's first write takes the database's write lock; a read, as
    `lock_federation`'s on SQLite, takes none), then the row."""
    session.execute(
        update(Federation)
        .where(Federation.id == federation_id)
        .values(name=Federation.name)
        .execution_options(synchronize_session=False)
    )
    return lock_federation(session, federation_id)


# --- clients ---------------------------------------------------------------------------------


def get_client(session: Session, client_id: uuid.UUID) -> Client | None:
    return session.get(Client, client_id)


def get_client_by_token_hash(session: Session, token_hash: str) -> Client | None:
    return session.scalar(select(Client).where(Client.token_hash == token_hash))


def client_name_taken(session: Session, federation_id: uuid.UUID, name: str) -> bool:
    """Whether the federation has a client called ``name`` (one indexed lookup, no rows)."""
    query = select(Client.id).where(Client.federation_id == federation_id, Client.name == name)
    return session.scalar(query.limit(1)) is not None


def list_clients(session: Session, federation_id: uuid.UUID) -> list[Client]:
    query = select(Client).where(Client.federation_id == federation_id)
    return list(session.scalars(query.order_by(Client.created_at, Client.name)))


def joined_clients(session: Session, federation_id: uuid.UUID) -> list[Client]:
    query = select(Client).where(
        Client.federation_id == federation_id, Client.joined_at.is_not(None)
    )
    return list(session.scalars(query.order_by(Client.name, Client.id)))


def suspended_client_ids(session: Session, federation_id: uuid.UUID) -> set[uuid.UUID]:
    """The federation's clients an admin suspended (their ids only)."""
    query = select(Client.id).where(
        Client.federation_id == federation_id, Client.suspended_at.is_not(None)
    )
    return set(session.scalars(query))


def clear_absence(session: Session, client_id: uuid.UUID) -> bool:
    """Mark an absent client present (``attendance``); False when it was not absent (any more)."""
    result = session.execute(
        update(Client)
        .where(Client.id == client_id, Client.absent_since.is_not(None))
        .values(absent_since=None, missed_rounds=0)
        .execution_options(synchronize_session=False)
    )
    return bool(getattr(result, "rowcount", 0) == 1)


def touch_client(session: Session, client_id: uuid.UUID, when: datetime) -> None:
    session.execute(update(Client).where(Client.id == client_id).values(last_seen_at=when))


# --- model versions --------------------------------------------------------------------------


def get_model_version(session: Session, model_id: uuid.UUID) -> ModelVersion | None:
    return session.get(ModelVersion, model_id)


def list_model_versions(session: Session, federation_id: uuid.UUID) -> list[ModelVersion]:
    query = select(ModelVersion).where(ModelVersion.federation_id == federation_id)
    return list(session.scalars(query.order_by(ModelVersion.version)))


# --- rounds ----------------------------------------------------------------------------------


def get_round(session: Session, round_id: uuid.UUID) -> Round | None:
    return session.get(Round, round_id)


def get_round_by_index(session: Session, federation_id: uuid.UUID, index: int) -> Round | None:
    return session.scalar(
        select(Round).where(Round.federation_id == federation_id, Round.index == index)
    )


def list_rounds(
    session: Session, federation_id: uuid.UUID, *, offset: int = 0, limit: int = 1000
) -> list[Round]:
    query = select(Round).where(Round.federation_id == federation_id).order_by(Round.index)
    return list(session.scalars(query.offset(offset).limit(limit)))


def count_rounds(session: Session, federation_id: uuid.UUID) -> int:
    query = select(func.count()).select_from(Round).where(Round.federation_id == federation_id)
    return session.scalar(query) or 0


def open_round_of(session: Session, federation_id: uuid.UUID) -> Round | None:
    return session.scalar(
        select(Round).where(Round.federation_id == federation_id, Round.state == "open")
    )


def latest_round(session: Session, federation_id: uuid.UUID) -> Round | None:
    query = select(Round).where(Round.federation_id == federation_id)
    return session.scalar(query.order_by(Round.index.desc()).limit(1))


def all_open_rounds(session: Session) -> list[Round]:
    return list(session.scalars(select(Round).where(Round.state == "open")))


def fail_open_rounds(session: Session, federation_id: uuid.UUID, reason: str) -> int:
    """Move the federation's open round (if any) to ``failed``; the number of rounds moved.

    A conditional UPDATE, like :func:`claim_round_for_close`: a round that a closer has already
    claimed (``aggregating``) is not touched (on PostgreSQL this waits for the closer's row lock
    and then matches nothing).
    """
    result = session.execute(
        update(Round)
        .where(Round.federation_id == federation_id, Round.state == "open")
        .values(state="failed", state_reason=reason)
        .execution_options(synchronize_session=False)
    )
    return int(getattr(result, "rowcount", 0) or 0)


def claim_round_for_close(session: Session, round_id: uuid.UUID) -> bool:
    """Move an open round to ``aggregating``; False when somebody else already did.

    This UPDATE is the first statement of the closing transaction: on PostgreSQL it takes the
    round's row lock (a concurrent closer waits, then sees the new state and matches nothing);
    on SQLite it takes the database write lock with the same effect.
    """
    result = session.execute(
        update(Round)
        .where(Round.id == round_id, Round.state == "open")
        .values(state="aggregating")
        .execution_options(synchronize_session=False)
    )
    return bool(getattr(result, "rowcount", 0) == 1)


def touch_open_round(session: Session, round_id: uuid.UUID) -> bool:
    """Lock an open round against a concurrent close while an update is inserted.

    Writes the row (a no-op change) so that, as the close's compare-and-set, it serialises with
    closing; returns False when the round is no longer open.
    """
    result = session.execute(
        update(Round)
        .where(Round.id == round_id, Round.state == "open")
        .values(state="open")
        .execution_options(synchronize_session=False)
    )
    return bool(getattr(result, "rowcount", 0) == 1)


def add_participants(
    session: Session, round_id: uuid.UUID, instructions: Mapping[uuid.UUID, Mapping[str, Any]]
) -> None:
    for client_id, payload in instructions.items():
        session.add(RoundParticipant(round_id=round_id, client_id=client_id, instructions=payload))
    session.flush()


def participants(session: Session, round_id: uuid.UUID) -> list[RoundParticipant]:
    query = select(RoundParticipant).where(RoundParticipant.round_id == round_id)
    return list(session.scalars(query))


def selected_client_ids(session: Session, round_id: uuid.UUID) -> list[uuid.UUID]:
    """The clients the round selected (their ids only: no instructions loaded)."""
    query = select(RoundParticipant.client_id).where(RoundParticipant.round_id == round_id)
    return list(session.scalars(query))


def submitted_client_ids(session: Session, round_id: uuid.UUID) -> list[uuid.UUID]:
    """The clients with an update stored in the round, in the order of `updates_of_round`."""
    query = select(ModelUpdate.client_id).where(ModelUpdate.round_id == round_id)
    return list(session.scalars(query.order_by(ModelUpdate.received_at, ModelUpdate.id)))


def participation_counts(session: Session, round_id: uuid.UUID) -> tuple[int, int]:
    """How many clients the round selected, and how many of those have an update stored in it:
    two COUNT queries on the tables' keys, no rows loaded (a poll of a round with thousands of
    sites asks this)."""
    selected = select(func.count()).where(RoundParticipant.round_id == round_id)
    submitted = (
        select(func.count())
        .select_from(ModelUpdate)
        .join(
            RoundParticipant,
            (RoundParticipant.round_id == ModelUpdate.round_id)
            & (RoundParticipant.client_id == ModelUpdate.client_id),
        )
        .where(ModelUpdate.round_id == round_id)
    )
    return int(session.scalar(selected) or 0), int(session.scalar(submitted) or 0)


def remove_participant(session: Session, round_id: uuid.UUID, client_id: uuid.UUID) -> bool:
    """Withdraw a client from a round's selection; whether it was selected."""
    result = session.execute(
        delete(RoundParticipant).where(
            RoundParticipant.round_id == round_id, RoundParticipant.client_id == client_id
        )
    )
    return bool(getattr(result, "rowcount", 0))


def participant(
    session: Session, round_id: uuid.UUID, client_id: uuid.UUID
) -> RoundParticipant | None:
    return session.get(RoundParticipant, (round_id, client_id))


def client_rounds(session: Session, client_id: uuid.UUID) -> list[Round]:
    query = (
        select(Round)
        .join(RoundParticipant, RoundParticipant.round_id == Round.id)
        .where(RoundParticipant.client_id == client_id)
        .order_by(Round.index)
    )
    return list(session.scalars(query))


# --- updates ---------------------------------------------------------------------------------


def get_update(session: Session, update_id: uuid.UUID) -> ModelUpdate | None:
    return session.get(ModelUpdate, update_id)


def has_update(session: Session, round_id: uuid.UUID, client_id: uuid.UUID) -> bool:
    """Whether the client has an update stored in the round (its id only: no row loaded)."""
    query = select(ModelUpdate.id).where(
        ModelUpdate.round_id == round_id, ModelUpdate.client_id == client_id
    )
    return session.scalar(query) is not None


def update_by_idempotency_key(
    session: Session, client_id: uuid.UUID, key: str
) -> ModelUpdate | None:
    return session.scalar(
        select(ModelUpdate).where(
            ModelUpdate.client_id == client_id, ModelUpdate.idempotency_key == key
        )
    )


def updates_of_round(session: Session, round_id: uuid.UUID) -> list[ModelUpdate]:
    query = select(ModelUpdate).where(ModelUpdate.round_id == round_id)
    return list(session.scalars(query.order_by(ModelUpdate.received_at, ModelUpdate.id)))


def per_class_losses_of_client(
    session: Session, federation_id: uuid.UUID, client_id: uuid.UUID
) -> list[tuple[int, Any, Any]]:
    """(round index, per_class_loss, class_counts) of every accepted update of one client, by
    round: two fields read from each update's signals in the database, not the whole JSON
    (probes and centroids stay there)."""
    query = select(
        ModelUpdate.round_index,
        ModelUpdate.signals["per_class_loss"],
        ModelUpdate.signals["class_counts"],
    ).where(ModelUpdate.federation_id == federation_id, ModelUpdate.client_id == client_id)
    rows = session.execute(query.order_by(ModelUpdate.round_index)).all()
    return [(int(index), losses, counts) for index, losses, counts in rows]


def count_updates_of_round(session: Session, round_id: uuid.UUID) -> int:
    query = select(func.count()).select_from(ModelUpdate).where(ModelUpdate.round_id == round_id)
    return session.scalar(query) or 0


def update_counts(
    session: Session, federation_id: uuid.UUID, client_ids: Sequence[uuid.UUID], *, up_to_round: int
) -> dict[uuid.UUID, int]:
    """How many updates each client has had accepted in rounds up to ``up_to_round``."""
    if not client_ids:
        return {}
    query = (
        select(ModelUpdate.client_id, func.count())
        .where(
            ModelUpdate.federation_id == federation_id,
            ModelUpdate.client_id.in_(client_ids),
            ModelUpdate.round_index <= up_to_round,
        )
        .group_by(ModelUpdate.client_id)
    )
    return {client_id: int(count) for client_id, count in session.execute(query).all()}


def latest_updates(
    session: Session, federation_id: uuid.UUID, client_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, ModelUpdate]:
    """Each client's most recent accepted update (its latest local model)."""
    if not client_ids:
        return {}
    newest = (
        select(ModelUpdate.client_id, func.max(ModelUpdate.round_index).label("round_index"))
        .where(ModelUpdate.federation_id == federation_id, ModelUpdate.client_id.in_(client_ids))
        .group_by(ModelUpdate.client_id)
        .subquery()
    )
    query = select(ModelUpdate).join(
        newest,
        (ModelUpdate.client_id == newest.c.client_id)
        & (ModelUpdate.round_index == newest.c.round_index),
    )
    return {row.client_id: row for row in session.scalars(query)}


# --- retention -------------------------------------------------------------------------------


def finished_round_indices(session: Session, federation_id: uuid.UUID) -> list[int]:
    """The indices of the federation's closed or failed rounds, newest first."""
    query = select(Round.index).where(
        Round.federation_id == federation_id, Round.state.in_(("closed", "failed"))
    )
    return list(session.scalars(query.order_by(Round.index.desc())))


def unpruned_updates_up_to(
    session: Session, federation_id: uuid.UUID, last_round: int
) -> list[ModelUpdate]:
    """The updates not pruned yet of rounds ``<= last_round``, oldest round first."""
    query = select(ModelUpdate).where(
        ModelUpdate.federation_id == federation_id,
        ModelUpdate.round_index <= last_round,
        ModelUpdate.pruned_at.is_(None),
    )
    return list(session.scalars(query.order_by(ModelUpdate.round_index, ModelUpdate.id)))


def count_pruned_updates(session: Session, federation_id: uuid.UUID) -> int:
    query = select(func.count()).where(
        ModelUpdate.federation_id == federation_id, ModelUpdate.pruned_at.is_not(None)
    )
    return session.scalar(query) or 0


def open_round_instructions(session: Session, federation_id: uuid.UUID) -> list[dict[str, Any]]:
    """The instructions handed to the sites of the federation's rounds not closed yet."""
    query = (
        select(RoundParticipant.instructions)
        .join(Round, Round.id == RoundParticipant.round_id)
        .where(Round.federation_id == federation_id, Round.state.in_(("open", "aggregating")))
    )
    return list(session.scalars(query))


def pruned_clients_of_round(session: Session, round_id: uuid.UUID) -> list[uuid.UUID]:
    """The clients whose update of the round was pruned."""
    query = select(ModelUpdate.client_id).where(
        ModelUpdate.round_id == round_id, ModelUpdate.pruned_at.is_not(None)
    )
    return list(session.scalars(query.order_by(ModelUpdate.client_id)))


# --- audit results ---------------------------------------------------------------------------


def audit_of_round(session: Session, round_id: uuid.UUID) -> AuditResult | None:
    return session.scalar(select(AuditResult).where(AuditResult.round_id == round_id))


def count_audits(session: Session, federation_id: uuid.UUID) -> int:
    query = select(func.count()).select_from(AuditResult)
    return session.scalar(query.where(AuditResult.federation_id == federation_id)) or 0


def audits_newest_first(
    session: Session, federation_id: uuid.UUID, batch: int = 8
) -> Iterator[AuditResult]:
    """The federation's audits from the last round back, read ``batch`` rows at a time, so a
    caller that stops early never loads the whole history."""
    query = (
        select(AuditResult)
        .where(AuditResult.federation_id == federation_id)
        .order_by(AuditResult.round_index.desc())
    )
    offset = 0
    while True:
        rows = list(session.scalars(query.offset(offset).limit(batch)))
        yield from rows
        if len(rows) < batch:
            return
        offset += batch


def ping(session: Session) -> None:
    session.execute(select(1))
