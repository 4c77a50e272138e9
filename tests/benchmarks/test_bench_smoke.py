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
    subjects = data["subjects"]
    assert set(subjects) >= {"floor", "read_only", "fedavg", "daagg", "median", "trimmed_mean"}
    for name, entry in subjects.items():
        assert len(entry["seconds"]) == data["parameters"]["repeats"], name
        assert math.isfinite(entry["ratio_to_copy_bandwidth"]), name
    # Every rule's memory was measured against the size of one state.
    for rule in data["parameters"]["rules"]:
        assert subjects[rule]["peak_over_one_state"] > 0, rule
    # The timed FedAvg is the real one: it equals the plain numpy weighted sum of the updates
    # (float64 accumulation cast to float32; values of size ~0.05, so float32 rounding is
    # ~0.05 * 6e-8 = 3e-9 per value; 1e-6 leaves room for another summation order only).
    assert data["fedavg_vs_floor_max_abs_diff"] < 1e-6
    flwr = data["flwr"]
    assert flwr["installed"] or flwr["note"] == "flwr not installed: comparison skipped"


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
