"""A federation's signal privacy policy: told to the sites, and what disobeys it refused (422,
/problems/privacy-policy) with nothing stored."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import make_federation
from tests.api.test_rounds import current, submit
from tests.api.test_updates import blob_files, nothing_stored
from tests.factories import ADMIN, tiny_state

pytestmark = [pytest.mark.anyio, pytest.mark.db]

POLICY = {"min_class_count": 5, "count_bucket": 10}
CONFIG = {
    "method": "fedavg",
    "detectors": ["fednoro", "evidence"],
    "primary_detector": "evidence",
    "privacy": POLICY,
}
OFF = {
    "min_class_count": 0,
    "count_bucket": 1,
    "dp_noise_multiplier": 0.0,
    "dp_clip_loss": None,
    "dp_clip_probe": None,
    "dp_delta": None,
}
# a holds [30, 3, 0] (37 samples), b [12, 8, 20] (40): as the SDK sends them under POLICY
JOINS = {
    "a": {"num_samples": 40, "class_counts": [30, None, 0]},
    "b": {"num_samples": 40, "class_counts": [20, 10, 20]},
}


async def policy_federation(api, *, join: bool = True) -> Any:
    return await make_federation(
        api, num_classes=3, config=CONFIG, joins=JOINS if join else None, join=join
    )


async def join(api, fed, name: str, body: dict[str, Any]):
    return await api.post(
        f"/api/v1/federations/{fed.id}/join", json=body, headers=fed.headers(name)
    )


async def clients(api, fed) -> dict[str, dict[str, Any]]:
    items = (await api.get(f"/api/v1/federations/{fed.id}/clients", headers=ADMIN)).json()
    return {c["name"]: c for c in items}


async def test_the_policy_is_stored_and_told_to_the_sites(api) -> None:
    fed = await policy_federation(api)
    stored = {**OFF, **POLICY}
    assert fed.data["config"]["privacy"] == stored
    task = await api.get(f"/api/v1/federations/{fed.id}/task", headers=fed.headers("a"))
    assert task.json()["privacy"] == stored
    joined = await join(api, fed, "a", JOINS["a"])
    assert joined.status_code == 200, joined.text
    assert joined.json()["privacy"] == stored
    instructions = (await current(api, fed, "a"))["instructions"]
    assert instructions["privacy"] == stored
    # the suppressed class is stored as sent: null, not a number
    assert (await clients(api, fed))["a"]["class_counts"] == [30, None, 0]


async def test_a_federation_without_a_policy_has_it_off(api) -> None:
    fed = await make_federation(api)
    assert fed.data["config"]["privacy"] == OFF
    task = await api.get(f"/api/v1/federations/{fed.id}/task", headers=fed.headers("a"))
    assert task.json()["privacy"] == OFF


@pytest.mark.parametrize(
    ("body", "locs"),
    [
        # the exact count 3 of a class below m = 5
        ({"num_samples": 40, "class_counts": [30, 3, 0]}, [["body", "class_counts", 1]]),
        # exact counts, not rounded to the bucket
        (
            {"num_samples": 37, "class_counts": [30, None, 0]},
            [["body", "num_samples"]],
        ),
        ({"num_samples": 40, "class_counts": [33, None, 0]}, [["body", "class_counts", 0]]),
        # every class suppressed: nothing left to compare
        ({"num_samples": 10, "class_counts": [None, None, 0]}, [["body", "class_counts"]]),
    ],
    ids=["count-below-m", "samples-not-bucketed", "count-not-bucketed", "all-suppressed"],
)
async def test_a_join_finer_than_the_policy_is_refused_and_not_recorded(api, body, locs) -> None:
    fed = await policy_federation(api, join=False)
    response = await join(api, fed, "a", body)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"] == "/problems/privacy-policy"
    assert [e["loc"] for e in problem["errors"]] == locs
    site = (await clients(api, fed))["a"]
    assert site["class_counts"] is None
    assert site["num_samples"] is None
    assert site["joined_at"] is None
    events = (await api.get(f"/api/v1/federations/{fed.id}/events", headers=ADMIN)).json()
    assert [e for e in events["items"] if e["kind"] in ("client.joined", "client.rejoined")] == []


async def test_a_null_count_without_the_policy_is_refused(api) -> None:
    fed = await make_federation(api, join=False)
    response = await join(api, fed, "a", {"num_samples": 10, "class_counts": [10, None]})
    assert response.status_code == 422, response.text
    assert response.json()["type"] == "/problems/privacy-policy"
    assert (await clients(api, fed))["a"]["class_counts"] is None


async def test_counts_that_cannot_add_up_are_a_bad_request(api) -> None:
    fed = await policy_federation(api, join=False)
    # [10, null, 0] stands for 5-10 + 1-4 = 6-14 samples; num_samples 40 stands for 31-40
    response = await join(api, fed, "a", {"num_samples": 40, "class_counts": [10, None, 0]})
    assert response.status_code == 400, response.text
    assert (
        "stand for 6 to 14 samples in all, num_samples 40 for 31 to 40" in response.json()["detail"]
    )


def policy_signals(**overrides: Any) -> dict[str, Any]:
    """The signals of site a as the SDK sends them under POLICY."""
    return {
        "class_counts": [30, None, 0],
        "per_class_loss": [0.5, None, None],
        "per_class_loss_sd": [0.1, None, None],
        "per_class_errors": [2, None, None],
        **overrides,
    }


@pytest.mark.parametrize(
    ("overrides", "loc"),
    [
        ({"per_class_loss": [0.5, 0.7, None]}, ["metadata", "signals", "per_class_loss", 1]),
        (
            {"per_class_loss_sd": [0.1, 0.2, None]},
            ["metadata", "signals", "per_class_loss_sd", 1],
        ),
        ({"per_class_errors": [2, 1, None]}, ["metadata", "signals", "per_class_errors", 1]),
        (
            {"per_class_errors": [2, 1, None], "per_class_confident_errors": [1, 1, None]},
            ["metadata", "signals", "per_class_confident_errors", 1],
        ),
        ({"class_counts": [30, 3, 0]}, ["metadata", "signals", "class_counts", 1]),
    ],
    ids=["loss", "spread", "errors", "confident-errors", "exact-count"],
)
async def test_an_update_finer_than_the_policy_is_refused_and_not_stored(
    api, settings, overrides, loc
) -> None:
    fed = await policy_federation(api)
    before = blob_files(settings)
    response = await submit(
        api, fed, "a", 0, tiny_state(1.0), 40, signal_overrides=policy_signals(**overrides)
    )
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"] == "/problems/privacy-policy"
    assert loc in [e["loc"] for e in problem["errors"]]
    rejected = await nothing_stored(api, fed, settings, before)
    assert len(rejected) == 1
    # the refusal in the event trail keeps the policy's reasons, not the value withheld (its
    # message and data: the timestamp may hold "0.7" by chance, as in "06:04:00.749")
    trail = str((rejected[0]["message"], rejected[0]["data"]))
    assert "0.7" not in trail
    assert "[30, 3, 0]" not in trail


async def test_a_round_of_updates_under_the_policy_is_accepted_and_audited(api) -> None:
    fed = await policy_federation(api)
    first = await submit(api, fed, "a", 0, tiny_state(1.0), 40, signal_overrides=policy_signals())
    assert first.status_code == 201, first.text
    second = await submit(
        api,
        fed,
        "b",
        0,
        tiny_state(3.0),
        40,
        signal_overrides={
            "class_counts": [20, 10, 20],
            # a model that clearly beats the label prior (a small federation's verdict needs it)
            "per_class_loss": [0.2, 0.3, 0.25],
            "per_class_loss_sd": [0.1, 0.1, 0.1],
            "per_class_errors": [1, 2, 3],
        },
    )
    assert second.status_code == 201, second.text
    round0 = (await api.get(f"/api/v1/federations/{fed.id}/rounds/0", headers=ADMIN)).json()
    assert round0["state"] == "closed"
    assert round0["audit"] is not None
    audit = round0["audit"]
    evidence = audit["detections"]["evidence"]
    assert evidence["status"] == "ok", evidence.get("reason")
    by_client = dict(zip(audit["client_ids"], evidence["verdicts"], strict=True))
    # the suppressed class counts as not held: a's mean loss is its one reported class's
    assert by_client[fed.client_ids["a"]]["evidence"]["mean_loss"] == pytest.approx(0.5)
    # the reports, a site's history and diagnostics and the dashboard read the nulls
    a = fed.client_ids["a"]
    for path, headers in [
        (f"/api/v1/federations/{fed.id}/report", ADMIN),
        (f"/api/v1/federations/{fed.id}/report?format=csv", ADMIN),
        (f"/api/v1/federations/{fed.id}/clients/{a}/history", ADMIN),
        (f"/api/v1/federations/{fed.id}/diagnostics", fed.headers("a")),
        (f"/admin/federations/{fed.id}", ADMIN),
        (f"/admin/federations/{fed.id}/rounds/0", ADMIN),
    ]:
        response = await api.get(path, headers=headers)
        assert response.status_code == 200, (path, response.text)
