"""Bad input on update submission: clear problem details, nothing stored, an event saying why."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from service.coordinator import updates
from service.main import create_app
from tests.api.conftest import make_federation
from tests.api.test_rounds import current, submit
from tests.factories import ADMIN, state_bytes, tiny_state, update_parts

pytestmark = [pytest.mark.anyio, pytest.mark.db]


def blob_files(settings) -> set[Path]:
    return {p for p in settings.blob_dir.rglob("*") if p.is_file() and ".tmp" not in p.parts}


async def nothing_stored(api, fed, settings, blobs_before) -> list[dict]:
    """Assert the round holds no update and no blob was added; return the rejection events."""
    round0 = (await api.get(f"/api/v1/federations/{fed.id}/rounds/0", headers=ADMIN)).json()
    assert round0["submitted_clients"] == []
    assert blob_files(settings) == blobs_before
    assert list(settings.tmp_dir.glob("upload-*")) == []
    events = (await api.get(f"/api/v1/federations/{fed.id}/events", headers=ADMIN)).json()["items"]
    return [e for e in events if e["kind"] == "update.rejected"]


def wrong_shape() -> dict[str, np.ndarray]:
    state = tiny_state(1.0)
    state["layer.weight"] = np.ones((2, 3), dtype=np.float32)
    return state


def wrong_dtype() -> dict[str, np.ndarray]:
    state = tiny_state(1.0)
    state["layer.bias"] = np.ones((2,), dtype=np.float64)
    return state


def with_nan() -> dict[str, np.ndarray]:
    state = tiny_state(1.0)
    state["layer.weight"][0, 0] = np.nan
    return state


def extra_tensor() -> dict[str, np.ndarray]:
    return {**tiny_state(1.0), "rogue": np.zeros(1, dtype=np.float32)}


@pytest.mark.parametrize(
    ("state", "kwargs", "needle"),
    [
        (wrong_shape(), {}, "shape [2, 3], expected [3, 2]"),
        (wrong_dtype(), {}, "dtype F64, expected F32"),
        (with_nan(), {}, "non-finite"),
        (extra_tensor(), {}, "'rogue' is not in the global model"),
        (tiny_state(1.0), {"declared_sha": "0" * 64}, "declared sha256"),
        (tiny_state(1.0), {"signal_overrides": {"class_counts": [3, 3]}}, "sums to 6"),
        (
            tiny_state(1.0),
            {"signal_overrides": {"class_counts": [10, 0], "per_class_loss": [0.1, 0.2]}},
            "null",
        ),
        (tiny_state(1.0), {"signal_overrides": {"train_loss": None}}, "required"),
        (tiny_state(1.0), {"signal_overrides": {"train_accuracy": 1.5}}, "less than or equal to 1"),
        (tiny_state(1.0), {"signal_overrides": {"per_class_loss": [0.1]}}, "2 entries"),
        (tiny_state(1.0), {"signal_overrides": {"per_class_errors": [6, 0]}}, "count 5"),
        (tiny_state(1.0), {"signal_overrides": {"per_class_errors": [1.5, 0]}}, "integer"),
        (
            tiny_state(1.0),
            {"signal_overrides": {"per_class_loss": None, "per_class_errors": [1, 0]}},
            "without per_class_loss",
        ),
        (
            tiny_state(1.0),
            {"signal_overrides": {"per_class_confident_errors": [1, 0]}},
            "without per_class_errors",
        ),
        (
            tiny_state(1.0),
            {
                "signal_overrides": {
                    "per_class_errors": [2, 1],
                    "per_class_confident_errors": [3, 0],
                }
            },
            "exceeds the class's errors 2",
        ),
        (
            tiny_state(1.0),
            {
                "signal_overrides": {
                    "per_class_errors": [5, 5],
                    "per_class_confident_errors": [0, 6],
                }
            },
            "count 5",
        ),
        (tiny_state(1.0), {"extra": {"surprise": 1}}, "Extra inputs are not permitted"),
        (tiny_state(1.0), {"signal_overrides": {"train_loss": "0.5"}}, "valid number"),
        (tiny_state(1.0), {"signal_overrides": {"train_loss": float("nan")}}, "finite number"),
        (tiny_state(1.0), {"signal_overrides": {"class_counts": [5, True]}}, "valid integer"),
        (tiny_state(1.0), {"signal_overrides": {"class_counts": None}}, "valid list"),
    ],
    ids=[
        "shape",
        "dtype",
        "nan",
        "extra-tensor",
        "sha256",
        "counts-sum",
        "loss-for-absent-class",
        "missing-required-signal",
        "accuracy-range",
        "loss-length",
        "errors-above-count",
        "errors-not-integer",
        "errors-without-loss",
        "confident-without-errors",
        "confident-above-errors",
        "confident-above-count",
        "unknown-field",
        "number-as-string",
        "nan",
        "boolean-count",
        "no-class-counts",
    ],
)
async def test_invalid_update_is_rejected_and_nothing_changes(
    api, settings, state, kwargs, needle
) -> None:
    fed = await make_federation(api)
    before = blob_files(settings)
    response = await api.post(
        f"/api/v1/federations/{fed.id}/rounds/0/updates",
        files=update_parts(state, num_samples=10, **kwargs),
        headers={**fed.headers("a"), "Idempotency-Key": "k1"},
    )
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["type"] == "/problems/update-rejected"
    assert needle in body["detail"] or any(needle in e["msg"] for e in body.get("errors", []))
    rejected = await nothing_stored(api, fed, settings, before)
    assert len(rejected) == 1
    assert rejected[0]["client_id"] == fed.client_ids["a"]
    assert rejected[0]["data"]["status"] == 422


async def test_a_refusal_lists_at_most_50_problems(api, settings) -> None:
    # 200 negative losses are 200 problems: the answer names the count and lists the first 50
    fed = await make_federation(api)
    response = await api.post(
        f"/api/v1/federations/{fed.id}/rounds/0/updates",
        files=update_parts(
            tiny_state(1.0), num_samples=10, signal_overrides={"per_class_loss": [-1.0] * 200}
        ),
        headers={**fed.headers("a"), "Idempotency-Key": "k-many"},
    )
    assert response.status_code == 422, response.text
    body = response.json()
    assert "(200 problems, the first 50 listed;" in body["detail"]
    assert len(body["errors"]) == 50
    assert body["errors"][0]["loc"][:4] == ["metadata", "signals", "per_class_loss", 0]


async def test_malformed_metadata_and_missing_parts(api, settings) -> None:
    fed = await make_federation(api)
    before = blob_files(settings)
    url = f"/api/v1/federations/{fed.id}/rounds/0/updates"
    headers = {**fed.headers("a"), "Idempotency-Key": "k"}
    not_json = await api.post(
        url,
        files={
            "metadata": (None, "{oops", "application/json"),
            "state": ("s", state_bytes(tiny_state()), "application/octet-stream"),
        },
        headers=headers,
    )
    no_state = await api.post(
        url, files={"metadata": (None, "{}", "application/json")}, headers=headers
    )
    not_multipart = await api.post(url, content=b"hello", headers=headers)
    assert not_json.status_code == 422
    assert no_state.status_code == 400
    assert "state" in no_state.json()["detail"]
    assert not_multipart.status_code == 400
    assert len(await nothing_stored(api, fed, settings, before)) == 3


async def test_idempotent_retry_returns_first_result(api, settings) -> None:
    fed = await make_federation(api)
    first = await submit(api, fed, "a", 0, tiny_state(1.0), 10, key="same")
    replay = await submit(api, fed, "a", 0, tiny_state(1.0), 10, key="same")
    assert first.status_code == 201
    assert replay.status_code == 200
    assert replay.json()["id"] == first.json()["id"]
    assert replay.json()["replayed"] is True
    reused = await submit(api, fed, "a", 0, tiny_state(2.0), 10, key="same")
    assert reused.status_code == 409
    assert reused.json()["type"] == "/problems/idempotency-key-reused"
    different = await submit(api, fed, "a", 0, tiny_state(2.0), 10, key="other")
    assert different.status_code == 409
    assert different.json()["type"] == "/problems/duplicate-update"
    round0 = (await api.get(f"/api/v1/federations/{fed.id}/rounds/0", headers=ADMIN)).json()
    assert round0["submitted_clients"] == [fed.client_ids["a"]]


async def test_submission_to_closed_round_names_the_open_round(api) -> None:
    fed = await make_federation(api, rounds=3)
    await submit(api, fed, "a", 0, tiny_state(1.0), 10)
    await submit(api, fed, "b", 0, tiny_state(1.0), 10)
    late = await submit(api, fed, "a", 0, tiny_state(1.0), 10, key="late")
    assert late.status_code == 409
    assert late.json()["type"] == "/problems/round-closed"
    assert late.json()["open_round"] == 1
    assert "round 1 is open" in late.json()["detail"]
    missing = await submit(api, fed, "a", 9, tiny_state(1.0), 10, key="nine")
    assert missing.status_code == 404


async def test_wrong_token_and_wrong_federation(api) -> None:
    fed = await make_federation(api)
    other = await make_federation(api, name="other")
    url = f"/api/v1/federations/{fed.id}/rounds/0/updates"
    parts = update_parts(tiny_state(1.0), num_samples=10)
    anonymous = await api.post(url, files=parts, headers={"Idempotency-Key": "x"})
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"] == "Bearer"
    foreign = await api.post(
        url, files=parts, headers={**other.headers("a"), "Idempotency-Key": "x"}
    )
    assert foreign.status_code == 404
    round0 = (await api.get(f"/api/v1/federations/{fed.id}/rounds/0", headers=ADMIN)).json()
    assert round0["submitted_clients"] == []
    events = (await api.get(f"/api/v1/federations/{fed.id}/events", headers=ADMIN)).json()["items"]
    refused = [e for e in events if e["kind"] in ("auth.rejected", "update.rejected")]
    assert [e["kind"] for e in refused] == ["auth.rejected", "update.rejected"]
    assert "Authorization" not in refused[0]["message"]


async def test_a_flood_of_bad_tokens_writes_a_bounded_number_of_events(settings) -> None:
    settings.auth_rejected_events_per_minute = 3
    settings.auth_failure_limit = 100  # the event budget, not the per-address throttle
    app = create_app(settings, run_reaper=False)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t"
    ) as api:
        fed = await make_federation(api)
        url = f"/api/v1/federations/{fed.id}/rounds/current"
        bad = {"Authorization": "Bearer fa_c_not-a-token"}
        for _ in range(10):
            assert (await api.get(url, headers=bad)).status_code == 401

        async def rejected() -> list[dict[str, Any]]:
            events = (await api.get(f"/api/v1/federations/{fed.id}/events", headers=ADMIN)).json()[
                "items"
            ]
            return [e for e in events if e["kind"] == "auth.rejected"]

        assert len(await rejected()) == 3  # the other 7 are counted, not written
        # A minute later the next refusal is written and says how many were left out.
        services = app.state.services
        later = services.clock() + timedelta(seconds=61)
        services.clock = lambda: later
        assert (await api.get(url, headers=bad)).status_code == 401
        events = await rejected()
        assert len(events) == 4
        assert events[-1]["data"]["left_out_before"] == 7
        assert "7 earlier refusal(s) not recorded" in events[-1]["message"]
    app.state.services.close()


async def test_oversized_upload_is_413_and_not_stored(settings) -> None:
    settings.max_upload_bytes = 600  # the multipart body of tiny_state is ~700 bytes
    app = create_app(settings, run_reaper=False)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t"
    ) as api:
        fed = await make_federation(api)
        before = blob_files(settings)
        big = {**tiny_state(1.0), "layer.weight": np.ones((3, 2), dtype=np.float32)}
        response = await api.post(
            f"/api/v1/federations/{fed.id}/rounds/0/updates",
            files=update_parts(big, num_samples=10),
            headers={**fed.headers("a"), "Idempotency-Key": "big"},
        )
        assert response.status_code == 413
        assert response.json()["limit"] == 600
        rejected = await nothing_stored(api, fed, settings, before)
        assert rejected[0]["data"]["status"] == 413
    app.state.services.close()


async def test_rejection_event_reason_is_readable(api) -> None:
    fed = await make_federation(api)
    await api.post(
        f"/api/v1/federations/{fed.id}/rounds/0/updates",
        files=update_parts(wrong_shape(), num_samples=10),
        headers={**fed.headers("a"), "Idempotency-Key": "k"},
    )
    events = (
        await api.get(f"/api/v1/federations/{fed.id}/events?kind=update.rejected", headers=ADMIN)
    ).json()
    (event,) = events["items"]
    assert "shape" in event["message"]
    assert json.dumps(event["data"]["errors"])  # serialisable, names the tensor
    assert event["data"]["errors"][0]["loc"] == ["state"]
    assert (await current(api, fed, "a"))["status"] == "train"  # the client may still submit


@pytest.mark.parametrize(("state", "status"), [(with_nan(), 422), (tiny_state(1.0), 201)])
async def test_the_upload_is_checked_for_nan_without_a_second_read(
    api, settings, monkeypatch, state, status
) -> None:
    # The route's check for NaN and infinity answers from the bytes as they streamed in
    # (service.coordinator.finite_scan); the stored file is not read again for it.
    def second_read(*args: object) -> list[str]:
        raise AssertionError("the state was read a second time")

    monkeypatch.setattr(updates, "non_finite_tensors", second_read)
    fed = await make_federation(api)
    response = await api.post(
        f"/api/v1/federations/{fed.id}/rounds/0/updates",
        files=update_parts(state, num_samples=10),
        headers={**fed.headers("a"), "Idempotency-Key": "k-scan"},
    )
    assert response.status_code == status, response.text
    if status == 422:
        assert "non-finite values (NaN or infinity) in layer.weight" in response.json()["detail"]
