"""Where an accepted update's blob is put in its transaction (issue 24, point 1).

A file or an object (the directory and S3 stores) is put before the transaction's first
statement, so no pooled connection is held while the blob travels (with S3, a network upload).
The database store writes a row: it puts after the round's lock, which orders two sites' puts
of the same bytes (before it, both would insert the blob's row and one update be refused as a
duplicate)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from service.config import Settings
from service.coordinator.resources import Services
from service.store import repositories
from service.store.session import make_engine, make_sessionmaker
from tests.coordinator.test_close_once import prepare_round, submit

pytestmark = pytest.mark.db


@pytest.mark.parametrize(
    ("backend", "connections_at_put", "order"),
    [
        ("directory", [0, 0], ["put", "lock", "put", "lock"]),
        ("database", [1, 1], ["lock", "put", "lock", "put"]),
    ],
)
def test_where_the_update_blob_is_put(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
    connections_at_put: list[int],
    order: list[str],
) -> None:
    settings.close_rounds_inline = False  # the round's close (and its model's put) is not tested
    settings.blob_backend = backend  # type: ignore[assignment]
    engine = make_engine(settings.resolved_database_url)
    services = Services.create(settings, make_sessionmaker(engine))
    services.worker.submit_once = lambda key, job: None  # type: ignore[method-assign]  # no close
    fid, _, members = prepare_round(services, ["a", "b"], min_clients=2)

    held = [0]
    event.listen(engine, "checkout", lambda *_: held.__setitem__(0, held[0] + 1))
    event.listen(engine, "checkin", lambda *_: held.__setitem__(0, held[0] - 1))
    seen: list[int] = []
    calls: list[str] = []
    put_file = services.blobs.put_file
    touch_open_round = repositories.touch_open_round

    def spy_put(path: Path, key: str, **kwargs: Any) -> bool:
        seen.append(held[0])
        calls.append("put")
        return put_file(path, key, **kwargs)

    def spy_lock(*args: Any, **kwargs: Any) -> Any:
        calls.append("lock")
        return touch_open_round(*args, **kwargs)

    services.blobs.put_file = spy_put  # type: ignore[method-assign]
    monkeypatch.setattr(repositories, "touch_open_round", spy_lock)
    submit(services, fid, members["a"], 1.0)
    submit(services, fid, members["b"], 2.0)
    assert seen == connections_at_put  # checked out at the put, per update
    assert calls == order
    services.close()
