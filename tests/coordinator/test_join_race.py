"""Round 0 opens when the last sites join at the same time (issue 20, point 7: found under load).

On PostgreSQL (READ COMMITTED) two joins committing concurrently each counted the other as not
joined, so neither opened round 0 and the federation waited for ever. A join now locks the
federation row first, so the joins take turns and the last one sees the whole roster.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from sqlalchemy import select

from service.config import Settings
from service.coordinator import clients, federations
from service.coordinator.federation_config import FederationConfigInput
from service.coordinator.resources import Services
from service.store import tables
from service.store.blobs import write_temp_file
from service.store.session import make_engine, make_sessionmaker
from tests.factories import state_bytes, tiny_state

pytestmark = pytest.mark.db


def make_services(settings: Settings) -> Services:
    return Services.create(settings, make_sessionmaker(make_engine(settings.resolved_database_url)))


def waiting_federation(services: Services, names: list[str]) -> tuple[uuid.UUID, dict[str, Any]]:
    """A federation with its initial model and registered clients, none joined yet."""
    with services.sessions.begin() as session:
        federation = federations.create_federation(
            session,
            name="join-race",
            num_classes=2,
            input_shape=[2],
            class_names=None,
            rounds=2,
            min_clients=len(names),
            max_clients=None,
            round_deadline_s=600,
            config=FederationConfigInput(
                method="fedavg", detectors=["fedncl"], primary_detector="fedncl"
            ),
            seed=1,
            actor="admin",
        )
        path, digest, size = write_temp_file(
            services.settings.tmp_dir, state_bytes(tiny_state(0.0))
        )
        federations.upload_initial_model(
            services, session, federation.id, staged=path, sha256=digest, size=size, actor="admin"
        )
        created = [
            federations.add_client(session, federation.id, name=n, actor="admin")[0] for n in names
        ]
        return federation.id, {c.name: c for c in created}


def test_the_last_two_joins_at_once_open_round_zero(settings: Settings) -> None:
    services = make_services(settings)
    fid, members = waiting_federation(services, ["a", "b"])
    errors: list[BaseException] = []

    def join_b() -> None:
        try:
            clients.join_federation(
                services, members["b"], fid, num_samples=10, class_counts=[5, 5]
            )
        except BaseException as exc:
            errors.append(exc)

    # "a" joins in a transaction left open while "b" joins: on PostgreSQL, b's join must wait
    # for a's commit (the federation lock) and then see both; before the fix b saw only itself,
    # a saw only itself, and nobody opened round 0. (On SQLite b waits for the write lock.)
    other = threading.Thread(target=join_b)
    with services.sessions.begin() as session:
        clients.join(
            session, members["a"], num_samples=10, class_counts=[5, 5], now=services.clock()
        )
        other.start()
        other.join(timeout=1.0)
    other.join(timeout=60)
    assert not other.is_alive()
    assert not errors, errors
    with services.sessions() as session:
        status = session.scalar(select(tables.Federation.status).where(tables.Federation.id == fid))
        opened = session.scalars(
            select(tables.Round.index).where(tables.Round.federation_id == fid)
        ).all()
    assert status == "running"
    assert list(opened) == [0]
    services.close()
