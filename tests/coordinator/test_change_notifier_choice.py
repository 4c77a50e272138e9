"""Which change notifier a coordinator starts with (FEDAUDIT_CHANGE_NOTIFIER), where psycopg 3
(the postgres extra) is missing: a PostgreSQL database reached through another driver
(``postgresql+psycopg2://``) starts with in-process signals and a warning under ``auto``, and
refuses to start, saying what to install or set, under ``postgres``. Nothing connects."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Literal

import pytest

from service.config import Settings
from service.coordinator.notify import LocalNotifier
from service.coordinator.resources import change_notifier
from service.errors import MissingExtraError, StartupError

PSYCOPG2_URL = "postgresql+psycopg2://fedaudit:pw@db-host:5432/fedaudit"


def settings(tmp_path: Path, url: str | None, mode: Literal["auto", "local", "postgres"]):
    return Settings(_env_file=None, data_dir=tmp_path, database_url=url, change_notifier=mode)


@pytest.fixture
def without_psycopg(monkeypatch: pytest.MonkeyPatch) -> None:
    """psycopg 3 not installed: importing it (and so the PostgreSQL notifier) fails."""
    monkeypatch.setitem(sys.modules, "psycopg", None)
    monkeypatch.delitem(sys.modules, "service.coordinator.pg_notify", raising=False)


@pytest.mark.usefixtures("without_psycopg")
def test_auto_falls_back_to_local_signals_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="service.coordinator.resources"):
        chosen = change_notifier(settings(tmp_path, PSYCOPG2_URL, "auto"))
    assert type(chosen) is LocalNotifier
    warned = [r for r in caplog.records if r.name == "service.coordinator.resources"]
    assert len(warned) == 1
    assert warned[0].levelno == logging.WARNING
    message = warned[0].getMessage()
    assert "FEDAUDIT_CHANGE_NOTIFIER=auto" in message
    assert "pip install 'fedaudit[postgres]'" in message
    assert "FEDAUDIT_CHANGE_NOTIFIER=local" in message
    assert "pw" not in message.split()  # the URL (and its password) is not logged


@pytest.mark.usefixtures("without_psycopg")
def test_local_is_quiet_and_postgres_refuses_to_start_without_psycopg(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert type(change_notifier(settings(tmp_path, PSYCOPG2_URL, "local"))) is LocalNotifier
    assert caplog.records == []
    with pytest.raises(MissingExtraError) as refused:
        change_notifier(settings(tmp_path, PSYCOPG2_URL, "postgres"))
    assert "FEDAUDIT_CHANGE_NOTIFIER=postgres" in str(refused.value)
    assert "pip install 'fedaudit[postgres]'" in str(refused.value)


def test_postgres_needs_a_postgresql_database(tmp_path: Path) -> None:
    with pytest.raises(
        StartupError, match="needs a PostgreSQL database, and the database is sqlite"
    ):
        change_notifier(settings(tmp_path, None, "postgres"))


def test_postgres_with_psycopg_gets_the_listen_notify_notifier(tmp_path: Path) -> None:
    pg_notify = pytest.importorskip("service.coordinator.pg_notify", exc_type=ImportError)
    chosen = change_notifier(settings(tmp_path, PSYCOPG2_URL, "postgres"))
    assert isinstance(chosen, pg_notify.PgNotifier)
    chosen.close()  # never started: nothing to stop


def test_serve_refuses_postgres_signals_on_sqlite_in_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from service.cli import app
    from service.config import get_settings

    env = {
        "FEDAUDIT_DATA_DIR": str(tmp_path / "data"),
        "FEDAUDIT_ADMIN_TOKEN": "t" * 20,
        "FEDAUDIT_CHANGE_NOTIFIER": "postgres",
    }
    runner = CliRunner()
    get_settings.cache_clear()
    try:
        assert runner.invoke(app, ["db", "upgrade"], env=env).exit_code == 0
        get_settings.cache_clear()
        refused = runner.invoke(app, ["serve", "--port", "0"], env=env)
    finally:
        get_settings.cache_clear()
    assert refused.exit_code == 1
    output = " ".join(refused.output.split())
    assert "FEDAUDIT_CHANGE_NOTIFIER=postgres needs a PostgreSQL database" in output
    assert "Traceback" not in output
