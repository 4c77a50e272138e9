"""Smoke runs of the in-process benchmarks with tiny parameters (``--quick``).

They check that the scripts run and write the JSON they promise, never how fast anything is:
timings belong to the benchmarks themselves, as ratios measured in one run (EVALUATION.md).
The HTTP benchmarks (round overhead, upload) each start a coordinator process, which alone takes
several seconds here, so they are run by hand with ``--quick`` instead (see benchmarks/README.md).
"""

from __future__ import annotations

import json
import math
import runpy
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def run_quick(script: str, out: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Run ``benchmarks/<script>``'s ``main`` with ``--quick``; return the JSON it wrote."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the scripts import their _common helper
    namespace = runpy.run_path(str(BENCHMARKS / script))  # not "__main__": main() not called
    namespace["main"](["--quick", "--out", str(out)])
    data: dict[str, Any] = json.loads(out.read_text())
    assert data["machine"]["cpu_count"] >= 1
    assert data["parameters"]["quick"] is True
    return data


def test_aggregation_quick_run_writes_its_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = run_quick("bench_aggregation.py", tmp_path / "agg.json", monkeypatch)
    assert data["benchmark"] == "aggregation"
    assert [c["clients"] for c in data["configs"]] == [4, 6]
    for config in data["configs"]:
        seconds = config["seconds"]
        assert set(seconds) >= {"read", "read_mmap", "read_plain", "fedavg", "median", "audit"}
        for name, values in seconds.items():
            assert len(values) == config["repeats"], name
            assert all(math.isfinite(v) and v > 0 for v in values), name
        assert math.isfinite(config["ratios"]["fedavg_over_read"]["median"])
        assert config["audit_rule_applied"] == "daagg"  # the audit timed is the DaAgg round
        assert config["audit_flags"] == "status"  # a federation past its warm-up
        if config["flwr_installed"]:
            # The timed work is the same work: ours equals Flower's on the same files.
            assert config["max_abs_diff_vs_flwr"]["fedavg"] < 1e-6
            assert config["max_abs_diff_vs_flwr"]["median"] < 1e-6
            assert config["ratios"]["median_speedup_vs_flwr"]["median"] > 0
    # Peak RSS of a fresh process per K, above the interpreter's own import baseline.
    runs = data["memory"]["runs"]
    assert set(runs) == {"3", "6"}
    for run in runs.values():
        assert run["fedavg"]["peak_rss_bytes"] >= run["baseline"]["peak_rss_bytes"] > 0


def test_audit_scaling_quick_run_writes_its_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = run_quick("bench_audit_scaling.py", tmp_path / "scaling.json", monkeypatch)
    assert data["benchmark"] == "audit_scaling"
    assert list(data["sizes"]) == ["20", "60"]
    for size in data["sizes"].values():
        # Below the pipeline's exact-search limit its automatic choice is the exact call.
        assert size["auto_chunk_size"] is None
        assert size["subjects"]["neighbors_auto"]["same_call_as"] == "neighbors_exact"
        assert set(size["subjects"]) == {
            "fednoro_fit",
            "fedncl_fit",
            "evidence_fit",
            "neighbors_exact",
            "neighbors_chunked",
            "neighbors_auto",
        }
        for entry in size["subjects"].values():
            assert entry["reference_multiples"] > 0
            assert entry["peak_traced_bytes"] > 0
    # Every subject was timed at both sizes, so each has a fitted exponent.
    for name, exponent in data["scaling_exponents"].items():
        assert exponent["sizes"] == [20, 60], name
        assert math.isfinite(exponent["fit"]), name


def test_notify_benchmark_writes_its_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    url = os.environ.get("FEDAUDIT_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("needs a PostgreSQL server (FEDAUDIT_TEST_POSTGRES_URL)")
    pytest.importorskip("psycopg")
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    namespace = runpy.run_path(str(BENCHMARKS / "bench_notify.py"))
    out = tmp_path / "notify.json"
    namespace["main"](
        ["--url", url, "--writers", "1,2", "--seconds", "0.2", "--repeats", "1", "--out", str(out)]
    )
    data = json.loads(out.read_text())
    assert set(data["writers"]) == {"1", "2"}
    for entry in data["writers"].values():
        assert entry["plain_commits_per_second"][0] > 0
        assert entry["notifying_commits_per_second"][0] > 0
        assert entry["median_ratio"] > 0
