"""Trust anchors: marked through the API (and CLI), recorded, and used by the evidence detector."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import make_federation
from tests.api.test_rounds import submit
from tests.factories import ADMIN, tiny_state

pytestmark = [pytest.mark.anyio, pytest.mark.db]

NAMES = ("a", "b", "c", "d", "e")
EVIDENCE = {
    "method": "fedavg",
    "detectors": ["evidence"],
    "primary_detector": "evidence",
    "warmup_rounds": 0,
}
# The global model learned inverted labels: the curated site a and the other clean site b lose
# 2.0 nats per sample, the three inverted sites about 0.2. Against the consensus a and b look
# noisy (z of about 6.4 per class with spread 0.5 over 5 samples); with a as the anchor, the
# orientation flips and c, d, e are the ones far from it.
LOSS = {"a": 2.0, "b": 2.0, "c": 0.2, "d": 0.21, "e": 0.22}


async def run_round(
    api: httpx.AsyncClient, fed, index: int, loss: dict[str, float] | None = None
) -> None:
    """Every site of NAMES uploads round `index` with its loss on both classes (5 + 5 samples,
    spread 0.5); `loss` defaults to LOSS (the inverted consensus)."""
    loss = LOSS if loss is None else loss
    for name in NAMES:
        response = await submit(
            api,
            fed,
            name,
            index,
            tiny_state(1.0),
            10,
            signal_overrides={
                "class_counts": [5, 5],
                "per_class_loss": [loss[name]] * 2,
                "per_class_loss_sd": [0.5, 0.5],
            },
        )
        assert response.status_code == 201, response.text


def _flags(round_json: dict) -> dict[str, bool]:
    audit = round_json["audit"]
    evidence = audit["detections"]["evidence"]
    ids = audit["client_ids"]
    return {cid: v["flag"] for cid, v in zip(ids, evidence["verdicts"], strict=True)}


async def test_an_anchor_resolves_an_inverted_consensus(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api, clients=NAMES, rounds=2, config=EVIDENCE)
    by_id = {cid: name for name, cid in fed.client_ids.items()}

    await run_round(api, fed, 0)
    round0 = (await api.get(f"/api/v1/federations/{fed.id}/rounds/0", headers=ADMIN)).json()
    flagged0 = sorted(by_id[c] for c, f in _flags(round0).items() if f)
    assert flagged0 == ["a", "b"]  # the consensus accuses the clean sites
    assert round0["audit"]["detections"]["evidence"]["summary"]["mode"] == "consensus"

    url = f"/api/v1/federations/{fed.id}/clients/{fed.client_ids['a']}/anchor"
    assert (await api.put(url, json={"reason": ""}, headers=ADMIN)).status_code == 422
    marked = await api.put(
        url, json={"reason": "labels re-read by two radiologists"}, headers=ADMIN
    )
    assert marked.status_code == 200
    assert marked.json()["anchor"] is True
    assert marked.json()["anchor_reason"] == "labels re-read by two radiologists"

    await run_round(api, fed, 1)
    round1 = (await api.get(f"/api/v1/federations/{fed.id}/rounds/1", headers=ADMIN)).json()
    summary = round1["audit"]["detections"]["evidence"]["summary"]
    assert summary["mode"] == "anchored"
    assert summary["anchor_orientation"] == "inverted"
    assert sorted(by_id[c] for c, f in _flags(round1).items() if f) == ["c", "d", "e"]
    # the report says which site is the anchor, and why
    report = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    rows = {r["name"]: r for r in report["clients"]}
    assert [n for n, r in rows.items() if r["anchor"]] == ["a"]
    assert rows["a"]["anchor_reason"] == "labels re-read by two radiologists"
    assert rows["b"]["anchor_reason"] is None

    removed = await api.delete(url, headers=ADMIN)
    assert removed.json()["anchor"] is False
    events = (await api.get(f"/api/v1/federations/{fed.id}/events", headers=ADMIN)).json()["items"]
    kinds = [e["kind"] for e in events if e["kind"].startswith("client.") and "anchor" in e["kind"]]
    assert kinds == ["client.anchored", "client.unanchored"]


async def test_anchor_needs_admin_and_a_known_client(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api, clients=NAMES, rounds=1, config=EVIDENCE)
    url = f"/api/v1/federations/{fed.id}/clients/{fed.client_ids['a']}/anchor"
    assert (await api.put(url, json={"reason": "x"}, headers=fed.headers("a"))).status_code == 401
    unknown = f"/api/v1/federations/{fed.id}/clients/{fed.id}/anchor"
    assert (await api.put(unknown, json={"reason": "x"}, headers=ADMIN)).status_code == 404
