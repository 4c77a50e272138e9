"""Every recipe trains a tiny model for one round, then the signals are computed.

The end-to-end run through a real coordinator belongs to the integration tests; here each
recipe goes through ``recipe.train`` + ``compute_signals`` with a RoundContext built by hand, in
its early (warm-up / first-round) and late (method active) phase.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch

from client_sdk.local_state import LocalStateStore
from client_sdk.recipes import RECIPES, LocalData, RoundContext, TrainingDivergedError, get_recipe
from client_sdk.signals import compute_signals
from tests.client_sdk.recipes.helpers import (
    INPUT_SHAPE,
    NUM_CLASSES,
    frozen,
    make_context,
    make_data,
    neighbor,
    state_bytes,
    tiny_cnn,
    tiny_mlp,
)

# Short schedules so that round 2 is past every warm-up.
HP: dict[str, Any] = {
    "batch_size": 8,
    "lr": 0.05,
    "warmup_rounds": 1,
    "t_corr": 0,
    "t_pl": 1,
    "forget_rounds": 1,
    "r_w": 1,
    "ramp_rounds": 2,
}


def round_context(name: str, round_index: int, seed: int = 7, **overrides: Any) -> RoundContext:
    late = round_index > 0
    values: dict[str, Any] = {
        "round_index": round_index,
        "total_rounds": 4,
        "hyperparameters": HP,
        "role": "noisy" if name == "fednoro" else None,
        "label_correction": name == "fedncl_correction",
        "neighbors": [neighbor(tiny_mlp(9), 0.4)] if name == "fedrn" else [],
        "self_weight": 0.6 if name == "fedrn" else None,
        "global_centroids": (
            torch.randn(NUM_CLASSES, 8, generator=torch.Generator().manual_seed(2))
            if name == "rofl" and late
            else None
        ),
        "seed": seed,
        "state": LocalStateStore(None),
    }
    values.update(overrides)
    return make_context(**values)


@pytest.mark.parametrize("round_index", [0, 2])
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_one_round_then_signals(name: str, round_index: int) -> None:
    # Prepare
    data = make_data(30, flip=0.2)
    model, global_model = tiny_mlp(), frozen(tiny_mlp())
    before = state_bytes(global_model)
    ctx = round_context(name, round_index)
    required = {"per_class_loss", "train_loss", "train_accuracy", "probe_softmax"}
    if name == "rofl":
        required.add("centroids")
    # Execute
    report = get_recipe(name).train(model, global_model, data, ctx)
    signals = compute_signals(
        global_model=global_model,
        local_model=model,
        data=data,
        num_classes=NUM_CLASSES,
        required=required,
        train_report=report,
        probe_seed=11,
        probe_size=5,
        input_shape=INPUT_SHAPE,
        device="cpu",
    )
    # Assert
    assert math.isfinite(report.train_loss)
    assert report.train_loss > 0
    assert report.num_steps >= 1
    assert all(math.isfinite(v) for v in report.metrics.values())
    assert state_bytes(model) != before  # trained
    assert state_bytes(global_model) == before  # theta_G untouched
    assert model.training
    payload = json.loads(json.dumps(signals.to_json(), allow_nan=False))
    assert payload["num_samples"] == 30
    assert payload["class_counts"] == [10, 10, 10]
    assert len(payload["per_class_loss"]) == NUM_CLASSES
    assert 0.0 <= payload["train_accuracy"] <= 1.0
    assert len(payload["probe_softmax"]) == 5
    assert all(sum(row) == pytest.approx(1.0, abs=1e-5) for row in payload["probe_softmax"])
    assert payload["train_loss"] == report.train_loss
    assert ("centroids" in payload) == (name == "rofl")


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_same_seed_same_model_on_cpu(name: str) -> None:
    data = make_data(30, flip=0.2)

    def run(seed: int) -> bytes:
        model = tiny_mlp(dropout=0.3)
        neighbors = [neighbor(tiny_mlp(9, dropout=0.3), 0.4)] if name == "fedrn" else []
        ctx = round_context(name, 2, seed=seed, neighbors=neighbors)
        get_recipe(name).train(model, frozen(tiny_mlp(dropout=0.3)), data, ctx)
        return state_bytes(model)

    first = run(7)
    assert run(7) == first
    assert run(8) != first


def test_caller_rng_state_is_left_alone() -> None:
    # (the helpers seed while building models, so everything is built first)
    model, global_model, data = tiny_mlp(dropout=0.5), frozen(tiny_mlp()), make_data(16)
    ctx = round_context("fedavg", 0)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    get_recipe("fedavg").train(model, global_model, data, ctx)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_batchnorm_model_and_a_missing_class(name: str) -> None:
    # A CNN with BatchNorm, 17 samples in batches of 8 (8 + 8 + 1: the single-sample tail is
    # merged, BatchNorm could not train on it) and no sample of class 2: LA's prior has -inf
    # there, per_class_loss reports None. 25 samples cycle through 3 classes; 8 are class 2.
    full = make_data(25)
    keep = full.labels != 2
    assert full.true_labels is not None
    data = LocalData(full.inputs[keep], full.labels[keep], full.true_labels[keep])
    assert data.num_samples == 17
    model, global_model = tiny_cnn(), frozen(tiny_cnn())
    ctx = round_context(
        name,
        2,
        neighbors=[neighbor(tiny_cnn(4), 0.5)] if name == "fedrn" else [],
        global_centroids=torch.randn(NUM_CLASSES, 16) if name == "rofl" else None,
    )
    report = get_recipe(name).train(model, global_model, data, ctx)
    signals = compute_signals(
        global_model=global_model,
        local_model=model,
        data=data,
        num_classes=NUM_CLASSES,
        required={"per_class_loss"},
        train_report=report,
        probe_seed=None,
        probe_size=1,
        input_shape=INPUT_SHAPE,
        device="cpu",
    )
    assert math.isfinite(report.train_loss)
    assert signals.per_class_loss is not None
    assert signals.per_class_loss[2] is None
    assert signals.class_counts[2] == 0


def test_amp_is_ignored_on_cpu() -> None:
    data = make_data(24)
    models = []
    for amp in (False, True):
        model = tiny_mlp()
        get_recipe("fedavg").train(
            model, frozen(tiny_mlp()), data, round_context("fedavg", 0, amp=amp)
        )
        models.append(state_bytes(model))
    assert models[0] == models[1]


def test_adam_optimizer_trains() -> None:
    model, global_model = tiny_mlp(), frozen(tiny_mlp())
    ctx = round_context("fedavg", 0, hyperparameters={"optimizer": "adam", "lr": 1e-2})
    report = get_recipe("fedavg").train(model, global_model, make_data(24), ctx)
    assert math.isfinite(report.train_loss)
    assert state_bytes(model) != state_bytes(global_model)


def test_divergence_raises_a_clear_error() -> None:
    data = make_data(24)
    huge = LocalData(data.inputs * 1e6, data.labels)
    ctx = round_context("fedavg", 0, hyperparameters={"lr": 1e12, "batch_size": 4})
    with pytest.raises(TrainingDivergedError, match="non-finite"):
        get_recipe("fedavg").train(tiny_mlp(), frozen(tiny_mlp()), huge, ctx)


# ------------------------------------------------------------------------------------------
# CUDA (skipped without a device)
# ------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("amp", [False, True])
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipes_on_cuda(name: str, amp: bool, cuda_device: torch.device) -> None:
    data = make_data(64, flip=0.2).to(cuda_device)
    model, global_model = tiny_cnn().to(cuda_device), frozen(tiny_cnn()).to(cuda_device)
    neighbors = [neighbor(tiny_cnn(4).to(cuda_device), 0.5)] if name == "fedrn" else []
    centroids = torch.randn(NUM_CLASSES, 16) if name == "rofl" else None
    ctx = round_context(
        name, 2, device=cuda_device, amp=amp, neighbors=neighbors, global_centroids=centroids
    )
    report = get_recipe(name).train(model, global_model, data, ctx)
    signals = compute_signals(
        global_model=global_model,
        local_model=model,
        data=data,
        num_classes=NUM_CLASSES,
        required={"per_class_loss", "train_loss", "train_accuracy", "probe_softmax"},
        train_report=report,
        probe_seed=3,
        probe_size=4,
        input_shape=INPUT_SHAPE,
        device=cuda_device,
    )
    assert math.isfinite(report.train_loss)
    assert next(model.parameters()).device.type == "cuda"
    assert signals.train_accuracy is not None
    if report.centroids is not None:
        assert report.centroids.device.type == "cpu"


@pytest.mark.gpu
def test_cuda_and_cpu_agree_without_amp(cuda_device: torch.device) -> None:
    data = make_data(32)

    def run(device: torch.device) -> list[torch.Tensor]:
        model, global_model = tiny_mlp().to(device), frozen(tiny_mlp()).to(device)
        get_recipe("fedavg").train(
            model, global_model, data.to(device), round_context("fedavg", 0, device=device)
        )
        return [p.detach().cpu() for p in model.parameters()]

    for a, b in zip(run(torch.device("cpu")), run(cuda_device), strict=True):
        assert torch.allclose(a, b, atol=1e-4)
