"""Audit at round close, the stored result, and the report endpoints that read it."""

from __future__ import annotations

import copy
import csv
import io
import uuid

import httpx
import numpy as np
import pytest
from fastapi import FastAPI

from service.store import repositories as repo
from tests.api.conftest import make_federation
from tests.api.test_rounds import current, submit
from tests.factories import ADMIN, tiny_state

pytestmark = [pytest.mark.anyio, pytest.mark.db]

NAMES = ("a", "b", "c", "d")
# warmup_rounds 0: these tests read the audit of round 0, where Fed-NCL steers aggregation only
# without a warm-up (the fedncl preset warms up for 10 % of the rounds).
FEDNCL = {
    "method": "fedncl",
    "detectors": ["fedncl"],
    "primary_detector": "fedncl",
    "warmup_rounds": 0,
}


async def run_round(api, fed, index: int, *, noisy_samples: int = 10) -> None:
    # Global model is all zeros (round 0), so e_k = ||theta_k||^2 = 8 v^2 over the 8 floats.
    # Clean clients: v = 1, train_loss 0.1 -> q = e * (loss * n) / n = 8 * 0.1 = 0.8.
    # Client d: v = 3, train_loss 2.0 -> q = 72 * 2.0 = 144.
    # mean q = (3 * 0.8 + 144) / 4 = 36.6; population std = sqrt((3 * 35.8^2 + 107.4^2) / 4)
    # = sqrt((3844.92 + 11534.76) / 4) = 62.0 ; d: 144 - 36.6 = 107.4 > 1.0 * 62.0 -> flagged,
    # the clean ones are below the mean -> not flagged (one-sided rule).
    for name in NAMES:
        noisy = name == "d"
        response = await submit(
            api,
            fed,
            name,
            index,
            tiny_state(3.0 if noisy else 1.0),
            noisy_samples if noisy else 10,
            signal_overrides={"train_loss": 2.0 if noisy else 0.1},
        )
        assert response.status_code == 201, response.text


async def test_audit_flags_the_outlier_and_reports_agree(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api, clients=NAMES, rounds=3, config=FEDNCL)
    await run_round(api, fed, 0)

    round0 = (await api.get(f"/api/v1/federations/{fed.id}/rounds/0", headers=ADMIN)).json()
    audit = round0["audit"]
    fedncl = audit["detections"]["fedncl"]
    assert fedncl["status"] == "ok"
    ids = audit["client_ids"]
    flags = {
        fed_name: fedncl["verdicts"][ids.index(fed.client_ids[fed_name])]["flag"]
        for fed_name in NAMES
    }
    assert flags == {"a": False, "b": False, "c": False, "d": True}
    q_d = fedncl["verdicts"][ids.index(fed.client_ids["d"])]["score"]
    assert q_d == pytest.approx(144.0, rel=1e-5)
    # Fed-NCL layer-wise aggregation penalises d in the round it is flagged (the fedncl preset
    # aggregates on the round's flags): its weight is below the clean ones'.
    weights = round0["aggregation_weights"]
    assert audit["aggregation"]["rule"] == "fedncl_layerwise"
    assert weights[fed.client_ids["d"]] < weights[fed.client_ids["a"]]
    d_at = ids.index(fed.client_ids["d"])
    assert audit["aggregation_flags"] == [i == d_at for i in range(4)]
    assert audit["aggregation"]["details"]["penalty"][d_at] > 1.0

    report = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    rows = {row["name"]: row for row in report["clients"]}
    assert rows["d"]["times_flagged"] == 1
    assert rows["d"]["latest_flags"]["fedncl"] is True
    assert rows["d"]["latest_scores"]["fedncl"] == pytest.approx(q_d)
    assert rows["d"]["last_weight"] == pytest.approx(weights[fed.client_ids["d"]])
    assert rows["d"]["status"] == "suspect"  # flagged once: m = 2 flags needed for noisy
    assert rows["a"]["status"] == "trusted"

    csv_text = (
        await api.get(f"/api/v1/federations/{fed.id}/report?format=csv", headers=ADMIN)
    ).text
    parsed = {r["name"]: r for r in csv.DictReader(io.StringIO(csv_text))}
    assert parsed["d"]["status"] == "suspect"
    assert float(parsed["d"]["fedncl_score"]) == pytest.approx(q_d, rel=1e-5)
    # the primary detector (Fed-NCL here) has its own columns
    assert parsed["d"]["primary_detector"] == "fedncl"
    assert parsed["d"]["primary_status"] == "ok"
    assert float(parsed["d"]["primary_score"]) == pytest.approx(q_d, rel=1e-5)

    # a second flag makes d noisy; the next round's instructions say so
    await run_round(api, fed, 1)
    report = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    assert {r["name"]: r["status"] for r in report["clients"]}["d"] == "noisy"
    assert (await current(api, fed, "d"))["instructions"]["role"] == "noisy"
    assert (await current(api, fed, "a"))["instructions"]["role"] == "clean"
    # Fed-NCL judges sites, not classes: no class to restrict FedNoRo's distillation to
    assert (await current(api, fed, "d"))["instructions"]["distil_classes"] is None
    history = (
        await api.get(
            f"/api/v1/federations/{fed.id}/clients/{fed.client_ids['d']}/history", headers=ADMIN
        )
    ).json()
    assert [r["round"] for r in history["rounds"]] == [0, 1]
    assert all(r["flags"]["fedncl"] is True for r in history["rounds"])


async def test_client_history_reads_what_each_stored_audit_says(api: httpx.AsyncClient) -> None:
    # The history reads a few JSON paths of each stored audit in the database (not the whole
    # result): it must say what the full round view says, client by client and round by round.
    # (That a flag read on SQLite is a boolean, not 1, shows in the diagnostics test below: its
    # flagged rounds compare with `is True`.)
    config = {**FEDNCL, "method": "fedavg", "detectors": ["fednoro", "fedncl", "evidence"]}
    fed = await make_federation(api, clients=NAMES, rounds=3, config=config)
    await run_round(api, fed, 0)
    await run_round(api, fed, 1)
    audits = [
        (await api.get(f"/api/v1/federations/{fed.id}/rounds/{i}", headers=ADMIN)).json()["audit"]
        for i in (0, 1)
    ]
    seen_flag = False
    for name in NAMES:
        cid = fed.client_ids[name]
        url = f"/api/v1/federations/{fed.id}/clients/{cid}/history"
        history = (await api.get(url, headers=ADMIN)).json()
        assert [r["round"] for r in history["rounds"]] == [0, 1]
        for entry, audit in zip(history["rounds"], audits, strict=True):
            at = audit["client_ids"].index(str(cid))
            assert entry["primary_flag"] is audit["primary_flags"][at]
            assert entry["weight"] == pytest.approx(audit["aggregation"]["weights"][at])
            assert entry["neighbors"] == (audit.get("neighbors") or {}).get(str(cid))
            ran = {d: v for d, v in audit["detections"].items() if v is not None}
            assert set(entry["flags"]) == set(ran)
            for detector, detection in ran.items():
                verdict = (detection.get("verdicts") or [None] * 4)[at]
                if detection["status"] != "ok" or verdict is None:
                    assert entry["flags"][detector] is None
                    continue
                assert entry["flags"][detector] is verdict["flag"]
                assert entry["scores"][detector] == pytest.approx(verdict["score"])
                seen_flag |= verdict["flag"] is True
    assert seen_flag  # d's outlying update was flagged by some detector: the test saw a True


async def test_with_the_status_the_penalty_starts_at_the_second_flag(
    api: httpx.AsyncClient,
) -> None:
    config = {**FEDNCL, "audit": {"aggregation_flags": "status"}}
    fed = await make_federation(api, clients=NAMES, rounds=3, config=config)
    await run_round(api, fed, 0)
    audit = (await api.get(f"/api/v1/federations/{fed.id}/rounds/0", headers=ADMIN)).json()["audit"]
    # d is flagged, but one flag makes it "suspect" (noisy after 2 flags in 3 rounds): no
    # noisy client for the aggregation, no penalty
    assert (
        audit["detections"]["fedncl"]["verdicts"][audit["client_ids"].index(fed.client_ids["d"])][
            "flag"
        ]
        is True
    )
    assert audit["aggregation_flags"] == [False] * 4
    assert audit["aggregation"]["details"]["penalty"] == [1.0] * 4

    # round 1: d's second flag makes it noisy, so the aggregation penalises it
    await run_round(api, fed, 1)
    round1 = (await api.get(f"/api/v1/federations/{fed.id}/rounds/1", headers=ADMIN)).json()
    d_at = round1["audit"]["client_ids"].index(fed.client_ids["d"])
    assert round1["audit"]["aggregation_flags"] == [i == d_at for i in range(4)]
    assert round1["audit"]["aggregation"]["details"]["penalty"][d_at] > 1.0

    # recomputing round 0 now (d is noisy) replays the status as it was before round 0
    url = f"/api/v1/federations/{fed.id}/rounds/{{}}/recompute"
    again0 = (await api.post(url.format(0), json={}, headers=ADMIN)).json()
    assert again0["audit"]["aggregation_flags"] == [False] * 4
    assert again0["distance_to_actual_model"]["total"] == pytest.approx(0.0, abs=1e-6)
    again1 = (await api.post(url.format(1), json={}, headers=ADMIN)).json()
    assert again1["audit"]["aggregation_flags"] == round1["audit"]["aggregation_flags"]
    assert again1["distance_to_actual_model"]["total"] == pytest.approx(0.0, abs=1e-6)
    # ... and with status_m = 1 a single flag would have been enough in round 0
    m1 = {"audit": {"status_m": 1}}
    one_flag = (await api.post(url.format(0), json=m1, headers=ADMIN)).json()
    assert one_flag["audit"]["aggregation_flags"] == [
        i == audit["client_ids"].index(fed.client_ids["d"]) for i in range(4)
    ]
    assert one_flag["distance_to_actual_model"]["total"] > 0


async def test_client_sees_only_its_own_diagnostics(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api, clients=NAMES, rounds=2, config=FEDNCL)
    await run_round(api, fed, 0)
    mine = (
        await api.get(f"/api/v1/federations/{fed.id}/diagnostics", headers=fed.headers("d"))
    ).json()
    assert mine["name"] == "d"
    assert mine["status"] == "suspect"
    assert mine["flagged_rounds"] == [0]
    assert set(mine) == {
        "client_id",
        "name",
        "status",
        "latest_round",
        "flagged_rounds",
        "rounds_audited",
        "noisy_classes",
        "flag_basis",
        "scores",
        "advice",
    }
    # flagged in round 0 by its reported losses (the geometry needs 8 peers)
    assert mine["flag_basis"] == "losses"
    # the admin report and another client's history are closed to clients
    assert (
        await api.get(f"/api/v1/federations/{fed.id}/report", headers=fed.headers("d"))
    ).status_code == 401
    other = f"/api/v1/federations/{fed.id}/clients/{fed.client_ids['a']}/history"
    assert (await api.get(other, headers=fed.headers("d"))).status_code == 401


async def test_diagnostics_leave_the_warm_up_rounds_out(api: httpx.AsyncClient) -> None:
    # One warm-up round: d is flagged in round 0 (warm-up) and round 1 (FedAvg in the warm-up
    # gives round 1 the global model v = 1.5: q_d = 8 * 1.5^2 * 2.0 = 36 against 0.2 for the
    # others, still more than one standard deviation above the mean).
    fed = await make_federation(api, clients=NAMES, rounds=3, config={**FEDNCL, "warmup_rounds": 1})
    await run_round(api, fed, 0)
    await run_round(api, fed, 1)
    history_url = f"/api/v1/federations/{fed.id}/clients/{fed.client_ids['d']}/history"
    history = (await api.get(history_url, headers=ADMIN)).json()
    assert [(r["round"], r["primary_flag"]) for r in history["rounds"]] == [(0, True), (1, True)]
    mine = (
        await api.get(f"/api/v1/federations/{fed.id}/diagnostics", headers=fed.headers("d"))
    ).json()
    assert mine["flagged_rounds"] == [1]  # round 0's flag was in the warm-up
    assert mine["rounds_audited"] == 1
    assert mine["latest_round"] == 1
    report = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    row = {r["name"]: r for r in report["clients"]}["d"]
    assert (row["times_flagged"], row["rounds_audited"]) == (1, 1)  # the report agrees


async def test_pin_overrides_status_and_is_recorded(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api, clients=NAMES, rounds=3, config=FEDNCL)
    url = f"/api/v1/federations/{fed.id}/clients/{fed.client_ids['a']}/pin"
    no_reason = await api.put(url, json={"status": "noisy", "reason": ""}, headers=ADMIN)
    assert no_reason.status_code == 422
    pinned = await api.put(
        url, json={"status": "noisy", "reason": "known bad scanner"}, headers=ADMIN
    )
    assert pinned.status_code == 200
    assert pinned.json()["pinned_status"] == "noisy"
    await run_round(api, fed, 0)
    report = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    row = {r["name"]: r for r in report["clients"]}["a"]
    assert row["status"] == "noisy"
    assert row["pin_reason"] == "known bad scanner"
    # the pin reaches the aggregation: a's update (identical to b's and c's) is penalised
    round0 = (await api.get(f"/api/v1/federations/{fed.id}/rounds/0", headers=ADMIN)).json()
    weights = round0["aggregation_weights"]
    assert weights[fed.client_ids["a"]] < weights[fed.client_ids["b"]]
    assert (
        round0["audit"]["effective_flags"][round0["audit"]["client_ids"].index(fed.client_ids["a"])]
        is True
    )
    assert (await current(api, fed, "a"))["instructions"]["role"] == "noisy"
    unpinned = await api.delete(url, headers=ADMIN)
    assert unpinned.json()["pinned_status"] is None
    events = (await api.get(f"/api/v1/federations/{fed.id}/events", headers=ADMIN)).json()["items"]
    pins = [e for e in events if e["kind"] in ("client.pinned", "client.unpinned")]
    assert [e["kind"] for e in pins] == ["client.pinned", "client.unpinned"]
    assert pins[0]["actor"] == "admin"
    assert "known bad scanner" in pins[0]["message"]


async def test_recompute_is_a_what_if_that_changes_nothing(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api, clients=NAMES, rounds=2, config=FEDNCL)
    await run_round(api, fed, 0)
    before = (await api.get(f"/api/v1/federations/{fed.id}/rounds/0", headers=ADMIN)).json()
    url = f"/api/v1/federations/{fed.id}/rounds/0/recompute"

    same = (await api.post(url, json={}, headers=ADMIN)).json()
    assert same["distance_to_actual_model"]["total"] == pytest.approx(0.0, abs=1e-6)
    assert same["weights"] == pytest.approx(before["aggregation_weights"])

    # FedAvg without client d: the three clean clients (all 1.0) average to exactly 1.0,
    # while the stored model (layer-wise, d included) is not 1.0 -> a positive distance.
    without_d = (
        await api.post(
            url,
            json={"audit": {"aggregation": "fedavg"}, "exclude_clients": [fed.client_ids["d"]]},
            headers=ADMIN,
        )
    ).json()
    assert set(without_d["weights"]) == {fed.client_ids[n] for n in ("a", "b", "c")}
    assert all(w == pytest.approx(1 / 3) for w in without_d["weights"].values())
    assert without_d["distance_to_actual_model"]["total"] > 0
    median = (await api.post(url, json={"audit": {"aggregation": "median"}}, headers=ADMIN)).json()
    assert median["aggregation_rule"] == "median"

    bad = await api.post(url, json={"audit": {"aggregation": "nope"}}, headers=ADMIN)
    assert bad.status_code == 400
    open_round = await api.post(
        f"/api/v1/federations/{fed.id}/rounds/1/recompute", json={}, headers=ADMIN
    )
    assert open_round.status_code == 400
    after = (await api.get(f"/api/v1/federations/{fed.id}/rounds/0", headers=ADMIN)).json()
    assert after == before
    assert np.isfinite(without_d["distance_to_actual_model"]["total"])


async def test_report_takes_each_clients_latest_audit_walking_back_in_pages(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    fed = await make_federation(api, clients=NAMES, rounds=4, config=FEDNCL)
    for index in range(3):
        await run_round(api, fed, index)
    sessions = app.state.services.sessions
    fid = uuid.UUID(fed.id)
    with sessions.begin() as session:
        assert [a.round_index for a in repo.audits_newest_first(session, fid, batch=2)] == [
            2,
            1,
            0,
        ]
        assert repo.count_audits(session, fid) == 3
        # Client d is left out of the audits of rounds 1 and 2 (as if it had not reported).
        for audit in list(repo.audits_newest_first(session, fid))[:-1]:  # rounds 2 and 1
            result = copy.deepcopy(audit.result)
            result["client_ids"] = [
                str(uuid.uuid4()) if c == fed.client_ids["d"] else c for c in result["client_ids"]
            ]
            audit.result = result

    report = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()

    rows = {row["name"]: row for row in report["clients"]}
    assert report["rounds_audited"] == 3
    assert report["latest"]["round"] == 2
    assert rows["a"]["latest_round"] == 2
    assert rows["d"]["latest_round"] == 0
    assert rows["d"]["latest_flags"]["fedncl"] is True


async def fednoro_round(api, losses: dict[str, float]):
    """A FedNoRo-only federation (no warm-up) whose round 0 closes with each client's loss on
    both classes (5 + 5 samples each)."""
    config = {
        "method": "fedavg",
        "primary_detector": "fednoro",
        "detectors": ["fednoro"],
        "warmup_rounds": 0,
    }
    fed = await make_federation(api, clients=NAMES, rounds=2, config=config)
    for name in NAMES:
        response = await submit(
            api,
            fed,
            name,
            0,
            tiny_state(1.0),
            10,
            signal_overrides={"per_class_loss": [losses[name]] * 2},
        )
        assert response.status_code == 201, response.text
    return fed


async def test_fednoro_verdicts_carry_the_graded_score_and_the_probability(
    api: httpx.AsyncClient,
) -> None:
    # Every client holds both classes (5 + 5). Losses per class: a, b, c [0.2, 0.2], [0.3, 0.3],
    # [0.4, 0.4]; d [2.0, 2.0]. Per class: mu = (0.2 + 0.3 + 0.4 + 2.0) / 4 = 0.725,
    # deviations -0.525, -0.425, -0.325, 1.275; sigma^2 = 5 * (0.275625 + 0.180625 + 0.105625
    # + 1.625625) / 4 = 2.734375, sigma = 1.6536. z_kc = sqrt(5) * dev / sigma, and Stouffer
    # over two equal classes gives Z = sqrt(2) * z_kc: d: sqrt(10) * 1.275 / 1.6536 = 2.4382,
    # a: sqrt(10) * -0.525 / 1.6536 = -1.0040.
    fed = await fednoro_round(api, {"a": 0.2, "b": 0.3, "c": 0.4, "d": 2.0})
    audit = (await api.get(f"/api/v1/federations/{fed.id}/rounds/0", headers=ADMIN)).json()["audit"]
    fednoro = audit["detections"]["fednoro"]
    assert fednoro["status"] == "ok"
    by_name = {
        name: fednoro["verdicts"][audit["client_ids"].index(fed.client_ids[name])] for name in NAMES
    }
    assert by_name["d"]["score"] == pytest.approx(2.4382, abs=1e-4)
    assert by_name["a"]["score"] == pytest.approx(-1.0040, abs=1e-4)
    for verdict in by_name.values():
        assert verdict["score"] == verdict["evidence"]["class_z"]
        assert 0.0 <= verdict["probability"] <= 1.0
    report = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    scores = {row["name"]: row["latest_scores"]["fednoro"] for row in report["clients"]}
    assert scores == {name: by_name[name]["score"] for name in NAMES}


async def test_report_before_any_audit_has_an_empty_latest(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api, clients=NAMES, rounds=2, config=FEDNCL)
    report = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    assert report["latest"] == {}
    assert report["rounds_audited"] == 0
    row = {r["name"]: r for r in report["clients"]}["a"]
    assert row["latest_scores"] is None
    assert row["pinned_status"] is None  # nulls of the rows stay in the JSON
    assert row["flag_history"] == []


async def test_report_warns_when_most_clients_and_most_data_are_flagged(
    api: httpx.AsyncClient,
) -> None:
    # FedNoRo alone, no warm-up: a, b and c lose 2.0 on both classes, d 0.1. The mixture's noisy
    # group is a, b, c; within each group the statistic is identical, so Ashman's D is infinite
    # and the guard passes: 3 of the 4 clients, holding 30 of the 40 samples (75 %), flagged.
    fed = await fednoro_round(api, {"a": 2.0, "b": 2.0, "c": 2.0, "d": 0.1})
    report = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    assert sorted(r["name"] for r in report["clients"] if r["latest_flags"]["fednoro"]) == [
        "a",
        "b",
        "c",
    ]
    (warning,) = report["latest"]["warnings"]
    assert warning.startswith("3 of the 4 clients, holding 75% of round 0's samples, are flagged")
    assert "inverted" in warning


async def test_report_does_not_warn_when_the_flagged_clients_are_a_minority_of_the_data(
    api: httpx.AsyncClient,
) -> None:
    fed = await make_federation(api, clients=NAMES, rounds=3, config=FEDNCL)
    await run_round(api, fed, 0)  # d alone flagged, with 10 of the 40 samples
    report = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    assert report["latest"]["warnings"] == []
    # one client of four holding most of the data is not "most clients": still no warning
    fed = await make_federation(
        api,
        clients=NAMES,
        rounds=3,
        config=FEDNCL,
        name="fed-2",
        joins={"d": {"num_samples": 40, "class_counts": [20, 20]}},
    )
    await run_round(api, fed, 0, noisy_samples=40)  # d flagged, with 40 of the 70 samples
    report = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    assert [r["name"] for r in report["clients"] if r["latest_flags"]["fedncl"]] == ["d"]
    assert report["latest"]["warnings"] == []


async def test_a_score_without_an_answer_carries_the_detectors_status_and_reason(
    api: httpx.AsyncClient,
) -> None:
    # Three sites: Fed-NCL (3 needed) answers, FedNoRo (4 needed) is undetermined.
    config = {**FEDNCL, "detectors": ["fedncl", "fednoro"]}
    fed = await make_federation(api, clients=("a", "b", "c"), rounds=2, config=config)
    for name in ("a", "b", "c"):
        response = await submit(api, fed, name, 0, tiny_state(1.0), 10)
        assert response.status_code == 201, response.text
    report = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    row = {r["name"]: r for r in report["clients"]}["a"]
    assert row["latest_statuses"] == {"fedncl": "ok", "fednoro": "undetermined"}
    assert row["latest_scores"]["fednoro"] is None
    assert row["latest_scores"]["fedncl"] is not None
    fednoro = report["latest"]["detectors"]["fednoro"]
    assert fednoro["status"] == "undetermined"
    assert fednoro["reason"]  # FedNoRo's own words: fewer sites than it needs
    assert report["latest"]["detectors"]["fedncl"] == {"status": "ok", "reason": None}
    history = (
        await api.get(
            f"/api/v1/federations/{fed.id}/clients/{fed.client_ids['a']}/history", headers=ADMIN
        )
    ).json()
    assert history["rounds"][0]["statuses"] == {"fedncl": "ok", "fednoro": "undetermined"}

    from rich.console import Console

    from client_sdk.report_table import render_report

    console = Console(width=250, record=True)
    console.print(render_report(report))
    text = console.export_text()
    assert "n/a (undetermined)" in text
    assert f"FedNoRo undetermined in round 0: {fednoro['reason']}" in text


async def test_each_flagged_site_has_an_event_and_a_log_line_per_round(
    api: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    # Fed-NCL flags d in every round (see run_round); rounds 0 and 1 are the warm-up here,
    # where a flag counts toward no status: no event then.
    fed = await make_federation(api, clients=NAMES, rounds=4, config={**FEDNCL, "warmup_rounds": 2})
    with caplog.at_level("INFO", logger="fedaudit.events"):
        for index in range(4):
            await run_round(api, fed, index)
    events = (
        await api.get(f"/api/v1/federations/{fed.id}/events?kind=client.flagged", headers=ADMIN)
    ).json()["items"]
    assert sorted(e["data"]["round"] for e in events) == [2, 3]
    assert {e["client_id"] for e in events} == {fed.client_ids["d"]}
    assert all(e["data"]["detector"] == "fedncl" for e in events)
    assert all(e["data"]["score"] > 0 for e in events)
    lines = [r for r in caplog.records if r.__dict__.get("event") == "client.flagged"]
    assert [r.getMessage() for r in lines] == [
        f"client.flagged: client 'd' flagged in round {i} by fedncl (score "
        f"{e['data']['score']:.3f})"
        for i, e in zip((2, 3), sorted(events, key=lambda e: e["data"]["round"]), strict=True)
    ]
    assert all(r.__dict__["client_id"] == fed.client_ids["d"] for r in lines)
