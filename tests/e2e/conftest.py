"""Fixtures of the end-to-end tests that run several coordinator processes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import make_url

from fedaudit_sim.coordinator_process import CoordinatorProcess


@pytest.fixture
def replicas(tmp_path: Path, database_url: str) -> Iterator[tuple[CoordinatorProcess, ...]]:
    """Two `fedaudit serve` processes on one PostgreSQL database, blobs in the database, rounds
    closed in the request of their last upload (skipped on SQLite)."""
    if make_url(database_url).get_backend_name() != "postgresql":
        pytest.skip("replicas share a PostgreSQL database")
    env = {"FEDAUDIT_BLOB_BACKEND": "database", "FEDAUDIT_CLOSE_ROUNDS_INLINE": "true"}
    token = f"replica-admin-{uuid.uuid4().hex}"
    servers = tuple(
        CoordinatorProcess(
            tmp_path / name, admin_token=token, database_url=database_url, extra_env=env
        )
        for name in ("replica-a", "replica-b")
    )
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def sqlite_replicas(tmp_path: Path) -> Iterator[tuple[CoordinatorProcess, ...]]:
    """Two `fedaudit serve` processes on one SQLite database file (as the workers of
    ``fedaudit serve --workers N`` are), blobs in the database, rounds closed inline."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    env = {"FEDAUDIT_BLOB_BACKEND": "database", "FEDAUDIT_CLOSE_ROUNDS_INLINE": "true"}
    token = f"worker-admin-{uuid.uuid4().hex}"
    servers = tuple(
        CoordinatorProcess(tmp_path / name, admin_token=token, database_url=url, extra_env=env)
        for name in ("worker-a", "worker-b")
    )
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.stop()
