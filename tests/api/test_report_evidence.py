"""Each detector's evidence beside the verdict, end to end: a round's stored audit replaced by a
literal one with hand-written values, read back through the report (JSON and CSV), a client's
history, the dashboard's client page and the SDK's typed report; an audit without them (stored by
an older version) shows them as null, not as an error."""

from __future__ import annotations

import csv
import io
import uuid
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from client_sdk import ClientHistory, NoisyClientReport
from service.store import repositories as repo
from tests.api.conftest import make_federation
from tests.api.test_reports import FEDNCL, NAMES, run_round
from tests.factories import ADMIN

pytestmark = [pytest.mark.anyio, pytest.mark.db]

CLASSES = ["<i>cat</i>", "=dog"]  # escaped on the page, not run as a formula in the CSV


def evidence_verdict(site_z: float) -> dict[str, Any]:
    return {
        "score": site_z,
        "flag": site_z > 3,
        "evidence": {
            "p_value": 0.0012,
            "q_value": 0.0024,
            "site_z": site_z,
            "site_factor": 1.75,
            "stouffer_z": 2.5,
            "class_z": [0.25, 4.5],
            "noisy_classes": [1] if site_z > 3 else [],
            "mean_loss": 1.125,
            "errors": 7,
            "errors_expected": 2.5,
            "errors_z": 2.75,
            "errors_p_value": 0.003,
            "accuracy_z": -0.5,
            "accuracy_p_value": 0.69,
            "accuracy_gap": -0.02,
            "flagged_by_accuracy": False,
            "geometry_cosine": 0.125,
            "geometry_z": 11.5,
            "geometry_p_value": 1e-6,
            "flagged_by_geometry": False,
        },
    }


def literal_audit(client_ids: list[str], noisy: str) -> dict[str, Any]:
    """A stored audit in which every detector's verdict on each client is hand-written, the
    client ``noisy`` flagged."""
    last = client_ids.index(noisy)
    verdicts = [evidence_verdict(3.25 if i == last else 0.5) for i in range(len(client_ids))]
    fedncl = [
        {
            "score": 144.0 if i == last else 0.8,
            "flag": i == last,
            "evidence": {"divergence": 72.0, "data_quality": 20.0, "deviation": 1.75},
        }
        for i in range(len(client_ids))
    ]
    fednoro = [
        {
            "score": 2.125,
            "flag": i == last,
            "evidence": {
                "normalised_loss": [0.0, 0.875],
                "noisy_classes": [1] if i == last else [],
                "mean_loss": 1.5,
                "class_z": 2.125,
                "gmm_noisy_probability": 0.9375,
                "noisy_votes": 9,
            },
        }
        for i in range(len(client_ids))
    ]
    return {
        "client_ids": client_ids,
        "primary": "evidence",
        "primary_flags": [i == last for i in range(len(client_ids))],
        "detections": {
            "evidence": {"method": "evidence", "status": "ok", "verdicts": verdicts},
            "fednoro": {"method": "fednoro", "status": "ok", "verdicts": fednoro},
            "fedncl": {"method": "fedncl", "status": "ok", "verdicts": fedncl},
        },
        "aggregation": {"rule": "fedavg", "weights": [0.25] * len(client_ids)},
        "round_index": 0,
        "in_warmup": False,
    }


async def federation_with(api: httpx.AsyncClient, app: FastAPI, result: Any) -> Any:
    """A federation whose round 0's stored audit is replaced by ``result(client_ids, d's id)``."""
    fed = await make_federation(api, clients=NAMES, rounds=2, config=FEDNCL)
    await run_round(api, fed, 0)
    with app.state.services.sessions.begin() as session:
        fid = uuid.UUID(fed.id)
        (audit,) = repo.audits_newest_first(session, fid)
        audit.result = result(list(audit.result["client_ids"]), fed.client_ids["d"])
        federation = repo.get_federation(session, fid)
        assert federation is not None
        federation.class_names = CLASSES
    return fed


async def test_the_report_shows_the_stored_evidence_everywhere(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    fed = await federation_with(api, app, literal_audit)
    base = f"/api/v1/federations/{fed.id}"

    report = (await api.get(f"{base}/report", headers=ADMIN)).json()
    row = {r["name"]: r for r in report["clients"]}["d"]
    found = row["latest_detector_evidence"]
    assert found["evidence"]["site_z"] == 3.25
    assert (found["evidence"]["stouffer_z"], found["evidence"]["errors_z"]) == (2.5, 2.75)
    assert (found["evidence"]["errors"], found["evidence"]["errors_p_value"]) == (7, 0.003)
    assert found["evidence"]["accuracy_z"] == -0.5
    assert (found["evidence"]["geometry_cosine"], found["evidence"]["geometry_z"]) == (0.125, 11.5)
    assert found["fedncl"] == {
        "q": 144.0,
        "divergence": 72.0,
        "data_quality": 20.0,
        "deviation": 1.75,
    }
    assert found["fednoro"]["separation_score"] == 2.125
    assert found["expertise"] is None  # not run
    assert row["latest_class_evidence"] == [
        {
            "index": 0,
            "label": "<i>cat</i>",
            "evidence_z": 0.25,
            "fednoro_normalised_loss": 0.0,
            "noisy_by": [],
        },
        {
            "index": 1,
            "label": "=dog",
            "evidence_z": 4.5,
            "fednoro_normalised_loss": 0.875,
            "noisy_by": ["fednoro", "evidence"],
        },
    ]
    typed = NoisyClientReport.model_validate(report)  # the SDK's report objects
    sdk_row = {c.name: c for c in typed.clients}["d"]
    assert sdk_row.latest_detector_evidence is not None
    assert sdk_row.latest_detector_evidence.evidence is not None
    assert sdk_row.latest_detector_evidence.evidence.geometry_z == 11.5
    assert sdk_row.latest_class_evidence[1].evidence_z == 4.5

    history = (await api.get(f"{base}/clients/{fed.client_ids['d']}/history", headers=ADMIN)).json()
    (entry,) = history["rounds"]
    assert entry["detector_evidence"] == found  # read in the database: the same values
    assert entry["class_evidence"] == row["latest_class_evidence"]
    typed_history = ClientHistory.model_validate(history)
    assert typed_history.rounds[0].class_evidence[0].label == "<i>cat</i>"

    text = (await api.get(f"{base}/report", params={"format": "csv"}, headers=ADMIN)).text
    cells = {r["name"]: r for r in csv.DictReader(io.StringIO(text))}["d"]
    assert (cells["evidence_site_z"], cells["evidence_geometry_z"]) == ("3.25", "11.5")
    assert (cells["fedncl_divergence"], cells["fedncl_data_quality"]) == ("72", "20")
    assert cells["evidence_class_z"] == "<i>cat</i>:0.25 =dog:4.5"
    assert cells["fednoro_normalised_loss"] == "<i>cat</i>:0 =dog:0.875"

    page = (
        await api.get(f"/admin/federations/{fed.id}/clients/{row['client_id']}", headers=ADMIN)
    ).text
    assert "<i>cat" not in page
    assert "<td>&lt;i&gt;cat&lt;/i&gt;</td>" in page
    assert '<td>geometry_z</td><td class="num">11.5</td>' in page
    assert '<td>divergence</td><td class="num">72</td>' in page
    assert '<td>=dog</td><td class="num">5</td><td class="num">4.5</td>' in page


async def test_an_audit_without_evidence_shows_nulls(api: httpx.AsyncClient, app: FastAPI) -> None:
    def older(client_ids: list[str], noisy: str) -> dict[str, Any]:
        result = literal_audit(client_ids, noisy)
        for detection in result["detections"].values():
            for verdict in detection["verdicts"]:
                del verdict["evidence"]
        del result["detections"]["fednoro"]
        return result

    fed = await federation_with(api, app, older)
    base = f"/api/v1/federations/{fed.id}"
    report = (await api.get(f"{base}/report", headers=ADMIN)).json()
    row = {r["name"]: r for r in report["clients"]}["d"]
    assert row["latest_detector_evidence"] == {
        "evidence": None,
        "fednoro": None,
        "fedncl": None,
        "expertise": None,
    }
    assert row["latest_class_evidence"] == []
    assert row["latest_scores"]["evidence"] == 3.25
    NoisyClientReport.model_validate(report)
    text = (await api.get(f"{base}/report", params={"format": "csv"}, headers=ADMIN)).text
    cells = {r["name"]: r for r in csv.DictReader(io.StringIO(text))}["d"]
    assert cells["evidence_site_z"] == ""
    assert cells["evidence_class_z"] == ""
    page = await api.get(f"/admin/federations/{fed.id}/clients/{row['client_id']}", headers=ADMIN)
    assert page.status_code == 200
    assert "holds no detector evidence for the site" in page.text
