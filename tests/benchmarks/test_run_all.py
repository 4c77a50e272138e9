"""benchmarks/run_all.sh runs every benchmark script there is (a new one cannot be forgotten)."""

from __future__ import annotations

import re
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_run_all_names_every_benchmark_script() -> None:
    script = (BENCHMARKS / "run_all.sh").read_text()
    named = set(re.findall(r"benchmarks/(bench_\w+\.py)", script))
    present = {p.name for p in BENCHMARKS.glob("bench_*.py")}
    assert named == present
