"""What a site's poll of ``rounds/current`` needs to know, read in one statement.

A poll is the coordinator's most frequent request: every waiting site asks it again after each
change (or every few seconds without long-polls), a thousand sites at once when a round opens.
Read through the ORM one object at a time it took seven statements (the client, its
federation, the open round, the site's participation, whether its update is stored, and two
counts); here it is one SELECT of plain columns, no ORM object built. The caller turns it into
the answer (:func:`service.coordinator.rounds.current_for`). The counts are O(sites) each and
are made only where the answer quotes them (a ``CASE`` around each subquery: SQLite and
PostgreSQL evaluate a branch only when it is taken): at 1,000 sites they were most of the
statement's time.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, and_, bindparam, case, exists, func, select
from sqlalchemy.orm import Session, aliased

from service.store.tables import Client, Federation, ModelUpdate, Round, RoundParticipant


@dataclass(frozen=True)
class PollState:
    """One site's view of its federation at one instant (columns only)."""

    federation_name: str
    federation_status: str
    status_reason: str | None
    current_model_id: uuid.UUID | None
    joined: bool
    """Whether the polling site has joined."""
    suspended: bool
    """Whether an admin suspended the site (``service.coordinator.attendance``)."""
    absent: bool
    """Whether the site counts as absent (it missed rounds); its poll marks it present."""
    clients: int | None
    """Sites registered in the federation; counted only while it waits for them (None else)."""
    joined_clients: int | None
    """Of those, the sites that have joined (likewise)."""
    round_id: uuid.UUID | None
    """The federation's open round; None when no round is open."""
    round_index: int | None
    deadline_at: datetime | None
    selected: bool
    """Whether the open round selected the polling site."""
    instructions: dict[str, Any] | None
    """The site's instructions for the open round (None when not selected)."""
    has_update: bool
    """Whether the site's update for the open round is stored."""
    sites_selected: int | None
    """Sites the open round selected; counted only once the polling site's update is stored
    (None else)."""
    sites_submitted: int | None
    """Of those, the sites whose update is stored (likewise)."""


def _poll_query() -> Select[Any]:
    """The statement, built once: its aliases are module-level objects, so SQLAlchemy compiles
    it once and caches it (aliases made per call would miss the cache: a few milliseconds a
    poll, measured)."""
    site = aliased(Client)
    open_round = aliased(Round)
    mine = aliased(RoundParticipant)
    peer = aliased(Client)
    chosen = aliased(RoundParticipant)
    update = aliased(ModelUpdate)
    registered = (
        select(func.count(peer.id))
        .where(peer.federation_id == site.federation_id)
        .correlate(site)
        .scalar_subquery()
    )
    joined = (
        select(func.count(peer.joined_at))
        .where(peer.federation_id == site.federation_id)
        .correlate(site)
        .scalar_subquery()
    )
    selected = (
        select(func.count())
        .select_from(chosen)
        .where(chosen.round_id == open_round.id)
        .correlate(open_round)
    )
    submitted = (
        select(func.count())
        .select_from(update)
        .join(
            chosen, and_(chosen.round_id == update.round_id, chosen.client_id == update.client_id)
        )
        .where(update.round_id == open_round.id)
        .correlate(open_round)
    )
    stored = exists().where(ModelUpdate.round_id == open_round.id, ModelUpdate.client_id == site.id)
    return (
        select(
            Federation.name,
            Federation.status,
            Federation.status_reason,
            Federation.current_model_id,
            site.joined_at,
            site.suspended_at,
            site.absent_since,
            # Counted only where the answer quotes them: O(sites) each, a thousand sites at once.
            case((Federation.status == "waiting", registered)),
            case((Federation.status == "waiting", joined)),
            open_round.id,
            open_round.index,
            open_round.deadline_at,
            mine.client_id,
            mine.instructions,
            stored.correlate(open_round, site),
            case((stored.correlate(open_round, site), selected.scalar_subquery())),
            case((stored.correlate(open_round, site), submitted.scalar_subquery())),
        )
        .select_from(site)
        .join(Federation, Federation.id == site.federation_id)
        .outerjoin(
            open_round,
            and_(open_round.federation_id == site.federation_id, open_round.state == "open"),
        )
        .outerjoin(mine, and_(mine.round_id == open_round.id, mine.client_id == site.id))
        .where(site.id == bindparam("client_id"))
        .limit(1)
    )


_POLL = _poll_query()


def poll_state(session: Session, client_id: uuid.UUID) -> PollState | None:
    """The poll's state for ``client_id`` in one statement; None when the client does not
    exist. The counts are those of :func:`service.store.repositories.federation_counts` (sites,
    joined sites) and :func:`service.store.repositories.participation_counts` (an update counts
    only when its site was selected)."""
    row = session.execute(_POLL, {"client_id": client_id}).first()
    if row is None:
        return None
    (name, status, reason, model_id, joined_at, suspended_at, absent_since) = row[:7]
    (n_clients, n_joined, round_id, index, deadline, chosen_id, instructions) = row[7:14]
    (has_update, n_sel, n_sub) = row[14:]
    return PollState(
        federation_name=name,
        federation_status=status,
        status_reason=reason,
        current_model_id=model_id,
        joined=joined_at is not None,
        suspended=suspended_at is not None,
        absent=absent_since is not None,
        clients=None if n_clients is None else int(n_clients),
        joined_clients=None if n_joined is None else int(n_joined),
        round_id=round_id,
        round_index=index,
        deadline_at=deadline,
        selected=chosen_id is not None,
        instructions=instructions if chosen_id is not None else None,
        has_update=bool(has_update) and round_id is not None,
        sites_selected=None if n_sel is None or round_id is None else int(n_sel),
        sites_submitted=None if n_sub is None or round_id is None else int(n_sub),
    )
