"""Tiny models, data and round contexts for the recipe and signal tests (CPU, milliseconds)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from client_sdk.local_state import LocalStateStore
from client_sdk.recipes import LocalData, NeighborModel, RoundContext

NUM_CLASSES = 3
INPUT_SHAPE = (1, 4, 4)


def tiny_mlp(seed: int = 0, num_classes: int = NUM_CLASSES, dropout: float = 0.0) -> nn.Sequential:
    """Flatten -> Linear(16, 8) -> ReLU -> [Dropout] -> Linear(8, C); the head is the last."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Flatten(), nn.Linear(16, 8), nn.ReLU()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    layers.append(nn.Linear(8, num_classes))
    return nn.Sequential(*layers)


def scaled_identity(scale: float, num_classes: int = NUM_CLASSES) -> nn.Sequential:
    """A single Linear(C, C) with weight ``scale * I`` and no bias: logits = scale * x."""
    layer = nn.Linear(num_classes, num_classes, bias=False)
    with torch.no_grad():
        layer.weight.copy_(scale * torch.eye(num_classes))
    return nn.Sequential(layer)


def one_hot_data(n: int = 30, num_flipped: int = 6, seed: int = 0) -> LocalData:
    """Inputs one_hot(true class) + N(0, 0.05^2); the first ``num_flipped`` labels moved to c+1.

    With ``scaled_identity(4)`` a correctly labelled sample has CE ~ log(1 + 2 e^-4) ~ 0.036 and
    a flipped one ~ 4.04, so a loss GMM separates them cleanly.
    """
    gen = torch.Generator().manual_seed(seed)
    truth = torch.arange(n) % NUM_CLASSES
    x = torch.nn.functional.one_hot(truth, NUM_CLASSES).float()
    x = x + 0.05 * torch.randn(n, NUM_CLASSES, generator=gen)
    labels = truth.clone()
    labels[:num_flipped] = (labels[:num_flipped] + 1) % NUM_CLASSES
    return LocalData(x, labels, true_labels=truth)


def tiny_cnn(seed: int = 0, num_classes: int = NUM_CLASSES) -> nn.Sequential:
    """Conv -> BatchNorm -> ReLU -> pool -> Linear head (exercises eval/train mode)."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(16, num_classes),
    )


def linear(model: nn.Module, index: int) -> nn.Linear:
    """The ``nn.Linear`` at position ``index`` of a Sequential (typed access for assertions)."""
    assert isinstance(model, nn.Sequential)
    layer = model[index]
    assert isinstance(layer, nn.Linear)
    return layer


def frozen(model: nn.Module) -> nn.Module:
    """A frozen eval-mode copy, as the Participant passes theta_G to recipes."""
    out = copy.deepcopy(model).eval()
    for p in out.parameters():
        p.requires_grad_(False)
    return out


def make_data(
    n: int = 48, seed: int = 0, flip: float = 0.0, num_classes: int = NUM_CLASSES
) -> LocalData:
    """Separable Gaussian blobs of shape (1, 4, 4); a fraction ``flip`` of labels moved to c+1."""
    gen = torch.Generator().manual_seed(seed)
    truth = torch.arange(n) % num_classes
    centres = torch.randn(num_classes, 16, generator=gen) * 2.0
    x = centres[truth] + 0.3 * torch.randn(n, 16, generator=gen)
    labels = truth.clone()
    num_flip = int(flip * n)
    labels[:num_flip] = (labels[:num_flip] + 1) % num_classes
    return LocalData(x.reshape(n, *INPUT_SHAPE), labels, true_labels=truth)


def make_context(**overrides: Any) -> RoundContext:
    """A RoundContext on the CPU with small batches; any field can be overridden."""
    values: dict[str, Any] = {
        "round_index": 0,
        "total_rounds": 10,
        "num_classes": NUM_CLASSES,
        "hyperparameters": {"batch_size": 8, "lr": 0.05},
        "role": None,
        "label_correction": False,
        "neighbors": [],
        "self_weight": None,
        "global_centroids": None,
        "device": torch.device("cpu"),
        "amp": False,
        "seed": 7,
        "state": LocalStateStore(None),
    }
    values.update(overrides)
    return RoundContext(**values)


def neighbor(model: nn.Module, weight: float, client_id: str = "n1") -> NeighborModel:
    """A NeighborModel holding a copy of ``model``'s state."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return NeighborModel(client_id=client_id, state_dict=state, weight=weight)


def state_bytes(model: nn.Module) -> bytes:
    """All tensors of a state_dict as bytes, for exact comparisons."""
    return b"".join(v.detach().cpu().numpy().tobytes() for v in model.state_dict().values())
