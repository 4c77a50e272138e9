"""A small connection pool under many long-polls, slow uploads and exhaustion (issue #24).

The coordinator runs in this process under a real uvicorn on a loopback port, so a test can look
at its pool (`checkedout()`), at its notifier's subscribers, and hold connections itself. Pool
size 1 and no overflow make any request that keeps a connection while it waits visible: every
other request would then wait the pool timeout and get a 503.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI
from sqlalchemy import Engine, event

from client_sdk import FederationClient
from fedaudit_sim.coordinator_process import free_port
from service.config import Settings
from service.coordinator.resources import Services
from service.main import create_app
from tests.factories import ADMIN, auth, federation_spec, state_bytes, tiny_state, update_parts

pytestmark = [pytest.mark.slow, pytest.mark.db]

JOIN = {"num_samples": 10, "class_counts": [5, 5]}
PROMPT_S = 5.0
"""Generous bound for "promptly": the pool timeout below is longer, so a request that had to
wait for a connection held by a waiter would fail (503) or take longer than this."""


class LiveServer:
    """uvicorn serving `app` on 127.0.0.1 in a background thread."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.port = free_port()
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn-test", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def services(self) -> Services:
        services: Services = self.app.state.services
        return services

    @property
    def engine(self) -> Engine:
        bind = self.services.sessions.kw["bind"]
        assert isinstance(bind, Engine)
        return bind

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive(), "uvicorn exited during start-up"
            assert time.monotonic() < deadline, "uvicorn did not start in 30 s"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def pool_settings(settings: Settings, **overrides: Any) -> Settings:
    values: dict[str, Any] = {"db_pool_size": 1, "db_max_overflow": 0, "db_pool_timeout_s": 10.0}
    values.update(overrides)
    return settings.model_copy(update=values)


@pytest.fixture
def small_pool(settings: Settings) -> Settings:
    return pool_settings(settings)


@pytest.fixture
def server(small_pool: Settings) -> Iterator[LiveServer]:
    live = LiveServer(create_app(small_pool, run_reaper=False))
    live.start()
    try:
        yield live
    finally:
        live.stop()


@pytest.fixture
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def make_federation(
    http: httpx.Client, clients: list[str], *, join: list[str], name: str | None = None
) -> tuple[str, dict[str, str]]:
    """A federation with its initial model and clients; those in `join` join it."""
    spec = federation_spec(name or f"pool-{uuid.uuid4().hex[:6]}")
    response = http.post("/api/v1/federations", json=spec, headers=ADMIN)
    assert response.status_code == 201, response.text
    fid = response.json()["id"]
    response = http.put(
        f"/api/v1/federations/{fid}/model",
        content=state_bytes(tiny_state(0.0)),
        headers={**ADMIN, "Content-Type": "application/octet-stream"},
    )
    assert response.status_code == 201, response.text
    tokens = {}
    for client_name in clients:
        response = http.post(
            f"/api/v1/federations/{fid}/clients", json={"name": client_name}, headers=ADMIN
        )
        assert response.status_code == 201, response.text
        tokens[client_name] = response.json()["token"]
    for client_name in join:
        response = http.post(
            f"/api/v1/federations/{fid}/join", json=JOIN, headers=auth(tokens[client_name])
        )
        assert response.status_code == 200, response.text
    return fid, tokens


def wait_for_subscribers(server: LiveServer, fid: str, count: int) -> None:
    deadline = time.monotonic() + 30
    while server.services.notifier.subscribers(uuid.UUID(fid)) < count:
        assert time.monotonic() < deadline, (
            f"only {server.services.notifier.subscribers(uuid.UUID(fid))} of {count} "
            "long-polls are waiting"
        )
        time.sleep(0.02)


def wait_for_idle_pool(server: LiveServer) -> None:
    """Every connection back in the pool (a waiter's first read may still be finishing)."""
    deadline = time.monotonic() + PROMPT_S
    while server.engine.pool.checkedout() != 0:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "a request keeps a connection while it waits"
        time.sleep(0.02)


def timed(call: Any) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = call()
    return response, time.monotonic() - started


def test_many_long_polls_leave_the_pool_to_other_requests(
    server: LiveServer, http: httpx.Client
) -> None:
    waiters = [f"site-{i:02d}" for i in range(32)]
    fid, tokens = make_federation(http, [*waiters, "late"], join=waiters)
    other, other_tokens = make_federation(http, ["x", "y"], join=["x", "y"])

    def long_poll(name: str) -> httpx.Response:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            return client.get(
                f"/api/v1/federations/{fid}/rounds/current",
                params={"wait_s": 30},
                headers=auth(tokens[name]),
            )

    with ThreadPoolExecutor(max_workers=len(waiters)) as pool:
        futures = [pool.submit(long_poll, name) for name in waiters]
        wait_for_subscribers(server, fid, len(waiters))
        # every waiter is parked server-side, and none of them holds a connection
        wait_for_idle_pool(server)

        response, took = timed(lambda: http.get(f"/api/v1/federations/{fid}", headers=ADMIN))
        assert response.status_code == 200, response.text
        assert took < PROMPT_S
        response, took = timed(
            lambda: http.post(
                f"/api/v1/federations/{other}/rounds/0/updates",
                files=update_parts(tiny_state(1.0), num_samples=10),
                headers={**auth(other_tokens["x"]), "Idempotency-Key": "x-0"},
            )
        )
        assert response.status_code == 201, response.text
        assert took < PROMPT_S
        assert all(not f.done() for f in futures), "a long-poll returned before the round opened"

        # the last site joins: round 0 opens, and every waiter is told to train in it
        response, took = timed(
            lambda: http.post(
                f"/api/v1/federations/{fid}/join", json=JOIN, headers=auth(tokens["late"])
            )
        )
        opened = time.monotonic()
        assert response.status_code == 200, response.text
        assert took < PROMPT_S
        answers = [f.result(timeout=60) for f in futures]
        woken_within = time.monotonic() - opened

    for answer in answers:
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["status"] == "train", body
        assert body["round"]["index"] == 0
    assert woken_within < PROMPT_S
    assert server.services.notifier.subscribers(uuid.UUID(fid)) == 0


def test_a_long_poll_is_woken_when_the_round_opens(server: LiveServer, http: httpx.Client) -> None:
    fid, tokens = make_federation(http, ["a", "b"], join=["a"])
    with ThreadPoolExecutor(max_workers=1) as pool:
        started = time.monotonic()
        future = pool.submit(
            lambda: httpx.get(
                f"{server.url}/api/v1/federations/{fid}/rounds/current",
                params={"wait_s": 30},
                headers=auth(tokens["a"]),
                timeout=60,
            )
        )
        wait_for_subscribers(server, fid, 1)
        time.sleep(0.5)
        response = http.post(f"/api/v1/federations/{fid}/start", headers=ADMIN)
        assert response.status_code == 200, response.text
        answer = future.result(timeout=60)
    took = time.monotonic() - started
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "train"
    assert answer.json()["round"]["index"] == 0
    assert took < PROMPT_S  # woken by the signal, well before its 30 s


def test_a_waiting_long_poll_does_not_query_the_database(
    server: LiveServer, http: httpx.Client
) -> None:
    fid, tokens = make_federation(http, ["a", "b"], join=["a"])
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(
            lambda: httpx.get(
                f"{server.url}/api/v1/federations/{fid}/rounds/current",
                params={"wait_s": 30},
                headers=auth(tokens["a"]),
                timeout=60,
            )
        )
        time.sleep(1.0)  # the request has arrived and read once (that read precedes the wait)
        event.listen(server.engine, "before_cursor_execute", count)
        try:
            time.sleep(3.0)  # nothing changes: a polling loop would have re-read many times
        finally:
            event.remove(server.engine, "before_cursor_execute", count)
        assert statements == []
        assert not future.done()
        response = http.post(f"/api/v1/federations/{fid}/start", headers=ADMIN)
        assert response.status_code == 200, response.text
        assert future.result(timeout=60).json()["status"] == "train"


def test_an_upload_streams_without_holding_a_connection(
    server: LiveServer, http: httpx.Client, small_pool: Settings
) -> None:
    fid, tokens = make_federation(http, ["a"], join=["a"])
    request = http.build_request(
        "POST",
        f"/api/v1/federations/{fid}/rounds/0/updates",
        files=update_parts(tiny_state(1.0), num_samples=10),
    )
    body = request.read()
    half = len(body) // 2
    release = threading.Event()

    def slow_body() -> Iterator[bytes]:
        yield body[:half]
        assert release.wait(timeout=60)
        yield body[half:]

    def upload() -> httpx.Response:
        return httpx.post(
            f"{server.url}/api/v1/federations/{fid}/rounds/0/updates",
            content=slow_body(),
            headers={
                **auth(tokens["a"]),
                "Idempotency-Key": "a-0",
                "Content-Type": request.headers["Content-Type"],
            },
            timeout=60,
        )

    tmp_dir = small_pool.tmp_dir
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(upload)
        deadline = time.monotonic() + 30
        while not list(tmp_dir.glob("upload-*.part")):  # the handler is streaming the body
            assert time.monotonic() < deadline, "the upload never reached the handler"
            time.sleep(0.02)
        wait_for_idle_pool(server)
        response, took = timed(lambda: http.get(f"/api/v1/federations/{fid}", headers=ADMIN))
        assert response.status_code == 200, response.text
        assert took < PROMPT_S
        assert not future.done()
        release.set()
        answer = future.result(timeout=60)
    assert answer.status_code == 201, answer.text
    rounds = http.get(f"/api/v1/federations/{fid}/rounds", headers=ADMIN).json()["items"]
    assert rounds[0]["state"] == "closed"  # the only site submitted: closed inline


@pytest.fixture
def tight_server(settings: Settings) -> Iterator[LiveServer]:
    live = LiveServer(create_app(pool_settings(settings, db_pool_timeout_s=0.5), run_reaper=False))
    live.start()
    try:
        yield live
    finally:
        live.stop()


def assert_busy(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["retry-after"] == "2"
    body = response.json()
    assert body["status"] == 503
    assert body["type"] == "/problems/unavailable"


def test_an_exhausted_pool_answers_503_with_retry_after(tight_server: LiveServer) -> None:
    server = tight_server
    with httpx.Client(base_url=server.url, timeout=60) as http:
        fid, tokens = make_federation(http, ["a"], join=["a"])
        events_before = http.get(f"/api/v1/federations/{fid}/events", headers=ADMIN).json()
        held = server.engine.connect()  # the pool's only connection
        try:
            assert_busy(http.get(f"/api/v1/federations/{fid}", headers=ADMIN))
            assert_busy(
                http.get(f"/api/v1/federations/{fid}/rounds/current", headers=auth(tokens["a"]))
            )
            assert_busy(
                http.post(
                    f"/api/v1/federations/{fid}/rounds/0/updates",
                    files=update_parts(tiny_state(1.0), num_samples=10),
                    headers={**auth(tokens["a"]), "Idempotency-Key": "a-0"},
                )
            )
            # no token: refused at once, without a connection (and not recorded: none is free)
            refused = http.get(f"/api/v1/federations/{fid}/rounds/current")
            assert refused.status_code == 401, refused.text
            assert refused.headers["content-type"] == "application/problem+json"
            no_federation = http.get("/api/v1/federations/not-a-uuid/rounds/current")
            assert no_federation.status_code == 401
            assert http.get("/healthz").status_code == 200
        finally:
            held.close()
        # nothing was stored while the pool was exhausted; the same requests now succeed
        events_after = http.get(f"/api/v1/federations/{fid}/events", headers=ADMIN).json()
        assert events_after == events_before
        assert list(server.services.settings.tmp_dir.glob("upload-*")) == []
        response = http.post(
            f"/api/v1/federations/{fid}/rounds/0/updates",
            files=update_parts(tiny_state(1.0), num_samples=10),
            headers={**auth(tokens["a"]), "Idempotency-Key": "a-0"},
        )
        assert response.status_code == 201, response.text


def test_the_sdk_backs_off_on_503_honouring_retry_after(tight_server: LiveServer) -> None:
    server = tight_server
    with httpx.Client(base_url=server.url, timeout=60) as http:
        fid, tokens = make_federation(http, ["a"], join=["a"])
    held = server.engine.connect()
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        held.close()  # the pool frees up while the SDK waits

    try:
        with FederationClient(server.url, tokens["a"], sleep=sleep) as client:
            current = client.get_current_round(fid)
    finally:
        held.close()
    assert sleeps == [2.0]  # one 503, and the server's Retry-After was the delay
    assert current.status == "train"
    assert current.round is not None
    assert current.round.index == 0


def test_a_model_download_streams_without_holding_a_connection(
    server: LiveServer, http: httpx.Client
) -> None:
    # A 32 MB model: far more than the socket buffers hold, so the server is still sending while
    # the client reads slowly.
    spec = federation_spec(f"pool-{uuid.uuid4().hex[:6]}")
    fid = http.post("/api/v1/federations", json=spec, headers=ADMIN).json()["id"]
    big = {**tiny_state(0.0), "big.weight": np.zeros(8_000_000, dtype=np.float32)}
    response = http.put(
        f"/api/v1/federations/{fid}/model",
        content=state_bytes(big),
        headers={**ADMIN, "Content-Type": "application/octet-stream"},
    )
    assert response.status_code == 201, response.text
    model_id = http.get(f"/api/v1/federations/{fid}", headers=ADMIN).json()["current_model_id"]
    with httpx.Client(base_url=server.url, timeout=60) as slow:
        with slow.stream("GET", f"/api/v1/models/{model_id}", headers=ADMIN) as download:
            assert download.status_code == 200
            chunks = download.iter_bytes(65536)
            received = len(next(chunks))
            wait_for_idle_pool(server)
            answer, took = timed(lambda: http.get(f"/api/v1/federations/{fid}", headers=ADMIN))
            assert answer.status_code == 200, answer.text
            assert took < PROMPT_S
            received += sum(len(chunk) for chunk in chunks)
    assert received == len(state_bytes(big))
