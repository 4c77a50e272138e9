"""docs/eval/holdout.py: the held-out scenario draw is valid, reproducible and a minority.

No simulation runs: the drawn files are validated by the simulator's own scenario schema.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from fedaudit_sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


holdout = _load("holdout_script", ROOT / "docs/eval/holdout.py")


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_every_drawn_scenario_loads(tmp_path: Path, seed: int) -> None:
    scenarios = holdout.draw(seed, 40)
    holdout.write(scenarios, tmp_path)
    files = sorted(tmp_path.glob("*.yaml"))
    assert len(files) == 40
    for path in files:
        scenario = load_scenario(path)
        assert scenario.name == path.stem
        assert [m.name for m in scenario.methods] == ["fednoro", "fedavg"]


def test_same_seed_same_draw_other_seed_other_draw() -> None:
    assert holdout.draw(3, 12) == holdout.draw(3, 12)
    assert holdout.draw(3, 12) != holdout.draw(4, 12)


def test_noisy_sites_are_a_strict_minority_and_sites_within_the_data_set() -> None:
    seen_clean = seen_noisy = 0
    for seed in range(5):
        for scenario in holdout.draw(seed, 30):
            _, fewest, most, _ = holdout.DATASETS[scenario["dataset"]]
            assert fewest <= scenario["clients"] <= most
            noise = scenario["noise"]
            if noise["protocol"] == "none":
                seen_clean += 1
                continue
            seen_noisy += 1
            noisy = noise["params"]["noisy_clients"]
            assert 1 <= noisy
            assert 2 * noisy < scenario["clients"]
            assert 0.1 <= noise["params"]["lo"] <= noise["params"]["hi"] <= 0.8
    # 150 draws at a clean share of 0.3: both kinds appear (a failure here means the draw broke)
    assert seen_clean >= 20
    assert seen_noisy >= 70
