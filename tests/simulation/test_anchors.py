"""Simulated trust anchors: the first sites' labels curated, the sites marked as anchors."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from fedaudit_sim.noise import NoiseReport
from fedaudit_sim.preparation import curated
from fedaudit_sim.scenario import ScenarioError, validate_scenario


def report() -> NoiseReport:
    # two sites of three samples; site 0's second label and site 1's second label flipped
    return NoiseReport(
        noisy_labels=np.array([0, 0, 0, 1, 0, 0]),
        flipped=np.array([False, True, False, False, True, False]),
        target_rates=np.array([0.4, 0.4]),
        realised_rates=np.array([1 / 3, 1 / 3]),
        noisy_clients=np.array([True, True]),
        client_flipped=(np.array([False, True, False]), np.array([False, True, False])),
        protocol="rho_range",
        flip="symmetric",
        threshold=0.1,
    )


LABELS = np.array([0, 1, 0, 1, 1, 0])
INDICES = [np.array([0, 1, 2]), np.array([3, 4, 5])]


def test_an_anchor_holds_its_true_labels_and_the_others_keep_their_noise() -> None:
    noise = curated(report(), LABELS, INDICES, anchors=1)
    assert noise.noisy_labels.tolist() == [0, 1, 0, 1, 0, 0]  # site 0 restored, site 1 not
    assert noise.flipped.tolist() == [False, False, False, False, True, False]
    assert noise.realised_rates.tolist() == [0.0, pytest.approx(1 / 3)]
    assert noise.target_rates.tolist() == [0.0, 0.4]
    assert noise.noisy_clients.tolist() == [False, True]
    assert noise.client_flipped[0].tolist() == [False, False, False]
    assert noise.client_flipped[1].tolist() == [False, True, False]
    assert any("trust anchors" in note for note in noise.notes)
    # the input is not changed, and no anchors change nothing
    assert report().noisy_labels.tolist() == [0, 0, 0, 1, 0, 0]
    unchanged = curated(report(), LABELS, INDICES, anchors=0)
    assert unchanged.noisy_labels.tolist() == [0, 0, 0, 1, 0, 0]


def test_anchors_must_leave_a_site_that_is_not_one() -> None:
    with pytest.raises(ScenarioError, match="at least one of the 4 sites"):
        validate_scenario({"clients": 4, "anchors": 4})
    with pytest.raises(ScenarioError, match="anchors"):
        validate_scenario({"anchors": -1})
    assert validate_scenario({"clients": 4, "anchors": 1}).anchors == 1


def test_the_flag_sets_the_scenarios_anchors() -> None:
    from fedaudit_sim.simulate_flags import SimulateFlags

    assert SimulateFlags(dataset="digits", clients=4, anchors=2).scenario().anchors == 2
    assert SimulateFlags(dataset="digits", clients=4).scenario().anchors == 0


@pytest.mark.slow
def test_a_simulated_anchor_is_marked_in_every_federation(tmp_path) -> None:
    from fedaudit_sim.runner import simulate

    scenario = validate_scenario(
        {
            "name": "anchored",
            "dataset": "digits",
            "clients": 5,
            "partition": {"method": "iid"},
            "noise": {"protocol": "rho_range", "params": {"rho": 1.0, "lo": 0.5, "hi": 0.5}},
            "anchors": 1,
            "training": {"rounds": 1, "local_epochs": 1},
            "methods": [{"method": "fedavg"}, {"method": "fednoro"}],
            "seeds": [0],
        }
    )
    runs = simulate(scenario, tmp_path / "out", plots=False).runs
    assert len(runs) == 2
    for run in runs:
        by_name = {c.name: c for c in run.clients}
        # every site was drawn noisy at 0.5; the anchor's labels are curated
        assert not by_name["client-00"].true_noisy
        assert by_name["client-00"].realised_rate == 0.0
        assert all(by_name[f"client-0{k}"].true_noisy for k in range(1, 5))
    # the coordinator's own record (its data are kept): the anchor marked in both federations
    database = tmp_path / "out" / "coordinator" / "fedaudit.db"
    with sqlite3.connect(database) as con:
        rows = con.execute("SELECT name, anchor FROM client").fetchall()
    assert sorted(rows) == sorted(
        [("client-00", 1), ("client-01", 0), ("client-02", 0), ("client-03", 0), ("client-04", 0)]
        * 2
    )
