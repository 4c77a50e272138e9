"""Suspending a site over the API: the answer, the refusal, and what a site is told."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.api.conftest import make_federation
from tests.factories import ADMIN

pytestmark = [pytest.mark.anyio, pytest.mark.db]


async def test_suspend_and_resume_a_site(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api, clients=("a", "b", "c"), rounds=3, min_clients=2)
    url = f"/api/v1/federations/{fed.id}/clients/{fed.client_ids['c']}/suspend"
    assert (await api.put(url, json={"reason": ""}, headers=ADMIN)).status_code == 422
    suspended = await api.put(url, json={"reason": "offline until Monday"}, headers=ADMIN)
    assert suspended.status_code == 200, suspended.text
    assert suspended.json()["attendance"] == "suspended"
    assert suspended.json()["suspend_reason"] == "offline until Monday"

    # c polls: it waits, and is not told the admin's reason
    current = await api.get(
        f"/api/v1/federations/{fed.id}/rounds/current", headers=fed.headers("c")
    )
    assert current.json()["status"] == "wait"
    assert current.json()["reason"] == "suspended by the federation's admin until they resume it"

    # a second suspension would leave 1 site where the federation needs 2 a round
    other = f"/api/v1/federations/{fed.id}/clients/{fed.client_ids['b']}/suspend"
    refused = await api.put(other, json={"reason": "also"}, headers=ADMIN)
    assert refused.status_code == 409
    assert refused.headers["content-type"] == "application/problem+json"
    assert "would leave 1 site able to take part" in refused.json()["detail"]
    listed = (await api.get(f"/api/v1/federations/{fed.id}/clients", headers=ADMIN)).json()
    assert {c["name"]: c["attendance"] for c in listed} == {
        "a": "present",
        "b": "present",
        "c": "suspended",
    }

    resumed = await api.delete(url, headers=ADMIN)
    assert resumed.status_code == 200
    assert (resumed.json()["attendance"], resumed.json()["suspend_reason"]) == ("present", None)
    unknown = f"/api/v1/federations/{fed.id}/clients/{uuid.uuid4()}/suspend"
    assert (await api.delete(unknown, headers=ADMIN)).status_code == 404
    assert (await api.put(url, json={"reason": "x"})).status_code == 401
