"""`fedaudit simulate` with the signal privacy policy on: the simulated sites send what the
policy allows (the coordinator's database holds the suppressed counts as null) and the run
completes with its detection scored, so the policy's cost can be measured."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from fedaudit_sim.runner import simulate
from fedaudit_sim.scenario import validate_scenario

SCENARIO = {
    "name": "privacy",
    "dataset": "digits",
    "clients": 6,
    # Dirichlet(0.3): each site holds some classes by a handful of samples
    "partition": {"method": "dirichlet", "params": {"beta": 0.3}},
    "noise": {"protocol": "rho_range", "params": {"noisy_clients": 2, "lo": 0.8, "hi": 0.8}},
    "training": {"rounds": 3, "local_epochs": 1, "lr": 0.05, "batch_size": 32},
    "methods": [
        {
            "method": "fednoro",
            "name": "private",
            "warmup_rounds": 1,
            "privacy": {"min_class_count": 10, "count_bucket": 5},
        }
    ],
    "seeds": [2],
}


@pytest.mark.slow
def test_a_simulated_federation_under_the_policy_runs_and_is_scored(tmp_path: Path):
    outcome = simulate(validate_scenario(SCENARIO), tmp_path / "out", plots=False)
    (run,) = outcome.runs
    assert len(run.rounds) == 3
    assert "f1" in run.summary["final"]
    with sqlite3.connect(outcome.data_dir / "fedaudit.db") as db:
        rows = db.execute("SELECT num_samples, class_counts FROM client").fetchall()
    declared = [(n, json.loads(counts)) for n, counts in rows]
    assert len(declared) == 6
    assert all(n % 5 == 0 for n, _ in declared)
    assert all(c is None or c % 5 == 0 for _, counts in declared for c in counts)
    assert all(c is None or c == 0 or c >= 10 for _, counts in declared for c in counts)
    # Dirichlet(0.3) leaves some site a class of 1-9 samples: sent as null
    assert any(c is None for _, counts in declared for c in counts)


DP_SCENARIO = {
    **SCENARIO,
    "name": "privacy-dp",
    "methods": [
        {
            "method": "fednoro",
            "name": "gaussian",
            "warmup_rounds": 1,
            # expertise asks for the probe softmax: two noised signals per update
            "detectors": ["fednoro", "evidence", "expertise"],
            "primary_detector": "evidence",
            "privacy": {"dp_noise_multiplier": 2.0, "dp_clip_loss": 5.0, "dp_delta": 1e-5},
        }
    ],
}


@pytest.mark.slow
def test_a_simulated_federation_under_the_gaussian_mechanism_reports_its_epsilon(
    tmp_path: Path,
) -> None:
    epsilon = pytest.importorskip("service.coordinator.privacy_budget").epsilon
    pytest.importorskip("dp_accounting")
    outcome = simulate(validate_scenario(DP_SCENARIO), tmp_path / "out", plots=False)
    (run,) = outcome.runs
    assert len(run.rounds) == 3
    assert "f1" in run.summary["final"]
    privacy = run.report["privacy"]
    assert privacy["releases_per_update"] == 2
    assert privacy["epsilon_per_round"] == pytest.approx(epsilon(2.0, 1e-5, 2))
    # every site sent an update in each of the 3 rounds: 6 releases each
    for row in run.report["clients"]:
        assert row["epsilon_round"] == pytest.approx(privacy["epsilon_per_round"])
        assert row["epsilon_total"] == pytest.approx(epsilon(2.0, 1e-5, 6))
    with sqlite3.connect(outcome.data_dir / "fedaudit.db") as db:
        stored = [json.loads(s) for (s,) in db.execute("SELECT signals FROM model_update")]
    assert len(stored) == 18
    for signals in stored:
        # the mechanism sends no spread and no error counts; the means stay within the clip
        assert "per_class_loss_sd" not in signals
        assert "per_class_errors" not in signals
        assert "per_class_confident_errors" not in signals
        assert all(v is None or 0.0 <= v <= 5.0 for v in signals["per_class_loss"])
        assert all(abs(sum(row) - 1.0) < 1e-6 for row in signals["probe_softmax"])


def test_a_site_the_policy_leaves_nothing_to_report_fails_the_run_clearly(tmp_path: Path):
    # A minimum of 1,000 samples a class: every digits site's classes are suppressed, the SDK
    # refuses to join the first one, and the simulator says which site and why.
    from fedaudit_sim.federation import SimulationError

    scenario = {
        **SCENARIO,
        "name": "privacy-too-strict",
        "methods": [{**SCENARIO["methods"][0], "privacy": {"min_class_count": 1000}}],
    }
    with pytest.raises(
        SimulationError, match=r"'private': client-00 cannot join .*min_class_count"
    ):
        simulate(validate_scenario(scenario), tmp_path / "out", plots=False)
