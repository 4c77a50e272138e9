"""Bounded influence through the API: an update's counts must agree with the site's join (within
the federation's max_sample_drift), refusals are evidence in the report, and no site's
aggregation weight exceeds min(1, 4 / K)."""

from __future__ import annotations

from datetime import datetime

import httpx
import numpy as np
import pytest
from safetensors.numpy import load

from service.coordinator import updates
from tests.api.conftest import Federation, make_federation
from tests.api.test_rounds import submit
from tests.api.test_updates import blob_files, nothing_stored
from tests.factories import ADMIN, federation_spec, tiny_state

pytestmark = [pytest.mark.anyio, pytest.mark.db]

# Both sites join with 100 samples, 50 per class: the default drift 0.1 allows 10 samples more
# or fewer, and 10 samples of L1 distance between the class histograms.
JOINED_100 = {name: {"num_samples": 100, "class_counts": [50, 50]} for name in ("a", "b")}


async def events_of(api: httpx.AsyncClient, fed: Federation) -> list[dict]:
    response = await api.get(f"/api/v1/federations/{fed.id}/events", headers=ADMIN)
    items: list[dict] = response.json()["items"]
    return items


async def test_a_size_claim_out_of_proportion_is_refused_then_an_honest_one_accepted(
    api, settings
) -> None:
    fed = await make_federation(api, joins=JOINED_100)
    before = blob_files(settings)
    # 10^9 samples (within the column's range), class counts consistent with it (5 x 10^8 each).
    lie = await submit(api, fed, "a", 0, tiny_state(1.0), 10**9, key="lie")
    assert lie.status_code == 422, lie.text
    assert lie.headers["content-type"] == "application/problem+json"
    body = lie.json()
    assert body["type"] == "/problems/update-inconsistent"
    assert body["status"] == 422
    assert body["claimed"] == {"num_samples": 10**9, "class_counts": [5 * 10**8] * 2}
    assert body["declared"] == {"num_samples": 100, "class_counts": [50, 50]}
    assert body["max_sample_drift"] == 0.1
    assert [e["loc"] for e in body["errors"]] == [
        ["metadata", "num_samples"],
        ["metadata", "signals", "class_counts"],
    ]
    # nothing stored: no update, no blob, no staged upload; the site's join is unchanged
    rejected = await nothing_stored(api, fed, settings, before)
    assert len(rejected) == 1
    assert rejected[0]["client_id"] == fed.client_ids["a"]
    assert rejected[0]["data"]["type"] == "update-inconsistent"
    assert rejected[0]["data"]["claimed"]["num_samples"] == 10**9
    assert rejected[0]["data"]["declared"]["num_samples"] == 100
    clients = (await api.get(f"/api/v1/federations/{fed.id}/clients", headers=ADMIN)).json()
    assert {c["name"]: c["num_samples"] for c in clients} == {"a": 100, "b": 100}

    honest = await submit(api, fed, "a", 0, tiny_state(1.0), 100, key="honest")
    assert honest.status_code == 201, honest.text
    assert honest.json()["num_samples"] == 100


async def test_a_histogram_claim_beyond_the_drift_is_refused(api, settings) -> None:
    fed = await make_federation(api, joins=JOINED_100)
    before = blob_files(settings)
    # Same total, [90, 10] against the joined [50, 50]: L1 distance 80 > 10.
    response = await submit(
        api, fed, "a", 0, tiny_state(1.0), 100, signal_overrides={"class_counts": [90, 10]}
    )
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["type"] == "/problems/update-inconsistent"
    assert [e["loc"] for e in body["errors"]] == [["metadata", "signals", "class_counts"]]
    assert "by 80 samples" in body["errors"][0]["msg"]
    assert len(await nothing_stored(api, fed, settings, before)) == 1


@pytest.mark.parametrize(
    ("n", "counts", "accepted"),
    [
        (105, [55, 50], True),  # |5| <= 10, L1 5
        (110, [55, 55], True),  # |10| <= 10, L1 10: the edge is inside
        (90, [45, 45], True),  # |-10| <= 10, L1 10
        (100, [55, 45], True),  # L1 10 (5 samples relabelled cost 10)
        (111, [56, 55], False),  # |11| > 10
        (100, [56, 44], False),  # L1 12 > 10
        (89, [45, 44], False),  # |-11| > 10
    ],
)
async def test_the_default_drift_is_ten_percent_of_the_joined_samples(
    api, n, counts, accepted
) -> None:
    fed = await make_federation(api, joins=JOINED_100)
    response = await submit(
        api, fed, "a", 0, tiny_state(1.0), n, signal_overrides={"class_counts": counts}
    )
    assert response.status_code == (201 if accepted else 422), response.text


async def test_drift_zero_means_exactly_the_join(api) -> None:
    config = {
        "method": "fedavg",
        "detectors": ["fedncl"],
        "primary_detector": "fedncl",
        "max_sample_drift": 0.0,
    }
    fed = await make_federation(api, joins=JOINED_100, config=config)
    assert fed.data["config"]["max_sample_drift"] == 0.0
    off_by_one = await submit(
        api, fed, "a", 0, tiny_state(1.0), 101, signal_overrides={"class_counts": [51, 50]}
    )
    assert off_by_one.status_code == 422
    exact = await submit(api, fed, "a", 0, tiny_state(1.0), 100, key="exact")
    assert exact.status_code == 201, exact.text


@pytest.mark.parametrize("drift", [-0.1, 1.5, "lots"])
async def test_an_invalid_drift_is_refused_at_creation(api, drift) -> None:
    spec = federation_spec(config={"method": "fedavg", "max_sample_drift": drift})
    response = await api.post("/api/v1/federations", json=spec, headers=ADMIN)
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"


async def test_the_report_counts_each_sites_inconsistent_claims(api) -> None:
    fed = await make_federation(api, joins=JOINED_100)
    for key in ("lie-1", "lie-2"):
        response = await submit(api, fed, "a", 0, tiny_state(1.0), 10**9, key=key)
        assert response.status_code == 422
    # another kind of rejection (bad sha256) is not counted as an inconsistent claim
    other = await submit(api, fed, "b", 0, tiny_state(1.0), 100, declared_sha="0" * 64)
    assert other.status_code == 422
    assert other.json()["type"] == "/problems/update-rejected"

    report = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    rows = {row["name"]: row for row in report["clients"]}
    assert rows["a"]["inconsistent_updates"] == 2
    assert rows["b"]["inconsistent_updates"] == 0
    assert rows["b"]["last_inconsistent_at"] is None
    events = await events_of(api, fed)
    last = [e for e in events if e["data"].get("type") == "update-inconsistent"][-1]
    assert datetime.fromisoformat(rows["a"]["last_inconsistent_at"]) == datetime.fromisoformat(
        last["created_at"]
    )
    csv = (
        await api.get(f"/api/v1/federations/{fed.id}/report?format=csv", headers=ADMIN)
    ).text.splitlines()
    header = csv[0].split(",")
    at = header.index("inconsistent_updates")
    assert header[at : at + 2] == ["inconsistent_updates", "last_inconsistent_at"]
    by_name = {line.split(",")[1]: line.split(",") for line in csv[1:]}
    assert by_name["a"][at] == "2"
    assert by_name["b"][at : at + 2] == ["0", ""]


TEN = tuple(f"s{i}" for i in range(10))
# s0 holds 10x the data of each of the nine others: FedAvg would give it 100/190 = 0.526.
BIG_FIRST = {
    name: {
        "num_samples": 100 if name == "s0" else 10,
        "class_counts": [50, 50] if name == "s0" else [5, 5],
    }
    for name in TEN
}


async def ten_sites_round(api, config: dict | None = None) -> tuple[Federation, dict]:
    fed = await make_federation(api, clients=TEN, rounds=2, joins=BIG_FIRST, config=config)
    for name in TEN:
        big = name == "s0"
        response = await submit(
            api, fed, name, 0, tiny_state(10.0 if big else 0.0), 100 if big else 10
        )
        assert response.status_code == 201, response.text
    round0 = (await api.get(f"/api/v1/federations/{fed.id}/rounds/0", headers=ADMIN)).json()
    assert round0["state"] == "closed"
    return fed, round0


async def test_a_site_with_ten_times_the_data_weighs_at_most_the_cap(api) -> None:
    fed, round0 = await ten_sites_round(api)
    # cap = min(1, 4 / 10) = 0.4; the nine others share 0.6: 0.0667 each.
    weights = round0["aggregation_weights"]
    assert weights[fed.client_ids["s0"]] == pytest.approx(0.4)
    for name in TEN[1:]:
        assert weights[fed.client_ids[name]] == pytest.approx(0.6 / 9)
    cap = round0["audit"]["aggregation"]["weight_cap"]
    assert cap["factor"] == 4.0
    assert cap["cap"] == pytest.approx(0.4)
    assert cap["capped"] == [
        {
            "index": 0,
            "client_id": fed.client_ids["s0"],
            "before": pytest.approx(100 / 190),
            "after": pytest.approx(0.4),
            "layers": None,  # fedncl_layerwise's only
        }
    ]
    assert cap["note"] is None
    # the new model: 0.4 * 10 = 4.0 (FedAvg uncapped: 5.263)
    model = await api.get(f"/api/v1/models/{round0['model_out_id']}", headers=ADMIN)
    np.testing.assert_allclose(load(model.content)["layer.bias"], [4.0, 4.0], rtol=1e-6)
    report = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    rows = {row["name"]: row for row in report["clients"]}
    assert rows["s0"]["last_weight"] == pytest.approx(0.4)


async def test_the_cap_can_be_switched_off_per_federation(api) -> None:
    config = {
        "method": "fedavg",
        "detectors": ["fedncl"],
        "primary_detector": "fedncl",
        "audit": {"max_client_weight_factor": None},
    }
    fed, round0 = await ten_sites_round(api, config)
    assert fed.data["config"]["audit"]["max_client_weight_factor"] is None
    weights = round0["aggregation_weights"]
    assert weights[fed.client_ids["s0"]] == pytest.approx(100 / 190)
    assert round0["audit"]["aggregation"]["weight_cap"] is None


async def test_the_resolved_config_stores_both_defaults(api) -> None:
    fed = await make_federation(api)
    assert fed.data["config"]["max_sample_drift"] == 0.1
    assert fed.data["config"]["audit"]["max_client_weight_factor"] == 4.0


async def test_joining_again_cannot_inflate_the_declaration_once_running(api) -> None:
    # Rejoining used to replace the declared counts, so a site could rejoin with 10^12 samples
    # and then pass the update check against its own new declaration.
    fed = await make_federation(api, joins=JOINED_100)
    join_url = f"/api/v1/federations/{fed.id}/join"
    lie = await api.post(
        join_url,
        json={"num_samples": 10**9, "class_counts": [5 * 10**8] * 2},
        headers=fed.headers("a"),
    )
    assert lie.status_code == 422, lie.text
    assert lie.headers["content-type"] == "application/problem+json"
    assert lie.json()["type"] == "/problems/update-inconsistent"
    assert lie.json()["declared"] == {"num_samples": 100, "class_counts": [50, 50]}
    clients = (await api.get(f"/api/v1/federations/{fed.id}/clients", headers=ADMIN)).json()
    assert {c["name"]: c["num_samples"] for c in clients} == {"a": 100, "b": 100}
    refused = [e for e in await events_of(api, fed) if e["kind"] == "update.rejected"]
    assert len(refused) == 1
    assert refused[0]["data"]["claimed"]["num_samples"] == 10**9
    report = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    row = {r["name"]: r for r in report["clients"]}["a"]
    assert row["inconsistent_updates"] == 1
    # Within the drift (a site restarted with 5 more samples) a rejoin is still accepted.
    honest = await api.post(
        join_url, json={"num_samples": 105, "class_counts": [55, 50]}, headers=fed.headers("a")
    )
    assert honest.status_code == 200, honest.text


async def test_a_site_refused_again_and_again_is_recorded_a_bounded_number_of_times(
    api, settings
) -> None:
    # every refusal is answered (422); the event trail keeps the first MAX_RECORDED_REJECTIONS
    # of a site within the window, so a site with a valid token cannot grow it without bound
    fed = await make_federation(api, joins=JOINED_100)
    limit = updates.MAX_RECORDED_REJECTIONS
    for attempt in range(limit + 5):
        lie = await submit(api, fed, "a", 0, tiny_state(1.0), 10**9, key=f"lie-{attempt}")
        assert lie.status_code == 422, lie.text
    events = (
        await api.get(
            f"/api/v1/federations/{fed.id}/events",
            params={"kind": "update.rejected", "limit": 200},
            headers=ADMIN,
        )
    ).json()["items"]
    assert len(events) == limit
    report = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    row = next(c for c in report["clients"] if c["name"] == "a")
    assert row["inconsistent_updates"] == limit
    # the other site is not held back by a's refusals
    honest = await submit(api, fed, "b", 0, tiny_state(1.0), 100, key="b-honest")
    assert honest.status_code == 201, honest.text
