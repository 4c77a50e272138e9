"""FedRN: own-previous-model GMM, neighbor head fine-tuning, R'-weighted ensemble, selection."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from client_sdk.local_state import LocalStateStore
from client_sdk.recipes import ensemble_clean_probability, get_recipe
from client_sdk.recipes.errors import InvalidRoundContextError, ModelContractError
from client_sdk.recipes.fedrn import PREVIOUS_MODEL_PREFIX
from tests.client_sdk.recipes.helpers import (
    frozen,
    linear,
    make_context,
    make_data,
    neighbor,
    one_hot_data,
    scaled_identity,
    tiny_mlp,
)

# one_hot_data(30, 6): samples 0-5 flipped, 24 correct.
HP = {"batch_size": 8, "lr": 0.01, "warmup_rounds": 2}


def test_ensemble_weights_by_hand() -> None:
    # weights [3, 1] -> R' = [0.75, 0.25]; p = 0.75 * [1, 0] + 0.25 * [0.5, 0.5] = [0.875, 0.125]
    out = ensemble_clean_probability([np.array([1.0, 0.0]), np.array([0.5, 0.5])], [3.0, 1.0])
    np.testing.assert_allclose(out, [0.875, 0.125])
    with pytest.raises(InvalidRoundContextError, match="weights"):
        ensemble_clean_probability([np.array([1.0])], [0.0])


def test_previous_local_model_selects_clean_and_drops_flipped() -> None:
    # Prepare: the client's previous local model fits the true labels (logits = 4 x); theta_G
    # is useless (all logits 0). FedRN must use the previous model, not theta_G.
    state = LocalStateStore(None)
    state.put_tensors(PREVIOUS_MODEL_PREFIX, scaled_identity(4.0).state_dict())
    model, global_model = scaled_identity(0.0), frozen(scaled_identity(0.0))
    ctx = make_context(round_index=2, hyperparameters=HP, state=state)
    # Execute
    report = get_recipe("fedrn").train(model, global_model, one_hot_data(), ctx)
    # Assert: exactly the 24 correctly labelled samples are selected.
    assert report.metrics["used_previous_model"] == 1.0
    assert report.metrics["num_selected"] == 24.0
    assert report.metrics["label_precision"] == 1.0
    assert report.metrics["label_recall"] == 1.0
    assert report.metrics["fallback_all_samples"] == 0.0


def test_without_previous_model_theta_g_is_used_and_a_flat_loss_keeps_everyone() -> None:
    # theta_G gives every sample the same loss ln 3: no GMM can be fitted, every sample counts
    # as clean (24 correct of 30 selected: precision 0.8), and the report says why.
    model, global_model = scaled_identity(0.0), frozen(scaled_identity(0.0))
    ctx = make_context(round_index=2, hyperparameters=HP)
    report = get_recipe("fedrn").train(model, global_model, one_hot_data(), ctx)
    assert report.metrics["used_previous_model"] == 0.0
    assert report.metrics["num_selected"] == 30.0
    assert report.metrics["label_precision"] == pytest.approx(0.8)
    assert any("all losses are equal" in note for note in report.notes)


def test_reliable_neighbor_outweighs_an_uninformative_own_model() -> None:
    # Own model: flat losses -> p_self = 1 for all. Neighbor fits the truth -> p_n ~ 1 for the
    # 24 correct, ~ 0 for the 6 flipped. With R' = (0.2, 0.8):
    #   correct: 0.2 * 1 + 0.8 * ~1 ~ 1 > 0.5;  flipped: 0.2 * 1 + 0.8 * ~0 ~ 0.2 < 0.5.
    good = scaled_identity(4.0)
    sent = neighbor(good, weight=0.8)
    before = {k: v.clone() for k, v in sent.state_dict.items()}
    model, global_model = scaled_identity(0.0), frozen(scaled_identity(0.0))
    ctx = make_context(round_index=2, hyperparameters=HP, neighbors=[sent], self_weight=0.2)
    report = get_recipe("fedrn").train(model, global_model, one_hot_data(), ctx)
    assert report.metrics["num_selected"] == 24.0
    assert report.metrics["label_precision"] == 1.0
    # the neighbor's head was fine-tuned on a private copy, never on the state we were sent
    assert all(torch.equal(before[k], sent.state_dict[k]) for k in before)


def test_head_fine_tuning_changes_only_the_head(monkeypatch: pytest.MonkeyPatch) -> None:
    from client_sdk.recipes.fedrn import FedRNRecipe

    captured: list[torch.nn.Module] = []
    original = FedRNRecipe._finetune_head

    def spy(helper: torch.nn.Module, *args: object, **kwargs: object) -> None:
        original(helper, *args, **kwargs)  # type: ignore[arg-type]
        captured.append(helper)

    monkeypatch.setattr(FedRNRecipe, "_finetune_head", staticmethod(spy))
    net = tiny_mlp(3)
    model, global_model = tiny_mlp(0), frozen(tiny_mlp(0))
    ctx = make_context(
        round_index=2,
        hyperparameters={**HP, "head_lr": 0.5},
        neighbors=[neighbor(net, 0.5)],
        self_weight=0.5,
    )
    get_recipe("fedrn").train(model, global_model, make_data(24, flip=0.2), ctx)
    tuned = captured[0]
    assert torch.equal(linear(tuned, 1).weight, linear(net, 1).weight)  # body unchanged
    assert not torch.equal(linear(tuned, 3).weight, linear(net, 3).weight)  # head moved


def test_previous_model_is_stored_and_survives_a_restart(tmp_path: Path) -> None:
    model, global_model = tiny_mlp(), frozen(tiny_mlp())
    ctx = make_context(round_index=0, hyperparameters=HP, state=LocalStateStore(tmp_path))
    report = get_recipe("fedrn").train(model, global_model, make_data(24), ctx)
    assert report.metrics["warmup"] == 1.0
    stored = LocalStateStore(tmp_path).get_tensors(PREVIOUS_MODEL_PREFIX)
    assert sorted(stored) == sorted(model.state_dict())
    assert all(torch.equal(stored[k], v) for k, v in model.state_dict().items())


def test_neighbors_need_a_self_weight_and_a_matching_state() -> None:
    model, global_model = tiny_mlp(), frozen(tiny_mlp())
    data = make_data(24)
    ctx = make_context(round_index=2, hyperparameters=HP, neighbors=[neighbor(tiny_mlp(1), 0.5)])
    with pytest.raises(InvalidRoundContextError, match="self_weight"):
        get_recipe("fedrn").train(model, global_model, data, ctx)
    wrong = neighbor(scaled_identity(1.0), 0.5)
    ctx = make_context(round_index=2, hyperparameters=HP, neighbors=[wrong], self_weight=0.5)
    with pytest.raises(ModelContractError, match="n1"):
        get_recipe("fedrn").train(model, global_model, data, ctx)
