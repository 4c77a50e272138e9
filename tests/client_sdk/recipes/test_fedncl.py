"""Fed-NCL label correction: threshold, activation rule, per-round restart, status."""

from __future__ import annotations

import pytest
import torch

from client_sdk.local_state import LocalStateStore
from client_sdk.recipes import get_recipe, relabel
from client_sdk.recipes.fedncl import CORRECTION_STATUS_KEY
from tests.client_sdk.recipes.helpers import frozen, make_context, one_hot_data, scaled_identity


def test_relabel_respects_the_threshold() -> None:
    # max p: 0.95 > 0.9 -> relabel to 0; exactly 0.9 is not "exceeding" (eq. 18) but passes the
    # inclusive variant; 0.8 < 0.9 keeps its label; 0.95 agreeing with the label changes nothing.
    probs = torch.tensor([[0.95, 0.05], [0.9, 0.1], [0.2, 0.8], [0.05, 0.95]], dtype=torch.float64)
    labels = torch.tensor([1, 1, 0, 1])
    new, confident = relabel(probs, labels, 0.9)
    assert new.tolist() == [0, 1, 0, 1]
    assert confident.tolist() == [True, False, False, True]
    new_inclusive, _ = relabel(probs, labels, 0.9, inclusive=True)
    assert new_inclusive.tolist() == [0, 0, 0, 1]
    assert labels.tolist() == [1, 1, 0, 1]  # the input is not modified


def test_candidate_after_t_corr_relabels_the_flipped_samples() -> None:
    # theta_G = 4 * identity on one-hot inputs: max softmax ~ e^4 / (e^4 + 2) = 0.965 > 0.9 and
    # the argmax is the true class, so the 6 flipped labels are corrected for this round.
    data = one_hot_data()
    model, global_model = scaled_identity(0.5), frozen(scaled_identity(4.0))
    state = LocalStateStore(None)
    ctx = make_context(
        round_index=61,
        label_correction=True,
        hyperparameters={"batch_size": 8, "t_corr": 60},
        state=state,
    )
    report = get_recipe("fedncl_correction").train(model, global_model, data, ctx)
    assert report.metrics["correction_active"] == 1.0
    assert report.metrics["num_confident"] == 30.0
    assert report.metrics["num_relabelled"] == 6.0
    assert report.metrics["label_accuracy_before"] == pytest.approx(0.8)
    assert report.metrics["label_accuracy_after"] == 1.0
    # labels restart from the given ones every round: the data are untouched
    assert data.true_labels is not None
    assert int((data.labels != data.true_labels).sum()) == 6
    status = state.get_json(CORRECTION_STATUS_KEY)
    assert status["active"] is True
    assert status["first_active_round"] == 61
    assert status["num_relabelled"] == 6


@pytest.mark.parametrize(
    ("round_index", "candidate", "threshold"),
    [(60, True, 0.9), (61, False, 0.9), (61, True, 0.99)],
)
def test_no_relabelling_when_not_due(round_index: int, candidate: bool, threshold: float) -> None:
    # round 60 == t_corr does nothing (round > t_corr); a non-candidate never relabels; with
    # eta 0.99 no prediction (max 0.965) is confident enough.
    model, global_model = scaled_identity(0.5), frozen(scaled_identity(4.0))
    ctx = make_context(
        round_index=round_index,
        label_correction=candidate,
        hyperparameters={"batch_size": 8, "t_corr": 60, "confidence_threshold": threshold},
    )
    report = get_recipe("fedncl_correction").train(model, global_model, one_hot_data(), ctx)
    assert report.metrics.get("num_relabelled", 0.0) == 0.0
