"""What every aggregation rule shares: :class:`AggregationResult`, the input checks, the
weighted sum of the updates and the fall-back to FedAvg.

A rule that cannot be applied as asked (for example DaAgg without any clean client) falls back
to FedAvg and says so in ``AggregationResult.fallback_reason``; it never raises for that.
Malformed states or arguments raise :class:`~service.audit._validation.InvalidInputError` /
:class:`~service.audit._validation.InvalidParameterError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from service.audit._json import to_jsonable
from service.audit._typing import AnyArray, BoolArray, FloatArray
from service.audit._validation import (
    InvalidInputError,
    InvalidParameterError,
    as_bool_array,
    as_float_array,
)
from service.audit.aggregators.weight_cap import WeightCapRecord, apply_cap, normalise
from service.audit.blocks import stream_pass
from service.audit.round_pass import RoundPass
from service.audit.state import StateReader

__all__ = ["AggregationResult"]


@dataclass(frozen=True)
class AggregationResult:
    """A new global state and how it was obtained.

    Attributes
    ----------
    state : dict of str to ndarray
        New global state: same names, dtypes and shapes as the global state.
    weights : ndarray of shape (n_clients,)
        Per-client weights actually used. For ``fedncl_layerwise`` the mean over float tensors
        of the per-tensor weights; for ``trimmed_mean`` and ``median`` 1/K each (those rules
        are not weighted averages; ``details`` says how many values were trimmed).
    layer_weights : dict of str to list of float, or None
        Per float tensor, the per-client weights (``fedncl_layerwise`` only).
    rule : str
        The rule actually applied (e.g. ``"fedavg"`` after a fallback).
    requested_rule : str
        The rule asked for.
    fallback_reason : str or None
        Why ``rule`` differs from ``requested_rule``.
    details : dict
        Rule-specific facts (distances, penalties, trimmed counts, ...), JSON-serialisable.
    weight_cap : WeightCapRecord or None
        The cap on a single client's weight (:class:`~service.audit.aggregators.weight_cap.
        WeightCapRecord`: f, the cap, the clients it lowered). None: no cap (f None).
    """

    state: dict[str, AnyArray]
    weights: FloatArray
    layer_weights: dict[str, list[float]] | None
    rule: str
    requested_rule: str
    fallback_reason: str | None
    details: dict[str, Any] = field(default_factory=dict)
    weight_cap: WeightCapRecord | None = None

    def to_json(self) -> dict[str, Any]:
        """Return everything but the state as plain JSON values."""
        return cast(
            dict[str, Any],
            to_jsonable(
                {
                    "rule": self.rule,
                    "requested_rule": self.requested_rule,
                    "fallback_reason": self.fallback_reason,
                    "weights": self.weights,
                    "layer_weights": self.layer_weights,
                    "details": self.details,
                    "weight_cap": self.weight_cap,
                }
            ),
        )


def check_updates(updates: Sequence[StateReader]) -> int:
    """The number of updates (at least one)."""
    if len(updates) == 0:
        raise InvalidInputError("updates: at least one client update is needed")
    return len(updates)


def num_samples_array(num_samples: Any, n_clients: int) -> FloatArray:
    """n_k checked: one positive count per update."""
    n = as_float_array("num_samples", num_samples, ndim=1)
    if n.size != n_clients:
        raise InvalidInputError(
            f"num_samples: length {n.size} differs from the {n_clients} updates"
        )
    if (n <= 0).any():
        raise InvalidInputError("num_samples: every client needs a positive sample count")
    return n


def noisy_flags(noisy: Any, n_clients: int) -> BoolArray | None:
    """The detector's flags checked (one per update), or None (undetermined)."""
    if noisy is None:
        return None
    flags = as_bool_array("noisy", noisy, ndim=1)
    if flags.size != n_clients:
        raise InvalidInputError(f"noisy: length {flags.size} differs from the {n_clients} updates")
    return flags


def weighted_state(
    global_state: StateReader,
    updates: Sequence[StateReader],
    weights: FloatArray,
    shared: RoundPass | None = None,
) -> dict[str, AnyArray]:
    """sum_k w_k theta_k per float tensor, in one blocked pass over the updates (or from the
    round's shared pass when it computed these weights)."""
    if shared is not None:
        return shared.weighted(weights, int(np.argmax(weights)))
    result = stream_pass(global_state, updates, weights=weights, chosen=int(np.argmax(weights)))
    assert result.state is not None
    return result.state


def fedavg_weights(n: FloatArray) -> FloatArray:
    """FedAvg's weights n_k / sum n (uncapped)."""
    return normalise(n, "num_samples")


def check_shared(
    shared: RoundPass | None, global_state: StateReader, updates: Sequence[StateReader]
) -> None:
    """Reject a shared pass over other states than these."""
    if shared is None:
        return
    if (
        shared.global_state is not global_state
        or len(shared.updates) != len(updates)
        or any(a is not b for a, b in zip(shared.updates, updates, strict=True))
    ):
        raise InvalidParameterError("shared: a pass over other states than these")


def result(
    state: dict[str, AnyArray],
    weights: FloatArray,
    rule: str,
    requested: str,
    *,
    fallback_reason: str | None = None,
    layer_weights: dict[str, list[float]] | None = None,
    details: dict[str, Any] | None = None,
    weight_cap: WeightCapRecord | None = None,
) -> AggregationResult:
    """An :class:`AggregationResult` (``details`` {} when None)."""
    return AggregationResult(
        state=state,
        weights=weights,
        layer_weights=layer_weights,
        rule=rule,
        requested_rule=requested,
        fallback_reason=fallback_reason,
        details={} if details is None else details,
        weight_cap=weight_cap,
    )


def fallback(
    global_state: StateReader,
    updates: Sequence[StateReader],
    n: FloatArray,
    requested: str,
    reason: str,
    details: dict[str, Any] | None = None,
    *,
    factor: float | None,
    shared: RoundPass | None = None,
) -> AggregationResult:
    """FedAvg (capped) instead of ``requested``, with the reason."""
    weights, cap = apply_cap(fedavg_weights(n), factor)
    state = weighted_state(global_state, updates, weights, shared)
    return result(
        state,
        weights,
        "fedavg",
        requested,
        fallback_reason=reason,
        details=details,
        weight_cap=cap,
    )
