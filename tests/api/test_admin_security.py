"""Admin sessions and credentials: logout everywhere, token guessing slowed per address (429),
Secure cookies on demand, admin and site token rotation without a restart, API docs off in
production, CSV cells that a spreadsheet does not run."""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from fastapi import FastAPI

from service.config import Settings
from service.coordinator.report_csv import csv_text
from service.main import create_app
from tests.api.conftest import make_federation
from tests.conftest import ADMIN_TOKEN
from tests.factories import ADMIN, auth

pytestmark = [pytest.mark.anyio, pytest.mark.db]


def client_for(app: FastAPI, address: str = "127.0.0.1", base: str = "http://test"):
    transport = httpx.ASGITransport(app=app, client=(address, 40000))
    return httpx.AsyncClient(transport=transport, base_url=base)


async def login(api: httpx.AsyncClient, token: str = ADMIN_TOKEN) -> httpx.Response:
    return await api.post("/admin/login", data={"token": token})


@pytest.fixture
async def throttled_app(settings: Settings) -> AsyncIterator[FastAPI]:
    """Five wrong tokens per address and minute; a clock the test moves."""
    app = create_app(
        settings.model_copy(update={"auth_failure_limit": 5, "auth_failure_window_s": 60.0}),
        run_reaper=False,
    )
    clock = {"now": datetime(2026, 11, 26, 9, 0, tzinfo=UTC)}
    app.state.services.clock = lambda: clock["now"]
    app.state.clock = clock
    yield app
    app.state.services.close()


def assert_throttled(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"] == "/problems/rate-limited"
    assert 1 <= int(response.headers["retry-after"]) <= 60
    assert problem["retry_after_s"] == int(response.headers["retry-after"])


# --- sessions ----------------------------------------------------------------------------------


async def test_log_out_everywhere_ends_every_session(app: FastAPI) -> None:
    async with client_for(app) as laptop, client_for(app, "10.0.0.2") as desktop:
        await login(laptop)
        await login(desktop)
        assert (await desktop.get("/admin")).status_code == 200
        assert "Log out everywhere" in (await laptop.get("/admin")).text
        out = await laptop.post("/admin/logout-everywhere")
        assert out.status_code == 303
        assert (await laptop.get("/admin")).status_code == 303
        assert (await desktop.get("/admin")).status_code == 303  # the other browser too


async def test_log_out_everywhere_needs_a_session(app: FastAPI) -> None:
    async with client_for(app) as stranger, client_for(app) as admin:
        await login(admin)
        response = await stranger.post("/admin/logout-everywhere")
        assert response.status_code == 303
        assert response.headers["location"] == "/admin/login"
        assert (await admin.get("/admin")).status_code == 200  # nothing ended


async def test_api_ends_every_session(app: FastAPI) -> None:
    async with client_for(app) as browser, client_for(app) as script:
        await login(browser)
        await login(browser)  # a second session of the same browser
        assert (await script.delete("/api/v1/admin/sessions")).status_code == 401
        response = await script.delete("/api/v1/admin/sessions", headers=ADMIN)
        assert response.status_code == 200
        assert response.json() == {"ended": 2}
        assert (await browser.get("/admin")).status_code == 303


async def test_secure_cookie_can_be_forced_on_plain_http(settings: Settings) -> None:
    for forced in (False, True):
        app = create_app(
            settings.model_copy(update={"force_secure_cookies": forced}), run_reaper=False
        )
        try:
            async with client_for(app) as api:  # plain http, no proxy headers
                cookie = (await login(api)).headers["set-cookie"]
                assert ("Secure" in cookie) is forced
                # logout deletes it with the same attributes (else the browser keeps it)
                assert (
                    "Secure" in (await api.post("/admin/logout")).headers["set-cookie"]
                ) is forced
        finally:
            app.state.services.close()


# --- throttling --------------------------------------------------------------------------------


async def test_wrong_logins_are_slowed_per_address(throttled_app: FastAPI) -> None:
    clock = throttled_app.state.clock
    async with client_for(throttled_app, "10.0.0.66") as attacker:
        answers = [(await login(attacker, f"guess-{i}")).status_code for i in range(300)]
        assert answers[:5] == [401] * 5
        assert set(answers[5:]) == {429}
        assert_throttled(await login(attacker, "guess-again"))
        # while throttled even the right token is refused: a guess tells nothing
        right = await login(attacker)
        assert_throttled(right)
        assert "set-cookie" not in right.headers
        # another address is not affected
        async with client_for(throttled_app, "10.0.0.7") as admin:
            assert (await login(admin)).status_code == 303
        # the window ends: the address may try again
        clock["now"] += timedelta(seconds=61)
        assert (await login(attacker)).status_code == 303


async def test_wrong_bearer_tokens_are_slowed_per_address(throttled_app: FastAPI) -> None:
    async with client_for(throttled_app) as admin:
        fed = await make_federation(admin, clients=("a",), join=False)
    path = f"/api/v1/federations/{fed.id}"
    async with client_for(throttled_app, "10.0.0.66") as attacker:
        for i in range(5):
            response = await attacker.get(path, headers=auth(f"wrong-admin-{i}"))
            assert response.status_code == 401
        assert_throttled(await attacker.get(path, headers=ADMIN))
        # site routes and model downloads count and refuse the same way
        assert_throttled(await attacker.get(f"{path}/task", headers=fed.headers("a")))
        model = fed.data.get("current_model_id") or "00000000-0000-0000-0000-000000000000"
        assert_throttled(await attacker.get(f"/api/v1/models/{model}", headers=ADMIN))
        # no token at all is not a guess: the ordinary 401
        assert (await attacker.get(path)).status_code == 401
    async with client_for(throttled_app, "10.0.0.9") as site:
        for i in range(5):
            response = await site.get(f"{path}/task", headers=auth(f"fa_c_wrong-{i}"))
            assert response.status_code == 401
        assert_throttled(await site.get(f"{path}/task", headers=fed.headers("a")))
    async with client_for(throttled_app) as admin:  # the admin's own address is untouched
        assert (await admin.get(path, headers=ADMIN)).status_code == 200


async def test_right_tokens_are_never_counted(throttled_app: FastAPI) -> None:
    async with client_for(throttled_app) as admin:
        for _ in range(50):
            assert (await admin.get("/api/v1/federations", headers=ADMIN)).status_code == 200


# --- admin token rotation ----------------------------------------------------------------------


async def test_the_admin_token_rotates_without_a_restart(app: FastAPI, settings: Settings) -> None:
    # a second process on the same database (another replica)
    other = create_app(settings, run_reaper=False)
    try:
        async with client_for(app) as api, client_for(other) as replica:
            await login(api)
            response = await api.post("/api/v1/admin/token", headers=ADMIN)
            assert response.status_code == 201, response.text
            new = response.json()["token"]
            assert new != ADMIN_TOKEN
            for process in (api, replica):
                old = await process.get("/api/v1/federations", headers=ADMIN)
                assert old.status_code == 401
                ok = await process.get("/api/v1/federations", headers=auth(new))
                assert ok.status_code == 200
            assert (await api.get("/admin")).status_code == 303  # the session ended
            assert (await login(api)).status_code == 401  # the old token no longer logs in
            assert (await login(api, new)).status_code == 303
    finally:
        other.state.services.close()


# --- site tokens -------------------------------------------------------------------------------


async def test_site_tokens_rotate_and_revoke(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api, clients=("a", "b"))
    cid = fed.client_ids["a"]
    task = f"/api/v1/federations/{fed.id}/task"
    base = f"/api/v1/federations/{fed.id}/clients/{cid}/token"

    refused = await api.post(f"{base}/revoke", json={"reason": ""}, headers=ADMIN)
    assert refused.status_code == 422
    assert (await api.get(task, headers=fed.headers("a"))).status_code == 200  # unchanged

    revoked = await api.post(f"{base}/revoke", json={"reason": "laptop stolen"}, headers=ADMIN)
    assert revoked.status_code == 200, revoked.text
    denied = await api.get(task, headers=fed.headers("a"))
    assert denied.status_code == 401
    assert "revoked" in denied.json()["detail"]
    assert (await api.get(task, headers=fed.headers("b"))).status_code == 200  # b untouched

    rotated = await api.post(base, headers=ADMIN)
    assert rotated.status_code == 201, rotated.text
    new = rotated.json()["token"]
    assert new.startswith("fa_c_")
    assert (await api.get(task, headers=fed.headers("a"))).status_code == 401  # old one
    assert (await api.get(task, headers=auth(new))).status_code == 200

    # another federation's client, or a site token, cannot do this
    assert (await api.post(base, headers=auth(new))).status_code == 401
    other = await make_federation(api, clients=("c",), name="other")
    wrong = f"/api/v1/federations/{other.id}/clients/{cid}/token"
    assert (await api.post(wrong, headers=ADMIN)).status_code == 404

    events = (await api.get(f"/api/v1/federations/{fed.id}/events", headers=ADMIN)).json()
    kinds = [e["kind"] for e in events["items"]]
    assert "client.token_revoked" in kinds
    assert "client.token_rotated" in kinds
    assert not any(new in str(e) for e in events["items"])  # the token is never logged


# --- API docs ----------------------------------------------------------------------------------


async def test_api_docs_are_off_in_production_unless_asked_for(settings: Settings) -> None:
    cases = [("development", None, 200), ("production", None, 404), ("production", True, 200)]
    for environment, docs, expected in cases:
        app = create_app(
            settings.model_copy(update={"environment": environment, "api_docs": docs}),
            run_reaper=False,
        )
        try:
            async with client_for(app) as api:
                assert (await api.get("/docs")).status_code == expected, environment
                assert (await api.get("/redoc")).status_code == expected, environment
        finally:
            app.state.services.close()


# --- CSV ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('=HYPERLINK("http://x")', '\'=HYPERLINK("http://x")'),
        ("+1+1", "'+1+1"),
        ("-2+3", "'-2+3"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\t=1", "'\t=1"),
        ("\r=1", "'\r=1"),
        ("hospital-a", "hospital-a"),
        ("", ""),
    ],
)
def test_csv_text_neutralises_formulas(value: str, expected: str) -> None:
    assert csv_text(value) == expected


async def test_csv_report_writes_no_formula(api: httpx.AsyncClient) -> None:
    names = ("=1+2", "@cmd", "+x", "-y", "plain")
    fed = await make_federation(api, clients=names)
    response = await api.get(f"/api/v1/federations/{fed.id}/report?format=csv", headers=ADMIN)
    assert response.status_code == 200
    rows = list(csv.DictReader(io.StringIO(response.text)))
    written = {row["name"] for row in rows}
    assert written == {"'=1+2", "'@cmd", "'+x", "'-y", "plain"}
