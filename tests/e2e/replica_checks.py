"""What the replica tests read back from the shared database."""

from __future__ import annotations

import uuid

from sqlalchemy import select

from service.store import tables
from service.store.session import make_engine


def stored_round0(database_url: str, fid: uuid.UUID) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """(update id, client id) of every update stored in the federation's round 0."""
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(tables.ModelUpdate.id, tables.ModelUpdate.client_id)
                .join(tables.Round, tables.Round.id == tables.ModelUpdate.round_id)
                .where(tables.Round.federation_id == fid, tables.Round.index == 0)
            ).all()
    finally:
        engine.dispose()
    return [(r.id, r.client_id) for r in rows]
