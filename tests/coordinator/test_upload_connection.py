"""An accepted update's blob is stored before its transaction takes a database connection: no
pooled connection is held while the blob travels (issue 24, point 1; with the S3 store the put
is a network upload)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from service.config import Settings
from service.coordinator.resources import Services
from service.store.session import make_engine, make_sessionmaker
from tests.coordinator.test_close_once import prepare_round, submit

pytestmark = pytest.mark.db


def test_no_connection_is_held_while_the_update_blob_is_put(settings: Settings) -> None:
    settings.close_rounds_inline = False  # the round's close (and its model's put) is not tested
    engine = make_engine(settings.resolved_database_url)
    services = Services.create(settings, make_sessionmaker(engine))
    services.worker.submit_once = lambda key, job: None  # type: ignore[method-assign]  # no close
    fid, _, members = prepare_round(services, ["a", "b"], min_clients=2)

    held = [0]
    event.listen(engine, "checkout", lambda *_: held.__setitem__(0, held[0] + 1))
    event.listen(engine, "checkin", lambda *_: held.__setitem__(0, held[0] - 1))
    seen: list[int] = []
    put_file = services.blobs.put_file

    def spy(path: Path, key: str, **kwargs: Any) -> bool:
        seen.append(held[0])
        return put_file(path, key, **kwargs)

    services.blobs.put_file = spy  # type: ignore[method-assign]
    submit(services, fid, members["a"], 1.0)
    submit(services, fid, members["b"], 2.0)
    assert seen == [0, 0]  # two updates stored, each with no connection checked out
    services.close()
