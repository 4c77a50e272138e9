"""The command-line layer of the simulator: flags to scenario, method selection, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedaudit_sim.presets import get_preset
from fedaudit_sim.scenario import ScenarioError
from fedaudit_sim.simulate_flags import build_scenario, select_methods

# --------------------------------------------------------------------------------------------
# command-line assembly


def test_compare_selects_scenario_methods_and_presets():
    scenario = get_preset("V5")
    chosen = select_methods(scenario, ["trimmed_mean", "fednoro"], {})
    assert [(m.name, m.method, m.aggregation) for m in chosen] == [
        ("trimmed_mean", "fedavg", "trimmed_mean"),
        ("fednoro", "fednoro", None),
    ]
    with pytest.raises(ScenarioError, match="method 'fedsgd' is neither"):
        select_methods(scenario, ["fedsgd"], {})


def test_method_overrides_apply_to_every_selected_method():
    scenario = get_preset("V1")
    chosen = select_methods(
        scenario,
        None,
        {
            "warmup_rounds": 3,
            "hyperparameters": {"lr": 0.5},
            "audit": {"status_m": 1},
            "aggregation": None,
        },
    )
    assert [(m.name, m.warmup_rounds, m.hyperparameters, m.audit) for m in chosen] == [
        ("fednoro", 3, {"lr": 0.5}, {"status_m": 1}),
        ("fedavg", 3, {"lr": 0.5}, {"status_m": 1}),
    ]


def test_build_scenario_from_preset_and_flags(tmp_path: Path):
    scenario = build_scenario(
        preset="V1",
        overrides={"clients": 6, "training.rounds": 3, "seeds": [4, 5]},
        methods=["fedavg"],
    )
    assert (scenario.name, scenario.clients, scenario.training.rounds) == ("V1", 6, 3)
    assert scenario.seeds == [4, 5]
    assert [m.name for m in scenario.methods] == ["fedavg"]
    path = tmp_path / "s.yaml"
    path.write_text("clients: 4\n")
    with pytest.raises(ScenarioError, match="not both"):
        build_scenario(scenario_file=path, preset="V1")
    assert build_scenario(scenario_file=path).clients == 4


def test_the_flags_are_exactly_the_parameters_of_simulate():
    # fedaudit simulate passes locals() to SimulateFlags: the two lists must not drift apart.
    import dataclasses
    import inspect

    from fedaudit_sim.commands import simulate
    from fedaudit_sim.simulate_flags import SimulateFlags

    assert [f.name for f in dataclasses.fields(SimulateFlags)] == list(
        inspect.signature(simulate).parameters
    )
