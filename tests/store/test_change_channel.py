"""``pg_notify`` in the committing transaction (`service.store.change_channel`), heard by a plain
``LISTEN`` connection on a real PostgreSQL database: nothing while the transaction is open or
after it rolls back, one notification per payload when it commits, within the issue's 1 s."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import Engine, make_url
from sqlalchemy.orm import Session, sessionmaker

from service.coordinator.pg_notify import libpq_dsn
from service.store import change_channel
from service.store.session import make_engine, make_sessionmaker

WAKE_S = 1.0


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    if make_url(database_url).get_backend_name() != "postgresql":
        pytest.skip("pg_notify needs PostgreSQL")
    engine = make_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def listener(database_url: str) -> Iterator[psycopg.Connection]:
    channel = sql.Identifier(change_channel.CHANNEL)
    with psycopg.connect(libpq_dsn(database_url), autocommit=True) as conn:
        conn.execute(sql.SQL("LISTEN {}").format(channel))
        yield conn


def heard(listener: psycopg.Connection, within_s: float) -> list[str]:
    payloads = []
    deadline = time.monotonic() + within_s
    while (left := deadline - time.monotonic()) > 0:
        payloads += [note.payload for note in listener.notifies(timeout=left)]
    return payloads


@pytest.mark.db
def test_only_a_commit_delivers_and_once_per_payload(
    engine: Engine, listener: psycopg.Connection
) -> None:
    sessions: sessionmaker[Session] = make_sessionmaker(engine)
    rolled_back, committed = uuid.uuid4().hex, uuid.uuid4().hex

    with sessions() as session:
        change_channel.send_in_transaction(session, rolled_back)
        assert heard(listener, 0.3) == []  # sent, but the transaction is open
        session.rollback()
    assert heard(listener, WAKE_S) == []

    with sessions.begin() as session:
        change_channel.send_in_transaction(session, committed)
        change_channel.send_in_transaction(session, committed)  # the same: delivered once
        assert heard(listener, 0.3) == []
    first = [note.payload for note in listener.notifies(timeout=WAKE_S, stop_after=1)]
    assert first == [committed]  # within 1 s of the commit
    assert heard(listener, 0.3) == []  # and no second one
