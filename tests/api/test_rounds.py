"""The round protocol through the API: join, instructions, updates, FedAvg close, finish."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
from safetensors.numpy import load

from service.config import Settings
from tests.api.conftest import make_federation
from tests.factories import ADMIN, tiny_state, update_parts
from tests.s3 import s3_settings

pytestmark = [pytest.mark.anyio, pytest.mark.db]


async def current(api: httpx.AsyncClient, fed, name: str) -> dict:
    response = await api.get(
        f"/api/v1/federations/{fed.id}/rounds/current", headers=fed.headers(name)
    )
    assert response.status_code == 200, response.text
    return response.json()


# Client b joins with 30 samples (an update must agree with its join).
B_HOLDS_30 = {"b": {"num_samples": 30, "class_counts": [15, 15]}}


async def submit(api, fed, name, index, state, n, key=None, **kwargs) -> httpx.Response:
    return await api.post(
        f"/api/v1/federations/{fed.id}/rounds/{index}/updates",
        files=update_parts(state, num_samples=n, **kwargs),
        headers={**fed.headers(name), "Idempotency-Key": key or f"{name}-{index}"},
    )


async def test_round_zero_opens_when_every_client_joined(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api, join=False)
    waiting = await api.get(
        f"/api/v1/federations/{fed.id}/rounds/current", headers=fed.headers("a")
    )
    assert waiting.json()["status"] == "wait"
    assert waiting.headers["retry-after"] == "2"
    join = {"num_samples": 10, "class_counts": [5, 5]}
    await api.post(f"/api/v1/federations/{fed.id}/join", json=join, headers=fed.headers("a"))
    assert (await current(api, fed, "a"))["status"] == "wait"  # b has not joined yet
    await api.post(f"/api/v1/federations/{fed.id}/join", json=join, headers=fed.headers("b"))
    now = await current(api, fed, "a")
    assert now["status"] == "train"
    assert now["round"]["index"] == 0
    instructions = now["instructions"]
    assert instructions["recipe"] == "fedavg"
    assert instructions["global_model_id"] == fed.data["id"] or instructions["global_model_id"]
    assert instructions["role"] == "clean"
    assert instructions["signals"] == ["train_loss"]


async def test_join_rejects_inconsistent_counts(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api, join=False)
    bad_sum = await api.post(
        f"/api/v1/federations/{fed.id}/join",
        json={"num_samples": 10, "class_counts": [5, 4]},
        headers=fed.headers("a"),
    )
    bad_len = await api.post(
        f"/api/v1/federations/{fed.id}/join",
        json={"num_samples": 10, "class_counts": [10]},
        headers=fed.headers("a"),
    )
    negative = await api.post(
        f"/api/v1/federations/{fed.id}/join",
        json={"num_samples": 10, "class_counts": [11, -1]},
        headers=fed.headers("a"),
    )
    assert bad_sum.status_code == 400
    assert "sums to 9" in bad_sum.json()["detail"]
    assert bad_len.status_code == 400
    assert negative.status_code == 422
    clients = (await api.get(f"/api/v1/federations/{fed.id}/clients", headers=ADMIN)).json()
    assert all(c["joined_at"] is None for c in clients)


async def test_fedavg_close_and_finish(api: httpx.AsyncClient) -> None:
    # Prepare: client a sends all-1.0 with 10 samples, b all-3.0 with 30 samples (as joined).
    fed = await make_federation(api, rounds=2, joins=B_HOLDS_30)

    # Execute: round 0
    first = await submit(api, fed, "a", 0, tiny_state(1.0, steps=3), 10)
    assert first.status_code == 201, first.text
    assert (await current(api, fed, "a"))["status"] == "wait"  # submitted, waiting for b
    second = await submit(api, fed, "b", 0, tiny_state(3.0, steps=7), 30)
    assert second.status_code == 201, second.text

    # Assert: weights n_k / sum n = 10/40 and 30/40; new value 0.25*1 + 0.75*3 = 2.5
    round0 = (await api.get(f"/api/v1/federations/{fed.id}/rounds/0", headers=ADMIN)).json()
    assert round0["state"] == "closed"
    weights = round0["aggregation_weights"]
    assert weights[fed.client_ids["a"]] == pytest.approx(0.25)
    assert weights[fed.client_ids["b"]] == pytest.approx(0.75)
    model = await api.get(f"/api/v1/models/{round0['model_out_id']}", headers=ADMIN)
    state = load(model.content)
    np.testing.assert_allclose(state["layer.weight"], np.full((3, 2), 2.5, dtype=np.float32))
    # the integer buffer is copied from the client with the largest weight (b), not averaged
    assert int(state["norm.num_batches_tracked"]) == 7
    assert round0["audit"] is not None

    # round 1 uses the new model as global model
    nxt = await current(api, fed, "a")
    assert nxt["round"]["index"] == 1
    assert nxt["instructions"]["global_model_id"] == round0["model_out_id"]
    await submit(api, fed, "a", 1, tiny_state(0.0), 10)
    await submit(api, fed, "b", 1, tiny_state(0.0), 30)
    done = await current(api, fed, "b")
    assert done["status"] == "finished"
    federation = (await api.get(f"/api/v1/federations/{fed.id}", headers=ADMIN)).json()
    assert federation["status"] == "finished"
    assert done["final_model_id"] == federation["current_model_id"]
    rounds = (await api.get(f"/api/v1/federations/{fed.id}/rounds", headers=ADMIN)).json()
    assert [r["index"] for r in rounds["items"]] == [0, 1]
    assert all(r["state"] == "closed" for r in rounds["items"])

    # the events tell the story
    events = (await api.get(f"/api/v1/federations/{fed.id}/events", headers=ADMIN)).json()["items"]
    kinds = [e["kind"] for e in events]
    assert kinds[:2] == ["federation.created", "model.initial_uploaded"]
    assert kinds.count("update.accepted") == 4
    assert kinds.count("round.closed") == 2
    assert kinds[-1] == "federation.finished"


async def test_model_download_etag_and_304(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api)
    model_id = (await current(api, fed, "a"))["instructions"]["global_model_id"]
    first = await api.get(f"/api/v1/models/{model_id}", headers=fed.headers("a"))
    assert first.status_code == 200
    etag = first.headers["etag"]
    again = await api.get(
        f"/api/v1/models/{model_id}", headers={**fed.headers("a"), "If-None-Match": etag}
    )
    assert again.status_code == 304
    assert again.content == b""


async def test_clients_cannot_see_other_federations_or_clients(api: httpx.AsyncClient) -> None:
    one = await make_federation(api, name="one")
    two = await make_federation(api, name="two")
    # another federation does not exist for this client
    response = await api.get(
        f"/api/v1/federations/{two.id}/rounds/current", headers=one.headers("a")
    )
    assert response.status_code == 404
    model_two = (await current(api, two, "a"))["instructions"]["global_model_id"]
    assert (
        await api.get(f"/api/v1/models/{model_two}", headers=one.headers("a"))
    ).status_code == 404
    # another client's local model is private unless assigned as a neighbor
    await submit(api, one, "a", 0, tiny_state(1.0), 10)
    round0 = (await api.get(f"/api/v1/federations/{one.id}/rounds/0", headers=ADMIN)).json()
    assert round0["submitted_clients"] == [one.client_ids["a"]]
    events = (await api.get(f"/api/v1/federations/{one.id}/events", headers=ADMIN)).json()["items"]
    update_id = next(e["data"]["update_id"] for e in events if e["kind"] == "update.accepted")
    forbidden = await api.get(f"/api/v1/models/{update_id}", headers=one.headers("b"))
    assert forbidden.status_code == 403
    assert forbidden.headers["content-type"] == "application/problem+json"
    own = await api.get(f"/api/v1/models/{update_id}", headers=one.headers("a"))
    assert own.status_code == 200


@pytest.mark.parametrize("backend", ["database", "s3"])
async def test_shared_blob_backends_serve_the_same_protocol(
    settings: Settings, backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Blobs in the database or in an S3 bucket (moto's server, over loopback HTTP): several
    replicas without a shared disk. A round runs with nothing under blob_dir, and another
    replica, with a data directory of its own, serves the new model."""
    from service.main import create_app

    if backend == "s3":
        settings = s3_settings(settings, request.getfixturevalue("s3_location"))
    else:
        settings = settings.model_copy(update={"blob_backend": backend})
    app = create_app(settings, run_reaper=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as api:
        fed = await make_federation(api, joins=B_HOLDS_30)
        await submit(api, fed, "a", 0, tiny_state(1.0), 10)
        await submit(api, fed, "b", 0, tiny_state(3.0), 30)
        round0 = (await api.get(f"/api/v1/federations/{fed.id}/rounds/0", headers=ADMIN)).json()
        model = await api.get(f"/api/v1/models/{round0['model_out_id']}", headers=fed.headers("a"))
        np.testing.assert_allclose(load(model.content)["layer.bias"], [2.5, 2.5])
    if backend == "s3":  # the initial model, two updates and the new model
        assert len(list(app.state.services.blobs.keys())) == 4
    app.state.services.close()
    on_disk = (
        [p for p in settings.blob_dir.rglob("*") if p.is_file()]
        if settings.blob_dir.exists()
        else []
    )
    assert on_disk == []

    replica = create_app(
        settings.model_copy(update={"data_dir": tmp_path / "replica"}), run_reaper=False
    )
    transport = httpx.ASGITransport(app=replica)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as api:
        again = await api.get(f"/api/v1/models/{round0['model_out_id']}", headers=fed.headers("a"))
        assert again.status_code == 200
        assert again.content == model.content
    replica.state.services.close()


async def test_a_waiting_site_is_told_how_many_sites_it_waits_for(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api, clients=("a", "b", "c"), join=False)
    join = {"num_samples": 10, "class_counts": [5, 5]}
    await api.post(f"/api/v1/federations/{fed.id}/join", json=join, headers=fed.headers("a"))
    before = await current(api, fed, "a")
    assert before["reason"] == "the federation has not started: 1 of 3 sites joined"
    for name in ("b", "c"):
        await api.post(f"/api/v1/federations/{fed.id}/join", json=join, headers=fed.headers(name))
    assert (await submit(api, fed, "a", 0, tiny_state(1.0), 10)).status_code == 201
    waiting = await current(api, fed, "a")
    assert waiting["status"] == "wait"
    assert waiting["reason"] == (
        "update for round 0 received; 1 of 3 sites sent theirs, waiting for 2"
    )
    assert (waiting["sites_selected"], waiting["sites_submitted"]) == (3, 1)
    # counts only: no other site's name or id in the answer
    assert fed.client_ids["b"] not in str(waiting)
    assert fed.client_ids["c"] not in str(waiting)
    assert (await submit(api, fed, "b", 0, tiny_state(1.0), 10)).status_code == 201
    later = await current(api, fed, "b")
    assert later["reason"].endswith("2 of 3 sites sent theirs, waiting for 1")
    # a site still to train is told to train, with no counts
    train = await current(api, fed, "c")
    assert train["status"] == "train"
    assert train["sites_selected"] is None
