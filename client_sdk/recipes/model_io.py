"""What goes into and out of a model: the classification head, features, logits, per-sample
losses, and the label checks.

* :func:`find_head` and :func:`forward_with_features` -- feature capture at the classification
  head (RoFL's centroids, FedRN's head fine-tuning);
* :func:`predict_logits`, :func:`check_logits`, :func:`per_sample_cross_entropy`;
* :func:`class_counts` and :func:`validate_labels`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from client_sdk.recipes.base import LocalData
from client_sdk.recipes.errors import (
    InvalidLocalDataError,
    ModelContractError,
)

__all__ = [
    "check_logits",
    "class_counts",
    "find_head",
    "forward_with_features",
    "per_sample_cross_entropy",
    "predict_logits",
    "validate_labels",
]


def find_head(model: nn.Module, head_name: str | None = None) -> tuple[str, nn.Module]:
    """Return the classification head: the module named ``head_name``, else the last Linear.

    Raises
    ------
    ModelContractError
        If ``head_name`` names no module, or the model has no ``nn.Linear``.
    """
    modules = dict(model.named_modules())
    if head_name is not None:
        if head_name not in modules:
            raise ModelContractError(f"head_name: the model has no module named {head_name!r}")
        return head_name, modules[head_name]
    last: tuple[str, nn.Module] | None = None
    for name, module in modules.items():
        if isinstance(module, nn.Linear):
            last = (name, module)
    if last is None:
        raise ModelContractError("model: has no nn.Linear classification head (set head_name)")
    return last


def forward_with_features(
    model: nn.Module, x: torch.Tensor, head: nn.Module | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``model(x)`` and also return the input of its head, flattened to ``(B, d)``.

    The features keep their autograd graph (RoFL's centroid loss must reach the body).
    """
    module = find_head(model)[1] if head is None else head
    captured: list[torch.Tensor] = []

    def hook(_module: nn.Module, args: tuple[Any, ...]) -> None:
        captured.append(args[0])

    handle = module.register_forward_pre_hook(hook)
    try:
        logits = model(x)
    finally:
        handle.remove()
    if not captured:
        raise ModelContractError("model: the head was not called during forward")
    features = captured[-1]
    return logits, features.reshape(features.shape[0], -1)


def check_logits(logits: torch.Tensor, num_classes: int) -> None:
    """Raise :class:`ModelContractError` unless ``logits`` has shape ``(B, num_classes)``."""
    if logits.dim() != 2 or logits.shape[1] != num_classes:
        raise ModelContractError(
            f"model: expected logits of shape (B, {num_classes}), got {tuple(logits.shape)}"
        )


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def predict_logits(
    model: nn.Module,
    inputs: torch.Tensor,
    *,
    batch_size: int = 512,
    inference: bool = False,
    with_features: bool = False,
    head: nn.Module | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Float32 logits (and optionally head features) of ``model`` on ``inputs`` in eval mode.

    Runs batched without gradients and restores the model's train/eval mode. With
    ``inference=True`` it runs under ``torch.inference_mode`` (results must not enter autograd).
    """
    grad_off = torch.inference_mode() if inference else torch.no_grad()
    outs: list[torch.Tensor] = []
    feats: list[torch.Tensor] = []
    with _eval_mode(model), grad_off:
        for start in range(0, inputs.shape[0], batch_size):
            x = inputs[start : start + batch_size]
            if with_features:
                logits, f = forward_with_features(model, x, head)
                feats.append(f.float())
            else:
                logits = model(x)
            outs.append(logits.float())
    return torch.cat(outs), (torch.cat(feats) if with_features else None)


def per_sample_cross_entropy(
    model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, *, batch_size: int = 512
) -> torch.Tensor:
    """Per-sample cross-entropy (float32, ``(N,)``) of ``model`` in eval mode, no gradients."""
    logits, _ = predict_logits(model, inputs, batch_size=batch_size)
    return F.cross_entropy(logits, labels, reduction="none")


def class_counts(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Histogram of ``labels`` over ``num_classes`` classes (int64, same device)."""
    return torch.bincount(labels, minlength=num_classes)[:num_classes]


def validate_labels(data: LocalData, num_classes: int) -> None:
    """Raise :class:`InvalidLocalDataError` when a label is ``>= num_classes``."""
    if int(data.labels.max().item()) >= num_classes:
        raise InvalidLocalDataError(
            f"labels: maximum {int(data.labels.max().item())} outside [0, {num_classes})"
        )
    if data.true_labels is not None and int(data.true_labels.max().item()) >= num_classes:
        raise InvalidLocalDataError(f"true_labels: a label is outside [0, {num_classes})")
    if data.inputs.device != data.labels.device:
        raise InvalidLocalDataError("labels: not on the same device as inputs")
