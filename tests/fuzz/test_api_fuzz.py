"""Fuzzing the real coordinator with schemathesis (issue 20): no request may get a 5xx, and every
answer must be one the OpenAPI document lists, with the content type and body schema it gives.

A coordinator runs as an operator runs it (``fedaudit db upgrade``, ``fedaudit serve`` on a
loopback port) on SQLite and on PostgreSQL. A federation is seeded so that the fuzzer's requests
reach real rows (its id and a client's id are fixed path parameters): two sites joined; for the
admin run both submitted round 0, so it closed and can be recomputed; for the site run round 0 is
open for the site whose token is used. Then ``st run`` sends the schema's examples, the coverage
phase's boundary and invalid values, generated requests, and stateful sequences (links inferred
from the responses), with a fixed seed and a time budget per run, once with the admin token and
once with a site's token.

Select or skip it with ``-m fuzz`` / ``-m "not fuzz"``. ``FEDAUDIT_FUZZ_BUDGET_S`` scales the
budget (seconds per admin run; a site run gets half). On failure the message names the failing
checks and ends with schemathesis' own report; the NDJSON report is left in the test's tmp dir.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from client_sdk import AdminClient, FederationClient
from client_sdk.participant import state_to_bytes
from fedaudit_sim.coordinator_process import CoordinatorProcess
from tests.e2e.test_federation_e2e import tiny_model

pytestmark = [pytest.mark.fuzz, pytest.mark.slow, pytest.mark.db]

SEED = 20
ADMIN_BUDGET_S = int(os.environ.get("FEDAUDIT_FUZZ_BUDGET_S", "40"))
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
)
PHASES = "examples,coverage,fuzzing,stateful"
SITE_OPERATIONS = (
    r"/(task|join|rounds/current|rounds/\{round_index\}/updates|diagnostics)$|^/api/v1/models/"
)
"""The operations a site's token opens (the admin token opens all of them and the rest)."""


def schemathesis_cli() -> str:
    """The `st` installed beside this interpreter (the pinned one of the dev extra)."""
    found = Path(sys.executable).parent / "st"
    if not found.exists():
        pytest.fail(f"schemathesis is not installed ({found}): `scripts/setup --dev` installs it")
    return str(found)


def seed(server: CoordinatorProcess, *, close_round_0: bool) -> dict[str, str]:
    """A federation with two joined sites; round 0 open, or closed with both updates."""
    state = state_to_bytes(tiny_model())
    signals = {"class_counts": [5, 5], "train_loss": 0.5}
    with AdminClient(server.url, server.admin_token) as admin:
        federation = admin.create_federation(
            {
                "name": "fuzzed",
                "task": {"num_classes": 2, "input_shape": [4]},
                "plan": {"rounds": 3, "min_clients": 2, "round_deadline_s": 3600},
                "config": {
                    "method": "fedavg",
                    "detectors": ["fedncl"],
                    "primary_detector": "fedncl",
                },
                "seed": 1,
            }
        )
        admin.upload_initial_model(federation.id, state)
        sites = {name: admin.add_client(federation.id, name) for name in ("a", "b")}
        for site in sites.values():
            with FederationClient(server.url, site.token) as client:
                client.join(federation.id, num_samples=10, class_counts=[5, 5])
        for site in sites.values() if close_round_0 else ():
            with FederationClient(server.url, site.token) as client:
                client.submit_update(federation.id, 0, state=state, num_samples=10, signals=signals)
        if close_round_0:
            deadline = time.monotonic() + 60
            while admin.get_round(federation.id, 0).state != "closed":
                assert time.monotonic() < deadline, "round 0 did not close"
                time.sleep(0.2)
    return {
        "federation_id": str(federation.id),
        "client_id": str(sites["a"].id),
        "site_token": sites["a"].token,
    }


def summary(report_dir: Path) -> dict[str, Any]:
    """Requests sent and their status codes, read from schemathesis' NDJSON report."""
    statuses: Counter[int] = Counter()
    phases: Counter[str] = Counter()
    for path in report_dir.glob("*.ndjson"):
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                event = json.loads(line).get("ScenarioFinished")
                if event is None:
                    continue
                if event["status"] != "skip":
                    phases[event["phase"]] += 1
                for interaction in event["recorder"].get("interactions", {}).values():
                    response = interaction.get("response")
                    if response is not None:
                        statuses[int(response["status_code"])] += 1
    return {
        "requests": sum(statuses.values()),
        "server_errors": sum(n for code, n in statuses.items() if code >= 500),
        "statuses": dict(sorted(statuses.items())),
        "scenarios": dict(sorted(phases.items())),
    }


@pytest.mark.parametrize("role", ["admin", "site"])
def test_no_server_error_and_every_answer_documented(
    database_url: str, tmp_path: Path, role: str
) -> None:
    budget = ADMIN_BUDGET_S if role == "admin" else max(1, ADMIN_BUDGET_S // 2)
    with CoordinatorProcess(tmp_path / "coordinator", database_url=database_url) as server:
        ids = seed(server, close_round_0=role == "admin")
        token = server.admin_token if role == "admin" else ids["site_token"]
        config = tmp_path / "schemathesis.toml"
        # No example database and no cache: each run starts from the seed alone, and leaves
        # nothing outside tmp_path.
        config.write_text(
            "[cache]\nenabled = false\n"
            '[generation]\ndatabase = "none"\n'
            "[parameters]\n"
            f'federation_id = "{ids["federation_id"]}"\n'
            f'client_id = "{ids["client_id"]}"\n',
            encoding="utf-8",
        )
        report_dir = tmp_path / "report"
        started = time.monotonic()
        result = subprocess.run(
            [
                schemathesis_cli(),
                "--no-color",
                "--config-file",
                str(config),
                "run",
                f"{server.url}/openapi.json",
                "--phases",
                PHASES,
                "--checks",
                ",".join(CHECKS),
                "--seed",
                str(SEED),
                "--max-time",
                str(budget),
                "--workers",
                "1",
                "--request-timeout",
                "60",
                "--header",
                f"Authorization: Bearer {token}",
                *(() if role == "admin" else ("--include-path-regex", SITE_OPERATIONS)),
                "--report",
                "ndjson",
                "--report-dir",
                str(report_dir),
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=budget + 300,
            check=False,
        )
        elapsed = time.monotonic() - started
        found = summary(report_dir)
        backend = database_url.split(":", 1)[0]
        print(f"fuzz {backend} {role}: {elapsed:.0f} s, {found}")
        failure = (
            f"schemathesis ({backend}, {role} token, seed {SEED}) found failures: {found}\n"
            f"{result.stdout[-12000:]}\n{result.stderr[-2000:]}\n"
            f"coordinator log:\n{server.log_tail(80)}"
        )
        assert found["server_errors"] == 0, failure
        assert result.returncode == 0, failure
        # every phase ran (the examples phase runs the operations whose schema has examples)
        assert set(found["scenarios"]) == set(PHASES.split(",")), result.stdout[-4000:]
