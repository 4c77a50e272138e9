"""Reading a round's hyper-parameters (docs/design/recipes-api.md, "Common").

* :class:`Hyperparameters` -- typed, range-checked reads of ``ctx.hyperparameters``;
* :class:`TrainingConfig` -- the keys every recipe shares (learning rate, momentum, optimiser,
  epochs, batch size, gradient clipping);
* :func:`make_optimizer` -- SGD or Adam from a :class:`TrainingConfig`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from client_sdk.recipes.errors import (
    InvalidHyperparameterError,
    ModelContractError,
)

__all__ = ["Hyperparameters", "TrainingConfig", "make_optimizer"]


class Hyperparameters:
    """Typed, validated reads of the server's hyper-parameters with the spec defaults.

    Unknown keys are ignored (the server's instructions carry keys for other parts of the system);
    a known key with the wrong type or out of range raises :class:`InvalidHyperparameterError`.
    """

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = values

    def _raw(self, key: str, default: Any) -> Any:
        value = self._values.get(key, default)
        return default if value is None else value

    def get_float(
        self,
        key: str,
        default: float,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        exclusive_minimum: bool = False,
    ) -> float:
        """Read a finite float in ``[minimum, maximum]`` (``(minimum, ...`` when exclusive)."""
        value = self._raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidHyperparameterError(f"{key}: expected a number, got {value!r}")
        result = float(value)
        if not math.isfinite(result):
            raise InvalidHyperparameterError(f"{key}: must be finite, got {value!r}")
        if minimum is not None and (result < minimum or (exclusive_minimum and result == minimum)):
            bound = ">" if exclusive_minimum else ">="
            raise InvalidHyperparameterError(f"{key}: must be {bound} {minimum}, got {result}")
        if maximum is not None and result > maximum:
            raise InvalidHyperparameterError(f"{key}: must be <= {maximum}, got {result}")
        return result

    def get_int(self, key: str, default: int, *, minimum: int | None = None) -> int:
        """Read an integer (an integral float such as ``10.0`` is accepted) ``>= minimum``."""
        value = self._raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidHyperparameterError(f"{key}: expected an integer, got {value!r}")
        if isinstance(value, float) and not value.is_integer():
            raise InvalidHyperparameterError(f"{key}: expected an integer, got {value!r}")
        result = int(value)
        if minimum is not None and result < minimum:
            raise InvalidHyperparameterError(f"{key}: must be >= {minimum}, got {result}")
        return result

    def get_choice(self, key: str, default: str, choices: Sequence[str]) -> str:
        """Read a string that must be one of ``choices``."""
        value = self._raw(key, default)
        if not isinstance(value, str) or value not in choices:
            raise InvalidHyperparameterError(
                f"{key}: expected one of {list(choices)}, got {value!r}"
            )
        return value

    def get_bool(self, key: str, default: bool) -> bool:
        """Read a boolean (JSON true/false only)."""
        value = self._raw(key, default)
        if not isinstance(value, bool):
            raise InvalidHyperparameterError(f"{key}: expected true or false, got {value!r}")
        return value

    def get_optional_float(
        self, key: str, *, minimum: float | None = None, exclusive_minimum: bool = False
    ) -> float | None:
        """Read an optional finite float (absent or null: None), checked as :meth:`get_float`."""
        if self._values.get(key) is None:
            return None
        return self.get_float(key, 0.0, minimum=minimum, exclusive_minimum=exclusive_minimum)

    def get_optional_str(self, key: str) -> str | None:
        """Read an optional non-empty string."""
        value = self._values.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise InvalidHyperparameterError(f"{key}: expected a non-empty string, got {value!r}")
        return value


@dataclass(frozen=True)
class TrainingConfig:
    """The hyper-parameters every recipe shares (recipes-api.md, "Common")."""

    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0
    optimizer: str = "sgd"
    local_epochs: int = 1
    batch_size: int = 32
    max_grad_norm: float | None = None

    @classmethod
    def from_hyperparameters(cls, hp: Hyperparameters) -> TrainingConfig:
        """Read the common keys with their defaults."""
        return cls(
            lr=hp.get_float("lr", cls.lr, minimum=0.0, exclusive_minimum=True),
            momentum=hp.get_float("momentum", cls.momentum, minimum=0.0, maximum=1.0),
            weight_decay=hp.get_float("weight_decay", cls.weight_decay, minimum=0.0),
            optimizer=hp.get_choice("optimizer", cls.optimizer, ("sgd", "adam")),
            local_epochs=hp.get_int("local_epochs", cls.local_epochs, minimum=1),
            batch_size=hp.get_int("batch_size", cls.batch_size, minimum=1),
            max_grad_norm=hp.get_optional_float(
                "max_grad_norm", minimum=0.0, exclusive_minimum=True
            ),
        )


def make_optimizer(
    params: Iterable[nn.Parameter], config: TrainingConfig, *, lr: float | None = None
) -> torch.optim.Optimizer:
    """SGD (lr, momentum, weight decay) or Adam (lr, weight decay) over ``params``."""
    rate = config.lr if lr is None else lr
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        raise ModelContractError("model: has no trainable parameters")
    if config.optimizer == "adam":
        return torch.optim.Adam(trainable, lr=rate, weight_decay=config.weight_decay)
    return torch.optim.SGD(
        trainable, lr=rate, momentum=config.momentum, weight_decay=config.weight_decay
    )
