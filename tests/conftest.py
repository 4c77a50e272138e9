"""Shared fixtures: databases (SQLite always, PostgreSQL when configured), settings, the app.

PostgreSQL: set ``FEDAUDIT_TEST_POSTGRES_URL`` (``.ci/run`` starts a server and sets it). Each test
gets a fresh database cloned from a migrated template (PostgreSQL ``CREATE DATABASE ... TEMPLATE``,
SQLite a file copy), because the coordinator opens its own transactions and a per-test rollback
cannot isolate them. With ``FEDAUDIT_REQUIRE_POSTGRES=1`` (set by ``.ci/run``) a missing server is
an error, not a skip.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from service.config import Settings
from service.store.migrate import upgrade
from tests.s3 import s3_location, s3_server  # noqa: F401  (fixtures: S3 on loopback)

ADMIN_TOKEN = "test-admin-token-0123456789"
PG_ENV = "FEDAUDIT_TEST_POSTGRES_URL"
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(autouse=True, scope="session")
def _absl_logs_to_the_real_stderr() -> None:
    """dp-accounting (the DP accountant) imports absl, whose logging handler keeps the
    ``sys.stderr`` of the moment it was imported (pytest's capture) and closes that stream when
    a later ``logging.config.dictConfig`` (``fedaudit serve`` run in process by a CLI test)
    shuts every handler down; pytest then dies with "lost sys.stderr". absl never closes the
    real standard error, so its handler writes there (imported here, before any test)."""
    import sys

    try:
        from absl import logging as absl_logging
    except ImportError:  # the dp extra is not installed
        return
    absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__


def postgres_url() -> str | None:
    url = os.environ.get(PG_ENV)
    if not url and os.environ.get("FEDAUDIT_REQUIRE_POSTGRES") == "1":
        raise RuntimeError(f"FEDAUDIT_REQUIRE_POSTGRES=1 but {PG_ENV} is not set")
    return url


def _pg_admin_engine(url: str) -> Engine:
    parsed = make_url(url).set(drivername="postgresql+psycopg")
    return create_engine(parsed, isolation_level="AUTOCOMMIT")


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "template.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[str | None]:
    url = postgres_url()
    if url is None:
        yield None
        return
    name = f"fedaudit_tmpl_{uuid.uuid4().hex[:8]}"
    engine = _pg_admin_engine(url)
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    upgrade(make_url(url).set(database=name).render_as_string(hide_password=False))
    yield name
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


def _backends() -> list[object]:
    return [
        "sqlite",
        pytest.param(
            "postgresql",
            marks=pytest.mark.skipif(
                postgres_url() is None, reason=f"PostgreSQL not configured ({PG_ENV} unset)"
            ),
        ),
    ]


@pytest.fixture(params=_backends())
def database_url(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    sqlite_template: Path,
    postgres_template: str | None,
) -> Iterator[str]:
    """A fresh, migrated database for one test, on each configured backend."""
    if request.param == "sqlite":
        target = tmp_path / "fedaudit.db"
        shutil.copyfile(sqlite_template, target)
        yield f"sqlite:///{target}"
        return
    base = postgres_url()
    assert base is not None
    assert postgres_template is not None
    name = f"fedaudit_t_{uuid.uuid4().hex[:10]}"
    engine = _pg_admin_engine(base)
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{postgres_template}"'))
    yield make_url(base).set(database=name).render_as_string(hide_password=False)
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    return Settings(
        _env_file=None,
        data_dir=tmp_path / "data",
        database_url=database_url,
        admin_token=SecretStr(ADMIN_TOKEN),
        close_rounds_inline=True,
    )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def shared_data_dir() -> Path:
    """``../shared/data`` (or FEDAUDIT_DATASETS_DIR); tests needing it skip when absent."""
    configured = os.environ.get("FEDAUDIT_DATASETS_DIR")
    return Path(configured) if configured else SHARED_DATA
