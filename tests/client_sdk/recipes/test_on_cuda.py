"""The recipes and the signals on CUDA: repeatability, the caller's RNG, agreement with the CPU.

Every test here needs a CUDA device and skips without one (``cuda_device``); ``test_rounds.py``
has the smoke test of every recipe on CUDA with and without mixed precision.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from client_sdk.recipes import RECIPES, get_recipe
from client_sdk.signals import compute_signals
from tests.client_sdk.recipes.helpers import (
    INPUT_SHAPE,
    NUM_CLASSES,
    frozen,
    make_data,
    neighbor,
    state_bytes,
    tiny_mlp,
)
from tests.client_sdk.recipes.test_rounds import round_context

pytestmark = pytest.mark.gpu

SIGNALS = {"per_class_loss", "train_loss", "train_accuracy", "probe_softmax"}


def train_on(name: str, device: torch.device, *, seed: int = 7, amp: bool = False) -> bytes:
    """One late round of ``name`` on ``device`` from fixed models and data; the state as bytes."""
    data = make_data(30, flip=0.2).to(device)
    model = tiny_mlp(dropout=0.3).to(device)
    global_model = frozen(tiny_mlp(dropout=0.3)).to(device)
    neighbors = [neighbor(tiny_mlp(9, dropout=0.3), 0.4)] if name == "fedrn" else []
    ctx = round_context(name, 2, seed=seed, neighbors=neighbors, device=device, amp=amp)
    get_recipe(name).train(model, global_model, data, ctx)
    return state_bytes(model)


@pytest.mark.parametrize("amp", [False, True])
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_same_seed_same_model_on_cuda(name: str, amp: bool, cuda_device: torch.device) -> None:
    first = train_on(name, cuda_device, amp=amp)
    assert train_on(name, cuda_device, amp=amp) == first
    assert train_on(name, cuda_device, seed=8, amp=amp) != first


def test_caller_cuda_rng_state_is_left_alone(cuda_device: torch.device) -> None:
    model = tiny_mlp(dropout=0.5).to(cuda_device)
    global_model = frozen(tiny_mlp()).to(cuda_device)
    data = make_data(16).to(cuda_device)
    ctx = round_context("fedavg", 0, device=cuda_device)
    torch.cuda.manual_seed(123)
    expected = torch.rand(3, device=cuda_device)
    torch.cuda.manual_seed(123)
    get_recipe("fedavg").train(model, global_model, data, ctx)
    assert torch.equal(torch.rand(3, device=cuda_device), expected)


@pytest.mark.parametrize("spelling", ["cuda", "cuda:0"])
def test_device_spellings_train_the_same_model(spelling: str, cuda_device: torch.device) -> None:
    assert train_on("fedavg", torch.device(spelling)) == train_on("fedavg", cuda_device)


def test_signals_on_cuda_match_the_cpu(cuda_device: torch.device) -> None:
    data = make_data(30, flip=0.2)
    model, global_model = tiny_mlp(), frozen(tiny_mlp(5))
    report = get_recipe("fedavg").train(model, global_model, data, round_context("fedavg", 0))

    def signals(device: torch.device) -> dict[str, object]:
        # compute_signals takes the models where they are ("device": where the models are),
        # as the Participant passes them; each device gets its own copies
        return compute_signals(
            global_model=copy.deepcopy(global_model).to(device),
            local_model=copy.deepcopy(model).to(device),
            data=data,
            num_classes=NUM_CLASSES,
            required=SIGNALS,
            train_report=report,
            probe_seed=11,
            probe_size=5,
            input_shape=INPUT_SHAPE,
            device=device,
        ).to_json()

    on_cpu, on_cuda = signals(torch.device("cpu")), signals(cuda_device)
    assert on_cuda.keys() == on_cpu.keys()
    assert on_cuda["class_counts"] == on_cpu["class_counts"]
    assert on_cuda["train_accuracy"] == on_cpu["train_accuracy"]
    for key in ("per_class_loss", "probe_softmax"):
        a = torch.tensor(on_cpu[key], dtype=torch.float64)
        b = torch.tensor(on_cuda[key], dtype=torch.float64)
        assert torch.allclose(a, b, atol=1e-5), key


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_amp_keeps_float32_parameters(name: str, cuda_device: torch.device) -> None:
    data = make_data(30, flip=0.2).to(cuda_device)
    model = tiny_mlp().to(cuda_device)
    global_model = frozen(tiny_mlp()).to(cuda_device)
    neighbors = [neighbor(tiny_mlp(9).to(cuda_device), 0.4)] if name == "fedrn" else []
    ctx = round_context(name, 2, neighbors=neighbors, device=cuda_device, amp=True)
    report = get_recipe(name).train(model, global_model, data, ctx)
    assert math.isfinite(report.train_loss)
    floats = [v for v in model.state_dict().values() if v.is_floating_point()]
    assert all(v.dtype == torch.float32 for v in floats)
    assert all(math.isfinite(v) for v in report.metrics.values())
