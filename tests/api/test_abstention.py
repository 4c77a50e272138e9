"""An audit that abstains says so: the event trail, the report, the dashboard and /metrics."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import make_federation
from tests.api.test_anchors import EVIDENCE, NAMES
from tests.api.test_anchors import run_round as close_round
from tests.api.test_metrics import parse_exposition, value
from tests.factories import ADMIN

pytestmark = [pytest.mark.anyio, pytest.mark.db]


async def test_an_inconclusive_round_is_recorded_and_counted(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api, clients=NAMES, rounds=3, config=EVIDENCE)
    # Two balanced classes: a model that predicts the prior loses ln 2 = 0.693 nats per sample.
    # Round 0: every site loses about that (1 - L/H < 0 < 0.05), so the audit abstains.
    await close_round(api, fed, 0, {"a": 0.70, "b": 0.71, "c": 0.72, "d": 0.73, "e": 3.0})
    # Round 1: the model learned (0.2 nats), and e stands out: an ordinary verdict.
    await close_round(api, fed, 1, {"a": 0.20, "b": 0.21, "c": 0.22, "d": 0.23, "e": 2.0})

    events = (await api.get(f"/api/v1/federations/{fed.id}/events", headers=ADMIN)).json()
    abstained = [e for e in events["items"] if e["kind"].startswith("audit.")]
    assert [(e["kind"], e["data"]["index"]) for e in abstained] == [("audit.inconclusive", 0)]
    assert abstained[0]["data"]["detector"] == "evidence"
    # not an abstention for a noisy majority (what majority_memory counts)
    assert abstained[0]["data"]["majority"] is False
    assert "does not beat the label prior" in abstained[0]["message"]

    report = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    rows = {row["name"]: row for row in report["clients"]}
    for name in NAMES:
        history = rows[name]["flag_history"]
        assert [(h["round"], h["verdict"]) for h in history] == [(0, "inconclusive"), (1, "ok")]
        # round 0 gives no flag at all, not a clean one: e's 3.0 nats are not held against it
        assert history[0]["primary"] is None
    assert rows["e"]["flag_history"][1]["primary"] is True
    assert rows["a"]["flag_history"][1]["primary"] is False

    page = await api.get(f"/admin/federations/{fed.id}", headers=ADMIN)
    assert page.status_code == 200
    assert 'class="flag inconclusive"' in page.text
    assert "round 0: inconclusive (the audit abstained: suspect consensus)" in page.text
    assert "round 1: flagged noisy" in page.text

    metrics = parse_exposition((await api.get("/metrics")).text)
    assert value(metrics, "fedaudit_audits_abstained_total", status="inconclusive") == 1
    assert value(metrics, "fedaudit_audits_abstained_total", status="undetermined") == 0


async def test_an_abstention_for_a_noisy_majority_says_so_in_its_event(
    api: httpx.AsyncClient,
) -> None:
    fed = await make_federation(api, clients=NAMES, rounds=2, config=EVIDENCE)
    # the model learned, and three of the five sites stand out: not a clear minority
    await close_round(api, fed, 0, {"a": 0.20, "b": 0.21, "c": 0.50, "d": 0.52, "e": 0.55})
    events = (await api.get(f"/api/v1/federations/{fed.id}/events", headers=ADMIN)).json()
    abstained = [e for e in events["items"] if e["kind"] == "audit.inconclusive"]
    assert len(abstained) == 1, events
    assert abstained[0]["data"]["majority"] is True, abstained[0]["message"]
