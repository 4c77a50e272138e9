"""examples/flower/digits_flower.py: a Flower simulation (Ray backend), 10 sites, 3 noisy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "flwr", reason="flwr is not installed here (the flower extra); scripts/test-flower runs these"
)
pytest.importorskip(
    "ray", reason="Flower's simulation backend is not installed (pip install 'flwr[simulation]')"
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flower" / "digits_flower.py"


@pytest.mark.slow
def test_the_simulation_finds_the_three_noisy_partitions(tmp_path):
    report_path = tmp_path / "report.json"
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--rounds", "5", "--report", str(report_path)],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "status after the last round" in run.stdout
    report = json.loads(report_path.read_text())
    partitions = report["partitions"]
    assert sorted(partitions.values()) == list(range(10))
    status = {partitions[node]: s["status"] for node, s in report["statuses"].items()}
    assert status == {p: "noisy" if p in (0, 1, 2) else "trusted" for p in range(10)}
    last = report["rounds"][-1]
    assert (last["decided"], last["applied"], last["rule"]) == (True, "audit", "daagg")
    weights = {partitions[str(c["node_id"])]: c["weight"] for c in last["clients"]}
    # DaAgg: the noisy partitions weigh n exp(-D) with D in (0, 1], the clean ones n
    assert max(weights[p] for p in (0, 1, 2)) < min(weights[p] for p in range(3, 10))
    # the first round's model has learned nothing: the audit abstains and FedAvg is kept
    first = report["rounds"][0]
    assert (first["decided"], first["applied"]) == (False, "wrapped")
    assert "does not beat the label prior" in first["reason"]
