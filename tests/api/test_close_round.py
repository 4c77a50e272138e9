"""The admin closes an open round before its deadline: the sites that sent are audited and
aggregated, the others are left out, the next round opens; refusals change nothing."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import make_federation
from tests.api.test_rounds import current, submit
from tests.factories import ADMIN, tiny_state

pytestmark = [pytest.mark.anyio, pytest.mark.db]


async def close(
    api: httpx.AsyncClient, fid: str, index: int, body: object, **headers: str
) -> httpx.Response:
    return await api.post(
        f"/api/v1/federations/{fid}/rounds/{index}/close", json=body, headers=headers or ADMIN
    )


async def round_of(api: httpx.AsyncClient, fid: str, index: int) -> dict:
    response = await api.get(f"/api/v1/federations/{fid}/rounds/{index}", headers=ADMIN)
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_the_round_closes_with_the_sites_that_sent(api: httpx.AsyncClient) -> None:
    # Prepare: three sites selected for round 0, two of them sent
    fed = await make_federation(api, clients=("a", "b", "c"), rounds=3)
    for name, value in (("a", 1.0), ("b", 3.0)):
        response = await submit(api, fed, name, 0, tiny_state(value), 10)
        assert response.status_code == 201, response.text

    # Execute
    response = await close(api, fed.id, 0, {"reason": "site c is down"})

    # Assert: closed now, audited and aggregated over a and b only
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["state"] == "closed"
    assert body["state_reason"] == "closed by the admin: site c is down"
    assert sorted(body["audit"]["client_ids"]) == sorted([fed.client_ids["a"], fed.client_ids["b"]])
    assert set(body["aggregation_weights"]) == {fed.client_ids["a"], fed.client_ids["b"]}
    assert body == await round_of(api, fed.id, 0)
    # round 1 is open for all three (c too: it missed a round, it is not out)
    assert (await current(api, fed, "c"))["round"]["index"] == 1
    events = (await api.get(f"/api/v1/federations/{fed.id}/events", headers=ADMIN)).json()
    requested = [e for e in events["items"] if e["kind"] == "round.close_requested"]
    assert [(e["actor"], e["data"]) for e in requested] == [
        ("admin", {"index": 0, "updates": 2, "reason": "site c is down"})
    ]
    # c's late update for round 0 is refused as after any close
    late = await submit(api, fed, "c", 0, tiny_state(2.0), 10)
    assert late.status_code == 409, late.text


async def test_a_round_without_enough_updates_stays_open(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api, min_clients=2)
    response = await close(api, fed.id, 0, {"reason": "impatient"})
    assert response.status_code == 409, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert "has 0 updates; closing it needs at least 2" in response.json()["detail"]
    await submit(api, fed, "a", 0, tiny_state(1.0), 10)
    response = await close(api, fed.id, 0, {"reason": "impatient"})
    assert response.status_code == 409, response.text
    assert (await round_of(api, fed.id, 0))["state"] == "open"


async def test_a_closed_or_unknown_round_is_refused(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api, rounds=3)
    for name in ("a", "b"):
        await submit(api, fed, name, 0, tiny_state(1.0), 10)  # complete: closes by itself
    assert (await round_of(api, fed.id, 0))["state"] == "closed"
    response = await close(api, fed.id, 0, {"reason": "again"})
    assert response.status_code == 409, response.text
    assert "round 0 is closed" in response.json()["detail"]
    assert (await close(api, fed.id, 7, {"reason": "x"})).status_code == 404
    unknown = "00000000-0000-0000-0000-000000000000"
    assert (await close(api, unknown, 0, {"reason": "x"})).status_code == 404


@pytest.mark.parametrize("body", [{}, {"reason": ""}, {"reason": "x", "extra": 1}, []])
async def test_a_bad_body_or_a_site_token_is_refused(api: httpx.AsyncClient, body: object) -> None:
    fed = await make_federation(api)
    await submit(api, fed, "a", 0, tiny_state(1.0), 10)
    assert (await close(api, fed.id, 0, body)).status_code == 422
    as_site = await close(api, fed.id, 0, {"reason": "x"}, **fed.headers("a"))
    assert as_site.status_code == 401
    assert (await round_of(api, fed.id, 0))["state"] == "open"
