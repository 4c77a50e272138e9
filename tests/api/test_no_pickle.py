"""No pickle on the server: a pickled model (what torch.save writes) is refused as an update and
as an initial model, and its payload never runs."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import make_federation
from tests.factories import ADMIN, signals

pytestmark = [pytest.mark.anyio, pytest.mark.db]


class _Payload:
    """Unpickling this calls os.mkdir(marker): the directory exists only if something unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (str(self.marker),))


async def test_a_pickled_update_is_refused_and_never_unpickled(
    api: httpx.AsyncClient, tmp_path: Path
) -> None:
    fed = await make_federation(api)
    marker = tmp_path / "unpickled"
    data = pickle.dumps({"w": _Payload(marker)})
    metadata = {
        "num_samples": 10,
        "sha256": hashlib.sha256(data).hexdigest(),
        "signals": signals(10),
        "metrics": {},
    }
    response = await api.post(
        f"/api/v1/federations/{fed.id}/rounds/0/updates",
        files={
            "metadata": (None, json.dumps(metadata), "application/json"),
            "state": ("state.pt", data, "application/octet-stream"),
        },
        headers={**fed.headers("a"), "Idempotency-Key": "pickle-1"},
    )
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert not marker.exists()
    updates = await api.get(f"/api/v1/federations/{fed.id}/rounds/0", headers=ADMIN)
    assert updates.json()["submitted_clients"] == []


async def test_a_pickled_initial_model_is_refused_and_never_unpickled(
    api: httpx.AsyncClient, tmp_path: Path
) -> None:
    response = await api.post(
        "/api/v1/federations",
        json={
            "name": "pickle-check",
            "task": {"num_classes": 2, "input_shape": [2]},
            "plan": {"rounds": 1, "min_clients": 1},
        },
        headers=ADMIN,
    )
    assert response.status_code == 201, response.text
    fid = response.json()["id"]
    marker = tmp_path / "unpickled"
    response = await api.put(
        f"/api/v1/federations/{fid}/model",
        content=pickle.dumps({"w": _Payload(marker)}),
        headers={**ADMIN, "Content-Type": "application/octet-stream"},
    )
    assert response.status_code in (400, 422), response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert not marker.exists()
    models = await api.get(f"/api/v1/federations/{fid}/models", headers=ADMIN)
    assert models.status_code == 200
    assert models.json() == []
