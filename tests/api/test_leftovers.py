"""Nothing left behind: a request that fails after its blob was stored removes the blob again.

The failure is injected into a collaborator that runs after the blob is in place and before the
transaction commits (touching the client's last-seen time, marking the federation changed,
updating statuses after aggregation), on every blob backend (a directory, the database, an S3
bucket on moto's server over loopback HTTP) and both databases.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from service.config import Settings
from service.coordinator import federations as federation_use_cases
from service.coordinator import rounds
from service.main import create_app
from service.store import repositories as repo
from service.store.s3blobs import S3BlobStore
from tests.api.conftest import make_federation
from tests.api.test_rounds import submit
from tests.factories import ADMIN, federation_spec, sha256, state_bytes, tiny_state
from tests.s3 import s3_settings

pytestmark = [pytest.mark.anyio, pytest.mark.db]


@pytest.fixture(params=["directory", "database", "s3"])
def backend_app(request: pytest.FixtureRequest, settings: Settings) -> Iterator[FastAPI]:
    if request.param == "s3":  # a bucket of its own on moto's server, over loopback HTTP
        settings = s3_settings(settings, request.getfixturevalue("s3_location"))
    else:
        settings = settings.model_copy(update={"blob_backend": request.param})
    app = create_app(settings, run_reaper=False)
    yield app
    app.state.services.close()


@pytest.fixture
async def api500(backend_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client that gets the app's 500 answer instead of the exception."""
    transport = httpx.ASGITransport(app=backend_app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


def stored_keys(app: FastAPI) -> set[str]:
    """Every blob key on disk (the directory store, or the database or S3 store's cache) and,
    for the database store, every blob row, for the S3 store every object in the bucket."""
    services = app.state.services
    store = getattr(services.blobs, "cache", services.blobs)
    keys = {key for key, _ in store.keys()}
    if isinstance(services.blobs, S3BlobStore):
        keys |= {f"row:{key}" for key, _ in services.blobs.keys()}
    elif hasattr(services.blobs, "cache"):
        from sqlalchemy import select

        from service.store.tables import Blob

        with services.sessions() as session:
            keys |= {f"row:{key}" for key in session.scalars(select(Blob.key))}
    return keys


def fail(*_: Any, **__: Any) -> None:
    raise RuntimeError("injected failure after the blob was stored")


async def test_a_500_after_the_update_blob_was_stored_leaves_no_blob(
    api500: httpx.AsyncClient, backend_app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    fed = await make_federation(api500)
    before = stored_keys(backend_app)
    state = tiny_state(3.0)
    monkeypatch.setattr(repo, "touch_client", fail)
    response = await submit(api500, fed, "a", 0, state, 10)
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/problem+json"
    assert "injected" not in response.text  # nothing internal in the answer
    assert sha256(state_bytes(state)) not in {k.removeprefix("row:") for k in before}
    assert stored_keys(backend_app) == before
    assert list(backend_app.state.services.settings.tmp_dir.iterdir()) == []
    round0 = (await api500.get(f"/api/v1/federations/{fed.id}/rounds/0", headers=ADMIN)).json()
    assert round0["submitted_clients"] == []

    monkeypatch.undo()  # the same upload, retried, is stored
    response = await submit(api500, fed, "a", 0, state, 10)
    assert response.status_code == 201, response.text
    key = sha256(state_bytes(state))
    assert key in stored_keys(backend_app)


async def test_a_500_after_the_initial_model_was_stored_leaves_no_blob(
    api500: httpx.AsyncClient, backend_app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    response = await api500.post("/api/v1/federations", json=federation_spec(), headers=ADMIN)
    fid = response.json()["id"]
    monkeypatch.setattr(federation_use_cases, "mark_changed", fail)
    model = state_bytes(tiny_state(0.5))
    response = await api500.put(
        f"/api/v1/federations/{fid}/model",
        content=model,
        headers={**ADMIN, "Content-Type": "application/octet-stream"},
    )
    assert response.status_code == 500
    assert stored_keys(backend_app) == set()
    federation = (await api500.get(f"/api/v1/federations/{fid}", headers=ADMIN)).json()
    assert federation["status"] == "created"


async def test_a_failed_round_close_leaves_no_aggregate_blob(
    api500: httpx.AsyncClient, backend_app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    fed = await make_federation(api500)
    assert (await submit(api500, fed, "a", 0, tiny_state(1.0), 10)).status_code == 201
    before = stored_keys(backend_app)
    monkeypatch.setattr(rounds, "_update_statuses", fail)
    # the last update closes the round inline; the close fails after the new model was stored
    response = await submit(api500, fed, "b", 0, tiny_state(2.0), 10)
    assert response.status_code == 500
    after = stored_keys(backend_app)
    added = after - before
    update_key = sha256(state_bytes(tiny_state(2.0)))
    assert {k.removeprefix("row:") for k in added} == {update_key}  # b's update, no aggregate
    round0 = (await api500.get(f"/api/v1/federations/{fed.id}/rounds/0", headers=ADMIN)).json()
    assert round0["state"] == "failed"
    assert round0["model_out_id"] is None
