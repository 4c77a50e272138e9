"""The long-poll of rounds/current is woken by the coordinator's change signals.

Each waiter below waits up to 30 s; what wakes it is the commit of a round closing (and the next
opening), of the last round finishing the federation, or of the admin stopping it. The bound of
5 s is generous on purpose: the point is that the answer comes on the change, not at wait_s.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import pytest
from fastapi import FastAPI

from service.api.routes import participation
from service.coordinator.notify import LocalNotifier
from tests.api.conftest import Federation, make_federation
from tests.api.test_rounds import submit
from tests.factories import ADMIN, tiny_state

pytestmark = [pytest.mark.anyio, pytest.mark.db]

WOKEN_WITHIN_S = 5.0


async def long_poll(api: httpx.AsyncClient, fed: Federation, name: str) -> httpx.Response:
    return await api.get(
        f"/api/v1/federations/{fed.id}/rounds/current",
        params={"wait_s": 30},
        headers=fed.headers(name),
    )


async def parked(app: FastAPI, fed: Federation, count: int = 1) -> None:
    """Until `count` long-polls of the federation wait on its signal."""
    notifier = app.state.services.notifier
    for _ in range(500):
        if notifier.subscribers(uuid.UUID(fed.id)) >= count:
            await asyncio.sleep(0.05)  # past the first read, into the wait
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the long-poll never started waiting")


async def test_a_waiter_is_woken_when_the_round_closes_and_the_next_opens(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    fed = await make_federation(api, rounds=2)
    assert (await submit(api, fed, "a", 0, tiny_state(1.0), 10)).status_code == 201
    waiter = asyncio.create_task(long_poll(api, fed, "a"))
    await parked(app, fed)
    assert not waiter.done()  # a waits for b

    started = time.monotonic()
    assert (await submit(api, fed, "b", 0, tiny_state(3.0), 10)).status_code == 201
    answer = await asyncio.wait_for(waiter, timeout=60)

    assert time.monotonic() - started < WOKEN_WITHIN_S
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "train"
    assert answer.json()["round"]["index"] == 1
    assert app.state.services.notifier.subscribers(uuid.UUID(fed.id)) == 0


async def test_a_waiter_is_told_when_the_federation_finishes(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    fed = await make_federation(api, rounds=1)
    assert (await submit(api, fed, "a", 0, tiny_state(1.0), 10)).status_code == 201
    waiter = asyncio.create_task(long_poll(api, fed, "a"))
    await parked(app, fed)

    started = time.monotonic()
    assert (await submit(api, fed, "b", 0, tiny_state(3.0), 10)).status_code == 201
    answer = await asyncio.wait_for(waiter, timeout=60)

    assert time.monotonic() - started < WOKEN_WITHIN_S
    assert answer.json()["status"] == "finished"


async def test_a_waiter_is_told_when_the_admin_stops_the_federation(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    fed = await make_federation(api)
    assert (await submit(api, fed, "a", 0, tiny_state(1.0), 10)).status_code == 201
    waiter = asyncio.create_task(long_poll(api, fed, "a"))
    await parked(app, fed)

    started = time.monotonic()
    response = await api.post(
        f"/api/v1/federations/{fed.id}/stop", json={"reason": "wrong data"}, headers=ADMIN
    )
    assert response.status_code == 200, response.text
    answer = await asyncio.wait_for(waiter, timeout=60)

    assert time.monotonic() - started < WOKEN_WITHIN_S
    assert answer.status_code == 409
    assert "wrong data" in answer.json()["detail"]


async def test_a_signal_for_another_federation_does_not_answer_a_waiter(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    fed = await make_federation(api, name="one", join=False)
    other = await make_federation(api, name="two", join=False)
    join = {"num_samples": 10, "class_counts": [5, 5]}
    await api.post(f"/api/v1/federations/{fed.id}/join", json=join, headers=fed.headers("a"))
    response = await api.get(
        f"/api/v1/federations/{fed.id}/rounds/current",
        params={"wait_s": 1.0},
        headers=fed.headers("a"),
    )
    assert response.json()["status"] == "wait"  # timed out: nothing changed
    assert response.headers["retry-after"] == "2"

    waiter = asyncio.create_task(long_poll(api, fed, "a"))
    await parked(app, fed)
    for name in ("a", "b"):  # round 0 of the other federation opens
        await api.post(
            f"/api/v1/federations/{other.id}/join", json=join, headers=other.headers(name)
        )
    await asyncio.sleep(0.3)
    assert not waiter.done()
    await api.post(f"/api/v1/federations/{fed.id}/join", json=join, headers=fed.headers("b"))
    answer = await asyncio.wait_for(waiter, timeout=60)
    assert answer.json()["status"] == "train"


async def test_a_refused_token_is_still_recorded(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api)
    response = await api.get(
        f"/api/v1/federations/{fed.id}/rounds/current",
        params={"wait_s": 5},
        headers={"Authorization": "Bearer fa_c_not-a-token"},
    )
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/problem+json"
    events = (await api.get(f"/api/v1/federations/{fed.id}/events", headers=ADMIN)).json()
    assert events["items"][-1]["kind"] == "auth.rejected"


async def test_a_missed_signal_is_caught_by_the_safety_recheck(
    api: httpx.AsyncClient, app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    fed = await make_federation(api, join=False)
    join = {"num_samples": 10, "class_counts": [5, 5]}
    await api.post(f"/api/v1/federations/{fed.id}/join", json=join, headers=fed.headers("a"))
    monkeypatch.setattr(participation, "SAFETY_RECHECK_S", 0.2)
    # waiters subscribe to a notifier that the commits never signal: every signal is "lost"
    monkeypatch.setattr(app.state.services, "notifier", LocalNotifier())
    waiter = asyncio.create_task(long_poll(api, fed, "a"))
    await parked(app, fed)
    started = time.monotonic()
    await api.post(f"/api/v1/federations/{fed.id}/join", json=join, headers=fed.headers("b"))
    answer = await asyncio.wait_for(waiter, timeout=60)
    assert time.monotonic() - started < WOKEN_WITHIN_S
    assert answer.json()["status"] == "train"
