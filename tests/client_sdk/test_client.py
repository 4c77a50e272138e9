"""The SDK's HTTP client against `httpx.MockTransport`: errors, retries, headers, integrity."""

from __future__ import annotations

import hashlib
import json
import uuid

import httpx
import pytest

from client_sdk import (
    APIConnectionError,
    AuthenticationError,
    ConflictError,
    FederationClient,
    IntegrityError,
    InternalServerError,
    RateLimitError,
    UnprocessableEntityError,
)

FID = "00000000-0000-0000-0000-000000000001"


def make_client(
    handler, *, max_retries: int = 3, sleeps: list[float] | None = None
) -> FederationClient:
    transport = httpx.MockTransport(handler)
    http = httpx.Client(transport=transport, base_url="http://coord")
    recorded = sleeps if sleeps is not None else []
    return FederationClient(
        api_token="fa_c_token", http_client=http, max_retries=max_retries, sleep=recorded.append
    )


def problem(status: int, slug: str, detail: str, **ext) -> httpx.Response:
    body = {"type": f"/problems/{slug}", "title": slug, "status": status, "detail": detail, **ext}
    return httpx.Response(status, json=body, headers={"content-type": "application/problem+json"})


@pytest.mark.parametrize(
    ("status", "slug", "exc"),
    [
        (401, "unauthorized", AuthenticationError),
        (409, "round-closed", ConflictError),
        (422, "update-rejected", UnprocessableEntityError),
    ],
)
def test_status_errors_are_typed_and_carry_the_problem(status, slug, exc) -> None:
    client = make_client(lambda request: problem(status, slug, "nope", open_round=3))
    with pytest.raises(exc) as info:
        client.join(FID, num_samples=2, class_counts=[1, 1])
    assert info.value.status_code == status
    assert info.value.problem is not None
    assert info.value.problem.type == f"/problems/{slug}"
    assert info.value.extensions["open_round"] == 3
    assert "nope" in str(info.value)


def test_retries_5xx_and_429_honouring_retry_after() -> None:
    answers = [
        httpx.Response(503, text="busy"),
        httpx.Response(429, headers={"Retry-After": "2"}, json={}),
        httpx.Response(200, json={"status": "wait", "retry_after_s": 1.0, "reason": "x"}),
    ]
    sleeps: list[float] = []
    client = make_client(lambda request: answers.pop(0), sleeps=sleeps)
    current = client.get_current_round(FID)
    assert current.status == "wait"
    assert len(sleeps) == 2
    assert 0.25 <= sleeps[0] <= 0.5  # backoff base 0.5 s with jitter in [0.5, 1] x base
    assert sleeps[1] == 2.0  # the server's Retry-After wins


def test_gives_up_after_max_retries() -> None:
    calls = []

    def handler(request):
        calls.append(request)
        return httpx.Response(500, text="boom")

    client = make_client(handler, max_retries=2)
    with pytest.raises(InternalServerError):
        client.get_current_round(FID)
    assert len(calls) == 3


def test_rate_limit_error_after_retries() -> None:
    client = make_client(lambda r: httpx.Response(429, headers={"Retry-After": "0"}), max_retries=1)
    with pytest.raises(RateLimitError):
        client.get_current_round(FID)


def test_connection_errors_are_retried_then_raised() -> None:
    attempts = []

    def handler(request):
        attempts.append(1)
        raise httpx.ConnectError("refused", request=request)

    client = make_client(handler, max_retries=2)
    with pytest.raises(APIConnectionError):
        client.get_current_round(FID)
    assert len(attempts) == 3


def test_submit_sends_token_idempotency_key_and_declared_sha() -> None:
    seen: dict = {}
    state = b"fake-safetensors-bytes"

    def handler(request: httpx.Request) -> httpx.Response:
        seen["auth"] = request.headers["authorization"]
        seen["key"] = request.headers["idempotency-key"]
        body = request.read()
        seen["body"] = body
        return httpx.Response(
            201,
            json={
                "id": "00000000-0000-0000-0000-0000000000aa",
                "round_id": "00000000-0000-0000-0000-0000000000bb",
                "round_index": 4,
                "client_id": "00000000-0000-0000-0000-0000000000cc",
                "sha256": hashlib.sha256(state).hexdigest(),
                "size_bytes": len(state),
                "num_samples": 5,
                "received_at": "2026-01-01T00:00:00Z",
                "replayed": False,
            },
        )

    client = make_client(handler)
    receipt = client.submit_update(
        FID, 4, state=state, num_samples=5, signals={"class_counts": [5]}, idempotency_key="k-1"
    )
    assert receipt.round_index == 4
    assert seen["auth"] == "Bearer fa_c_token"
    assert seen["key"] == "k-1"
    # the metadata part declares the sha256 of the state part
    metadata = json.loads(seen["body"].split(b"\r\n\r\n", 1)[1].split(b"\r\n--", 1)[0])
    assert metadata["sha256"] == hashlib.sha256(state).hexdigest()
    assert state in seen["body"]


def test_download_checks_sha256() -> None:
    client = make_client(
        lambda request: httpx.Response(200, content=b"tampered", headers={"ETag": '"abc"'})
    )
    with pytest.raises(IntegrityError, match="does not match"):
        client.download_model("m", expected_sha256="0" * 64)


def test_download_304_returns_none() -> None:
    def handler(request):
        assert request.headers["if-none-match"] == '"abc"'
        return httpx.Response(304)

    assert make_client(handler).download_model("m", if_none_match="abc") is None


def test_missing_token_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.delenv("FEDAUDIT_TOKEN", raising=False)
    with pytest.raises(ValueError, match="api_token is required"):
        FederationClient("http://x")


def test_failed_federation_is_a_typed_error() -> None:
    from client_sdk import FederationFailedError

    client = make_client(
        lambda request: problem(409, "federation-state", "federation 'x' failed: round 3 failed")
    )
    with pytest.raises(FederationFailedError, match="round 3 failed"):
        client.get_current_round(FID)


def test_create_federation_refuses_a_spec_that_is_not_a_mapping() -> None:
    from client_sdk import AdminClient

    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(500)

    http = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://coord")
    admin = AdminClient(api_token="t" * 20, http_client=http)
    with pytest.raises(TypeError, match=r"spec: expected a mapping \(a JSON object\), got list"):
        admin.create_federation([("name", "x")])  # type: ignore[arg-type]
    assert sent == []  # refused before any request


def test_stop_federation_posts_the_reason_and_does_not_retry_a_conflict() -> None:
    from client_sdk import AdminClient, ConflictError

    sent: list[httpx.Request] = []
    federation = {
        "id": FID,
        "name": "f",
        "status": "stopped",
        "status_reason": "stopped by the admin: bad data",
        "task": {"num_classes": 2, "input_shape": [4]},
        "plan": {"rounds": 3},
        "config": {},
        "seed": 0,
        "current_model_id": None,
        "clients": 2,
        "joined_clients": 2,
        "rounds_started": 1,
        "created_at": "2026-11-23T00:00:00Z",
    }

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        if len(sent) == 1:
            return httpx.Response(200, json=federation)
        return problem(409, "federation-state", "federation 'f' has already stopped")

    http = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://coord")
    admin = AdminClient(api_token="t" * 20, http_client=http, sleep=lambda s: None)
    stopped = admin.stop_federation(FID, "bad data")
    assert stopped.status == "stopped"
    assert stopped.status_reason == "stopped by the admin: bad data"
    assert sent[0].method == "POST"
    assert sent[0].url.path == f"/api/v1/federations/{FID}/stop"
    assert json.loads(sent[0].content) == {"reason": "bad data"}
    with pytest.raises(ConflictError, match="already stopped"):
        admin.stop_federation(FID, "again")
    assert len(sent) == 2  # a 409 is an answer, not retried


def _round(i: int) -> dict:
    return {
        "id": str(uuid.UUID(int=i + 1)),
        "federation_id": FID,
        "index": i,
        "state": "closed",
        "opened_at": "2026-11-23T00:00:00Z",
        "deadline_at": "2026-11-23T01:00:00Z",
        "deadline_extensions": 0,
        "model_in_id": str(uuid.UUID(int=100 + i)),
        "selected_clients": [],
        "submitted_clients": [],
    }


def _event(i: int) -> dict:
    return {
        "id": 10 * i + 3,  # increasing, not consecutive
        "kind": "round.closed",
        "actor": "coordinator",
        "message": f"round {i} closed",
        "data": {},
        "created_at": "2026-11-23T00:00:00Z",
    }


def test_list_rounds_and_events_read_every_page() -> None:
    # A coordinator with 5 rounds and 5 events that answers at most `limit` items per request.
    from client_sdk import AdminClient

    rounds = [_round(i) for i in range(5)]
    events = [_event(i) for i in range(5)]
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        limit = int(request.url.params["limit"])
        if request.url.path.endswith("/rounds"):
            offset = int(request.url.params["offset"])
            return httpx.Response(200, json={"items": rounds[offset : offset + limit], "total": 5})
        after = int(request.url.params["after_id"])
        later = [e for e in events if e["id"] > after]
        return httpx.Response(200, json={"items": later[:limit]})

    http = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://coord")
    admin = AdminClient(api_token="t" * 20, http_client=http)
    assert [r.index for r in admin.list_rounds(FID, page_size=2)] == [0, 1, 2, 3, 4]
    assert [int(r.url.params["offset"]) for r in sent] == [0, 2, 4]
    sent.clear()
    listed = admin.list_events(FID, kind="round.closed", page_size=2)
    assert [e.id for e in listed] == [3, 13, 23, 33, 43]
    assert [int(r.url.params["after_id"]) for r in sent] == [0, 13, 33]
    assert {r.url.params["kind"] for r in sent} == {"round.closed"}
    sent.clear()
    # A full last page costs one more request, which comes back empty.
    assert len(admin.list_rounds(FID, page_size=5)) == 5
    assert len(sent) == 2
    with pytest.raises(ValueError, match="cursor"):
        admin.get_json_pages("/x", cursor="page")
