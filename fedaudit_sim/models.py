"""Small models for the simulator (the reference scenarios of docs/evaluation.md).

Every model ends in an ``nn.Linear`` classification head and that head is the **last** module
registered, so the SDK's "features = input of the last Linear" hook (recipes-api.md) and FedRN's
head fine-tuning work on all of them.

- ``mlp``: Flatten - Linear(d, h) - ReLU - [Dropout] - Linear(h, h) - ReLU - ``head`` Linear(h, C),
  h = 64; for tabular inputs (any input shape is flattened).
- ``cnn``: for (c, 8, 8) and (c, 28, 28) images (any (c, H, W) works):
  Conv3x3(c -> 16, stride 2) - ReLU - Conv3x3(16 -> 32, stride 2) - ReLU - Flatten -
  Linear(32 * ceil(H/4) * ceil(W/4), 64) - ReLU - ``head`` Linear(64, C).
  Design decisions:

  * **No BatchNorm** (default ``norm="none"``; ``norm="group"`` inserts GroupNorm after each
    conv). BatchNorm adds running statistics and an integer ``num_batches_tracked`` buffer that
    aggregation must special-case (the aggregation's conventions), makes eval-mode losses depend on
    stale statistics (FedNoRo's per-class losses, FedRN's probe) and behaves badly with the tiny,
    label-skewed local batches of the scenarios. GroupNorm has no buffers but costs time, and with
    standardised inputs a two-conv network trains well without normalisation. So the state of
    ``mlp`` and ``cnn`` is float parameters only.
  * **Stride-2 convolutions instead of conv + max-pool, 16 then 32 channels.** V3/V6 train 50
    MNIST clients of ~160 samples for tens of rounds on a 2-core CPU. Measured on the shared
    2-core development machine (SGD, one epoch over 160 samples, batch 32-50): about 20-35 ms for
    28x28 inputs (45-90 ms with conv(32)+max-pool blocks) and 10-20 ms for 8x8 inputs, where the
    ~2 ms fixed cost of each optimizer step dominates, so batch size matters more than width.
    ``channels=(8, 16)`` roughly halves the 28x28 time. On a loaded machine one torch thread is
    faster than two for models this small.
- ``tv:<name>``: any torchvision classification model by name (``weights=None``, nothing is
  downloaded), built with ``num_classes``; its first ``Conv2d`` is replaced by one with the input's
  channel count, and the model must end in an ``nn.Linear`` head. It is checked with one dry
  forward pass on the given input shape. Needs ``torchvision`` (the ``vision`` extra); without it
  :class:`TorchvisionNotInstalledError` is raised.

Weights are initialised from ``seed`` inside ``torch.random.fork_rng``, so building a model neither
reads nor changes torch's global random state.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from typing import Any, Final, Literal

import torch
from torch import nn

__all__ = [
    "MODEL_NAMES",
    "MLP",
    "ModelConfigError",
    "SmallCNN",
    "TorchvisionNotInstalledError",
    "build_model",
    "classifier_head",
]

MODEL_NAMES: Final[tuple[str, ...]] = ("mlp", "cnn", "tv:<torchvision name>")
_TV_PREFIX: Final = "tv:"


class ModelConfigError(ValueError):
    """A model was asked for with an unknown name or unusable arguments."""


class TorchvisionNotInstalledError(ImportError):
    """A ``tv:<name>`` model was requested but torchvision cannot be imported."""


class MLP(nn.Module):
    """Two-hidden-layer perceptron with a final ``head`` Linear.

    Parameters
    ----------
    in_features : int
        Flattened input size.
    num_classes : int
        Output size of the head.
    hidden : int
        Width of both hidden layers.
    dropout : float
        Dropout probability after the first hidden layer (0 disables the layer).
    """

    def __init__(
        self, in_features: int, num_classes: int, *, hidden: int = 64, dropout: float = 0.0
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        layers += [nn.Linear(hidden, hidden), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(hidden, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Return the input of the head (the penultimate representation)."""
        out: torch.Tensor = self.body(x)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the logits, shape (batch, num_classes)."""
        out: torch.Tensor = self.head(self.body(x))
        return out


def _group_count(channels: int) -> int:
    return next(g for g in (8, 4, 2, 1) if channels % g == 0)


class SmallCNN(nn.Module):
    """Two stride-2 conv blocks, a hidden Linear and a final ``head`` Linear.

    Parameters
    ----------
    input_shape : tuple of int
        (channels, height, width).
    num_classes : int
        Output size of the head.
    channels : sequence of two int
        Output channels of the two convolutions.
    hidden : int
        Width of the hidden Linear (the feature size seen by the head).
    norm : {"none", "group"}
        Normalisation after each convolution (module docstring: why not BatchNorm).
    """

    def __init__(
        self,
        input_shape: tuple[int, int, int],
        num_classes: int,
        *,
        channels: Sequence[int] = (16, 32),
        hidden: int = 64,
        norm: Literal["none", "group"] = "none",
    ) -> None:
        super().__init__()
        in_ch, height, width = input_shape
        c1, c2 = channels
        layers: list[nn.Module] = [nn.Conv2d(in_ch, c1, 3, stride=2, padding=1)]
        if norm == "group":
            layers.append(nn.GroupNorm(_group_count(c1), c1))
        layers += [nn.ReLU(), nn.Conv2d(c1, c2, 3, stride=2, padding=1)]
        if norm == "group":
            layers.append(nn.GroupNorm(_group_count(c2), c2))
        layers.append(nn.ReLU())
        self.conv = nn.Sequential(*layers)
        # A 3x3, stride-2, padding-1 convolution maps a side s to ceil(s / 2); twice: ceil(s / 4).
        flat = c2 * math.ceil(height / 4) * math.ceil(width / 4)
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(flat, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Return the input of the head (the penultimate representation)."""
        out: torch.Tensor = self.body(self.conv(x))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the logits, shape (batch, num_classes)."""
        out: torch.Tensor = self.head(self.features(x))
        return out


def classifier_head(model: nn.Module) -> tuple[str, nn.Linear]:
    """Return the name and module of the model's classification head (its last module).

    Raises
    ------
    ModelConfigError
        The last registered module is not an ``nn.Linear``.
    """
    name, last = list(model.named_modules())[-1]
    if not isinstance(last, nn.Linear):
        raise ModelConfigError(
            f"the last module of {type(model).__name__} is {type(last).__name__} ({name!r}), "
            "not an nn.Linear classification head"
        )
    return name, last


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelConfigError(f"{name}={value!r} must be an int >= 1")
    return value


def _build_mlp(shape: tuple[int, ...], num_classes: int, **kwargs: Any) -> nn.Module:
    unknown = sorted(set(kwargs) - {"hidden", "dropout"})
    if unknown:
        raise ModelConfigError(
            f"model 'mlp' has no option(s) {unknown}; it accepts hidden, dropout"
        )
    hidden = _positive_int("hidden", kwargs.get("hidden", 64))
    dropout = kwargs.get("dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
        raise ModelConfigError(f"dropout={dropout!r} must be a number in [0, 1)")
    return MLP(math.prod(shape), num_classes, hidden=hidden, dropout=float(dropout))


def _build_cnn(shape: tuple[int, ...], num_classes: int, **kwargs: Any) -> nn.Module:
    unknown = sorted(set(kwargs) - {"channels", "hidden", "norm"})
    if unknown:
        raise ModelConfigError(
            f"model 'cnn' has no option(s) {unknown}; it accepts channels, hidden, norm"
        )
    if len(shape) != 3:
        raise ModelConfigError(
            f"model 'cnn' needs an image input_shape (channels, height, width), got {shape}"
        )
    channels = tuple(kwargs.get("channels", (16, 32)))
    if len(channels) != 2:
        raise ModelConfigError(f"channels={channels!r} must give two conv widths")
    for c in channels:
        _positive_int("channels", c)
    norm = kwargs.get("norm", "none")
    if norm not in ("none", "group"):
        raise ModelConfigError(f"norm={norm!r} must be 'none' or 'group' (BatchNorm is avoided)")
    return SmallCNN(
        (shape[0], shape[1], shape[2]),
        num_classes,
        channels=channels,
        hidden=_positive_int("hidden", kwargs.get("hidden", 64)),
        norm=norm,
    )


def _replace_first_conv(model: nn.Module, in_channels: int, label: str) -> None:
    first = next(((name, m) for name, m in model.named_modules() if isinstance(m, nn.Conv2d)), None)
    if first is None:
        raise ModelConfigError(f"{label} has no Conv2d to adapt to {in_channels} input channel(s)")
    name, conv = first
    if conv.in_channels == in_channels:
        return
    if conv.groups != 1:
        raise ModelConfigError(f"{label}'s first convolution is grouped; cannot adapt its input")
    replacement = nn.Conv2d(
        in_channels,
        conv.out_channels,
        kernel_size=conv.kernel_size,  # type: ignore[arg-type]
        stride=conv.stride,  # type: ignore[arg-type]
        padding=conv.padding,  # type: ignore[arg-type]
        dilation=conv.dilation,  # type: ignore[arg-type]
        bias=conv.bias is not None,
        padding_mode=conv.padding_mode,
    )
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name), child, replacement)


def _build_torchvision(
    arch: str, shape: tuple[int, ...], num_classes: int, **kwargs: Any
) -> nn.Module:
    label = f"{_TV_PREFIX}{arch}"
    try:
        tv_models = importlib.import_module("torchvision.models")
    except (ImportError, RuntimeError) as exc:
        raise TorchvisionNotInstalledError(
            f"model {label!r} needs torchvision, which cannot be imported ({exc}); install the "
            "'vision' extra (pip install 'fedaudit[vision]', torchvision>=0.17) or use 'mlp' or "
            "'cnn'"
        ) from exc
    if len(shape) != 3:
        raise ModelConfigError(
            f"model {label!r} needs an image input_shape (channels, height, width), got {shape}"
        )
    try:
        model = tv_models.get_model(arch, weights=None, num_classes=num_classes, **kwargs)
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelConfigError(f"torchvision cannot build {arch!r}: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise ModelConfigError(f"torchvision's {arch!r} builder did not return an nn.Module")
    _replace_first_conv(model, shape[0], label)
    _, head = classifier_head(model)
    if head.out_features != num_classes:
        raise ModelConfigError(
            f"{label}'s last Linear has {head.out_features} outputs, expected {num_classes}"
        )
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros(2, *shape))
    except (RuntimeError, ValueError, AssertionError) as exc:
        # torchvision checks input sizes with torch._assert (AssertionError), e.g. ViT's
        # image_size; shape mismatches inside layers are RuntimeErrors.
        raise ModelConfigError(f"{label} does not accept inputs of shape {shape}: {exc}") from exc
    model.train(was_training)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, num_classes):
        raise ModelConfigError(f"{label} does not return logits of shape (batch, {num_classes})")
    return model


def build_model(
    name: str,
    input_shape: Sequence[int],
    num_classes: int,
    *,
    seed: int = 0,
    **kwargs: Any,
) -> nn.Module:
    """Build a freshly initialised classification model.

    Parameters
    ----------
    name : str
        ``"mlp"``, ``"cnn"`` or ``"tv:<torchvision model name>"`` (module docstring).
    input_shape : sequence of int
        Shape of one sample: ``(features,)`` or ``(channels, height, width)``.
    num_classes : int
        Number of classes C (the head's output size).
    seed : int
        Seed of the weight initialisation; torch's global random state is left untouched.
    **kwargs
        Model options: ``mlp``: ``hidden`` (64), ``dropout`` (0.0); ``cnn``: ``channels``
        ((16, 32)), ``hidden`` (64), ``norm`` ("none" or "group"); ``tv:*``: forwarded to
        ``torchvision.models.get_model``.

    Returns
    -------
    torch.nn.Module
        In train mode, float32, on the CPU; its last module is an ``nn.Linear`` head.

    Raises
    ------
    ModelConfigError
        Unknown name or option, or an unusable input shape.
    TorchvisionNotInstalledError
        A ``tv:`` model was requested without torchvision.
    """
    shape = tuple(int(d) for d in input_shape)
    if not shape or any(d < 1 for d in shape):
        raise ModelConfigError(f"input_shape={tuple(input_shape)!r} must be non-empty and positive")
    classes = _positive_int("num_classes", num_classes)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ModelConfigError(f"seed={seed!r} must be a non-negative int")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name == "mlp":
            model = _build_mlp(shape, classes, **kwargs)
        elif name == "cnn":
            model = _build_cnn(shape, classes, **kwargs)
        elif name.startswith(_TV_PREFIX) and len(name) > len(_TV_PREFIX):
            model = _build_torchvision(name[len(_TV_PREFIX) :], shape, classes, **kwargs)
        else:
            raise ModelConfigError(
                f"name={name!r} is not a model; choose 'mlp', 'cnn' or 'tv:<torchvision name>'"
            )
    return model.train()
