"""examples/flower/digits_flower.py: a Flower simulation (Ray backend), 10 sites, 3 noisy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from client_sdk.flower_report import flower_report_rows, read_flower_report

pytest.importorskip(
    "flwr", reason="flwr is not installed here (the flower extra); scripts/test-flower runs these"
)
pytest.importorskip(
    "ray", reason="Flower's simulation backend is not installed (pip install 'flwr[simulation]')"
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flower" / "digits_flower.py"


def run_example(report_path: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run the example for 5 rounds; return its report (the file)."""
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--rounds", "5", "--report", str(report_path), *args],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
        env=env,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "status after the last round" in run.stdout
    report: dict[str, Any] = json.loads(report_path.read_text())
    return report


@pytest.mark.slow
def test_the_simulation_finds_the_three_noisy_partitions(tmp_path):
    report = run_example(tmp_path / "report.json")
    partitions = report["partitions"]
    assert sorted(partitions.values()) == list(range(10))
    status = {partitions[node]: s["status"] for node, s in report["statuses"].items()}
    assert status == {p: "noisy" if p in (0, 1, 2) else "trusted" for p in range(10)}
    # `fedaudit report --file` reads the same file (client_sdk.flower_report)
    rows = flower_report_rows(read_flower_report(tmp_path / "report.json"))
    assert {partitions[str(r["node_id"])]: r["status"] for r in rows} == status
    last = report["rounds"][-1]
    assert (last["decided"], last["applied"], last["rule"]) == (True, "audit", "daagg")
    weights = {partitions[str(c["node_id"])]: c["weight"] for c in last["clients"]}
    # DaAgg: the noisy partitions weigh n exp(-D) with D in (0, 1], the clean ones n
    assert max(weights[p] for p in (0, 1, 2)) < min(weights[p] for p in range(3, 10))
    # the first round's model has learned nothing: the audit abstains and FedAvg is kept
    first = report["rounds"][0]
    assert (first["decided"], first["applied"]) == (False, "wrapped")
    assert "does not beat the label prior" in first["reason"]


@pytest.mark.slow
def test_the_simulation_forwarded_to_a_coordinator(tmp_path):
    from client_sdk import AdminClient
    from fedaudit_sim.coordinator_process import CoordinatorProcess

    with CoordinatorProcess(tmp_path / "coordinator") as server:
        env = {**os.environ, "FEDAUDIT_ADMIN_TOKEN": server.admin_token}
        report = run_example(tmp_path / "report.json", "--coordinator", server.url, env=env)
        federation_id = report["coordinator"]["federation_id"]
        with AdminClient(server.url, server.admin_token) as admin:
            on_coordinator = admin.get_json(f"/federations/{federation_id}/report")
            assert admin.get_federation(federation_id).status == "finished"
    partitions = report["partitions"]
    noisy = {p: "noisy" if p in (0, 1, 2) else "trusted" for p in range(10)}
    status = {partitions[node]: s["status"] for node, s in report["statuses"].items()}
    assert status == noisy
    # the coordinator's own report: the ten nodes as its sites, the same statuses
    assert len(on_coordinator["clients"]) == 10
    assert sorted(report["coordinator"]["clients"]) == sorted(partitions)
    by_node = {
        str(int(row["name"].removeprefix("flower-node-"))): row["status"]
        for row in on_coordinator["clients"]
    }
    assert {partitions[node]: s for node, s in by_node.items()} == noisy
    last = report["rounds"][-1]
    assert (last["decided"], last["applied"], last["rule"]) == (True, "audit", "daagg")
    # undecided rounds take the coordinator's aggregate, so that the next round is audited
    # against the model the sites received
    first = report["rounds"][0]
    assert (first["decided"], first["applied"]) == (False, "coordinator")
    assert all(r["coordinator"]["global_model_matches"] for r in report["rounds"])
