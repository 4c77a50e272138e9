"""A smaller run of the load benchmark in the suite (issue 24, point 4).

``benchmarks/bench_load.py`` with 100 sites in 4 processes for 2 rounds against a real
coordinator process (``fedaudit serve`` on a loopback port; SQLite, and PostgreSQL where
configured; on PostgreSQL also two replicas on one database, the blobs in the database, the
site processes dealt to them in turn). It asserts what must hold under load, from the figures
the benchmark reads back from the admin API, the database and the sites' receipts: no 5xx, no
transport error, nothing lost or duplicated, every round closed, no ERROR line in the
coordinators' logs. Never a latency.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_load.py"
SITES, ROUNDS = 100, 2


@pytest.mark.parametrize("replicas", [1, 2])
def test_100_sites_at_once_lose_nothing(database_url: str, tmp_path: Path, replicas: int) -> None:
    if replicas > 1 and database_url.startswith("sqlite"):
        pytest.skip("replicas share a PostgreSQL database")
    out = tmp_path / "load.json"
    (tmp_path / "work").mkdir()
    command = [
        sys.executable,
        str(BENCH),
        "--sites",
        str(SITES),
        "--rounds",
        str(ROUNDS),
        "--sites-per-process",
        "25",
        "--timeout-s",
        "300",
        "--workdir",
        str(tmp_path / "work"),
        "--out",
        str(out),
    ]
    if not database_url.startswith("sqlite"):  # SQLite: the benchmark's own temporary database
        command += ["--postgres-url", database_url, "--replicas", str(replicas)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=420, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["ok"] is True, data["problems"]
    assert data["parameters"]["replicas"] == replicas
    assert (data["five_xx"], data["transport_errors"], data["site_errors_count"]) == (0, 0, 0)
    assert data["federation_status"] == "finished"
    assert data["rounds_closed"] == data["rounds_expected"] == ROUNDS
    assert [r["round"] for r in data["per_round"]] == list(range(ROUNDS))
    for r in data["per_round"]:
        assert r["state"] == "closed"
        # one stored update per site, the same sites the API lists and the receipts name
        assert r["stored_rows_db"] == r["stored_distinct_sites_db"] == SITES
        assert r["receipts"] == r["receipts_distinct"] == r["submitted_api_distinct"] == SITES
        assert r["receipts_match_api"] is True
    assert data["coordinator_log"]["error_lines"] == 0
    assert data["coordinator_log"]["database_is_locked"] == 0
