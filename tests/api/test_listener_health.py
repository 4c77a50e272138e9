"""The change listener's state in /healthz and /metrics: kind, listening, last failure, and the
gauge fedaudit_change_listener_up (issue 24, point 2)."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from pathlib import Path

import httpx
import psycopg
import pytest
from prometheus_client import CollectorRegistry
from pydantic import SecretStr
from sqlalchemy import make_url

from service.api import prometheus
from service.config import Settings
from service.coordinator.pg_notify import PgNotifier, libpq_dsn
from service.main import create_app


def gauge_value(exposition: str) -> float | None:
    for line in exposition.splitlines():
        if line.startswith("fedaudit_change_listener_up "):
            return float(line.split()[1])
    return None


def test_a_listener_that_cannot_connect_says_so() -> None:
    # Nothing listens on port 1: every connection attempt is refused.
    notifier = PgNotifier("postgresql://fedaudit:secret-pw@127.0.0.1:1/none")
    registry = CollectorRegistry(auto_describe=False)
    seen: list[bool] = []
    notifier.watch(seen.append)
    notifier.watch(prometheus.listener_gauge(registry).set)
    assert notifier.state() == {
        "kind": "postgres",
        "listening": False,
        "last_error": None,
        "last_error_at": None,
    }
    before = datetime.now().astimezone()
    notifier.start(ready_timeout_s=0.0)
    try:
        deadline = time.monotonic() + 30
        while notifier.state()["last_error"] is None and time.monotonic() < deadline:
            threading.Event().wait(0.05)
        state = notifier.state()
    finally:
        notifier.close()
    assert state["listening"] is False
    assert state["last_error"] == "OperationalError"  # the type only: no host, no password
    failed_at = state["last_error_at"]
    assert failed_at is not None
    assert datetime.fromisoformat(failed_at) >= before
    assert set(seen) == {False}
    assert gauge_value(prometheus.render(registry).decode()) == 0.0


@pytest.mark.anyio
async def test_on_sqlite_healthz_shows_local_signals_when_asked(tmp_path: Path) -> None:
    settings = Settings(
        _env_file=None,
        data_dir=tmp_path,
        admin_token=SecretStr("t" * 20),
        check_migrations=False,
        change_notifier="local",
    )
    app = create_app(settings, run_reaper=False)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as api:
            health = (await api.get("/healthz")).json()
    finally:
        app.state.services.close()
    assert health == {
        "status": "ok",
        "change_notifier": {
            "kind": "local",
            "listening": None,
            "last_error": None,
            "last_error_at": None,
        },
    }


@pytest.mark.db
@pytest.mark.anyio
async def test_healthz_and_the_gauge_follow_the_postgresql_listener(settings: Settings) -> None:
    if make_url(settings.resolved_database_url).get_backend_name() != "postgresql":
        pytest.skip("LISTEN/NOTIFY needs PostgreSQL")
    app = create_app(settings, run_reaper=False)
    notifier = app.state.services.notifier
    seen: list[bool] = []
    notifier.watch(seen.append)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),  # starts the listener; stops it and the services
        httpx.AsyncClient(transport=transport, base_url="http://test") as api,
    ):
        health = (await api.get("/healthz")).json()["change_notifier"]
        assert health == {
            "kind": "postgres",
            "listening": True,
            "last_error": None,
            "last_error_at": None,
        }
        assert gauge_value((await api.get("/metrics")).text) == 1.0

        old_pid = notifier.listener_pid
        with psycopg.connect(libpq_dsn(settings.resolved_database_url), autocommit=True) as db:
            db.execute("SELECT pg_terminate_backend(%s)", (old_pid,))
        deadline = time.monotonic() + 30
        while len(seen) < 4 and time.monotonic() < deadline:
            threading.Event().wait(0.05)
        assert notifier.listener_pid not in (None, old_pid)
        # it lost its connection (0), then listened again (1); the failure stays shown
        assert seen == [False, True, False, True]
        health = (await api.get("/healthz")).json()["change_notifier"]
        assert health["listening"] is True
        assert health["last_error"] is not None
        assert gauge_value((await api.get("/metrics")).text) == 1.0


@pytest.mark.anyio
async def test_on_a_sqlite_file_healthz_shows_the_signal_file(tmp_path: Path) -> None:
    # auto on a SQLite database file: the signal file beside it (service.coordinator.file_notify);
    # the test transport runs no lifespan, so its watcher is not started.
    settings = Settings(
        _env_file=None, data_dir=tmp_path, admin_token=SecretStr("t" * 20), check_migrations=False
    )
    app = create_app(settings, run_reaper=False)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as api:
            health = (await api.get("/healthz")).json()
        notifier = app.state.services.notifier
    finally:
        app.state.services.close()
    assert health["change_notifier"] == {
        "kind": "file",
        "listening": False,
        "last_error": None,
        "last_error_at": None,
    }
    assert notifier.path.name == "fedaudit.db.signals"
    assert notifier.path.parent == tmp_path
