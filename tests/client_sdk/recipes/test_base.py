"""Shared machinery: LocalData, hyper-parameters, batches, head features, the per-sample GMM."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from client_sdk.recipes import get_recipe
from client_sdk.recipes.base import LocalData
from client_sdk.recipes.errors import (
    InvalidHyperparameterError,
    InvalidLocalDataError,
    InvalidRoundContextError,
    ModelContractError,
    RecipeError,
    UnknownRecipeError,
)
from client_sdk.recipes.hyperparameters import Hyperparameters, TrainingConfig
from client_sdk.recipes.model_io import find_head, forward_with_features
from client_sdk.recipes.sample_selection import per_sample_loss_gmm, selection_metrics
from client_sdk.recipes.training import minibatch_indices
from tests.client_sdk.recipes.helpers import (
    NUM_CLASSES,
    frozen,
    linear,
    make_context,
    scaled_identity,
    tiny_cnn,
    tiny_mlp,
)


class TestLocalData:
    def test_from_dataset_materialises_tensors_once(self) -> None:
        class Pairs(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
            def __len__(self) -> int:
                return 5

            def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
                return torch.full((1, 2, 2), float(i)), i % 2

        data = LocalData.from_dataset(Pairs(), true_labels=[0, 1, 0, 1, 1], batch_size=2)
        assert data.inputs.shape == (5, 1, 2, 2)
        assert data.inputs.dtype == torch.float32
        assert data.labels.tolist() == [0, 1, 0, 1, 0]
        assert data.true_labels is not None
        assert data.true_labels.tolist() == [0, 1, 0, 1, 1]
        assert data.input_shape == (1, 2, 2)

    def test_to_same_device_returns_self_and_moves_are_cached(self) -> None:
        data = LocalData(torch.zeros(2, 3), torch.tensor([0, 1]))
        assert data.to("cpu") is data
        assert data.to(torch.device("cpu")) is data

    @pytest.mark.parametrize(
        ("inputs", "labels", "match"),
        [
            (torch.zeros(2, 3, dtype=torch.float64), torch.tensor([0, 1]), "inputs"),
            (torch.zeros(0, 3), torch.zeros(0, dtype=torch.int64), "inputs"),
            (torch.zeros(2, 3), torch.tensor([0.0, 1.0]), "labels"),
            (torch.zeros(2, 3), torch.tensor([0, 1, 1]), "labels"),
            (torch.zeros(2, 3), torch.tensor([0, -1]), "labels"),
        ],
    )
    def test_bad_data_is_rejected(
        self, inputs: torch.Tensor, labels: torch.Tensor, match: str
    ) -> None:
        with pytest.raises(InvalidLocalDataError, match=match):
            LocalData(inputs, labels)

    def test_label_outside_the_classes_is_rejected_by_a_recipe(self) -> None:
        data = LocalData(torch.zeros(4, 1, 4, 4), torch.tensor([0, 1, 2, 3]))
        model = tiny_mlp()
        with pytest.raises(InvalidLocalDataError, match="labels"):
            get_recipe("fedavg").train(model, model, data, make_context())


class TestHyperparameters:
    def test_defaults_and_reads(self) -> None:
        config = TrainingConfig.from_hyperparameters(
            Hyperparameters({"lr": 0.1, "batch_size": 4.0})
        )
        assert config == TrainingConfig(lr=0.1, batch_size=4)

    @pytest.mark.parametrize(
        ("values", "match"),
        [
            ({"lr": 0}, "lr"),
            ({"lr": "fast"}, "lr"),
            ({"lr": float("nan")}, "lr"),
            ({"momentum": 1.5}, "momentum"),
            ({"batch_size": 2.5}, "batch_size"),
            ({"local_epochs": True}, "local_epochs"),
            ({"optimizer": "rmsprop"}, "optimizer"),
        ],
    )
    def test_bad_values_name_the_key(self, values: dict[str, object], match: str) -> None:
        with pytest.raises(InvalidHyperparameterError, match=match):
            TrainingConfig.from_hyperparameters(Hyperparameters(values))

    def test_recipe_specific_key_is_validated(self) -> None:
        model = tiny_mlp()
        data = LocalData(torch.zeros(4, 1, 4, 4), torch.tensor([0, 1, 2, 0]))
        ctx = make_context(hyperparameters={"mu": -1.0})
        with pytest.raises(InvalidHyperparameterError, match="mu"):
            get_recipe("fedprox").train(model, model, data, ctx)


def test_unknown_recipe_lists_the_known_ones() -> None:
    with pytest.raises(UnknownRecipeError, match="fedavg"):
        get_recipe("fedsgd")


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"round_index": -1}, "round_index"),
        ({"num_classes": 1}, "num_classes"),
        ({"role": "dirty"}, "role"),
        ({"self_weight": float("inf")}, "self_weight"),
        ({"global_centroids": torch.zeros(2, 4)}, "global_centroids"),
    ],
)
def test_bad_round_context_is_rejected(overrides: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidRoundContextError, match=match):
        make_context(**overrides)


class TestMinibatches:
    def test_every_index_once_per_epoch_and_seeded(self) -> None:
        gen = torch.Generator().manual_seed(3)
        batches = minibatch_indices(10, 4, gen, torch.device("cpu"))
        assert [b.numel() for b in batches] == [4, 4, 2]
        assert sorted(torch.cat(batches).tolist()) == list(range(10))
        again = minibatch_indices(10, 4, torch.Generator().manual_seed(3), torch.device("cpu"))
        assert all(torch.equal(a, b) for a, b in zip(batches, again, strict=True))

    def test_trailing_single_sample_is_merged(self) -> None:
        # 9 = 4 + 4 + 1: BatchNorm cannot train on the last batch of one sample, so it joins
        # the previous batch (4 + 5).
        batches = minibatch_indices(9, 4, torch.Generator().manual_seed(0), torch.device("cpu"))
        assert [b.numel() for b in batches] == [4, 5]

    def test_subset_draws_only_from_the_subset(self) -> None:
        subset = torch.tensor([1, 5, 7])
        batches = minibatch_indices(
            3, 2, torch.Generator().manual_seed(0), torch.device("cpu"), subset=subset
        )
        assert sorted(torch.cat(batches).tolist()) == [1, 5, 7]


class TestHead:
    def test_last_linear_is_the_head_and_its_input_the_features(self) -> None:
        model = tiny_mlp()
        name, head = find_head(model)
        assert name == "3"
        x = torch.randn(5, 1, 4, 4)
        logits, feats = forward_with_features(model, x)
        assert feats.shape == (5, 8)
        # the features are exactly what the head multiplies
        assert torch.allclose(head(feats), logits)
        assert torch.allclose(feats, model[2](model[1](model[0](x))))

    def test_named_head_and_errors(self) -> None:
        model = tiny_cnn()
        assert find_head(model, "5")[0] == "5"
        with pytest.raises(ModelContractError, match="head_name"):
            find_head(model, "classifier")
        with pytest.raises(ModelContractError, match="Linear"):
            find_head(nn.Sequential(nn.Flatten()))

    def test_features_keep_their_gradient(self) -> None:
        model = tiny_mlp()
        _, feats = forward_with_features(model, torch.randn(3, 1, 4, 4))
        torch.autograd.backward(feats.pow(2).sum())
        grad = linear(model, 1).weight.grad
        assert grad is not None
        assert grad.abs().sum().item() > 0


class TestPerSampleLossGmm:
    def test_keeps_small_losses_and_drops_large_ones(self) -> None:
        # 8 clean samples with losses near 0.1 and 3 flipped ones near 2.3: after min-max
        # scaling the groups sit near 0.0 and 1.0, and the lower-mean component's posterior is
        # ~1 for the first 8 and ~0 for the last 3.
        losses = [0.05, 0.10, 0.08, 0.12, 0.07, 0.09, 0.11, 0.06, 2.3, 2.5, 2.1]
        result = per_sample_loss_gmm(losses, random_state=0)
        assert result.fallback is None
        assert result.converged
        clean = result.clean_probability > 0.5
        assert clean.tolist() == [True] * 8 + [False] * 3

    def test_is_permutation_equivariant(self) -> None:
        losses = np.array([0.05, 0.10, 0.08, 0.12, 0.07, 2.3, 2.5, 2.1])
        perm = np.array([7, 2, 5, 0, 3, 6, 1, 4])
        a = per_sample_loss_gmm(losses, random_state=0).clean_probability
        b = per_sample_loss_gmm(losses[perm], random_state=0).clean_probability
        np.testing.assert_allclose(a[perm], b, atol=1e-6)

    @pytest.mark.parametrize("losses", [[0.7, 0.7, 0.7], [1.0]])
    def test_degenerate_input_counts_everyone_clean_and_says_why(self, losses: list[float]) -> None:
        result = per_sample_loss_gmm(losses)
        assert result.fallback is not None
        assert result.clean_probability.tolist() == [1.0] * len(losses)

    def test_non_finite_loss_is_rejected(self) -> None:
        with pytest.raises(RecipeError, match="losses"):
            per_sample_loss_gmm([0.1, float("nan"), 0.3])

    def test_two_distinct_values_do_not_warn(self) -> None:
        # k-means initialisation may warn on few distinct values; the warning is caught and
        # reported as converged=False instead of escaping (pytest turns warnings into errors).
        result = per_sample_loss_gmm([0.0] * 20 + [1.0] * 2, random_state=1)
        assert (result.clean_probability[:20] > 0.5).all()


def test_selection_metrics_by_hand() -> None:
    # labels vs truth: samples 0, 1, 2 correct; 3, 4 flipped. Selected: 0, 1, 3.
    # precision = |{0, 1}| / |{0, 1, 3}| = 2/3; recall = |{0, 1}| / |{0, 1, 2}| = 2/3.
    labels = torch.tensor([0, 1, 2, 1, 2])
    truth = torch.tensor([0, 1, 2, 0, 0])
    selected = torch.tensor([True, True, False, True, False])
    out = selection_metrics(selected, labels, truth)
    assert out["num_selected"] == 3.0
    assert out["label_precision"] == pytest.approx(2 / 3)
    assert out["label_recall"] == pytest.approx(2 / 3)
    assert "label_precision" not in selection_metrics(selected, labels, None)


class TestGradientClipping:
    """``max_grad_norm``: one SGD step (lr 1, no momentum) on one sample, checked by hand.

    Zero weights give uniform softmax p = 1/C, so for x = a * e_0 with label 0 the gradient of
    the cross-entropy is (p - e_0) x^T: only column 0 is non-zero, with entries
    a * (1/C - 1, 1/C, ..., 1/C) and norm a * sqrt((C - 1) / C). The step moves W by minus that
    gradient, rescaled to ``max_grad_norm`` when it is longer.
    """

    @staticmethod
    def step(max_grad_norm: float | None, a: float = 10.0) -> torch.Tensor:
        c = NUM_CLASSES
        model = scaled_identity(0.0, c)
        data = LocalData(a * torch.eye(c)[:1], torch.tensor([0]))
        hp: dict[str, object] = {"lr": 1.0, "momentum": 0.0, "batch_size": 1}
        if max_grad_norm is not None:
            hp["max_grad_norm"] = max_grad_norm
        get_recipe("fedavg").train(model, frozen(model), data, make_context(hyperparameters=hp))
        return linear(model, 0).weight.detach().clone()

    def test_without_clipping_the_step_is_the_whole_gradient(self) -> None:
        c = NUM_CLASSES
        expected = torch.zeros(c, c)
        expected[:, 0] = -10.0 * torch.full((c,), 1.0 / c)
        expected[0, 0] = -10.0 * (1.0 / c - 1.0)
        torch.testing.assert_close(self.step(None), expected)
        assert float(expected.norm()) == pytest.approx(10.0 * ((c - 1) / c) ** 0.5)

    def test_a_longer_gradient_is_rescaled_to_the_bound(self) -> None:
        clipped, whole = self.step(1.0), self.step(None)
        assert float(clipped.norm()) == pytest.approx(1.0, rel=1e-5)
        torch.testing.assert_close(clipped, whole / whole.norm())

    def test_a_shorter_gradient_is_left_alone(self) -> None:
        torch.testing.assert_close(self.step(100.0), self.step(None))

    @pytest.mark.parametrize("value", [0, -1.0, "big", float("inf"), True])
    def test_a_bad_bound_names_the_key(self, value: object) -> None:
        with pytest.raises(InvalidHyperparameterError, match="max_grad_norm"):
            TrainingConfig.from_hyperparameters(Hyperparameters({"max_grad_norm": value}))

    def test_absent_or_null_means_no_clipping(self) -> None:
        assert TrainingConfig.from_hyperparameters(Hyperparameters({})).max_grad_norm is None
        config = TrainingConfig.from_hyperparameters(Hyperparameters({"max_grad_norm": None}))
        assert config.max_grad_norm is None
