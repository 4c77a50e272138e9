"""A site reports a round it could not do; the event list, report, dashboard and metrics show it."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import make_federation
from tests.api.test_metrics import parse_exposition, value
from tests.factories import ADMIN

pytestmark = [pytest.mark.anyio, pytest.mark.db]

MESSAGE = (
    "Error(s) in loading state_dict for Net:\n\tsize mismatch for fc.weight: copying a param "
    "with shape torch.Size([2, 784]) from checkpoint, the shape in current model is "
    "torch.Size([10, 64])."
)
BODY = {"stage": "load", "error_type": "RuntimeError", "message": MESSAGE}


async def test_a_site_error_is_recorded_and_shown(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api)  # both joined: round 0 is open
    url = f"/api/v1/federations/{fed.id}/rounds/0/error"
    response = await api.post(url, json=BODY, headers=fed.headers("a"))
    assert response.status_code == 202, response.text
    assert response.json()["recorded"] is True

    events = await api.get(
        f"/api/v1/federations/{fed.id}/events", params={"kind": "site.error"}, headers=ADMIN
    )
    (event,) = events.json()["items"]
    assert event["client_id"] == fed.client_ids["a"]
    assert "size mismatch for fc.weight" in event["message"]
    assert event["data"]["stage"] == "load"
    assert event["data"]["error"] == MESSAGE

    report = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    (shown,) = report["site_errors"]
    assert (shown["name"], shown["round"], shown["stage"]) == ("a", 0, "load")
    assert shown["error_type"] == "RuntimeError"
    assert shown["message"] == MESSAGE

    page = await api.get(f"/admin/federations/{fed.id}", headers=ADMIN)
    assert page.status_code == 200
    assert "Site errors" in page.text
    assert "size mismatch for fc.weight" in page.text

    metrics = parse_exposition((await api.get("/metrics")).text)
    assert value(metrics, "fedaudit_site_errors_total") == 1


async def test_site_error_reports_are_bounded_and_checked(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api)
    url = f"/api/v1/federations/{fed.id}/rounds/0/error"
    for bad in (
        {**BODY, "message": "x" * 2001},
        {**BODY, "message": "colour \x1b[31m"},
        {**BODY, "message": ""},
        {**BODY, "stage": "anything"},
        {**BODY, "error_type": "Bad\nName"},
        {**BODY, "extra": 1},
    ):
        response = await api.post(url, json=bad, headers=fed.headers("a"))
        assert response.status_code == 422, (bad, response.text)
    assert (await api.post(url, json=BODY)).status_code == 401
    assert (await api.post(url, json=BODY, headers=ADMIN)).status_code == 401
    missing = await api.post(
        f"/api/v1/federations/{fed.id}/rounds/5/error", json=BODY, headers=fed.headers("a")
    )
    assert missing.status_code == 404
    other = await make_federation(api, name="other")
    foreign = await api.post(
        f"/api/v1/federations/{other.id}/rounds/0/error", json=BODY, headers=fed.headers("a")
    )
    assert foreign.status_code == 404

    recorded = [
        (await api.post(url, json=BODY, headers=fed.headers("b"))).json()["recorded"]
        for _ in range(7)
    ]
    assert recorded == [True] * 5 + [False] * 2  # a crash loop cannot flood the trail
    events = await api.get(
        f"/api/v1/federations/{fed.id}/events", params={"kind": "site.error"}, headers=ADMIN
    )
    assert len(events.json()["items"]) == 5
