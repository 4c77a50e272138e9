"""RoFL: total loss, centroid-loss gradient, centroid update, confident mask, schedules."""

from __future__ import annotations

import math

import pytest
import torch

from client_sdk.recipes import get_recipe, rofl_loss, update_centroids
from client_sdk.recipes.model_io import forward_with_features
from client_sdk.recipes.rofl import (
    centroid_weight,
    confident_mask,
    forget_fraction,
    initial_centroids,
    small_loss_indices,
)
from tests.client_sdk.recipes.helpers import (
    NUM_CLASSES,
    frozen,
    linear,
    make_context,
    make_data,
    state_bytes,
    tiny_mlp,
)


def test_total_loss_by_hand() -> None:
    # Two samples, C = 2, d = 2.
    # logits [[0, 0], [ln 3, 0]] -> p1 = [0.5, 0.5], p2 = [0.75, 0.25]; targets [0, 1]
    #   L_c = (ln 2 + ln 4) / 2 = (0.693147 + 1.386294) / 2 = 1.039721
    # features F1 = [1, 0], F2 = [0, 2]; centroids f0 = [1, 1], f1 = [0, 1]; labels [0, 1];
    # mask [1, 0]: L_cen = ||[1, 0] - [1, 1]||^2 = 1 (sample 2 is masked out; eq. 5 sums)
    #   L_e = mean(ln 2, -(0.75 ln 0.75 + 0.25 ln 0.25)) = (0.693147 + 0.562335) / 2 = 0.627741
    # total = 1.039721 + 1.0 * 1 + 0.8 * 0.627741 = 2.541914
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])
    features = torch.tensor([[1.0, 0.0], [0.0, 2.0]], requires_grad=True)
    centroids = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    parts = rofl_loss(
        logits,
        features,
        targets=torch.tensor([0, 1]),
        labels=torch.tensor([0, 1]),
        mask=torch.tensor([True, False]),
        centroids=centroids,
        lambda_cen=1.0,
        lambda_e=0.8,
        centroid_reduction="sum",
    )
    assert parts.ce.item() == pytest.approx(1.039721, abs=1e-5)
    assert parts.centroid.item() == pytest.approx(1.0)
    assert parts.entropy.item() == pytest.approx(0.627741, abs=1e-5)
    assert parts.total.item() == pytest.approx(2.541914, abs=1e-5)
    # d L_cen / d F1 = 2 (F1 - f0) = [0, -2]; the masked sample gets nothing
    torch.autograd.backward(parts.total)
    assert features.grad is not None
    assert features.grad.tolist() == [[0.0, -2.0], [0.0, 0.0]]


def test_default_reduction_divides_by_the_batch() -> None:
    # The same masked distance as above (1.0), averaged over the B = 2 selected samples.
    parts = rofl_loss(
        torch.zeros(2, 2),
        torch.tensor([[1.0, 0.0], [0.0, 2.0]]),
        torch.tensor([0, 1]),
        torch.tensor([0, 1]),
        torch.tensor([True, False]),
        torch.tensor([[1.0, 1.0], [0.0, 1.0]]),
        1.0,
        0.0,
    )
    assert parts.centroid.item() == pytest.approx(0.5)


def test_centroid_loss_reaches_the_feature_extractor() -> None:
    # The reference code detaches the features, which makes L_cen inert; ours must not.
    model = tiny_mlp()
    x = torch.randn(6, 1, 4, 4)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    logits, feats = forward_with_features(model, x)
    parts = rofl_loss(
        logits,
        feats,
        labels,
        labels,
        torch.ones(6, dtype=torch.bool),
        torch.randn(NUM_CLASSES, 8),
        lambda_cen=1.0,
        lambda_e=0.0,
    )
    torch.autograd.backward(parts.centroid)
    body_grad = linear(model, 1).weight.grad
    assert body_grad is not None
    assert body_grad.abs().sum().item() > 0
    assert linear(model, 3).weight.grad is None  # the head is not on L_cen's path


def test_centroid_loss_changes_training() -> None:
    # Same seed, same data; only lambda_cen differs. If L_cen had no gradient the two models
    # would be bit-identical.
    data = make_data(24)

    def run(lambda_cen: float) -> bytes:
        model, global_model = tiny_mlp(), frozen(tiny_mlp())
        ctx = make_context(
            round_index=3,
            hyperparameters={"batch_size": 8, "t_pl": 1, "lambda_cen": lambda_cen, "lambda_e": 0.0},
            global_centroids=torch.randn(
                NUM_CLASSES, 8, generator=torch.Generator().manual_seed(1)
            ),
        )
        get_recipe("rofl").train(model, global_model, data, ctx)
        return state_bytes(model)

    assert run(0.0) != run(5.0)


def test_centroid_update_by_hand() -> None:
    # f0 = [1, 0]; batch features [1, 1], [3, 3] labelled 0 -> f_hat0 = [2, 2].
    # s = cos([1, 0], [2, 2]) = 2 / (1 * 2.828427) = 0.707107, s^2 = 0.5
    # f0' = 0.5 [1, 0] + 0.5 [2, 2] = [1.5, 1.0]; class 1 is absent from the batch: unchanged.
    centroids = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    new = update_centroids(centroids, torch.tensor([[1.0, 1.0], [3.0, 3.0]]), torch.tensor([0, 0]))
    assert new.tolist() == [[pytest.approx(1.5), pytest.approx(1.0)], [0.0, 1.0]]


def test_orthogonal_batch_mean_leaves_the_centroid_and_zero_centroid_adopts_it() -> None:
    # cos([1, 0], [0, 5]) = 0 -> s^2 = 0 -> unchanged. A zero centroid has no direction, so the
    # batch mean replaces it.
    centroids = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    new = update_centroids(centroids, torch.tensor([[0.0, 5.0], [2.0, 4.0]]), torch.tensor([0, 1]))
    assert new.tolist() == [[1.0, 0.0], [2.0, 4.0]]


def test_confident_mask_by_hand() -> None:
    # cosine to f0 = [1, 0] and f1 = [0, 1]: [2, 0.1] -> class 0; [0.1, 2] -> class 1;
    # [1, 0.9] -> class 0. Labels [0, 0, 1] -> mask [True, False, False].
    mask = confident_mask(
        torch.tensor([[2.0, 0.1], [0.1, 2.0], [1.0, 0.9]]),
        torch.tensor([[1.0, 0.0], [0.0, 1.0]]),
        torch.tensor([0, 0, 1]),
    )
    assert mask.tolist() == [True, False, False]


def test_small_loss_selection_and_schedules() -> None:
    losses = torch.tensor([0.5, 0.1, 0.9, 0.3, 0.2])
    # forget 0.2 -> keep ceil(0.8 * 5) = 4 smallest: 0.1, 0.2, 0.3, 0.5 at positions 1, 4, 3, 0
    assert small_loss_indices(losses, 0.2).tolist() == [1, 4, 3, 0]
    # forget 0.5 -> keep ceil(2.5) = 3
    assert small_loss_indices(losses, 0.5).tolist() == [1, 4, 3]
    # R(t) = 0.2 * min(t / 10, 1); lambda_cen(t) = 1.0 * min(t / 100, 1)
    assert forget_fraction(0, 0.2, 10) == 0.0
    assert forget_fraction(5, 0.2, 10) == pytest.approx(0.1)
    assert forget_fraction(25, 0.2, 10) == pytest.approx(0.2)
    assert centroid_weight(0, 1.0, 100) == 0.0
    assert centroid_weight(50, 1.0, 100) == pytest.approx(0.5)
    assert centroid_weight(300, 1.0, 100) == 1.0


def test_initial_centroids_are_class_means_with_zeros_for_absent_classes() -> None:
    feats = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    out = initial_centroids(feats, torch.tensor([0, 0, 1]), 3)
    assert out.tolist() == [[2.0, 3.0], [5.0, 6.0], [0.0, 0.0]]


@pytest.mark.parametrize(("round_index", "pseudo"), [(0, 0.0), (5, 1.0)])
def test_recipe_returns_local_centroids(round_index: int, pseudo: float) -> None:
    model, global_model = tiny_mlp(), frozen(tiny_mlp())
    centroids = None if round_index == 0 else torch.randn(NUM_CLASSES, 8)
    ctx = make_context(
        round_index=round_index,
        hyperparameters={"batch_size": 8, "t_pl": 3, "forget_rounds": 2},
        global_centroids=centroids,
    )
    report = get_recipe("rofl").train(model, global_model, make_data(24, flip=0.2), ctx)
    assert report.centroids is not None
    assert report.centroids.shape == (NUM_CLASSES, 8)
    assert report.centroids.device.type == "cpu"
    assert torch.isfinite(report.centroids).all()
    assert report.metrics["pseudo_labels"] == pseudo
    assert report.metrics["forget_fraction"] == pytest.approx(0.0 if round_index == 0 else 0.2)
    assert 0.0 <= report.metrics["confident_fraction"] <= 1.0
