"""Simulated sites that report the losses of their true labels (fedaudit_sim.lying)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from fedaudit_sim.lying import true_label_errors, true_label_losses
from fedaudit_sim.runner import simulate
from fedaudit_sim.scenario import Scenario, ScenarioError, validate_scenario


def identity_model() -> nn.Module:
    model = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(2))
    return model


# logits = inputs: [2, 0] and [0, 2]. Cross-entropy of [2, 0] with label 0 (and of [0, 2] with
# label 1) is log(1 + e^-2) = 0.126928; of [2, 0] with label 1 it is log(1 + e^2) = 2.126928.
SMALL = math.log1p(math.exp(-2.0))
LARGE = math.log1p(math.exp(2.0))
INPUTS = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]])
TRUE = torch.tensor([0, 1, 1])


def test_losses_are_those_of_the_true_labels_grouped_by_true_class() -> None:
    means, sds, mean = true_label_losses(identity_model(), INPUTS, TRUE, [2, 1])
    assert means[0] == pytest.approx(SMALL)
    assert means[1] == pytest.approx((SMALL + LARGE) / 2)
    assert sds[0] == pytest.approx(0.0)
    assert sds[1] == pytest.approx(1.0)  # |LARGE - SMALL| / 2 = 1 exactly
    assert mean == pytest.approx((2 * SMALL + LARGE) / 3)


def test_a_declared_class_without_true_samples_gets_the_overall_loss() -> None:
    # The site's noisy labels hold class 1 only (counts [0, 3]); truly it holds class 0 only.
    means, sds, mean = true_label_losses(
        identity_model(), INPUTS[:1].repeat(3, 1), torch.tensor([0, 0, 0]), [0, 3]
    )
    assert means == [None, pytest.approx(SMALL)]
    assert sds == [None, pytest.approx(0.0)]
    assert mean == pytest.approx(SMALL)


def test_errors_are_those_of_the_true_labels_scaled_to_the_declared_counts() -> None:
    # argmax of the logits: [0, 1, 0]; against TRUE [0, 1, 1] only the third sample is wrong.
    # True class 0: no error (0 of the 3 declared); true class 1: 1 of 2 wrong, times 4 declared.
    # That error gives the true label 1 / (1 + e^2) = 0.119 > 0.1: not a confident one.
    assert true_label_errors(identity_model(), INPUTS, TRUE, [3, 4]) == ([0, 2], [0, 0])
    # An undeclared class gets None; a declared class truly empty gets the overall rate (1/3).
    only_zero = torch.tensor([0, 0, 0])
    assert true_label_errors(identity_model(), INPUTS, only_zero, [0, 6]) == ([None, 2], [None, 0])


def test_confident_errors_are_those_the_model_gives_the_true_label_at_most_a_tenth() -> None:
    # Logits [3, 0] against true label 1: p = 1 / (1 + e^3) = 0.047, a confident error; [2, 0]
    # against label 1: 0.119, an error but not a confident one; [0, 2] against 1: right.
    inputs = torch.tensor([[3.0, 0.0], [2.0, 0.0], [0.0, 2.0], [0.0, 2.0]])
    true = torch.tensor([1, 1, 1, 1])
    # True class 1: 2 of 4 wrong, 1 of 4 confidently; declared 8 of class 1.
    assert true_label_errors(identity_model(), inputs, true, [0, 8]) == ([None, 4], [None, 2])


def test_lying_needs_a_positive_count_and_noise() -> None:
    noisy = {"protocol": "rho_range", "params": {"noisy_clients": 2, "lo": 0.5, "hi": 0.5}}
    with pytest.raises(ScenarioError, match="sites"):
        validate_scenario({"lying": {"sites": 0}, "noise": noisy})
    with pytest.raises(ScenarioError, match="set a noise protocol"):
        validate_scenario({"lying": {}})
    assert validate_scenario({"lying": {}, "noise": noisy}).lying is not None


def _liar_federation(
    name: str, method: dict[str, Any], clients: int = 8, lying: Any = 1, rounds: int = 5
) -> Scenario:
    """Digits, 8 IID sites (or ``clients``), 3 with 80% of their labels flipped; the first of
    them (by index) reports its true labels' losses (or ``lying``). 5 rounds, seed 1."""
    return validate_scenario(
        {
            "name": name,
            "dataset": "digits",
            "clients": clients,
            "partition": {"method": "iid"},
            "noise": {
                "protocol": "rho_range",
                "params": {"noisy_clients": 3, "lo": 0.8, "hi": 0.8},
            },
            "lying": {"sites": lying},
            "training": {"rounds": rounds, "local_epochs": 5, "lr": 0.05, "batch_size": 32},
            "methods": [method],
            "seeds": [1],
        }
    )


@pytest.mark.slow
def test_a_lying_site_hides_from_the_loss_evidence_not_from_its_accuracy(tmp_path: Path) -> None:
    # The update geometry off: what the reported losses alone see (the geometry catches this
    # liar: the last test below).
    scenario = _liar_federation("liar", {"method": "fednoro", "audit": {"geometry_check": False}})
    (run,) = simulate(scenario, tmp_path / "out", plots=False).runs
    noisy = [c.name for c in run.clients if c.true_noisy]
    liars = [c.name for c in run.clients if c.lies_about_losses]
    assert len(noisy) == 3
    assert liars == noisy[:1]
    assert any("true labels' losses: " + liars[0] in note for note in run.notes)
    honest_noisy = set(noisy) - set(liars)
    clean = {c.name for c in run.clients if not c.true_noisy}
    for record in run.rounds[2:]:
        by_name = {c.name: c for c in record.clients}
        # The lie works: the per-class loss evidence finds the honest noisy sites, not the liar
        # (the attack issue 20 describes) ...
        assert set(record.metrics["flagged"]) == honest_noisy, record.index
        # ... while what it does not control still gives it away: its model's accuracy on its
        # own labels (FedRN's expertise) ranks it below every clean site.
        liar_expertise = by_name[liars[0]].detectors["expertise"]["score"]
        assert liar_expertise < min(by_name[n].detectors["expertise"]["score"] for n in clean)


@pytest.mark.slow
def test_the_accuracy_evidence_catches_the_lying_site(tmp_path: Path) -> None:
    # The same federation with the accuracy evidence switched on: from round 2 the primary
    # verdict flags every noisy site, the liar included, and no clean site; the liar's flag
    # comes from its accuracy, not from the losses it reported.
    scenario = _liar_federation(
        "liar-caught", {"method": "fednoro", "audit": {"evidence_accuracy_check": True}}
    )
    (run,) = simulate(scenario, tmp_path / "out", plots=False).runs
    noisy = {c.name for c in run.clients if c.true_noisy}
    (liar,) = [c.name for c in run.clients if c.lies_about_losses]
    for record in run.rounds[2:]:
        assert set(record.metrics["flagged"]) == noisy, record.index
        liar_round = next(c for c in record.clients if c.name == liar)
        assert liar_round.detectors["evidence"]["flag"] is True


@pytest.mark.slow
def test_the_update_geometry_catches_sites_that_lie_about_everything_they_report(
    tmp_path: Path,
) -> None:
    # 10 IID sites, the 3 noisy ones all lying about their losses and error counts, default
    # audit: the loss evidence sees nobody, the update's direction gives the liars away.
    scenario = _liar_federation("liars", {"method": "fednoro"}, clients=10, lying="noisy", rounds=8)
    (run,) = simulate(scenario, tmp_path / "out", plots=False).runs
    noisy = {c.name for c in run.clients if c.true_noisy}
    assert {c.name for c in run.clients if c.lies_about_losses} == noisy
    flagged_rounds = []
    for record in run.rounds[2:]:
        flagged = set(record.metrics["flagged"])
        assert flagged <= noisy, record.index  # never a clean site
        for client in record.clients:
            if client.name in flagged:
                assert client.detectors["evidence"]["flag"] is True
        if flagged == noisy:
            flagged_rounds.append(record.index)
    assert flagged_rounds, "the liars were never flagged together"
    assert flagged_rounds[0] <= 3
    # and they stay flagged: in the noisy role their updates move with the others', the flag
    # their update raised is carried (service.audit.geometry_evidence, "Carried flags")
    assert flagged_rounds == list(range(flagged_rounds[0], len(run.rounds)))
    # the coordinator's report says what the liars' flags rest on
    assert run.report is not None
    basis = {row["name"]: row["flag_basis"] for row in run.report["clients"]}
    assert {name for name, b in basis.items() if b == "update_direction"} == noisy
