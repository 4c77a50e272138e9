"""PostgreSQL LISTEN/NOTIFY between two notifiers ("replicas") on one real database.

Each test gets a fresh database from the `database_url` fixture, PostgreSQL only (skipped when
FEDAUDIT_TEST_POSTGRES_URL is unset). The wake-up bound is the issue's: 1 s from the commit.
Replica b's changes go through its `Services` (a session that marks a change and commits), as a
use case's do: the notification travels in the committing transaction.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import psycopg
import pytest
from pydantic import SecretStr
from sqlalchemy import make_url, text

from service.config import Settings
from service.coordinator.file_notify import FileNotifier
from service.coordinator.notify import LocalNotifier, mark_changed
from service.coordinator.pg_notify import PgNotifier, libpq_dsn
from service.coordinator.resources import Services, change_notifier
from service.store.blobs import DirectoryBlobStore
from service.store.session import make_engine, make_sessionmaker

WAKE_S = 1.0


@pytest.fixture
def pg_url(database_url: str) -> str:
    if make_url(database_url).get_backend_name() != "postgresql":
        pytest.skip("LISTEN/NOTIFY needs PostgreSQL")
    return database_url


@pytest.fixture
def replicas(pg_url: str) -> Iterator[tuple[PgNotifier, PgNotifier]]:
    a, b = PgNotifier.for_url(pg_url), PgNotifier.for_url(pg_url)
    a.start()
    b.start()
    assert a.listening
    assert b.listening
    yield a, b
    a.close()
    b.close()


def replica_services(url: str, tmp_path: Path, notifier: PgNotifier) -> Services:
    settings = Settings(
        _env_file=None,
        data_dir=tmp_path / "data",
        database_url=url,
        admin_token=SecretStr("test-admin-token-0123456789"),
    )
    return Services(
        settings=settings,
        sessions=make_sessionmaker(make_engine(url)),
        blobs=DirectoryBlobStore(settings.blob_dir),
        notifier=notifier,
    )


@pytest.fixture
def on_b(
    replicas: tuple[PgNotifier, PgNotifier], pg_url: str, tmp_path: Path
) -> Iterator[Services]:
    """Replica b's services: its commits publish through b (a's commit hook is not installed)."""
    services = replica_services(pg_url, tmp_path, replicas[1])
    yield services
    services.close()


def commit_change(services: Services, federation_id: uuid.UUID) -> None:
    with services.sessions.begin() as session:
        mark_changed(session, federation_id)


@pytest.mark.db
@pytest.mark.anyio
async def test_a_commit_on_b_wakes_a_waiter_on_a_and_a_rollback_wakes_nobody(
    replicas: tuple[PgNotifier, PgNotifier], on_b: Services
) -> None:
    a, _ = replicas
    fid, other = uuid.uuid4(), uuid.uuid4()
    with a.subscribe(fid) as changes:
        with on_b.sessions() as session:
            mark_changed(session, fid)
            session.rollback()  # the use case failed
        commit_change(on_b, other)  # another federation's change
        assert await changes.wait(WAKE_S) is False

        commit_change(on_b, fid)
        committed = time.monotonic()
        assert await changes.wait(WAKE_S) is True
        assert time.monotonic() - committed < WAKE_S
        assert await changes.wait(0.2) is False  # one signal, consumed


@pytest.mark.db
@pytest.mark.anyio
async def test_the_notification_is_sent_in_the_transaction_and_only_its_commit_delivers_it(
    replicas: tuple[PgNotifier, PgNotifier], on_b: Services, pg_url: str
) -> None:
    """``pg_notify`` runs on the committing session's own connection, before its COMMIT: nothing
    reaches another replica while the transaction is open, nothing at all if it rolls back (here
    after the ``pg_notify`` was sent, flushed by a savepoint's release), and the commit
    delivers it within the bound. No connection but the pool's and the listeners' is opened."""
    a, b = replicas
    fid = uuid.uuid4()
    with psycopg.connect(libpq_dsn(pg_url), autocommit=True) as admin:

        def backends() -> set[int]:
            rows = admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            ).fetchall()
            return {row[0] for row in rows}

        with a.subscribe(fid) as on_a, b.subscribe(fid) as here:
            with on_b.sessions() as session:
                own_pid = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
                with session.begin_nested():
                    mark_changed(session, fid)  # published when the savepoint is released
                assert await on_a.wait(0.5) is False  # sent, not delivered: still open
                session.rollback()
            assert await on_a.wait(WAKE_S) is False
            assert await here.wait(0.0) is False

            commit_change(on_b, fid)
            committed = time.monotonic()
            assert await on_a.wait(WAKE_S) is True
            assert time.monotonic() - committed < WAKE_S
            await asyncio.sleep(0)  # b's own waiter: set on this loop's next turn
            assert await here.wait(0.0) is True
            # b sent it on its pooled connection: no sender connection beside the listeners'
            assert backends() == {own_pid, a.listener_pid, b.listener_pid}


@pytest.mark.db
@pytest.mark.anyio
async def test_a_commit_wakes_its_own_process_once_and_other_replicas(
    replicas: tuple[PgNotifier, PgNotifier], on_b: Services
) -> None:
    a, b = replicas
    fid = uuid.uuid4()
    with a.subscribe(fid) as on_a, b.subscribe(fid) as here:
        commit_change(on_b, fid)
        await asyncio.sleep(0)  # the signal is set on this loop's next turn
        assert await here.wait(0.0) is True  # at once, without the round trip
        assert await on_a.wait(WAKE_S) is True
        # b's listener gets its own signal back too, and skips it: no second wake-up.
        assert await here.wait(0.5) is False


@pytest.mark.db
@pytest.mark.anyio
async def test_the_listener_reconnects_after_its_connection_is_terminated(
    replicas: tuple[PgNotifier, PgNotifier],
    on_b: Services,
    pg_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    a, _ = replicas
    fid = uuid.uuid4()
    old_pid = a.listener_pid
    assert old_pid is not None
    with a.subscribe(fid) as changes:
        with psycopg.connect(libpq_dsn(pg_url), autocommit=True) as admin:
            row = admin.execute("SELECT pg_terminate_backend(%s)", (old_pid,)).fetchone()
        assert row == (True,)
        deadline = time.monotonic() + 30
        while a.listener_pid in (None, old_pid) and time.monotonic() < deadline:
            threading.Event().wait(0.05)
        assert a.listener_pid not in (None, old_pid), "the listener did not reconnect"
        # Listening again, it wakes every waiter once: signals may have been missed meanwhile.
        assert await changes.wait(WAKE_S) is True
        commit_change(on_b, fid)
        assert await changes.wait(WAKE_S) is True
    logged = [r.getMessage() for r in caplog.records if r.name == "service.coordinator.pg_notify"]
    assert any("lost its database connection" in m for m in logged), logged
    assert any("connected again" in m for m in logged), logged


@pytest.mark.anyio
async def test_unreadable_payloads_are_ignored_and_others_delivered() -> None:
    # No database: what the listener hands over is judged alone (nothing is started).
    notifier = PgNotifier("postgresql://unused")
    fid = uuid.uuid4()
    with notifier.subscribe(fid) as changes:
        notifier._deliver("not-a-uuid somebody")  # logged, no exception, nobody woken
        notifier._deliver(f"{uuid.uuid4()} another-process")  # another federation's
        assert await changes.wait(0.2) is False
        notifier._deliver(f"{fid} another-process")  # this federation's, from elsewhere
        assert await changes.wait(0.2) is True


def test_postgresql_urls_get_the_pg_notifier_unless_forced_local(tmp_path: Path) -> None:
    def settings(url: str | None, mode: Literal["auto", "local"] = "auto") -> Settings:
        return Settings(_env_file=None, data_dir=tmp_path, database_url=url, change_notifier=mode)

    pg = "postgresql+psycopg://fedaudit:pw@db-host:5432/fedaudit"
    chosen = change_notifier(settings(pg))
    assert isinstance(chosen, PgNotifier)
    chosen.close()  # never started: nothing to stop
    assert type(change_notifier(settings(pg, "local"))) is LocalNotifier
    on_sqlite = change_notifier(settings(None))  # the SQLite file in the data directory
    assert type(on_sqlite) is FileNotifier
    assert on_sqlite.path == tmp_path / "fedaudit.db.signals"
    assert type(change_notifier(settings(None, "local"))) is LocalNotifier
    assert type(change_notifier(settings("sqlite://"))) is LocalNotifier  # in memory
    assert libpq_dsn(pg) == "postgresql://fedaudit:pw@db-host:5432/fedaudit"
