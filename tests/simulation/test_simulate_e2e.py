"""A whole simulated federation: a real coordinator process, real SDK participants, over HTTP.

Digits, 8 IID clients, 3 of them with 80% of their labels flipped (rho_range(rho=0.375,
lo=hi=0.8): exactly floor(0.375 * 8) = 3 noisy clients), FedNoRo against FedAvg on identical
data for 5 rounds. The primary detector (the calibrated evidence) must find exactly the
planted clients once the global model beats the label prior, and flag no clean client, after
the one-round warm-up (10 of 100 rounds scaled to 5 rounds, at least 1).
"""

from __future__ import annotations

import csv
import json
import sqlite3
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from fedaudit_sim.federation import RoundEvent
from fedaudit_sim.runner import simulate
from fedaudit_sim.scenario import TrainingSpec, validate_scenario
from service.cli import app

SCENARIO = {
    "name": "e2e",
    "dataset": "digits",
    "clients": 8,
    "partition": {"method": "iid"},
    "noise": {"protocol": "rho_range", "params": {"rho": 0.375, "lo": 0.8, "hi": 0.8}},
    "training": {"rounds": 5, "local_epochs": 5, "lr": 0.05, "batch_size": 32},
    "methods": [{"method": "fednoro"}, {"method": "fedavg"}],
    "seeds": [1],
}


@pytest.mark.slow
def test_detection_finds_the_planted_noisy_clients(tmp_path: Path):
    events: list[RoundEvent] = []
    outcome = simulate(
        validate_scenario(SCENARIO), tmp_path / "out", plots=False, on_round=events.append
    )
    fednoro, fedavg = outcome.runs
    planted = {c.name for c in fednoro.clients if c.true_noisy}
    assert len(planted) == 3
    # 0.8 * 180 samples: every planted client really lost about 80% of its labels.
    assert all(c.realised_rate > 0.75 for c in fednoro.clients if c.true_noisy)
    assert fednoro.warmup_rounds == 1
    # The primary detector is the calibrated evidence. In round 1, the first after the
    # warm-up, the global model does not beat the label prior yet: it abstains (nobody flagged).
    # From round 2 its flags are exactly the planted clients, and its score ranks them above
    # every clean client.
    assert fednoro.rounds[1].metrics["flagged"] == []
    for record in fednoro.rounds[2:]:
        assert set(record.metrics["flagged"]) == planted, record.index
        assert record.metrics["auroc"] == 1.0
    assert fednoro.summary["final"]["f1"] == 1.0
    # So every planted client is first flagged in round 2, and no clean client is ever flagged.
    assert fednoro.summary["first_detection"]["rounds"] == dict.fromkeys(sorted(planted), 2)
    assert fednoro.summary["false_alarms"]["total_false_flags"] == 0
    assert len(fednoro.summary["detection_per_round"]) == 5
    # Once flagged in two rounds (the status rule, 2 of 3), the noisy clients are told to train
    # as noisy (FedNoRo's second stage).
    last_roles = {c.name: c.role for c in fednoro.rounds[-1].clients}
    assert {name for name, role in last_roles.items() if role == "noisy"} == planted
    # Identical data and initial model for both methods: same clients, same truth, and the
    # round-0 audit (the initial model's per-class losses on the same labels) is identical.
    assert [(c.name, c.num_samples, c.realised_rate) for c in fednoro.clients] == [
        (c.name, c.num_samples, c.realised_rate) for c in fedavg.clients
    ]
    assert [c.normalised_loss for c in fednoro.rounds[0].clients] == [
        c.normalised_loss for c in fedavg.rounds[0].clients
    ]
    # The models learn: better than chance (0.1) on the clean test split.
    assert fednoro.rounds[-1].accuracy > 0.5
    assert fedavg.rounds[-1].accuracy > 0.5
    assert all(r.coordinator_seconds is not None for r in fednoro.rounds)
    assert len(events) == 10  # 5 rounds of each method
    assert {e.label for e in events} == {"fednoro", "fedavg"}
    # The coordinator's own report agrees with the flags.
    assert fednoro.report is not None
    assert {row["name"] for row in fednoro.report["clients"] if row["status"] == "noisy"} == planted
    # Files: JSON per run, CSV, the coordinator's data directory with its database.
    out = outcome.out_dir
    run_json = json.loads((out / "runs" / "fednoro_seed1.json").read_text())
    assert run_json["summary"]["final"]["flagged"] == sorted(planted)
    with (out / "clients.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 * 5 * 8
    assert (outcome.data_dir / "fedaudit.db").is_file()
    assert json.loads((out / "scenario.json").read_text())["clients"] == 8
    # The SDK's confident errors reach the store: at most the errors, class by class; in the
    # last round a planted site's errors (80 % of its labels flipped) are mostly confident,
    # a clean site's few.
    names = {c.client_id.replace("-", ""): c.name for c in fednoro.clients}
    with sqlite3.connect(outcome.data_dir / "fedaudit.db") as db:
        stored = db.execute(
            "SELECT client_id, signals FROM model_update WHERE round_index = 4 "
            "AND federation_id = ?",
            (fednoro.federation_id.replace("-", ""),),
        ).fetchall()
    assert len(stored) == 8
    for client_id, text in stored:
        signals = json.loads(text)
        errors, confident = signals["per_class_errors"], signals["per_class_confident_errors"]
        assert all(
            (e is None) == (k is None) and (k is None or 0 <= k <= e)
            for e, k in zip(errors, confident, strict=True)
        )
        share = sum(k or 0 for k in confident) / max(1, sum(e or 0 for e in errors))
        if names[client_id] in planted:
            assert share > 0.5, names[client_id]


runner = CliRunner()


def test_cli_simulate_reports_a_bad_scenario_file(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text("clients: 3\npartition: {method: shards, params: {beta: 1}}\n")
    result = runner.invoke(app, ["simulate", "--scenario", str(path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "partition: partition 'shards' has no parameter(s) ['beta']" in result.output
    assert not (tmp_path / "o").exists()


def test_cli_simulate_a_scenario_that_does_not_fit_its_data_writes_nothing(tmp_path: Path):
    out = tmp_path / "o"
    args = ["simulate", "--dataset", "wine", "--clients", "500", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "num_clients=500 exceeds the 142 samples" in " ".join(result.output.split())
    assert not out.exists()  # so the same --out can be used for the corrected scenario


def test_cli_simulate_missing_data_shows_the_error_without_progress_bars(tmp_path: Path):
    empty = tmp_path / "no-data"
    empty.mkdir()
    args = ["simulate", "--dataset", "breastmnist", "--clients", "4", "--datasets-dir", str(empty)]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert "breastmnist.npz' not found" in result.output
    assert "waiting" not in result.output  # no bar was drawn: nothing had started


def test_cli_simulate_without_torchvision_names_the_extra(tmp_path: Path, monkeypatch):
    # None in sys.modules makes "import torchvision" fail, whether or not it is installed.
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.delitem(sys.modules, "torchvision.models", raising=False)
    out = tmp_path / "o"
    args = ["simulate", "--dataset", "digits", "--clients", "4", "--model", "tv:resnet18"]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 2, result.output  # a clear error, not a traceback
    assert "model: model 'tv:resnet18' needs torchvision" in " ".join(result.output.split())
    # the extra's name is printed as written, not eaten as console markup
    assert "pip install 'fedaudit[vision]'" in " ".join(result.output.split())
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--seed", "1", "--seeds", "0,1"], "give --seed or --seeds, not both"),
        (["--seeds", "0,x"], "--seeds '0,x': expected comma-separated integers"),
        (["--method", "fedavg", "--compare", "fedavg,fednoro"], "not both"),
        (["--compare", "fedavg,fedsgd"], "method 'fedsgd' is neither"),
        (["--preset", "V9"], "preset 'V9' does not exist"),
        (["--partition-param", "beta"], "--partition-param 'beta': expected KEY=VALUE"),
        (["--flip", "asymmetric", "--class-map", "3-5"], "expected SOURCE:TARGET pairs"),
        (["--noise", "rho_range", "--noise-param", "rho=2"], "rho=2 must lie in [0, 1]"),
        (["--preset", "V1", "--momentum", "1.5"], "training.momentum: Input should be less than 1"),
        (["--data-npz", "a.npz", "--data-function", "m:f"], "give --data-npz or --data-function"),
        (["--dataset", "wine", "--data-npz", "a.npz"], "--dataset 'wine' and a custom data set"),
        (["--data-npz", "gone.npz"], "npz file 'gone.npz' not found"),
        (["--noise", "rho_range", "--noisy-clients", "12"], "noisy_clients=12 exceeds the 10"),
    ],
)
def test_cli_simulate_flag_errors(tmp_path: Path, args: list[str], expected: str):
    result = runner.invoke(app, ["simulate", *args, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert expected in " ".join(result.output.split())


def test_cli_simulate_help_states_the_scenario_training_defaults():
    # The help text writes the defaults out (the CLI module does not import the simulator at
    # load); they must be TrainingSpec's.
    command = typer.main.get_command(app)
    assert isinstance(command, typer.core.TyperGroup)
    helps = {p.name: getattr(p, "help", "") for p in command.commands["simulate"].params}
    defaults = TrainingSpec()
    for name in ("rounds", "local_epochs", "lr", "batch_size", "momentum"):
        assert f"(scenario default {getattr(defaults, name)})" in helps[name], name


def test_cli_simulate_refuses_a_used_output_directory(tmp_path: Path):
    (tmp_path / "results.json").write_text("{}")
    result = runner.invoke(app, ["simulate", "--preset", "V4", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "is not an empty directory" in " ".join(result.output.split())


@pytest.mark.slow
def test_cli_demo_prints_the_report_next_to_the_ground_truth(tmp_path: Path):
    out = tmp_path / "demo"
    result = runner.invoke(app, ["demo", "--rounds", "2", "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    text = result.output
    # The report table has the true-noise column; the ground truth and both methods follow.
    assert "true noise" in text
    assert "ground truth: 8 of 20 clients are noisy" in text
    assert "fednoro seed 0 (primary detector evidence)" in text
    assert "false alarms:" in text
    assert "accuracy and detection, both methods" in text
    # A run shorter than the reference schedule says where the accuracy gap shows.
    assert "after 2 rounds both models are still learning" in " ".join(text.split())
    assert "fedaudit demo --rounds 100" in " ".join(text.split())
    # where the results and the data are, and how to open the run in the dashboard (README)
    flat = " ".join(text.split())
    assert "results: " in flat
    assert "browse the reports in the admin dashboard: FEDAUDIT_DATA_DIR=" in flat
    assert "fedaudit serve, then open http://127.0.0.1:8000/admin" in flat
    for name in ("accuracy.png", "scores_vs_noise.png", "rounds.csv", "clients.csv"):
        assert (out / name).is_file(), name
    assert (out / "runs" / "fednoro_seed0.json").is_file()
    assert (out / "runs" / "fedavg_seed0.json").is_file()
    assert (out / "coordinator" / "coordinator.log").is_file()


@pytest.mark.slow
def test_a_diverging_method_fails_alone_and_the_comparison_completes(tmp_path: Path):
    # Two methods on identical data; one of them with an absurd learning rate, so its first
    # client's weights overflow within its first epoch. That run is recorded as failed (round,
    # client, the SDK's error) and the other one runs to the end and is scored.
    scenario = tmp_path / "diverge.json"
    scenario.write_text(
        json.dumps(
            {
                "name": "diverge",
                "dataset": "digits",
                "clients": 3,
                "partition": {"method": "iid"},
                "noise": {"protocol": "none"},
                "training": {"rounds": 2, "local_epochs": 1, "lr": 0.05, "batch_size": 32},
                "methods": [
                    {"name": "blowup", "method": "fedavg", "hyperparameters": {"lr": 1e30}},
                    {"method": "fedavg"},
                ],
                "seeds": [0],
            }
        )
    )
    out = tmp_path / "out[run]"  # brackets in the path are printed, not taken for markup
    args = ["simulate", "--scenario", str(scenario), "--out", str(out), "--no-progress"]
    result = runner.invoke(app, [*args, "--no-plots"])
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert f"results: {out} " in "".join(result.output.splitlines())
    assert "1 of 2 run(s) failed" in text
    assert "blowup seed 0: client-00 failed in round 0 (TrainingDivergedError:" in text
    assert "0 round(s) completed" in text
    # The finished run's row is in the comparison table, and its files are written.
    assert "│ fedavg" in result.output
    assert "│ blowup" not in result.output
    results = json.loads((out / "results.json").read_text())
    assert [run["label"] for run in results["runs"]] == ["fedavg"]
    assert results["runs"][0]["rounds"] == 2
    [failure] = results["failures"]
    assert failure["label"] == "blowup"
    assert failure["seed"] == 0
    assert failure["round_index"] == 0
    assert failure["client"] == "client-00"
    assert failure["error"].startswith("TrainingDivergedError: training: the loss became")
    assert failure["rounds_completed"] == 0
    assert (out / "runs" / "fedavg_seed0.json").is_file()
    assert not (out / "runs" / "blowup_seed0.json").exists()
    # The coordinator's database says why that federation ended.
    with sqlite3.connect(out / "coordinator" / "fedaudit.db") as db:
        status, reason = db.execute(
            "SELECT status, status_reason FROM federation WHERE id = ?",
            (failure["federation_id"].replace("-", ""),),
        ).fetchone()
    assert status == "stopped"
    assert reason.startswith("stopped by the admin: simulation: client-00 failed in round 0 (")


@pytest.mark.slow
def test_cli_simulate_a_custom_function_data_set_prints_the_detection_summary(tmp_path: Path):
    # 3 classes of 40 blobs from a function named in the scenario file, 4 sites holding 2
    # classes each, exactly one site with all labels flipped (pairflip), 2 rounds of fednoro.
    scenario = tmp_path / "custom.yaml"
    scenario.write_text(
        "name: custom-e2e\n"
        "dataset: custom\n"
        "custom_data:\n"
        "  function: tests.simulation.test_custom_data:blobs\n"
        "  params: {n_per_class: 40, classes: 3, features: 4}\n"
        "clients: 4\n"
        "partition: {method: k_classes, params: {k: 2}}\n"
        "noise: {protocol: rho_range, params: {noisy_clients: 1, lo: 1.0, hi: 1.0}, "
        "flip: pairflip}\n"
        "training: {rounds: 2, local_epochs: 1}\n"
        "methods: [{method: fednoro}]\n"
    )
    out = tmp_path / "out"
    args = ["simulate", "--scenario", str(scenario), "--out", str(out), "--no-progress"]
    result = runner.invoke(app, [*args, "--no-plots"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "custom data (tests.simulation.test_custom_data:blobs)" in text
    assert "fednoro seed 0 (primary detector evidence)" in text
    assert "false alarms:" in text
    assert "first detection:" in text
    run = json.loads((out / "results.json").read_text())["runs"][0]
    assert run["true_noisy"] == 1
    assert [r["round"] for r in run["detection_per_round"]] == [0, 1]
    assert run["first_detection"]["noisy_sites"] == 1
    assert set(run["false_alarms"]) >= {"first_false_flag_round", "worst_round", "sites"}


@pytest.mark.slow
def test_three_sites_one_with_shuffled_labels_is_flagged_with_the_defaults(tmp_path: Path):
    # README's federation has three sites; issue 21 point 4: with the default configuration a site
    # whose labels are all replaced at random is flagged (the small-federation rule of the
    # evidence detector: worse than the label prior), the two clean sites never, and the flags
    # cost the noisy site its weight.
    scenario = tmp_path / "three.json"
    scenario.write_text(
        json.dumps(
            {
                "name": "three",
                "dataset": "digits",
                "clients": 3,
                "partition": {"method": "iid"},
                "noise": {
                    "protocol": "rho_range",
                    "params": {"noisy_clients": 1, "lo": 1.0, "hi": 1.0},
                    "flip": "symmetric_any",
                },
                "training": {"rounds": 8},
                "methods": [{"method": "fednoro"}],
                "seeds": [0],
            }
        )
    )
    out = tmp_path / "out"
    args = ["simulate", "--scenario", str(scenario), "--out", str(out), "--no-progress"]
    result = runner.invoke(app, [*args, "--no-plots"])
    assert result.exit_code == 0, result.output
    run = json.loads((out / "runs" / "fednoro_seed0.json").read_text())
    noisy = [c["name"] for c in run["clients"] if c["true_noisy"]]
    assert len(noisy) == 1
    after = [r for r in run["rounds"] if r["index"] >= run["config"]["warmup_rounds"]]
    assert after, "no round after the warm-up"
    for rnd in after:
        assert rnd["primary"] == "evidence"
        for client in rnd["clients"]:
            if client["name"] not in noisy:
                assert client["primary_flag"] is not True, (rnd["index"], client["name"])
    last = {c["name"]: c for c in after[-1]["clients"]}
    assert last[noisy[0]]["primary_flag"] is True
    assert last[noisy[0]]["status"] == "noisy"
    clean_weights = [c["weight"] for name, c in last.items() if name != noisy[0]]
    assert last[noisy[0]]["weight"] < min(clean_weights)
