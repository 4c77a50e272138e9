"""Admin endpoints: federations, the initial model, clients; auth and problem details."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import event

from tests.api.conftest import make_federation
from tests.factories import ADMIN, auth, federation_spec, state_bytes, tiny_state

pytestmark = [pytest.mark.anyio, pytest.mark.db]

PROBLEM = "application/problem+json"


async def test_create_list_get_federation(api: httpx.AsyncClient) -> None:
    # Execute
    created = await api.post(
        "/api/v1/federations", json=federation_spec("alpha", rounds=4), headers=ADMIN
    )
    listed = await api.get("/api/v1/federations", headers=ADMIN)
    fetched = await api.get(f"/api/v1/federations/{created.json()['id']}", headers=ADMIN)

    # Assert
    assert created.status_code == 201
    body = created.json()
    assert body["status"] == "created"
    assert body["plan"]["rounds"] == 4
    assert body["config"]["aggregation"] == "fedavg"
    assert body["config"]["recipe"] == "fedavg"
    assert listed.json()["total"] == 1
    assert [f["name"] for f in listed.json()["items"]] == ["alpha"]
    assert fetched.json()["id"] == body["id"]


async def test_missing_or_wrong_admin_token_is_401_problem(api: httpx.AsyncClient) -> None:
    no_token = await api.get("/api/v1/federations")
    wrong = await api.get("/api/v1/federations", headers=auth("nope"))
    for response in (no_token, wrong):
        assert response.status_code == 401
        assert response.headers["content-type"] == PROBLEM
        assert response.json()["type"] == "/problems/unauthorized"
        assert response.json()["instance"] == "/api/v1/federations"


async def test_duplicate_name_is_409(api: httpx.AsyncClient) -> None:
    await api.post("/api/v1/federations", json=federation_spec("dup"), headers=ADMIN)
    again = await api.post("/api/v1/federations", json=federation_spec("dup"), headers=ADMIN)
    assert again.status_code == 409
    assert again.headers["content-type"] == PROBLEM


async def test_invalid_body_names_the_field(api: httpx.AsyncClient) -> None:
    spec = federation_spec()
    spec["plan"]["rounds"] = 0
    response = await api.post("/api/v1/federations", json=spec, headers=ADMIN)
    assert response.status_code == 422
    assert response.headers["content-type"] == PROBLEM
    locs = [e["loc"] for e in response.json()["errors"]]
    assert ["body", "plan", "rounds"] in locs


async def test_unknown_config_key_is_rejected(api: httpx.AsyncClient) -> None:
    spec = federation_spec(config={"method": "fedavg", "audit": {"no_such_knob": 1}})
    response = await api.post("/api/v1/federations", json=spec, headers=ADMIN)
    assert response.status_code == 400
    assert "no_such_knob" in response.json()["detail"]
    assert (await api.get("/api/v1/federations", headers=ADMIN)).json()["total"] == 0


async def test_invalid_config_value_is_rejected_with_its_choices(api: httpx.AsyncClient) -> None:
    spec = federation_spec(config={"method": "fednoro", "audit": {"aggregation_flags": "often"}})
    response = await api.post("/api/v1/federations", json=spec, headers=ADMIN)
    assert response.status_code == 400
    assert response.headers["content-type"] == PROBLEM
    detail = response.json()["detail"]
    assert "aggregation_flags" in detail
    assert "'status'" in detail
    assert "'round'" in detail
    assert (await api.get("/api/v1/federations", headers=ADMIN)).json()["total"] == 0


async def test_initial_model_upload_validates_and_stores_once(
    api: httpx.AsyncClient, settings
) -> None:
    fid = (await api.post("/api/v1/federations", json=federation_spec(), headers=ADMIN)).json()[
        "id"
    ]
    url = f"/api/v1/federations/{fid}/model"
    headers = {**ADMIN, "Content-Type": "application/octet-stream"}

    garbage = await api.put(
        url, content=b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}", headers=headers
    )
    assert garbage.status_code == 422
    assert garbage.json()["type"] == "/problems/invalid-model"
    assert (await api.get(f"/api/v1/federations/{fid}", headers=ADMIN)).json()[
        "status"
    ] == "created"
    blobs = [p for p in settings.blob_dir.rglob("*") if p.is_file()]
    assert blobs == []

    good = await api.put(url, content=state_bytes(tiny_state(1.0)), headers=headers)
    assert good.status_code == 201
    assert good.json()["version"] == 0
    assert good.json()["manifest"]["layer.weight"] == {"dtype": "F32", "shape": [3, 2]}
    federation = (await api.get(f"/api/v1/federations/{fid}", headers=ADMIN)).json()
    assert federation["status"] == "waiting"
    assert federation["current_model_id"] == good.json()["id"]
    # Replacing it before round 0 opens: tests/api/test_model_fit.py


async def test_non_finite_initial_model_is_rejected(api: httpx.AsyncClient) -> None:
    fid = (await api.post("/api/v1/federations", json=federation_spec(), headers=ADMIN)).json()[
        "id"
    ]
    state = tiny_state(1.0)
    state["layer.bias"][1] = float("inf")
    response = await api.put(
        f"/api/v1/federations/{fid}/model",
        content=state_bytes(state),
        headers={**ADMIN, "Content-Type": "application/octet-stream"},
    )
    assert response.status_code == 422
    assert "layer.bias" in response.json()["detail"]


async def test_client_token_is_returned_once_and_only_hashed(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api, clients=("hospital-a",), join=False)
    listed = await api.get(f"/api/v1/federations/{fed.id}/clients", headers=ADMIN)
    assert listed.status_code == 200
    assert [c["name"] for c in listed.json()] == ["hospital-a"]
    assert "token" not in listed.json()[0]
    assert fed.tokens["hospital-a"].startswith("fa_c_")
    # The token authenticates the client, and the admin endpoints stay closed to it.
    task = await api.get(f"/api/v1/federations/{fed.id}/task", headers=fed.headers("hospital-a"))
    assert task.status_code == 200
    assert task.json()["num_classes"] == 2
    admin_only = await api.get("/api/v1/federations", headers=fed.headers("hospital-a"))
    assert admin_only.status_code == 401


async def test_a_client_name_is_taken_once_per_federation(api: httpx.AsyncClient) -> None:
    one = await make_federation(api, clients=("hospital-a",), join=False, name="one")
    two = await make_federation(api, clients=(), join=False, name="two")
    again = await api.post(
        f"/api/v1/federations/{one.id}/clients", json={"name": "hospital-a"}, headers=ADMIN
    )
    assert again.status_code == 409
    assert again.headers["content-type"] == PROBLEM
    assert "hospital-a" in again.json()["detail"]
    elsewhere = await api.post(
        f"/api/v1/federations/{two.id}/clients", json={"name": "hospital-a"}, headers=ADMIN
    )
    assert elsewhere.status_code == 201
    listed = await api.get(f"/api/v1/federations/{one.id}/clients", headers=ADMIN)
    assert [c["name"] for c in listed.json()] == ["hospital-a"]


async def test_health_and_readiness(api: httpx.AsyncClient, app: FastAPI) -> None:
    health = (await api.get("/healthz")).json()
    assert health["status"] == "ok"
    # the notifier the database calls for (not started here: this client runs no lifespan)
    url = str(app.state.services.settings.resolved_database_url)
    expected = "postgres" if url.startswith("postgresql") else "file"  # a SQLite file
    assert health["change_notifier"]["kind"] == expected
    assert (await api.get("/readyz")).json() == {"status": "ready"}
    metrics = await api.get("/metrics")
    assert "fedaudit_updates_accepted_total 0" in metrics.text


async def test_list_counts_per_federation_in_a_fixed_number_of_queries(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    # Setup: two joined clients; three clients not joined; nobody.
    one = await make_federation(api, clients=("a", "b"), join=True, name="one")
    two = await make_federation(api, clients=("a", "b", "c"), join=False, name="two")
    await api.post("/api/v1/federations", json=federation_spec("three"), headers=ADMIN)
    engine = app.state.services.sessions.kw["bind"]
    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    # Execute
    event.listen(engine, "before_cursor_execute", count)
    try:
        listed = (await api.get("/api/v1/federations", headers=ADMIN)).json()
        all_three = len(statements)
        statements.clear()
        first = (await api.get("/api/v1/federations?limit=1", headers=ADMIN)).json()
        just_one = len(statements)
    finally:
        event.remove(engine, "before_cursor_execute", count)

    # Assert
    by_name = {f["name"]: f for f in listed["items"]}
    assert [by_name[n]["clients"] for n in ("one", "two", "three")] == [2, 3, 0]
    assert [by_name[n]["joined_clients"] for n in ("one", "two", "three")] == [2, 0, 0]
    for fed in (one, two):
        rounds = await api.get(f"/api/v1/federations/{fed.id}/rounds", headers=ADMIN)
        assert by_name[fed.data["name"]]["rounds_started"] == rounds.json()["total"]
    assert by_name["three"]["rounds_started"] == 0
    assert len(first["items"]) == 1
    assert all_three == just_one  # no query per federation
