"""API tests talk to the app through httpx's ASGI transport (no socket)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from service.config import Settings
from service.main import create_app
from tests.factories import ADMIN, auth, federation_spec, state_bytes, tiny_state


@pytest.fixture
def app(settings: Settings) -> Iterator[FastAPI]:
    app = create_app(settings, run_reaper=False)
    yield app
    app.state.services.close()


@pytest.fixture
async def api(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


class Federation:
    """A created federation with its initial model and clients, for tests to drive."""

    def __init__(self, data: dict[str, Any], tokens: dict[str, str], client_ids: dict[str, str]):
        self.data = data
        self.id = data["id"]
        self.tokens = tokens
        self.client_ids = client_ids

    def headers(self, name: str) -> dict[str, str]:
        return auth(self.tokens[name])


async def make_federation(
    api: httpx.AsyncClient,
    *,
    clients: tuple[str, ...] = ("a", "b"),
    join: bool = True,
    joins: dict[str, dict[str, Any]] | None = None,
    **spec_kwargs: Any,
) -> Federation:
    """`joins`: a client's join body when it is not 10 samples split [5, 5] (an update must agree
    with its join within the federation's max_sample_drift)."""
    response = await api.post(
        "/api/v1/federations", json=federation_spec(**spec_kwargs), headers=ADMIN
    )
    assert response.status_code == 201, response.text
    data = response.json()
    fid = data["id"]
    response = await api.put(
        f"/api/v1/federations/{fid}/model",
        content=state_bytes(tiny_state(0.0)),
        headers={**ADMIN, "Content-Type": "application/octet-stream"},
    )
    assert response.status_code == 201, response.text
    tokens, ids = {}, {}
    for name in clients:
        response = await api.post(
            f"/api/v1/federations/{fid}/clients", json={"name": name}, headers=ADMIN
        )
        assert response.status_code == 201, response.text
        tokens[name] = response.json()["token"]
        ids[name] = response.json()["id"]
    if join:
        for name in clients:
            response = await api.post(
                f"/api/v1/federations/{fid}/join",
                json=(joins or {}).get(name, {"num_samples": 10, "class_counts": [5, 5]}),
                headers=auth(tokens[name]),
            )
            assert response.status_code == 200, response.text
    return Federation(data, tokens, ids)


@pytest.fixture
async def federation(api: httpx.AsyncClient) -> Federation:
    return await make_federation(api)
