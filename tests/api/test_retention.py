"""Retention (issue 22, point 4): pruning the model updates of old rounds removes their blobs and
their probe softmax, keeps each site's latest update and every global model, and leaves the
reports, the dashboard and the round views working; what reads a pruned update answers 410.

Three sites: a and b send an update in every round, c only in round 0 (its rounds close by the
admin's hand), so c's round-0 update is its latest local model. Every update's content differs,
so each has a blob of its own.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import httpx
import pytest
from fastapi import FastAPI
from typer.testing import CliRunner

from service.cli import app as cli_app
from service.config import Settings
from service.main import create_app
from service.store import repositories as repo
from service.store.tables import ModelUpdate
from tests.api.conftest import make_federation
from tests.api.test_leftovers import stored_keys
from tests.api.test_rounds import submit
from tests.factories import ADMIN, sha256, state_bytes, tiny_state
from tests.s3 import s3_settings

pytestmark = [pytest.mark.anyio, pytest.mark.db]

PROBE = [[0.25, 0.75]] * 8  # probe_size 8 rows of the two classes' probabilities
SITES = ("a", "b", "c")


class SyncBridge(httpx.BaseTransport):
    """A synchronous httpx transport that sends each request to an ASGI app on the event loop
    of the thread that started the caller's worker thread (anyio.to_thread)."""

    def __init__(self, app: FastAPI) -> None:
        self._asgi = httpx.ASGITransport(app=app)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        async def send() -> httpx.Response:
            response = await self._asgi.handle_async_request(request)
            body = await response.aread()
            return httpx.Response(response.status_code, headers=response.headers, content=body)

        return anyio.from_thread.run(send)


@pytest.fixture
def app(request: pytest.FixtureRequest, settings: Settings) -> Iterator[FastAPI]:
    """The app on the blob backend named by the test's indirect parameter (default: directory),
    or by its first item and with ``retention_rounds`` its second."""
    param = getattr(request, "param", "directory")
    backend, retention_rounds = (param, None) if isinstance(param, str) else param
    if backend == "s3":  # a bucket of its own on moto's server, over loopback HTTP
        settings = s3_settings(settings, request.getfixturevalue("s3_location"))
    else:
        settings = settings.model_copy(update={"blob_backend": backend})
    settings = settings.model_copy(update={"retention_rounds": retention_rounds})
    app = create_app(settings, run_reaper=False)
    yield app
    app.state.services.close()


def site_state(site: str, index: int) -> dict[str, Any]:
    # Offsets 0, 0.1 and 0.4: no global model (a mean of the round's states) equals a site's
    # state. With 0, 0.1 and 0.2 round 0's mean was b's state, bit for bit on some machines,
    # and the shared blob (content-addressed) stayed with the global model when b's was pruned.
    return tiny_state(1.0 + index + 0.1 * SITES.index(site) ** 2)


async def play(api: httpx.AsyncClient, fed: Any, index: int) -> None:
    """Round `index`: a and b send; c too in round 0, else the admin closes the round."""
    senders = SITES if index == 0 else ("a", "b")
    for site in senders:
        response = await submit(
            api,
            fed,
            site,
            index,
            site_state(site, index),
            10,
            signal_overrides={"probe_softmax": PROBE},
        )
        assert response.status_code == 201, response.text
    if index > 0:
        response = await api.post(
            f"/api/v1/federations/{fed.id}/rounds/{index}/close",
            json={"reason": "c is away"},
            headers=ADMIN,
        )
        assert response.status_code == 200, response.text


def update_key(site: str, index: int) -> str:
    return sha256(state_bytes(site_state(site, index)))


def updates_by_site_and_round(app: FastAPI, fed: Any) -> dict[tuple[str, int], ModelUpdate]:
    names = {uuid.UUID(cid): name for name, cid in fed.client_ids.items()}
    with app.state.services.sessions() as session:
        rows = session.query(ModelUpdate).filter_by(federation_id=uuid.UUID(fed.id)).all()
    return {(names[u.client_id], u.round_index): u for u in rows}


async def global_models(api: httpx.AsyncClient, fed: Any) -> list[dict[str, Any]]:
    response = await api.get(f"/api/v1/federations/{fed.id}/models", headers=ADMIN)
    assert response.status_code == 200, response.text
    return list(response.json())


async def prune(api: httpx.AsyncClient, fed: Any, **body: Any) -> dict[str, Any]:
    response = await api.post(f"/api/v1/federations/{fed.id}/prune", json=body, headers=ADMIN)
    assert response.status_code == 200, response.text
    return dict(response.json())


@pytest.mark.parametrize("app", ["directory", "database", "s3"], indirect=True)
async def test_prune_removes_old_updates_and_keeps_what_reports_and_replays_read(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    # c stays selected though it sends nothing after round 0 (attendance off): the admin closes
    config = {"method": "fedavg", "detectors": ["fedncl"], "primary_detector": "fedncl"}
    fed = await make_federation(
        api, clients=SITES, rounds=6, config={**config, "absent_after_missed": 0}
    )
    for index in range(4):
        await play(api, fed, index)
    report_before = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    keys_before = stored_keys(app)
    old = {update_key(site, i) for site in ("a", "b") for i in (0, 1)}
    assert old <= {k.removeprefix("row:") for k in keys_before}

    # A dry run answers what would go and changes nothing.
    dry = await prune(api, fed, keep_rounds=2, dry_run=True)
    assert dry["dry_run"] is True
    assert dry["pruned"]["rounds"] == [0, 1]
    assert dry["pruned"]["updates"] == 4
    assert stored_keys(app) == keys_before
    assert all(u.pruned_at is None for u in updates_by_site_and_round(app, fed).values())

    done = await prune(api, fed, keep_rounds=2)
    sizes = sum(len(state_bytes(site_state(s, i))) for s in ("a", "b") for i in (0, 1))
    assert done["pruned"] == {
        "rounds": [0, 1],
        "updates": 4,
        "blobs": 4,
        "bytes": sizes,
        "signals": ["probe_softmax", "centroids"],
    }
    assert done["kept"] == {
        "rounds": [2, 3],
        "latest_updates": 1,  # c's round-0 update, its latest local model
        "neighbor_updates": 0,
        "global_models": 5,  # the initial model and the aggregate of rounds 0-3
        "already_pruned": 0,
    }

    # Gone: the four old blobs (files, rows or objects, and the local caches' copies).
    left = stored_keys(app)
    assert not {k for k in left if k.removeprefix("row:") in old}
    # Kept: c's latest update, the updates of rounds 2 and 3, every global model.
    kept = {update_key("c", 0)} | {update_key(s, i) for s in ("a", "b") for i in (2, 3)}
    kept |= {m["sha256"] for m in await global_models(api, fed)}
    for key in kept:
        assert key in left or f"row:{key}" in left, key

    rows = updates_by_site_and_round(app, fed)
    for (site, index), update in rows.items():
        if site in ("a", "b") and index < 2:
            assert update.pruned_at is not None
            assert "probe_softmax" not in update.signals
            assert update.signals["class_counts"] == [5, 5]  # what the reports read stays
            assert update.signals["per_class_loss"] == [0.5, 0.5]
        else:
            assert update.pruned_at is None
            assert update.signals["probe_softmax"] == PROBE

    # What reads a pruned update says it is gone; what it kept still serves.
    pruned_id = rows[("a", 0)].id
    gone = await api.get(f"/api/v1/models/{pruned_id}", headers=ADMIN)
    assert gone.status_code == 410, gone.text
    assert gone.headers["content-type"] == "application/problem+json"
    assert gone.json()["type"] == "/problems/gone"
    assert gone.json()["reason"] == "pruned by retention"
    assert gone.json()["round"] == 0
    own = await api.get(f"/api/v1/models/{pruned_id}", headers=fed.headers("a"))
    assert own.status_code == 410, own.text
    latest_c = await api.get(f"/api/v1/models/{rows[('c', 0)].id}", headers=ADMIN)
    assert latest_c.status_code == 200
    assert sha256(latest_c.content) == update_key("c", 0)
    for model in await global_models(api, fed):
        download = await api.get(f"/api/v1/models/{model['id']}", headers=ADMIN)
        assert download.status_code == 200, download.text
        assert sha256(download.content) == model["sha256"]

    # The report reads audit results and kept signals only: unchanged.
    report_after = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    assert report_after == report_before
    round0 = (await api.get(f"/api/v1/federations/{fed.id}/rounds/0", headers=ADMIN)).json()
    assert sorted(round0["pruned_clients"]) == sorted([fed.client_ids["a"], fed.client_ids["b"]])
    assert round0["audit"] is not None
    round2 = (await api.get(f"/api/v1/federations/{fed.id}/rounds/2", headers=ADMIN)).json()
    assert round2["pruned_clients"] == []

    # A what-if needs the round's updates: 410 for round 0, unless the pruned sites are left out.
    whatif = f"/api/v1/federations/{fed.id}/rounds/%d/recompute"
    refused = await api.post(whatif % 0, json={"audit": {}}, headers=ADMIN)
    assert refused.status_code == 410, refused.text
    assert "a, b" in refused.json()["detail"]
    without = {"exclude_clients": [fed.client_ids["a"], fed.client_ids["b"]]}
    assert (await api.post(whatif % 0, json=without, headers=ADMIN)).status_code == 200
    replay = await api.post(whatif % 2, json={"audit": {}}, headers=ADMIN)
    assert replay.status_code == 200, replay.text
    assert replay.json()["distance_to_actual_model"]["total"] == pytest.approx(0.0, abs=1e-6)

    # The event trail says what was pruned; pruning again removes nothing more.
    events = (await api.get(f"/api/v1/federations/{fed.id}/events", headers=ADMIN)).json()
    pruned_events = [e for e in events["items"] if e["kind"] == "federation.pruned"]
    assert len(pruned_events) == 1
    assert pruned_events[0]["actor"] != "system"
    assert pruned_events[0]["data"]["pruned"]["updates"] == 4
    again = await prune(api, fed, keep_rounds=2)
    assert again["pruned"]["updates"] == 0
    assert again["kept"]["already_pruned"] == 4

    # The federation goes on: round 4 is audited and aggregated from its own updates.
    await play(api, fed, 4)
    round4 = (await api.get(f"/api/v1/federations/{fed.id}/rounds/4", headers=ADMIN)).json()
    assert round4["state"] == "closed"
    assert round4["model_out_id"] is not None


async def test_a_failed_prune_keeps_the_blobs_and_the_rows(
    api: httpx.AsyncClient, app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    fed = await make_federation(api, clients=SITES, rounds=4)
    for index in range(3):
        await play(api, fed, index)
    keys_before = stored_keys(app)

    def fail(*_: Any, **__: Any) -> None:
        raise RuntimeError("injected failure after the updates were marked")

    monkeypatch.setattr(repo, "add_event", fail)  # the last step of a prune, before the commit
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as api500:
        response = await api500.post(
            f"/api/v1/federations/{fed.id}/prune", json={"keep_rounds": 1}, headers=ADMIN
        )
    assert response.status_code == 500
    assert stored_keys(app) == keys_before
    assert all(u.pruned_at is None for u in updates_by_site_and_round(app, fed).values())
    monkeypatch.undo()
    assert (await prune(api, fed, keep_rounds=1))["pruned"]["updates"] == 4


async def test_prune_needs_a_number_of_rounds(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api, clients=SITES)
    url = f"/api/v1/federations/{fed.id}/prune"
    response = await api.post(url, json={}, headers=ADMIN)
    assert response.status_code == 400, response.text
    assert "FEDAUDIT_RETENTION_ROUNDS" in response.json()["detail"]
    negative = await api.post(url, json={"keep_rounds": -1}, headers=ADMIN)
    assert negative.status_code == 422
    unknown = await api.post(
        f"/api/v1/federations/{uuid.uuid4()}/prune", json={"keep_rounds": 1}, headers=ADMIN
    )
    assert unknown.status_code == 404
    site = await api.post(url, json={"keep_rounds": 1}, headers=fed.headers("a"))
    assert site.status_code in (401, 403)


@pytest.mark.parametrize("app", [("directory", 1)], indirect=True)
async def test_retention_rounds_prunes_at_each_round_close(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    fed = await make_federation(api, clients=SITES, rounds=3)
    await play(api, fed, 0)
    assert all(u.pruned_at is None for u in updates_by_site_and_round(app, fed).values())
    await play(api, fed, 1)
    await play(api, fed, 2)  # the last round: the federation finishes

    rows = updates_by_site_and_round(app, fed)
    pruned = sorted(key for key, u in rows.items() if u.pruned_at is not None)
    assert pruned == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]  # c's round 0 is its latest
    left = {k.removeprefix("row:") for k in stored_keys(app)}
    assert not {update_key(site, i) for site, i in pruned} & left
    assert {update_key("a", 2), update_key("b", 2), update_key("c", 0)} <= left
    events = (await api.get(f"/api/v1/federations/{fed.id}/events", headers=ADMIN)).json()
    automatic = [e for e in events["items"] if e["kind"] == "federation.pruned"]
    assert [e["actor"] for e in automatic] == ["system", "system"]
    assert [e["data"]["pruned"]["rounds"] for e in automatic] == [[0], [1]]
    federation = (await api.get(f"/api/v1/federations/{fed.id}", headers=ADMIN)).json()
    assert federation["status"] == "finished"
    final = await api.get(f"/api/v1/models/{federation['current_model_id']}", headers=ADMIN)
    assert final.status_code == 200
    report = await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)
    assert report.status_code == 200
    assert {row["name"] for row in report.json()["clients"]} == set(SITES)
    await api.post("/admin/login", data={"token": ADMIN["Authorization"].split()[1]})
    page = await api.get(f"/admin/federations/{fed.id}/rounds/0")
    assert page.status_code == 200
    assert "2 of 3 model updates pruned" in page.text


async def test_fedaudit_prune_prints_what_went_and_what_stayed(
    api: httpx.AsyncClient, app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    fed = await make_federation(api, clients=SITES, rounds=4)
    for index in range(3):
        await play(api, fed, index)

    from client_sdk import AdminClient
    from service.cli import retention as cli_retention

    def local_admin(url: str, token: str) -> AdminClient:
        # The command's own SDK client, on this app in process instead of over a socket.
        http = httpx.Client(transport=SyncBridge(app), base_url="http://test")
        return AdminClient(http_client=http, api_token=token, max_retries=0)

    monkeypatch.setattr(cli_retention, "admin_client", local_admin)
    env = {"FEDAUDIT_ADMIN_TOKEN": ADMIN["Authorization"].split()[1], "COLUMNS": "200"}
    runner = CliRunner()

    async def invoke(*args: str) -> Any:
        """The command in a worker thread; its requests run on this test's event loop."""
        return await anyio.to_thread.run_sync(lambda: runner.invoke(cli_app, list(args), env=env))

    dry = await invoke("prune", fed.id, "--keep-rounds", "1", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "would prune 4 update(s) of rounds 0, 1" in dry.output
    assert all(u.pruned_at is None for u in updates_by_site_and_round(app, fed).values())

    done = await invoke("prune", fed.id, "--keep-rounds", "1", "--json")
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["pruned"]["updates"] == 4
    assert report["kept"]["rounds"] == [2]
    assert report["kept"]["latest_updates"] == 1

    missing = await invoke("prune", fed.id)
    assert missing.exit_code == 1
    assert "400" in missing.output
    assert "FEDAUDIT_RETENTION_ROUNDS" in missing.output


FEDRN = {"method": "fedrn", "hyperparameters": {"head_name": "norm"}, "warmup_rounds": 0}


async def send_fedrn(api: httpx.AsyncClient, fed: Any, site: str, index: int) -> None:
    position = SITES.index(site)
    probe = [[0.2 + 0.1 * position, 0.8 - 0.1 * position]] * 8
    response = await submit(
        api,
        fed,
        site,
        index,
        site_state(site, index),
        10,
        signal_overrides={"probe_softmax": probe, "train_accuracy": 0.8},
    )
    assert response.status_code == 201, response.text


async def test_prune_keeps_the_neighbour_models_an_open_round_hands_out(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    """FedRN: round 1's instructions give each site the latest local models of others. Once a
    and b have sent round 1, their round-0 updates are no longer their latest, but c may still
    download them as its neighbours: kept until round 1 is over."""
    fed = await make_federation(api, clients=SITES, rounds=4, config=FEDRN)
    for site in SITES:
        await send_fedrn(api, fed, site, 0)
    instructions = (
        await api.get(f"/api/v1/federations/{fed.id}/rounds/current", headers=fed.headers("c"))
    ).json()["instructions"]
    neighbours = {n["model_id"] for n in instructions["neighbors"]}
    rows = updates_by_site_and_round(app, fed)
    assert neighbours == {str(rows[("a", 0)].id), str(rows[("b", 0)].id)}
    await send_fedrn(api, fed, "a", 1)
    await send_fedrn(api, fed, "b", 1)

    held = await prune(api, fed, keep_rounds=0)
    assert held["pruned"]["updates"] == 0
    assert held["kept"]["neighbor_updates"] == 2  # a's and b's round 0, c's neighbours
    assert held["kept"]["latest_updates"] == 1  # c's round 0
    for model_id in neighbours:
        download = await api.get(f"/api/v1/models/{model_id}", headers=fed.headers("c"))
        assert download.status_code == 200, download.text

    closed = await api.post(
        f"/api/v1/federations/{fed.id}/rounds/1/close", json={"reason": "c is late"}, headers=ADMIN
    )
    assert closed.status_code == 200, closed.text
    done = await prune(api, fed, keep_rounds=0)
    assert done["pruned"]["updates"] == 2
    assert done["pruned"]["rounds"] == [0]
    assert done["kept"]["latest_updates"] == 3  # a's and b's round 1, c's round 0
    gone = await api.get(f"/api/v1/models/{rows[('a', 0)].id}", headers=ADMIN)
    assert gone.status_code == 410
    # Round 2 hands out the latest models, all kept, and closes with FedRN's neighbour search.
    for site in SITES:
        await send_fedrn(api, fed, site, 2)
    round2 = (await api.get(f"/api/v1/federations/{fed.id}/rounds/2", headers=ADMIN)).json()
    assert round2["state"] == "closed"
    assert round2["audit"]["neighbors"]


async def test_a_suspended_sites_model_is_not_handed_out_as_a_neighbour(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    """FedRN: b is suspended in round 1 (withdrawn: its update was not in); round 2 gives c
    the models of the sites it may learn from, not b's round-0 model."""
    fed = await make_federation(api, clients=SITES, rounds=4, config=FEDRN)
    for site in SITES:
        await send_fedrn(api, fed, site, 0)
    rows = updates_by_site_and_round(app, fed)
    first = (
        await api.get(f"/api/v1/federations/{fed.id}/rounds/current", headers=fed.headers("c"))
    ).json()["instructions"]
    assert str(rows[("b", 0)].id) in {n["model_id"] for n in first["neighbors"]}
    suspended = await api.put(
        f"/api/v1/federations/{fed.id}/clients/{fed.client_ids['b']}/suspend",
        json={"reason": "labels being checked"},
        headers=ADMIN,
    )
    assert suspended.status_code == 200, suspended.text
    await send_fedrn(api, fed, "a", 1)
    await send_fedrn(api, fed, "c", 1)
    second = (
        await api.get(f"/api/v1/federations/{fed.id}/rounds/current", headers=fed.headers("c"))
    ).json()
    assert second["round"]["index"] == 2
    handed = {n["model_id"] for n in second["instructions"]["neighbors"]}
    assert str(rows[("b", 0)].id) not in handed
    assert handed  # a's model still is
