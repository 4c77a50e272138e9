"""Stopping a federation: the open round fails, sites are told why, refusals change nothing."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import make_federation
from tests.api.test_rounds import current, submit
from tests.factories import ADMIN, tiny_state

pytestmark = [pytest.mark.anyio, pytest.mark.db]


async def stop(api: httpx.AsyncClient, fid: str, body: object, **headers: str) -> httpx.Response:
    return await api.post(f"/api/v1/federations/{fid}/stop", json=body, headers=headers or ADMIN)


async def test_stop_fails_the_open_round_and_tells_the_sites_why(api: httpx.AsyncClient) -> None:
    # Prepare: round 0 open (both sites joined), one update already in
    fed = await make_federation(api)
    assert (await current(api, fed, "a"))["round"]["index"] == 0
    response = await submit(api, fed, "a", 0, tiny_state(1.0), 10)
    assert response.status_code == 201, response.text

    # Execute
    response = await stop(api, fed.id, {"reason": "site b sent a wrong data set"})

    # Assert: the federation is stopped and its round failed, with the reason
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "stopped"
    assert body["status_reason"] == "stopped by the admin: site b sent a wrong data set"
    round_0 = (await api.get(f"/api/v1/federations/{fed.id}/rounds/0", headers=ADMIN)).json()
    assert round_0["state"] == "failed"
    assert round_0["state_reason"] == (
        "the federation was stopped by the admin: site b sent a wrong data set"
    )
    # A site asking for work gets a problem that carries the reason
    asked = await api.get(f"/api/v1/federations/{fed.id}/rounds/current", headers=fed.headers("b"))
    assert asked.status_code == 409
    assert asked.headers["content-type"] == "application/problem+json"
    assert "stopped by the admin: site b sent a wrong data set" in asked.json()["detail"]
    # and its late update is refused
    late = await submit(api, fed, "b", 0, tiny_state(2.0), 10)
    assert late.status_code == 409, late.text
    # The event trail records who stopped it and why
    events = (await api.get(f"/api/v1/federations/{fed.id}/events", headers=ADMIN)).json()
    stopped = [e for e in events["items"] if e["kind"] == "federation.stopped"]
    assert len(stopped) == 1
    assert stopped[0]["actor"] == "admin"
    assert stopped[0]["data"] == {
        "reason": "site b sent a wrong data set",
        "open_rounds_failed": 1,
    }


async def test_a_federation_that_has_not_started_can_be_stopped(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api, join=False)
    response = await stop(api, fed.id, {"reason": "created by mistake"})
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "stopped"
    added = await api.post(
        f"/api/v1/federations/{fed.id}/clients", json={"name": "late"}, headers=ADMIN
    )
    assert added.status_code == 409  # nothing more joins a stopped federation


@pytest.mark.parametrize(
    ("body", "status"),
    [({}, 422), ({"reason": ""}, 422), ({"reason": "x", "extra": 1}, 422), ([], 422)],
)
async def test_a_bad_body_is_refused_and_changes_nothing(
    api: httpx.AsyncClient, body: object, status: int
) -> None:
    fed = await make_federation(api)
    response = await stop(api, fed.id, body)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    after = (await api.get(f"/api/v1/federations/{fed.id}", headers=ADMIN)).json()
    assert after["status"] == "running"
    assert (await current(api, fed, "a"))["status"] == "train"


async def test_stopping_twice_unknown_or_without_the_token_is_refused(
    api: httpx.AsyncClient,
) -> None:
    fed = await make_federation(api)
    first = await stop(api, fed.id, {"reason": "first"})
    assert first.status_code == 200
    again = await stop(api, fed.id, {"reason": "second"})
    assert again.status_code == 409
    assert "has already stopped; nothing to stop" in again.json()["detail"]
    # the first reason stands
    after = (await api.get(f"/api/v1/federations/{fed.id}", headers=ADMIN)).json()
    assert after["status_reason"] == "stopped by the admin: first"

    unknown = await stop(api, "00000000-0000-0000-0000-000000000000", {"reason": "x"})
    assert unknown.status_code == 404
    other = await make_federation(api, name="other")
    anonymous = await stop(api, other.id, {"reason": "x"}, Authorization="Bearer wrong")
    assert anonymous.status_code == 401
    site = await stop(api, other.id, {"reason": "x"}, **other.headers("a"))
    assert site.status_code in (401, 403)
    still = (await api.get(f"/api/v1/federations/{other.id}", headers=ADMIN)).json()
    assert still["status"] == "running"


async def test_the_report_and_the_dashboard_say_why_it_was_stopped(
    api: httpx.AsyncClient,
) -> None:
    fed = await make_federation(api)
    before = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    assert before["status_reason"] is None
    await stop(api, fed.id, {"reason": "labels <unchecked>"})

    report = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    page = await api.get(f"/admin/federations/{fed.id}", headers=ADMIN)

    assert report["status"] == "stopped"
    assert report["status_reason"] == "stopped by the admin: labels <unchecked>"
    assert page.status_code == 200
    assert (
        "<dt>status</dt><dd>stopped (stopped by the admin: labels &lt;unchecked&gt;)</dd>"
        in page.text
    )
