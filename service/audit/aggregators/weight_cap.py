"""Bounded influence: the cap on a single client's weight (beyond the papers; docs/algorithms.md,
"Aggregation").

Every rule takes ``max_client_weight_factor`` f (default 4, None = off) and no client's
normalised weight exceeds ``cap = min(1, f / K)`` for K participating clients (so up to f clients
nothing changes). The weights a rule computes are capped by :func:`cap_weights` (water-filling:
clip at the cap, hand the excess to the uncapped clients in proportion to their weights, repeat);
``AggregationResult.weight_cap`` records the cap and, per capped client, its weight before and
after. A site that overstates its sample count therefore gains at most the cap, whatever it
claims.
"""

from __future__ import annotations

import math
from typing import Any, NotRequired

import numpy as np
from typing_extensions import TypedDict

from service.audit._typing import FloatArray
from service.audit._validation import (
    InvalidInputError,
    InvalidParameterError,
    as_float_array,
    check_float,
    check_int,
)

__all__ = [
    "DEFAULT_MAX_CLIENT_WEIGHT_FACTOR",
    "CappedWeight",
    "WeightCapRecord",
    "cap_weights",
    "client_weight_cap",
]


class CappedWeight(TypedDict):
    """One client whose weight the cap lowered.

    The audit knows clients by position only; the coordinator adds the site's ``client_id`` to
    the copy it stores and serves (``CappedWeightRecord`` in the API)."""

    index: int
    """Its position in the updates."""
    before: float
    after: float
    layers: NotRequired[int]
    """``fedncl_layerwise`` only: in how many float tensors it was capped (``before`` and
    ``after`` are then its mean weights over the tensors)."""


class WeightCapRecord(TypedDict):
    """What the cap on a single client's weight did in a round (stored with the audit)."""

    factor: float
    """f of ``min(1, f / K)``."""
    cap: float
    """The cap applied: min(1, f / K), or 1 / m when only m < 1 / cap clients have a positive
    weight (``note`` says so)."""
    capped: list[CappedWeight]
    note: NotRequired[str]


DEFAULT_MAX_CLIENT_WEIGHT_FACTOR = 4.0
"""Default f of the weight cap ``min(1, f / K)``: with up to 4 clients the cap is 1 (no effect);
with 10 a single client weighs at most 0.4, with 100 at most 0.04."""


def normalise(raw: FloatArray, name: str) -> FloatArray:
    """``raw`` divided by its sum, which must be finite and positive (else ``name`` is blamed)."""
    with np.errstate(over="ignore"):  # an overflowing sum is reported below, not warned
        total = float(raw.sum())
    if not math.isfinite(total) or total <= 0.0:
        raise InvalidInputError(f"{name}: weights must be finite with a positive sum")
    result: FloatArray = raw / total
    return result


def client_weight_cap(n_clients: int, factor: float) -> float:
    """The cap ``min(1, factor / n_clients)`` on one client's normalised weight.

    Parameters
    ----------
    n_clients : int
        K, the clients taking part in the aggregation (>= 1).
    factor : float
        f >= 1, so that the cap is never below the equal share 1 / K.

    Raises
    ------
    InvalidParameterError
        If ``n_clients`` < 1 or ``factor`` < 1 (or not finite).
    """
    k = check_int("n_clients", n_clients, min_value=1)
    f = check_float("max_client_weight_factor", factor, min_value=1.0)
    return min(1.0, f / k)


def cap_weights(weights: Any, cap: float) -> FloatArray:
    """Water-filling: normalised weights with none above ``cap``.

    ``weights`` are normalised to sum 1. Then, repeatedly: every weight above ``cap`` is set to
    ``cap`` and what is left (1 - cap x the number capped) is shared among the uncapped clients
    in proportion to their original weights, until no weight exceeds the cap (at most K passes:
    each one caps at least one more client). The result is ``min(cap, lam * w_k)`` with the one
    ``lam >= 1`` that makes it sum to 1, so the order of the weights is kept (ties stay ties), a
    zero weight stays zero, the uncapped weights keep their ratios, and nothing changes when no
    weight exceeds the cap. Pure: no state, no randomness.

    Example: ``[0.97, 0.01, 0.01, 0.01]`` with cap 0.5 gives ``[0.5, 1/6, 1/6, 1/6]``.

    Parameters
    ----------
    weights : array-like of shape (n_clients,)
        Non-negative, finite, with a positive sum (normalised here).
    cap : float
        In (0, 1], and at least 1 / m for the m positive weights: below that no weights summing
        to 1 without raising a zero weight can respect it.

    Returns
    -------
    ndarray of shape (n_clients,)
        The capped weights: sum 1 (up to rounding), none above ``cap``.

    Raises
    ------
    InvalidInputError
        If a weight is negative or not finite, or the weights do not have a positive sum.
    InvalidParameterError
        If ``cap`` is outside (0, 1] or below 1 / m.
    """
    original = normalise(as_float_array("weights", weights, ndim=1, min_value=0.0), "weights")
    c = check_float("cap", cap, min_value=0.0, max_value=1.0, min_inclusive=False)
    positive = int(np.count_nonzero(original))
    if c * positive < 1.0 - 1e-12:
        raise InvalidParameterError(
            f"cap: {c} is below 1/{positive} ({positive} positive weights): weights summing to 1 "
            "cannot all respect it"
        )
    result = original.copy()
    capped = np.zeros(result.size, dtype=bool)
    while True:
        over = result > c
        if not over.any():
            return result
        capped |= over
        result[capped] = c
        free = ~capped
        free_total = float(original[free].sum())
        if free_total > 0.0:
            remaining = max(1.0 - c * int(capped.sum()), 0.0)
            result[free] = original[free] * (remaining / free_total)


def check_factor(factor: float | None) -> float | None:
    """The factor f checked (>= 1), or None (no cap)."""
    if factor is None:
        return None
    return check_float("max_client_weight_factor", factor, min_value=1.0)


def apply_cap(
    weights: FloatArray, factor: float | None
) -> tuple[FloatArray, WeightCapRecord | None]:
    """``weights`` capped at min(1, f / K), and the record of what the cap changed.

    When fewer than 1 / cap clients have a positive weight (a rule gave the others 0), the cap
    is raised to 1 / m for the m positive ones (equal weights among them): the weights must sum
    to 1, and a weight a rule set to 0 is never raised.
    """
    if factor is None:
        return weights, None
    k = int(weights.size)
    cap = client_weight_cap(k, factor)
    record: WeightCapRecord = {"factor": factor, "cap": cap, "capped": []}
    positive = int(np.count_nonzero(weights))
    if cap * positive < 1.0 - 1e-12:
        cap = 1.0 / positive
        record["cap"] = cap
        record["note"] = (
            f"only {positive} of the {k} clients have a positive weight: the cap is raised to "
            f"1/{positive}"
        )
    if not (weights > cap).any():
        return weights, record
    capped = cap_weights(weights, cap)
    record["capped"] = [
        {"index": int(i), "before": float(weights[i]), "after": float(capped[i])}
        for i in np.flatnonzero(capped < weights)
    ]
    return capped, record


def moot_cap(n_clients: int, factor: float | None, rule: str) -> WeightCapRecord | None:
    """The cap record of a rule whose weights are 1/K (never above the cap)."""
    if factor is None:
        return None
    return {
        "factor": factor,
        "cap": client_weight_cap(n_clients, factor),
        "capped": [],
        "note": f"{rule} is not a weighted average: each client counts 1/K, never above the cap, "
        "and num_samples is not used",
    }
