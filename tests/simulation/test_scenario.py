"""Scenario files, presets and command-line overrides (fedaudit_sim.scenario/presets)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedaudit_sim.presets import PRESET_NAMES, get_preset, preset_data
from fedaudit_sim.scenario import (
    MethodSpec,
    Scenario,
    ScenarioError,
    TrainingSpec,
    apply_overrides,
    load_scenario,
    parse_key_values,
    validate_scenario,
)

V1_YAML = """\
name: my-v1
dataset: digits
clients: 20
partition:
  method: bernoulli_dirichlet
  params: {p: 0.9, alpha: 2.0}
noise:
  protocol: rho_range
  params: {rho: 0.4, lo: 0.5, hi: 0.7}
  flip: symmetric
training: {rounds: 12, local_epochs: 2, lr: 0.02, batch_size: 16}
methods:
  - method: fednoro
  - name: fedavg-trimmed
    method: fedavg
    aggregation: trimmed_mean
seeds: [0, 1]
"""


def test_yaml_file_parses_into_the_scenario(tmp_path: Path):
    path = tmp_path / "v1.yaml"
    path.write_text(V1_YAML)
    scenario = load_scenario(path)
    assert scenario.name == "my-v1"
    assert scenario.clients == 20
    assert scenario.partition.method == "bernoulli_dirichlet"
    assert scenario.partition.params == {"p": 0.9, "alpha": 2.0}
    assert scenario.noise.params == {"rho": 0.4, "lo": 0.5, "hi": 0.7}
    assert scenario.training == TrainingSpec(rounds=12, local_epochs=2, lr=0.02, batch_size=16)
    # The first method gets its name from its preset; the second keeps its own.
    assert [m.name for m in scenario.methods] == ["fednoro", "fedavg-trimmed"]
    assert scenario.methods[1].aggregation == "trimmed_mean"
    assert scenario.seeds == [0, 1]


def test_json_file_parses_the_same_as_yaml(tmp_path: Path):
    import yaml

    yaml_path = tmp_path / "v1.yaml"
    yaml_path.write_text(V1_YAML)
    json_path = tmp_path / "v1.json"
    json_path.write_text(json.dumps(yaml.safe_load(V1_YAML)))
    assert load_scenario(json_path) == load_scenario(yaml_path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("clients: 20\nclient_count: 3\n", "client_count: Extra inputs are not permitted"),
        ("clients: zero\n", "clients: Input should be a valid integer"),
        ("clients: 0\n", "clients: Input should be greater than or equal to 1"),
        ("dataset: cifar10\n", "dataset: Input should be"),
        (
            "partition: {method: shards, params: {beta: 0.5}}\n",
            "partition: partition 'shards' has no parameter(s) ['beta']",
        ),
        ("partition: {method: spectral}\n", "partition.method: Input should be"),
        ("noise: {protocol: rho_range, params: {rho: 1.5}}\n", "noise: rho=1.5 must lie in [0, 1]"),
        ("noise: {protocol: bernoulli, params: {q: 0.5}}\n", "has no parameter(s) ['q']"),
        ("noise: {protocol: none, flip: asymmetric}\n", "flip 'asymmetric' needs class_map"),
        ("training: {rounds: 0}\n", "training.rounds: Input should be greater than or equal to 1"),
        ("training: {epochs: 3}\n", "training.epochs: Extra inputs are not permitted"),
        ("methods: []\n", "methods: List should have at least 1 item"),
        ("methods: [{method: fedsgd}]\n", "methods.0.method: Input should be"),
        (
            "methods: [{method: fedavg}, {method: fedavg}]\n",
            "method names must be unique; repeated: ['fedavg']",
        ),
        ("methods: [{method: fedavg, name: 'a b'}]\n", "may hold only letters"),
        ("seeds: [1, 1]\n", "seeds [1, 1] repeat a value"),
    ],
)
def test_bad_scenario_file_names_the_field(tmp_path: Path, text: str, expected: str):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    message = str(info.value)
    assert str(path) in message
    assert expected in message


def test_every_problem_is_listed_on_its_own_line(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text("clients: 0\nrounds: 5\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    lines = str(info.value).splitlines()
    assert lines[1:] == [
        "  clients: Input should be greater than or equal to 1",
        "  rounds: Extra inputs are not permitted",
    ]


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("s.yaml", "clients: [1\n", "is not valid YAML"),
        ("s.json", "{clients: 3}", "is not valid JSON"),
        ("s.toml", "clients = 3", "unknown extension '.toml'"),
        ("s.yaml", "", "is empty"),
        ("s.yaml", "- 1\n- 2\n", "expected a mapping of settings, got list"),
    ],
)
def test_unreadable_files_give_a_clear_error(tmp_path: Path, name: str, text: str, expected: str):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert expected in str(info.value)


def test_missing_file(tmp_path: Path):
    with pytest.raises(ScenarioError, match="does not exist"):
        load_scenario(tmp_path / "nope.yaml")


def test_scenario_error_is_a_value_error():
    assert issubclass(ScenarioError, ValueError)


def test_method_config_input_sends_only_what_is_set():
    training = TrainingSpec(rounds=5, local_epochs=3, lr=0.1, batch_size=8, momentum=0.5)
    spec = MethodSpec(method="fedavg", aggregation="median", hyperparameters={"lr": 0.2})
    assert spec.config_input(training) == {
        "method": "fedavg",
        # The training schedule, then the method's own hyper-parameters win (lr 0.2).
        "hyperparameters": {"lr": 0.2, "local_epochs": 3, "batch_size": 8, "momentum": 0.5},
        "aggregation": "median",
    }
    assert MethodSpec(method="fednoro", warmup_rounds=0, probe_size=4).config_input(training) == {
        "method": "fednoro",
        "hyperparameters": {"lr": 0.1, "local_epochs": 3, "batch_size": 8, "momentum": 0.5},
        "warmup_rounds": 0,
        "probe_size": 4,
    }
    private = MethodSpec(method="fedavg", name="private", privacy={"min_class_count": 5})
    assert private.config_input(training)["privacy"] == {"min_class_count": 5, "count_bucket": 1}


def test_overrides_merge_params_and_reset_them_on_a_new_method():
    base = validate_scenario(
        {
            "partition": {"method": "dirichlet", "params": {"beta": 0.5}},
            "noise": {"protocol": "rho_range", "params": {"rho": 0.4}},
        }
    )
    merged = apply_overrides(base, {"partition.params": {"max_redraws": 3}, "clients": 7})
    assert merged.partition.params == {"beta": 0.5, "max_redraws": 3}
    assert merged.clients == 7
    # A new partition method has other parameters: the old ones are dropped, new ones kept
    # (whatever the order of the overrides).
    changed = apply_overrides(
        base, {"partition.params": {"num_shards_per_client": 3}, "partition.method": "shards"}
    )
    assert changed.partition.method == "shards"
    assert changed.partition.params == {"num_shards_per_client": 3}
    # The same method keeps its parameters; None means "not given".
    same = apply_overrides(base, {"noise.protocol": "rho_range", "training.rounds": None})
    assert same.noise.params == {"rho": 0.4}
    assert same.training.rounds == base.training.rounds
    with pytest.raises(ScenarioError, match="clients: Input should be greater"):
        apply_overrides(base, {"clients": -1})


def test_exact_number_of_noisy_clients_in_a_scenario_and_as_a_flag(tmp_path: Path):
    path = tmp_path / "count.yaml"
    path.write_text(
        "clients: 10\n"
        "noise:\n"
        "  protocol: rho_range\n"
        "  params: {noisy_clients: 3, lo: 0.5, hi: 0.7}\n"
    )
    assert load_scenario(path).noise.params == {"noisy_clients": 3, "lo": 0.5, "hi": 0.7}
    # More noisy clients than the dummy draw of 4 is fine; more than the clients is not.
    base = validate_scenario({"clients": 10, "noise": {"protocol": "rho_range"}})
    assert apply_overrides(base, {"noise.params": {"noisy_clients": 8}}).noise.params == {
        "noisy_clients": 8
    }
    with pytest.raises(ScenarioError, match="noisy_clients=12 exceeds the 10 clients"):
        apply_overrides(base, {"noise.params": {"noisy_clients": 12}})
    with pytest.raises(ScenarioError, match="give rho or noisy_clients, not both"):
        validate_scenario(
            {"noise": {"protocol": "rho_range", "params": {"rho": 0.4, "noisy_clients": 2}}}
        )
    # The flag (--noisy-clients) replaces the preset's rate-based selection (rho).
    v1 = get_preset("V1")
    assert v1.noise.params["rho"] == 0.4
    counted = apply_overrides(v1, {"noise.noisy_clients": 3})
    assert counted.noise.params == {"lo": 0.5, "hi": 0.7, "noisy_clients": 3}


def test_clipped_gaussian_and_k_classes_are_scenario_options():
    scenario = validate_scenario(
        {
            "partition": {"method": "k_classes", "params": {"k": 3}},
            "noise": {"protocol": "clipped_gaussian", "params": {"mu": 0.2, "lo": 0.0, "hi": 0.6}},
        }
    )
    assert scenario.partition.params == {"k": 3}
    with pytest.raises(ScenarioError, match="has no parameter"):
        validate_scenario({"partition": {"method": "k_classes", "params": {"beta": 1.0}}})
    with pytest.raises(ScenarioError, match="lo=0.7 must not exceed hi=0.6"):
        validate_scenario(
            {"noise": {"protocol": "clipped_gaussian", "params": {"lo": 0.7, "hi": 0.6}}}
        )


def test_parse_key_values():
    parsed = parse_key_values(
        ["lr=0.5", "amp=true", "name=sgd", "seeds=[0, 1]", "note=a=b"], option="--hp"
    )
    assert parsed == {"lr": 0.5, "amp": True, "name": "sgd", "seeds": [0, 1], "note": "a=b"}
    with pytest.raises(ScenarioError, match="--hp 'lr': expected KEY=VALUE"):
        parse_key_values(["lr"], option="--hp")
    with pytest.raises(ScenarioError, match="expected KEY=VALUE"):
        parse_key_values(["=3"], option="--hp")


def test_method_lookup_by_name():
    scenario = get_preset("V5")
    assert scenario.method("trimmed_mean").aggregation == "trimmed_mean"
    with pytest.raises(ScenarioError, match="has no method 'fedrn'"):
        scenario.method("fedrn")


# --------------------------------------------------------------------------------------------
# presets


def test_every_preset_is_a_valid_scenario():
    assert set(PRESET_NAMES) == {"V1", "V2", "V3", "V4", "V5", "V6", "demo"}
    for name in PRESET_NAMES:
        assert isinstance(get_preset(name), Scenario)


def test_presets_follow_the_evaluation_table():
    # EVALUATION.md, "Reference scenarios", row by row.
    v1 = get_preset("V1")
    assert (v1.dataset, v1.clients) == ("digits", 20)
    assert (v1.partition.method, v1.partition.params) == (
        "bernoulli_dirichlet",
        {"p": 0.9, "alpha": 2.0},
    )
    assert (v1.noise.protocol, v1.noise.params, v1.noise.flip) == (
        "rho_range",
        {"rho": 0.4, "lo": 0.5, "hi": 0.7},
        "symmetric",
    )
    v2 = get_preset("V2")
    assert (v2.dataset, v2.clients, v2.partition.method, v2.partition.params) == (
        "pneumoniamnist",
        10,
        "dirichlet",
        {"beta": 1.0},
    )
    assert (v2.noise.protocol, v2.noise.params) == ("rho_tau", {"rho": 0.4, "tau": 0.5})
    v3 = get_preset("V3")
    assert (v3.dataset, v3.clients, v3.partition.params) == (
        "mnist",
        50,
        {"num_shards_per_client": 2},
    )
    assert v3.noise.params == {"rho": 0.3, "lo": 0.3, "hi": 0.5}
    v4 = get_preset("V4")
    assert (v4.partition.method, v4.noise.protocol) == ("iid", "none")
    v5 = get_preset("V5")
    assert (v5.noise.protocol, v5.noise.params) == ("bernoulli", {"p": 0.7})
    assert [m.name for m in v5.methods] == ["fedncl", "trimmed_mean", "fedavg"]
    v6 = get_preset("V6")
    assert (v6.partition.method, v6.noise.protocol, v6.noise.params) == (
        "shards",
        "linear",
        {"lo": 0.0, "hi": 0.8},
    )
    assert [m.method for m in v6.methods] == ["fedrn"]


def test_demo_preset_is_v1_with_fednoro_against_fedavg():
    demo, v1 = get_preset("demo"), get_preset("V1")
    assert (demo.dataset, demo.clients, demo.partition, demo.noise) == (
        v1.dataset,
        v1.clients,
        v1.partition,
        v1.noise,
    )
    assert [m.method for m in demo.methods] == ["fednoro", "fedavg"]
    assert demo.training.rounds == 20


def test_a_scenario_without_training_gets_the_reference_schedule():
    # The schedule V1-V6 were measured with (presets module docstring), not the coordinator's
    # generic 20 rounds x 1 epoch at lr 0.01, with which the small models barely learn.
    scenario = validate_scenario({"dataset": "wine", "clients": 3, "methods": [{}]})
    assert scenario.training == TrainingSpec(
        rounds=100, local_epochs=5, lr=0.05, batch_size=32, momentum=0.5
    )
    for name in ("V1", "V2", "V3", "V4", "V5", "V6"):
        assert get_preset(name).training == scenario.training, name


def test_preset_names_are_case_insensitive_and_copies():
    assert get_preset("v1") == get_preset("V1")
    data = preset_data("V1")
    data["clients"] = 3
    data["partition"]["params"]["p"] = 0.1
    data["methods"].append({"method": "flr"})
    data["training"]["rounds"] = 2
    v1 = get_preset("V1")
    assert (v1.clients, v1.partition.params["p"], len(v1.methods)) == (20, 0.9, 2)
    assert v1.training.rounds == 100
    with pytest.raises(ScenarioError, match="preset 'V9' does not exist"):
        get_preset("V9")


def test_a_written_scenario_reads_back_identically(tmp_path: Path):
    # simulate() writes scenario.json with model_dump_json; it must be a valid scenario file.
    scenario = validate_scenario(
        {
            "noise": {"protocol": "uniform_all", "flip": "asymmetric", "class_map": {3: 5}},
            "methods": [{"method": "fedavg", "audit": {"status_m": 1}}],
            "seeds": [2, 7],
        }
    )
    path = tmp_path / "scenario.json"
    path.write_text(scenario.model_dump_json(indent=1))
    assert load_scenario(path) == scenario
