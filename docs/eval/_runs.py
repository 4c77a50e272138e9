"""What the docs/eval scripts share: the run JSONs of a simulation directory, mean ± std cells."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fedaudit_sim.comparison import mean_std  # noqa: E402


def run_json_paths(run_dir: Path) -> list[Path]:
    """``<run_dir>/runs/<label>_seed<seed>.json`` (``fedaudit_sim.results``), sorted."""
    return sorted((run_dir / "runs").glob("*_seed*.json"))


def load_run_jsons(run_dir: Path) -> list[dict[str, Any]]:
    """Every run JSON of a ``fedaudit simulate --out`` directory, in file-name order."""
    return [json.loads(p.read_text(encoding="utf-8")) for p in run_json_paths(run_dir)]


def fmt(values: Iterable[float | None], digits: int = 3) -> str:
    """Mean ± std over the values that are not None (one value alone, "-" for none)."""
    return mean_std(values, f".{digits}f")
