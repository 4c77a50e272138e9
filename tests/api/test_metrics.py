"""/metrics: the Prometheus exposition, read from the database (same answer on every replica)."""

from __future__ import annotations

import json
import math
import platform
import re
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

import service
from service.api.prometheus import DatabaseCollector, MetricFamily, render
from service.config import Settings
from service.main import create_app
from tests.api.conftest import make_federation
from tests.api.test_rounds import submit
from tests.factories import ADMIN, state_bytes, tiny_state

pytestmark = [pytest.mark.anyio, pytest.mark.db]


def parse_exposition(text: str) -> dict[str, dict]:
    """The exposition parsed by prometheus_client's own parser, keyed by sample name (a
    counter's ``..._total``, a histogram's ``..._bucket``/``_sum``/``_count``): each with its
    family's help and type and its samples by sorted label tuples. Duplicates fail."""
    assert text.endswith("\n")
    families: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            entry = families.setdefault(
                sample.name, {"help": family.documentation, "type": family.type, "samples": {}}
            )
            key = tuple(sorted(sample.labels.items()))
            assert key not in entry["samples"], f"duplicate sample {sample}"
            entry["samples"][key] = float(sample.value)
    return families


def value(families: dict[str, dict], family: str, /, **labels: str) -> float:
    return families[family]["samples"][tuple(sorted(labels.items()))]


def test_database_families_keep_their_labels_escaped_and_counters_named_total() -> None:
    families = [
        MetricFamily("x_total", "help with \\ and\nnewline", "counter", [({"k": 'a"b\\c\nd'}, 3)]),
        MetricFamily("y", "nan", "gauge", [({"v": "1"}, 0.5), ({"v": "2"}, math.nan)]),
    ]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(lambda: families))
    text = render(registry).decode()
    assert "# TYPE x_total counter" in text
    assert 'x_total{k="a\\"b\\\\c\\nd"} 3.0' in text
    parsed = parse_exposition(text)
    assert value(parsed, "x_total", k='a"b\\c\nd') == 3
    assert value(parsed, "y", v="1") == 0.5
    assert math.isnan(value(parsed, "y", v="2"))
    bad = CollectorRegistry(auto_describe=False)
    bad.register(DatabaseCollector(lambda: [MetricFamily("z", "h", "counter")]))
    with pytest.raises(ValueError, match="_total"):
        render(bad)


async def test_metrics_count_what_the_database_holds(
    api: httpx.AsyncClient, settings: Settings
) -> None:
    # Prepare: a running federation (both clients joined, round 0 open) with one accepted and
    # one rejected update and a pinned client; a second federation whose client never joined.
    one = await make_federation(api, name="one", clients=("a", "b"))
    two = await make_federation(api, name="two", clients=("x",), join=False)
    update = tiny_state(1.0)
    assert (await submit(api, one, "a", 0, update, 10)).status_code == 201
    bad = await submit(api, one, "b", 0, tiny_state(1.0), 10, declared_sha="0" * 64)
    assert bad.status_code == 422
    pin = await api.put(
        f"/api/v1/federations/{one.id}/clients/{one.client_ids['b']}/pin",
        json={"status": "noisy", "reason": "known bad annotator"},
        headers=ADMIN,
    )
    assert pin.status_code == 200
    statuses = Counter(
        f["status"] for f in (await api.get("/api/v1/federations", headers=ADMIN)).json()["items"]
    )
    events: Counter[str] = Counter()
    for fed in (one, two):
        page = await api.get(f"/api/v1/federations/{fed.id}/events?limit=1000", headers=ADMIN)
        events.update(e["kind"] for e in page.json()["items"])

    # Execute
    response = await api.get("/metrics")

    # Assert
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    metrics = parse_exposition(response.text)
    assert metrics["fedaudit_federations"]["type"] == "gauge"
    assert metrics["fedaudit_events_total"]["type"] == "counter"
    # this process's HTTP requests, by route template and status, and the process itself
    assert (
        value(
            metrics,
            "fedaudit_http_request_duration_seconds_count",
            method="GET",
            route="/api/v1/federations/{federation_id}/events",
            status="200",
        )
        == 2
    )
    assert (
        value(
            metrics,
            "fedaudit_http_request_duration_seconds_count",
            method="POST",
            route="/api/v1/federations/{federation_id}/rounds/{round_index}/updates",
            status="422",
        )
        >= 1
    )
    (python,) = metrics["python_info"]["samples"]  # the platform collector: one sample
    assert dict(python)["version"] == platform.python_version()
    if sys.platform.startswith("linux"):  # the process collector reads /proc
        assert value(metrics, "process_resident_memory_bytes") > 0
    assert statuses == {"running": 1, "waiting": 1}
    assert value(metrics, "fedaudit_federations", status="running") == 1
    assert value(metrics, "fedaudit_federations", status="waiting") == 1
    assert value(metrics, "fedaudit_federations", status="finished") == 0
    assert value(metrics, "fedaudit_rounds", state="open") == 1
    assert value(metrics, "fedaudit_rounds", state="closed") == 0
    # the running federation's sites only (a and the pinned b), not the waiting one's x
    assert value(metrics, "fedaudit_clients", status="trusted") == 1
    assert value(metrics, "fedaudit_clients", status="noisy") == 1  # the pin wins
    assert value(metrics, "fedaudit_clients", status="suspect") == 0
    assert value(metrics, "fedaudit_updates_accepted_total") == 1
    assert value(metrics, "fedaudit_updates_rejected_total") == 1
    assert events["update.rejected"] == 1
    assert {k[0][1]: v for k, v in metrics["fedaudit_events_total"]["samples"].items()} == events
    initial = len(state_bytes(tiny_state(0.0)))
    assert value(metrics, "fedaudit_model_bytes", kind="global") == 2 * initial
    assert value(metrics, "fedaudit_model_bytes", kind="update") == len(state_bytes(update))
    assert value(metrics, "fedaudit_build_info", version=service.__version__) == 1
    # the running federation's training-quality gauges; none for the waiting one
    mine = {"federation": str(one.id), "name": "one"}
    assert value(metrics, "fedaudit_federation_sites", **mine, status="trusted") == 1
    assert value(metrics, "fedaudit_federation_sites", **mine, status="noisy") == 1
    assert value(metrics, "fedaudit_federation_sites", **mine, status="suspect") == 0
    assert value(metrics, "fedaudit_federation_round", **mine) == 0
    assert all(
        dict(key)["federation"] != str(two.id)
        for key in metrics["fedaudit_federation_sites"]["samples"]
    )
    assert "fedaudit_federation_last_round_closed_timestamp_seconds" not in metrics  # none yet
    assert value(metrics, "fedaudit_federation_site_errors_total", **mine) == 0
    assert metrics["fedaudit_federation_site_errors_total"]["type"] == "counter"

    # a second replica over the same database answers the same
    replica = create_app(settings, run_reaper=False)
    try:
        transport = httpx.ASGITransport(app=replica)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as other:
            again = parse_exposition((await other.get("/metrics")).text)
        # the database's families, not the per-process ones (HTTP, process, platform)
        per_process = ("fedaudit_http_", "process_", "python_")
        ours = {k: v for k, v in metrics.items() if not k.startswith(per_process)}
        assert ours == {k: v for k, v in again.items() if not k.startswith(per_process)}
    finally:
        replica.state.services.close()


async def test_metrics_can_require_the_admin_token(settings: Settings) -> None:
    locked = settings.model_copy(update={"metrics_require_admin": True})
    app = create_app(locked, run_reaper=False)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as api:
            anonymous = await api.get("/metrics")
            assert anonymous.status_code == 401
            assert anonymous.headers["content-type"] == "application/problem+json"
            wrong = await api.get("/metrics", headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401
            admin = await api.get("/metrics", headers=ADMIN)
            assert admin.status_code == 200
            assert "fedaudit_federations" in admin.text
    finally:
        app.state.services.close()


def test_metrics_setting_is_off_by_default() -> None:
    assert Settings(_env_file=None, admin_token=SecretStr("x" * 20)).metrics_require_admin is False


SITE_ERROR = {"stage": "train", "error_type": "RuntimeError", "message": "CUDA out of memory"}


async def test_a_stopped_federation_leaves_the_site_counts_and_its_site_errors(
    api: httpx.AsyncClient,
) -> None:
    # Prepare: two running federations, each with a site error; then one of them is stopped.
    going = await make_federation(api, name="going", clients=("a", "b", "c"))
    stopped = await make_federation(api, name="stopped", clients=("x", "y"))
    for fed, site in ((going, "a"), (going, "b"), (stopped, "x")):
        url = f"/api/v1/federations/{fed.id}/rounds/0/error"
        response = await api.post(url, json=SITE_ERROR, headers=fed.headers(site))
        assert response.status_code == 202, response.text
    stop = await api.post(
        f"/api/v1/federations/{stopped.id}/stop", json={"reason": "the study ended"}, headers=ADMIN
    )
    assert stop.status_code == 200, stop.text

    # Execute
    metrics = parse_exposition((await api.get("/metrics")).text)

    # Assert: the stopped federation's two sites are counted nowhere any more
    assert value(metrics, "fedaudit_federations", status="stopped") == 1
    assert value(metrics, "fedaudit_federations", status="failed") == 0
    assert value(metrics, "fedaudit_clients", status="trusted") == 3
    assert sum(metrics["fedaudit_clients"]["samples"].values()) == 3
    going_labels = {"federation": str(going.id), "name": "going"}
    assert value(metrics, "fedaudit_federation_site_errors_total", **going_labels) == 2
    errors = metrics["fedaudit_federation_site_errors_total"]["samples"]
    assert {dict(key)["federation"] for key in errors} == {str(going.id)}
    # the unlabelled all-time counter keeps every federation's
    assert value(metrics, "fedaudit_site_errors_total") == 3


async def test_a_closed_round_shows_in_the_federation_gauges(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api, name="gauges", clients=("a", "b"))
    before = time.time()
    for name in ("a", "b"):
        assert (await submit(api, fed, name, 0, tiny_state(1.0), 10)).status_code == 201
    metrics = parse_exposition((await api.get("/metrics")).text)
    mine = {"federation": str(fed.id), "name": "gauges"}
    assert value(metrics, "fedaudit_federation_round", **mine) == 1  # round 1 opened
    closed = value(metrics, "fedaudit_federation_last_round_closed_timestamp_seconds", **mine)
    assert before - 1 <= closed <= time.time() + 1
    assert value(metrics, "fedaudit_federation_last_round_close_seconds", **mine) >= 0
    # the verdict gauge: one series per verdict, 1 for the one the stored audit holds
    stored = (await api.get(f"/api/v1/federations/{fed.id}/rounds/0", headers=ADMIN)).json()
    audit = stored["audit"]
    expected = audit["detections"][audit["primary"]]["status"]
    verdicts = {
        v: value(metrics, "fedaudit_federation_audit_verdict", **mine, verdict=v)
        for v in ("ok", "inconclusive", "undetermined")
    }
    assert verdicts == {v: float(v == expected) for v in verdicts}


async def test_the_grafana_dashboard_queries_only_metrics_that_exist(
    api: httpx.AsyncClient,
) -> None:
    # docker/grafana/fedaudit-dashboard.json: every metric its queries name is exposed (after a
    # round has closed and a request was timed, so that every series has a sample).
    dashboard = json.loads(
        (Path(__file__).resolve().parents[2] / "docker/grafana/fedaudit-dashboard.json").read_text()
    )
    fed = await make_federation(api, name="grafana", clients=("a", "b"))
    for name in ("a", "b"):
        assert (await submit(api, fed, name, 0, tiny_state(1.0), 10)).status_code == 201
    exposed = set(parse_exposition((await api.get("/metrics")).text))
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    named = {m for e in exprs for m in re.findall(r"\b(?:fedaudit|process)_[a-z_]+", e)}
    assert named, "no metric found in the dashboard's queries"
    # the change listener's gauge exists on PostgreSQL only (tests/api/test_listener_health.py)
    assert named - exposed <= {"fedaudit_change_listener_up"}, named - exposed
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "federation"} <= variables
