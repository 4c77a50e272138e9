"""/metrics: the Prometheus exposition, read from the database (same answer on every replica)."""

from __future__ import annotations

import math
import re
from collections import Counter

import httpx
import pytest
from pydantic import SecretStr

from service.api.prometheus import MetricFamily, escape_label_value, render
from service.config import Settings
from service.main import create_app
from tests.api.conftest import make_federation
from tests.api.test_rounds import submit
from tests.factories import ADMIN, state_bytes, tiny_state

pytestmark = [pytest.mark.anyio, pytest.mark.db]

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), value)


def parse_exposition(text: str) -> dict[str, dict]:
    """Parse text format 0.0.4 strictly: every sample belongs to a family with HELP and TYPE."""
    assert text.endswith("\n")
    families: dict[str, dict] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP ") :].partition(" ")
            assert name not in families, f"family {name} declared twice"
            families[name] = {"help": help_text, "type": None, "samples": {}}
        elif line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE ") :].partition(" ")
            assert kind in ("counter", "gauge", "untyped")
            assert families[name]["type"] is None
            families[name]["type"] = kind
        else:
            match = _SAMPLE.match(line)
            assert match, f"not a sample line: {line!r}"
            name, _, raw_labels, value = match.groups()
            assert families[name]["type"] is not None, f"{name}: sample before TYPE"
            labels: list[tuple[str, str]] = []
            rest = raw_labels or ""
            while rest:
                label = _LABEL.match(rest)
                assert label, f"bad labels in {line!r}"
                labels.append((label.group(1), _unescape(label.group(2))))
                rest = rest[label.end() :]
            key = tuple(sorted(labels))
            assert key not in families[name]["samples"], f"duplicate sample {line!r}"
            families[name]["samples"][key] = float(value)
    return families


def value(families: dict[str, dict], name: str, **labels: str) -> float:
    return families[name]["samples"][tuple(sorted(labels.items()))]


def test_render_escapes_label_values_and_help() -> None:
    family = MetricFamily(
        "x_total", 'help with \\ and\nnewline "quotes"', "counter", [({"k": 'a"b\\c\nd'}, 3)]
    )
    text = render([family, MetricFamily("y", "nan", "gauge", [({}, math.nan), ({"v": "1"}, 0.5)])])
    assert text.splitlines() == [
        '# HELP x_total help with \\\\ and\\nnewline "quotes"',
        "# TYPE x_total counter",
        'x_total{k="a\\"b\\\\c\\nd"} 3',
        "# HELP y nan",
        "# TYPE y gauge",
        "y NaN",
        'y{v="1"} 0.5',
    ]
    parsed = parse_exposition(text)
    assert value(parsed, "x_total", k='a"b\\c\nd') == 3
    assert escape_label_value("plain") == "plain"


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
    assert statuses == {"running": 1, "waiting": 1}
    assert value(metrics, "fedaudit_federations", status="running") == 1
    assert value(metrics, "fedaudit_federations", status="waiting") == 1
    assert value(metrics, "fedaudit_federations", status="finished") == 0
    assert value(metrics, "fedaudit_rounds", state="open") == 1
    assert value(metrics, "fedaudit_rounds", state="closed") == 0
    assert value(metrics, "fedaudit_clients", status="trusted") == 2
    assert value(metrics, "fedaudit_clients", status="noisy") == 1  # the pin wins
    assert value(metrics, "fedaudit_clients", status="suspect") == 0
    assert value(metrics, "fedaudit_updates_accepted_total") == 1
    assert value(metrics, "fedaudit_updates_rejected_total") == 1
    assert events["update.rejected"] == 1
    assert {k[0][1]: v for k, v in metrics["fedaudit_events_total"]["samples"].items()} == events
    initial = len(state_bytes(tiny_state(0.0)))
    assert value(metrics, "fedaudit_model_bytes", kind="global") == 2 * initial
    assert value(metrics, "fedaudit_model_bytes", kind="update") == len(state_bytes(update))
    assert value(metrics, "fedaudit_build_info", version="0.1.0") == 1

    # a second replica over the same database answers the same
    replica = create_app(settings, run_reaper=False)
    try:
        transport = httpx.ASGITransport(app=replica)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as other:
            assert (await other.get("/metrics")).text == response.text
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
