"""Fixtures of the end-to-end tests that run several coordinator processes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import make_url

from fedaudit_sim.coordinator_process import CoordinatorProcess


def _two_coordinators(
    tmp_path: Path, database_url: str, names: tuple[str, str]
) -> Iterator[tuple[CoordinatorProcess, ...]]:
    """Two `fedaudit serve` processes on one database, blobs in the database, rounds closed in
    the request of their last upload, one admin token."""
    env = {"FEDAUDIT_BLOB_BACKEND": "database", "FEDAUDIT_CLOSE_ROUNDS_INLINE": "true"}
    token = f"admin-{uuid.uuid4().hex}"
    servers = tuple(
        CoordinatorProcess(
            tmp_path / name, admin_token=token, database_url=database_url, extra_env=env
        )
        for name in names
    )
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def replicas(tmp_path: Path, database_url: str) -> Iterator[tuple[CoordinatorProcess, ...]]:
    """Two `fedaudit serve` processes on one PostgreSQL database, blobs in the database, rounds
    closed in the request of their last upload (skipped on SQLite)."""
    if make_url(database_url).get_backend_name() != "postgresql":
        pytest.skip("replicas share a PostgreSQL database")
    yield from _two_coordinators(tmp_path, database_url, ("replica-a", "replica-b"))


@pytest.fixture
def sqlite_replicas(tmp_path: Path) -> Iterator[tuple[CoordinatorProcess, ...]]:
    """Two `fedaudit serve` processes on one SQLite database file (as the workers of
    ``fedaudit serve --workers N`` are), blobs in the database, rounds closed inline."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    yield from _two_coordinators(tmp_path, url, ("worker-a", "worker-b"))
