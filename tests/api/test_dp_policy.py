"""The Gaussian mechanism in a federation's privacy policy: invalid settings refused at creation
(422 problem+json), what the mechanism never sends refused in an update, and the budget stored
with each round's audit and shown in the report, a site's history and the dashboard."""

from __future__ import annotations

import csv
import io
import sys
from typing import Any

import pytest
from rich.console import Console

from client_sdk.report_table import render_report
from service.coordinator.privacy_budget import epsilon
from tests.api.conftest import make_federation
from tests.api.test_rounds import submit
from tests.factories import ADMIN, federation_spec, tiny_state

pytestmark = [pytest.mark.anyio, pytest.mark.db]

DP = {"dp_noise_multiplier": 1.5, "dp_clip_loss": 4.0, "dp_delta": 1e-5}
CONFIG = {
    "method": "fedavg",
    "detectors": ["fednoro", "evidence"],
    "primary_detector": "evidence",
    "privacy": DP,
}


@pytest.mark.parametrize(
    ("privacy", "field"),
    [
        (
            {"dp_noise_multiplier": -0.5, "dp_clip_loss": 4.0, "dp_delta": 1e-5},
            "dp_noise_multiplier",
        ),
        ({"dp_noise_multiplier": 1.0, "dp_delta": 1e-5}, "dp_clip_loss required"),
        ({"dp_noise_multiplier": 1.0, "dp_clip_loss": 4.0}, "dp_delta required"),
        ({"dp_noise_multiplier": 1.0, "dp_clip_loss": 4.0, "dp_delta": 2.0}, "dp_delta"),
        ({"dp_noise_multiplier": 1.0, "dp_clip_loss": -1, "dp_delta": 1e-5}, "dp_clip_loss"),
        ({"dp_clip_loss": 4.0}, "without dp_noise_multiplier"),
        ({"dp_noise_multiplier": "lots", "dp_clip_loss": 4.0, "dp_delta": 1e-5}, "dp_noise"),
    ],
    ids=[
        "negative-sigma",
        "no-clip",
        "no-delta",
        "delta-above-1",
        "negative-clip",
        "stray",
        "text",
    ],
)
async def test_invalid_dp_settings_are_refused(api, privacy: dict[str, Any], field: str) -> None:
    spec = federation_spec(config={**CONFIG, "privacy": privacy})
    response = await api.post("/api/v1/federations", json=spec, headers=ADMIN)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"] == "/problems/validation-error"
    assert field in str(problem["errors"]), problem
    listed = await api.get("/api/v1/federations", headers=ADMIN)
    assert listed.json()["total"] == 0


async def test_without_the_accountant_the_federation_is_refused(api, monkeypatch) -> None:
    # The package absent: importing it fails (None in sys.modules makes `import` raise).
    monkeypatch.setitem(sys.modules, "dp_accounting", None)
    response = await api.post(
        "/api/v1/federations", json=federation_spec(config=CONFIG), headers=ADMIN
    )
    assert response.status_code == 501, response.text
    assert response.json()["type"] == "/problems/dp-accounting-unavailable"
    assert "fedaudit[dp]" in response.json()["detail"]


def dp_signals(loss: float, **overrides: Any) -> dict[str, Any]:
    return {"class_counts": [5, 5], "per_class_loss": [loss, loss], **overrides}


@pytest.mark.parametrize(
    ("overrides", "loc"),
    [
        ({"per_class_loss_sd": [0.1, 0.1]}, ["metadata", "signals", "per_class_loss_sd"]),
        ({"per_class_errors": [1, 0]}, ["metadata", "signals", "per_class_errors"]),
        (
            {"per_class_errors": [1, 0], "per_class_confident_errors": [1, 0]},
            ["metadata", "signals", "per_class_confident_errors"],
        ),
        ({"per_class_loss": [4.5, 0.5]}, ["metadata", "signals", "per_class_loss", 0]),
    ],
    ids=["spread", "errors", "confident-errors", "above-clip"],
)
async def test_what_the_mechanism_never_sends_is_refused(api, overrides, loc) -> None:
    pytest.importorskip("dp_accounting")
    fed = await make_federation(api, config=CONFIG)
    response = await submit(
        api, fed, "a", 0, tiny_state(1.0), 10, signal_overrides=dp_signals(0.5, **overrides)
    )
    assert response.status_code == 422, response.text
    assert response.json()["type"] == "/problems/privacy-policy"
    assert loc in [e["loc"] for e in response.json()["errors"]]


async def test_each_round_stores_the_budget_and_the_report_shows_it(api) -> None:
    pytest.importorskip("dp_accounting")
    fed = await make_federation(api, config=CONFIG, rounds=3)
    # a sends in rounds 0, 1 and 2; b in rounds 0 and 2 (round 1 closed without it by hand)
    for index in range(3):
        names = ("a", "b") if index != 1 else ("a",)
        for name in names:
            response = await submit(
                api,
                fed,
                name,
                index,
                tiny_state(float(index)),
                10,
                signal_overrides=dp_signals(1.0),
            )
            assert response.status_code == 201, response.text
        if index == 1:
            closed = await api.post(
                f"/api/v1/federations/{fed.id}/rounds/1/close",
                json={"reason": "b is late"},
                headers=ADMIN,
            )
            assert closed.status_code in (200, 202), closed.text
    per_round = epsilon(1.5, 1e-5, 1)  # one noised signal per update (per_class_loss)
    a, b = fed.client_ids["a"], fed.client_ids["b"]
    expected_totals = {0: {a: 1, b: 1}, 1: {a: 2}, 2: {a: 3, b: 2}}
    for index, totals in expected_totals.items():
        audit = (
            await api.get(f"/api/v1/federations/{fed.id}/rounds/{index}", headers=ADMIN)
        ).json()["audit"]
        privacy = audit["privacy"]
        assert privacy["epsilon_round"] == pytest.approx(per_round)
        by_client = dict(zip(audit["client_ids"], privacy["releases_total"], strict=True))
        assert by_client == totals
        eps = dict(zip(audit["client_ids"], privacy["epsilon_total"], strict=True))
        for cid, n in totals.items():
            assert eps[cid] == pytest.approx(epsilon(1.5, 1e-5, n))
    report = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    assert report["privacy"]["epsilon_per_round"] == pytest.approx(per_round)
    assert report["privacy"]["noise_multiplier"] == 1.5
    rows = {row["name"]: row for row in report["clients"]}
    assert rows["a"]["epsilon_total"] == pytest.approx(epsilon(1.5, 1e-5, 3))
    assert rows["b"]["epsilon_total"] == pytest.approx(epsilon(1.5, 1e-5, 2))
    assert rows["a"]["epsilon_total"] > rows["b"]["epsilon_total"] > per_round
    history = (
        await api.get(f"/api/v1/federations/{fed.id}/clients/{b}/history", headers=ADMIN)
    ).json()
    assert [(r["round"], r["epsilon_total"]) for r in history["rounds"]] == [
        (0, pytest.approx(per_round)),
        (2, pytest.approx(epsilon(1.5, 1e-5, 2))),
    ]
    csv_rows = {
        r["name"]: r
        for r in csv.DictReader(
            io.StringIO(
                (
                    await api.get(f"/api/v1/federations/{fed.id}/report?format=csv", headers=ADMIN)
                ).text
            )
        )
    }
    assert float(csv_rows["b"]["epsilon_total"]) == pytest.approx(
        rows["b"]["epsilon_total"], rel=1e-5
    )
    # `fedaudit report`'s table
    console = Console(width=200, record=True)
    console.print(render_report(report))
    table = console.export_text()
    assert "Gaussian mechanism: sigma 1.5" in table
    assert "eps total" in table
    assert f"{rows['a']['epsilon_total']:.3g}" in table
    page = await api.get(f"/admin/federations/{fed.id}", headers=ADMIN)
    assert page.status_code == 200
    assert "Gaussian mechanism" in page.text
    assert "\u03b5 total" in page.text
    client_page = await api.get(f"/admin/federations/{fed.id}/clients/{b}", headers=ADMIN)
    assert client_page.status_code == 200
    assert "\u03b5 round" in client_page.text


async def test_a_federation_without_the_mechanism_reports_no_budget(api) -> None:
    fed = await make_federation(api)
    for name in ("a", "b"):
        response = await submit(api, fed, name, 0, tiny_state(1.0), 10)
        assert response.status_code == 201, response.text
    audit = (await api.get(f"/api/v1/federations/{fed.id}/rounds/0", headers=ADMIN)).json()
    assert audit["audit"].get("privacy") is None
    report = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    assert report["privacy"] is None
    assert all(row["epsilon_total"] is None for row in report["clients"])
