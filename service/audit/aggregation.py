"""Aggregation rules: new global state plus the per-client weights actually used.

The papers' rules (docs/algorithms.md, "Aggregation"):

* ``fedavg`` -- w_k = n_k / sum n (FedRN eq. 1, McMahan et al. 2017).
* ``daagg`` -- FedNoRo distance-aware aggregation (Wu et al., IJCAI 2023, eq. 6-7).
* ``fedncl_layerwise`` -- Fed-NCL robust layer-wise aggregation with the noisy-client penalty
  (Tam et al., section V-B, eq. 12-16).
* ``trimmed_mean`` and ``median`` -- coordinate-wise robust baselines (Fed-NCL section VI).
* ``reliability_weighted`` -- beyond the papers: w_k proportional to n_k (1 - p_k).

Streaming: every rule reads the updates through :func:`~service.audit.blocks.stream_pass`, in
parameter blocks (zero-copy from the coordinator's memory maps, pages released as the pass moves
on), so the process never holds K whole states nor K copies of one tensor. Float tensors are
combined in float32 blocks (float64 for float64 tensors) with float64 totals across blocks;
:mod:`service.audit.blocks` says where float64 is kept and why. Every other tensor (e.g.
``num_batches_tracked``) is copied from the client with the largest weight (ties: lowest index).
DaAgg and the layer-wise rule need two passes (distances, then the weighted sum); the other rules
read each update once.

Bounded influence: every rule takes ``max_client_weight_factor`` f (default 4, None = off) and no
client's normalised weight exceeds ``cap = min(1, f / K)`` for K participating clients (so up to
f clients nothing changes). The weights a rule computes are capped by :func:`cap_weights`
(water-filling: clip at the cap, hand the excess to the uncapped clients in proportion to their
weights, repeat); ``AggregationResult.weight_cap`` records the cap and, per capped client, its
weight before and after. A site that overstates its sample count therefore gains at most the
cap, whatever it claims.

A rule that cannot be applied as asked (for example DaAgg without any clean client) falls back
to FedAvg and says so in ``AggregationResult.fallback_reason``; it never raises for that.
Malformed states or arguments raise :class:`~service.audit._validation.InvalidInputError` /
:class:`~service.audit._validation.InvalidParameterError`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np

from service.audit._json import to_jsonable
from service.audit._typing import AnyArray, BoolArray, FloatArray
from service.audit._validation import (
    InvalidInputError,
    InvalidParameterError,
    as_bool_array,
    as_float_array,
    check_choice,
    check_float,
    check_int,
)
from service.audit.blocks import RoundPass, stream_pass
from service.audit.sorted_blocks import coordinatewise
from service.audit.state import StateReader

__all__ = [
    "AGGREGATION_RULES",
    "DEFAULT_MAX_CLIENT_WEIGHT_FACTOR",
    "NOISY_SET_RULES",
    "AggregationResult",
    "aggregate",
    "aggregate_daagg",
    "aggregate_fedavg",
    "aggregate_fedncl_layerwise",
    "aggregate_median",
    "aggregate_reliability_weighted",
    "aggregate_trimmed_mean",
    "cap_weights",
    "client_weight_cap",
    "planned_fedavg_weights",
]

AGGREGATION_RULES = (
    "fedavg",
    "daagg",
    "fedncl_layerwise",
    "trimmed_mean",
    "median",
    "reliability_weighted",
)
"""Names accepted by :func:`aggregate`."""

NOISY_SET_RULES = ("daagg", "fedncl_layerwise")
"""Rules that read the ``noisy`` flags (the others ignore them)."""

DEFAULT_MAX_CLIENT_WEIGHT_FACTOR = 4.0
"""Default f of the weight cap ``min(1, f / K)``: with up to 4 clients the cap is 1 (no effect);
with 10 a single client weighs at most 0.4, with 100 at most 0.04."""


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
    weight_cap : dict or None
        The cap on a single client's weight: ``factor`` (f), ``cap`` (min(1, f / K), or higher
        when fewer than 1 / cap clients have a positive weight; ``note`` says so), and
        ``capped``, one entry per client whose weight was lowered: ``index`` (position in the
        updates), ``before`` and ``after`` (for ``fedncl_layerwise`` the means over float
        tensors, with ``layers`` = in how many tensors it was capped). None: no cap (f None).
    """

    state: dict[str, AnyArray]
    weights: FloatArray
    layer_weights: dict[str, list[float]] | None
    rule: str
    requested_rule: str
    fallback_reason: str | None
    details: dict[str, Any] = field(default_factory=dict)
    weight_cap: dict[str, Any] | None = None

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


# --------------------------------------------------------------------------------------------
# Shared machinery
# --------------------------------------------------------------------------------------------


def _check_updates(updates: Sequence[StateReader]) -> int:
    if len(updates) == 0:
        raise InvalidInputError("updates: at least one client update is needed")
    return len(updates)


def _num_samples(num_samples: Any, n_clients: int) -> FloatArray:
    n = as_float_array("num_samples", num_samples, ndim=1)
    if n.size != n_clients:
        raise InvalidInputError(
            f"num_samples: length {n.size} differs from the {n_clients} updates"
        )
    if (n <= 0).any():
        raise InvalidInputError("num_samples: every client needs a positive sample count")
    return n


def _noisy_flags(noisy: Any, n_clients: int) -> BoolArray | None:
    if noisy is None:
        return None
    flags = as_bool_array("noisy", noisy, ndim=1)
    if flags.size != n_clients:
        raise InvalidInputError(f"noisy: length {flags.size} differs from the {n_clients} updates")
    return flags


def _normalise(raw: FloatArray, name: str) -> FloatArray:
    with np.errstate(over="ignore"):  # an overflowing sum is reported below, not warned
        total = float(raw.sum())
    if not math.isfinite(total) or total <= 0.0:
        raise InvalidInputError(f"{name}: weights must be finite with a positive sum")
    result: FloatArray = raw / total
    return result


def _weighted_state(
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


def _fedavg_weights(n: FloatArray) -> FloatArray:
    return _normalise(n, "num_samples")


def planned_fedavg_weights(num_samples: Any, max_client_weight_factor: float | None) -> FloatArray:
    """The capped FedAvg weights :func:`aggregate_fedavg` will use (for a shared pass)."""
    n = _num_samples(num_samples, len(np.atleast_1d(num_samples)))
    weights, _ = _cap(_fedavg_weights(n), _check_factor(max_client_weight_factor))
    return weights


def _check_shared(
    shared: RoundPass | None, global_state: StateReader, updates: Sequence[StateReader]
) -> None:
    if shared is None:
        return
    if (
        shared.global_state is not global_state
        or len(shared.updates) != len(updates)
        or any(a is not b for a, b in zip(shared.updates, updates, strict=True))
    ):
        raise InvalidParameterError("shared: a pass over other states than these")


# --------------------------------------------------------------------------------------------
# Bounded influence: the cap on a single client's weight
# --------------------------------------------------------------------------------------------


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
    original = _normalise(as_float_array("weights", weights, ndim=1, min_value=0.0), "weights")
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


def _check_factor(factor: float | None) -> float | None:
    if factor is None:
        return None
    return check_float("max_client_weight_factor", factor, min_value=1.0)


def _cap(weights: FloatArray, factor: float | None) -> tuple[FloatArray, dict[str, Any] | None]:
    """``weights`` capped at min(1, f / K), and the record of what the cap changed.

    When fewer than 1 / cap clients have a positive weight (a rule gave the others 0), the cap
    is raised to 1 / m for the m positive ones (equal weights among them): the weights must sum
    to 1, and a weight a rule set to 0 is never raised.
    """
    if factor is None:
        return weights, None
    k = int(weights.size)
    cap = client_weight_cap(k, factor)
    record: dict[str, Any] = {"factor": factor, "cap": cap, "capped": []}
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


def _moot_cap(n_clients: int, factor: float | None, rule: str) -> dict[str, Any] | None:
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


def _result(
    state: dict[str, AnyArray],
    weights: FloatArray,
    rule: str,
    requested: str,
    *,
    fallback_reason: str | None = None,
    layer_weights: dict[str, list[float]] | None = None,
    details: dict[str, Any] | None = None,
    weight_cap: dict[str, Any] | None = None,
) -> AggregationResult:
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


def _fallback(
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
    weights, cap = _cap(_fedavg_weights(n), factor)
    state = _weighted_state(global_state, updates, weights, shared)
    return _result(
        state,
        weights,
        "fedavg",
        requested,
        fallback_reason=reason,
        details=details,
        weight_cap=cap,
    )


# --------------------------------------------------------------------------------------------
# Rules
# --------------------------------------------------------------------------------------------


def aggregate_fedavg(
    global_state: StateReader,
    updates: Sequence[StateReader],
    num_samples: Any,
    *,
    max_client_weight_factor: float | None = DEFAULT_MAX_CLIENT_WEIGHT_FACTOR,
    shared: RoundPass | None = None,
) -> AggregationResult:
    """FedAvg: w_k = n_k / sum n, capped at min(1, f / K) per client.

    Parameters
    ----------
    global_state : StateReader
        theta_G (defines names, shapes and dtypes; not averaged in).
    updates : sequence of StateReader
        theta_k of each client.
    num_samples : array-like of shape (n_clients,)
        n_k, positive.
    max_client_weight_factor : float or None, default=4.0
        f >= 1: no client's weight exceeds min(1, f / K) (:func:`cap_weights`); None: no cap.
    shared : RoundPass, optional
        The round's shared pass over these same states
        (:class:`~service.audit.blocks.RoundPass`): results it already computed are reused
        instead of reading the updates again.

    Returns
    -------
    AggregationResult
        Rule ``"fedavg"``.

    Raises
    ------
    InvalidParameterError
        If ``max_client_weight_factor`` is below 1.
    InvalidInputError
        If there is no update, a state does not match the global one, or a count is not
        positive.
    """
    factor = _check_factor(max_client_weight_factor)
    k = _check_updates(updates)
    _check_shared(shared, global_state, updates)
    weights, cap = _cap(_fedavg_weights(_num_samples(num_samples, k)), factor)
    state = _weighted_state(global_state, updates, weights, shared)
    return _result(state, weights, "fedavg", "fedavg", weight_cap=cap)


_DAAGG_VARIANTS = ("paper", "reference")


def _pairwise_distances(
    global_state: StateReader,
    updates: Sequence[StateReader],
    noisy_idx: Sequence[int],
    clean_idx: Sequence[int],
    variant: str,
    shared: RoundPass | None = None,
) -> FloatArray:
    """Distances between each noisy and each clean client over float tensors, in one blocked
    pass: per block the Gram cross term of the differences to the global model (one matrix
    product) instead of one subtraction per pair (or from the shared pass's Gram matrices)."""
    squared = (
        shared.pair_squared(noisy_idx, clean_idx)
        if shared is not None
        else stream_pass(global_state, updates, pairs=(noisy_idx, clean_idx)).pair_squared
    )
    assert squared is not None
    if variant == "paper":
        result: FloatArray = np.sqrt(squared.sum(axis=0))
        return result
    per_tensor: FloatArray = np.sqrt(squared).sum(axis=0)
    return per_tensor


def aggregate_daagg(
    global_state: StateReader,
    updates: Sequence[StateReader],
    num_samples: Any,
    noisy: Any,
    *,
    variant: str = "paper",
    max_client_weight_factor: float | None = DEFAULT_MAX_CLIENT_WEIGHT_FACTOR,
    shared: RoundPass | None = None,
) -> AggregationResult:
    """FedNoRo distance-aware aggregation (DaAgg, eq. 6-7).

    For a noisy client i, ``d(i) = min over clean j of dist(theta_i, theta_j)``; clean clients
    have d = 0; ``D(i) = d(i) / max d`` and ``w_i`` is proportional to ``n_i * exp(-D(i))``.

    Parameters
    ----------
    global_state : StateReader
        theta_G (names, shapes, dtypes).
    updates : sequence of StateReader
        theta_k of each client.
    num_samples : array-like of shape (n_clients,)
        n_k, positive.
    noisy : array-like of bool of shape (n_clients,), or None
        The detector's flags; None (undetermined) falls back to FedAvg.
    variant : {"paper", "reference"}, default="paper"
        ``"paper"``: L2 norm of the difference of all float tensors flattened into one
        vector. ``"reference"``: sum over float tensors (BatchNorm running statistics
        included) of the per-tensor L2 norms, as the authors' code does.
    max_client_weight_factor : float or None, default=4.0
        f >= 1: no client's weight exceeds min(1, f / K) after the distance weighting
        (:func:`cap_weights`); None: no cap.
    shared : RoundPass, optional
        The round's shared pass over these same states
        (:class:`~service.audit.blocks.RoundPass`): results it already computed are reused
        instead of reading the updates again.

    Returns
    -------
    AggregationResult
        Rule ``"daagg"``; ``details`` holds ``distances`` (d) and ``normalised_distances`` (D).
        Without any noisy client every d is 0 and the weights equal FedAvg's (recorded in
        ``details["note"]``, rule still ``"daagg"``). Falls back to ``"fedavg"`` (with the
        reason) when ``noisy`` is None, when every client is noisy (no clean reference), or
        when max d = 0 (the noisy models equal clean ones, D = 0/0).

    Raises
    ------
    InvalidParameterError
        If ``variant`` is unknown or ``max_client_weight_factor`` is below 1.
    InvalidInputError
        If the states, counts or flags are malformed.
    """
    check_choice("variant", variant, _DAAGG_VARIANTS)
    factor = _check_factor(max_client_weight_factor)
    k = _check_updates(updates)
    _check_shared(shared, global_state, updates)
    n = _num_samples(num_samples, k)
    flags = _noisy_flags(noisy, k)
    if flags is None:
        return _fallback(
            global_state,
            updates,
            n,
            "daagg",
            "no noisy flags (detection undetermined)",
            factor=factor,
            shared=shared,
        )
    noisy_idx = [int(i) for i in np.flatnonzero(flags)]
    clean_idx = [int(i) for i in np.flatnonzero(~flags)]
    if not clean_idx:
        return _fallback(
            global_state,
            updates,
            n,
            "daagg",
            "every client is flagged noisy: no clean client",
            factor=factor,
            shared=shared,
        )
    distances = np.zeros(k)
    details: dict[str, Any] = {"variant": variant, "noisy": flags.tolist()}
    if noisy_idx:
        pairwise = _pairwise_distances(global_state, updates, noisy_idx, clean_idx, variant, shared)
        distances[noisy_idx] = pairwise.min(axis=1)
        nearest = [clean_idx[int(j)] for j in pairwise.argmin(axis=1)]
        details["nearest_clean"] = dict(zip([str(i) for i in noisy_idx], nearest, strict=True))
    else:
        details["note"] = "no noisy client: every d = 0, so the weights equal FedAvg's"
    details["distances"] = distances.tolist()
    max_d = float(distances.max())
    if noisy_idx and max_d == 0.0:
        return _fallback(
            global_state,
            updates,
            n,
            "daagg",
            "max distance is 0 (noisy models equal clean ones), D = d / max d undefined",
            details,
            factor=factor,
            shared=shared,
        )
    normalised = distances / max_d if max_d > 0.0 else distances
    details["normalised_distances"] = normalised.tolist()
    weights, cap = _cap(_normalise(n * np.exp(-normalised), "num_samples"), factor)
    state = _weighted_state(global_state, updates, weights, shared)
    return _result(state, weights, "daagg", "daagg", details=details, weight_cap=cap)


def aggregate_fedncl_layerwise(
    global_state: StateReader,
    updates: Sequence[StateReader],
    num_samples: Any,
    noisy: Any,
    *,
    round_index: int = 0,
    tau: float = 50.0,
    t_k: int = 60,
    max_client_weight_factor: float | None = DEFAULT_MAX_CLIENT_WEIGHT_FACTOR,
    shared: RoundPass | None = None,
) -> AggregationResult:
    """Fed-NCL robust layer-wise aggregation with the noisy-client penalty (eq. 12-16).

    For every float tensor l: ``d_l^k = 1 + ||theta_G[l] - theta_k[l]||^2`` and
    ``w_l^k = (n_k / (m_k d_l^k)) / sum_k' (n_k' / (m_k' d_l^k'))``, where the penalty
    ``m_k = clip(tau * T / t_k, 1, tau)`` for a noisy client and 1 for a clean one. The penalty
    divides the weight (eq. 14 as printed would raise it; the text and the reference code
    penalise). ``T = round_index + 1``: ``round_index`` is 0-based like every round index in
    fedaudit, and eq. 14's T counts rounds from 1, so the first round already carries a
    penalty of ``max(1, tau / t_k)``.

    Parameters
    ----------
    global_state : StateReader
        theta_G, the model broadcast this round.
    updates : sequence of StateReader
        theta_k of each client.
    num_samples : array-like of shape (n_clients,)
        n_k, positive.
    noisy : array-like of bool of shape (n_clients,), or None
        The detector's flags; None (undetermined) falls back to FedAvg.
    round_index : int, default=0
        0-based index of the round being closed.
    tau : float, default=50.0
        Maximum penalty (>= 1).
    t_k : int, default=60
        Rounds to reach the maximum penalty (T_k = T_corr, Fed-NCL eq. 14), >= 1.
    max_client_weight_factor : float or None, default=4.0
        f >= 1: no client's weight exceeds min(1, f / K) in any float tensor's weights, hence
        in their mean either (:func:`cap_weights`); None: no cap.
    shared : RoundPass, optional
        The round's shared pass over these same states
        (:class:`~service.audit.blocks.RoundPass`): results it already computed are reused
        instead of reading the updates again.

    Returns
    -------
    AggregationResult
        Rule ``"fedncl_layerwise"``; ``layer_weights`` per float tensor; ``weights`` = their
        mean over float tensors (FedAvg weights if the state has no float tensor). Non-float
        tensors are copied from the client with the largest layer-independent factor
        ``n_k / m_k``. ``details``: ``penalty`` (m_k), ``T``, ``tau``, ``t_k``.

    Raises
    ------
    InvalidParameterError
        If ``round_index``, ``tau``, ``t_k`` or ``max_client_weight_factor`` is out of range.
    InvalidInputError
        If the states, counts or flags are malformed.
    """
    rnd = check_int("round_index", round_index, min_value=0)
    tau_f = check_float("tau", tau, min_value=1.0)
    t_k_i = check_int("t_k", t_k, min_value=1)
    factor = _check_factor(max_client_weight_factor)
    k = _check_updates(updates)
    _check_shared(shared, global_state, updates)
    n = _num_samples(num_samples, k)
    flags = _noisy_flags(noisy, k)
    if flags is None:
        return _fallback(
            global_state,
            updates,
            n,
            "fedncl_layerwise",
            "no noisy flags (detection undetermined)",
            factor=factor,
            shared=shared,
        )
    big_t = rnd + 1
    penalty_noisy = min(max(tau_f * big_t / t_k_i, 1.0), tau_f)
    penalty = np.where(flags, penalty_noisy, 1.0)
    base = n / penalty
    chosen = int(np.argmax(base))
    layer_weights: dict[str, list[float]] = {}
    uncapped: list[FloatArray] = []
    if shared is not None:
        float_names, squared = shared.squared()
    else:
        first = stream_pass(global_state, updates, distances=True)
        assert first.squared is not None
        float_names, squared = first.float_names, first.squared
    per_tensor: dict[str, FloatArray] = {}
    for name, row in zip(float_names, squared, strict=True):
        raw = _normalise(base / (1.0 + row), "num_samples")
        uncapped.append(raw)
        weights, _ = _cap(raw, factor)
        per_tensor[name] = weights
        layer_weights[name] = weights.tolist()
    if shared is not None:
        state = shared.layer_weighted(per_tensor, chosen)
    else:
        weighted = stream_pass(global_state, updates, layer_weights=per_tensor, chosen=chosen)
        assert weighted.state is not None
        state = weighted.state
    if layer_weights:
        mean_weights: FloatArray = np.mean(np.array(list(layer_weights.values())), axis=0)
        cap = _layer_cap_record(np.array(uncapped), np.array(list(layer_weights.values())), factor)
    else:
        mean_weights, cap = _cap(_fedavg_weights(n), factor)
    details = {"penalty": penalty.tolist(), "T": big_t, "tau": tau_f, "t_k": t_k_i}
    return _result(
        state,
        mean_weights,
        "fedncl_layerwise",
        "fedncl_layerwise",
        layer_weights=layer_weights,
        details=details,
        weight_cap=cap,
    )


def _layer_cap_record(
    before: FloatArray, after: FloatArray, factor: float | None
) -> dict[str, Any] | None:
    """The cap record of layer-wise weights (tensors x clients): per client capped in some
    tensor, its mean weight over tensors before and after, and in how many tensors."""
    if factor is None:
        return None
    k = int(before.shape[1])
    lowered = after < before
    record: dict[str, Any] = {
        "factor": factor,
        "cap": client_weight_cap(k, factor),
        "capped": [
            {
                "index": int(i),
                "before": float(before[:, i].mean()),
                "after": float(after[:, i].mean()),
                "layers": int(lowered[:, i].sum()),
            }
            for i in np.flatnonzero(lowered.any(axis=0))
        ],
    }
    return record


def aggregate_trimmed_mean(
    global_state: StateReader,
    updates: Sequence[StateReader],
    *,
    trim_fraction: float = 0.1,
    max_client_weight_factor: float | None = DEFAULT_MAX_CLIENT_WEIGHT_FACTOR,
) -> AggregationResult:
    """Coordinate-wise trimmed mean (Yin et al. 2018; the Fed-NCL baseline).

    Each coordinate: sort the K client values, drop ``floor(trim_fraction * K)`` from each end,
    average the rest (unweighted).

    The weight cap is moot here: sample counts are not used, every kept value counts equally,
    so a client weighs at most 1 / (K - 2 trim) in a coordinate and 1/K overall, and the cap
    min(1, f / K) with f >= 1 is never below 1/K. It is recorded (``weight_cap``, nothing
    capped) so every rule's result says which cap was in force.

    Parameters
    ----------
    global_state : StateReader
        theta_G (names, shapes, dtypes).
    updates : sequence of StateReader
        theta_k of each client.
    trim_fraction : float, default=0.1
        Fraction trimmed per side, in [0, 0.5).
    max_client_weight_factor : float or None, default=4.0
        f >= 1 (recorded only, see above); None: no cap recorded.

    Returns
    -------
    AggregationResult
        Rule ``"trimmed_mean"``; ``weights`` 1/K each (the kept clients differ per coordinate);
        ``details``: ``trimmed_per_side``, ``kept_per_coordinate``.

    Raises
    ------
    InvalidParameterError
        If ``trim_fraction`` or ``max_client_weight_factor`` is out of range.
    InvalidInputError
        If there is no update or a state does not match the global one.
    """
    fraction = check_float(
        "trim_fraction", trim_fraction, min_value=0.0, max_value=0.5, max_inclusive=False
    )
    factor = _check_factor(max_client_weight_factor)
    k = _check_updates(updates)
    trim = math.floor(fraction * k)
    state = coordinatewise(global_state, updates, trim)
    details = {
        "trim_fraction": fraction,
        "trimmed_per_side": trim,
        "kept_per_coordinate": k - 2 * trim,
        "weights_note": "weights are 1/K: which clients are kept differs per coordinate",
    }
    return _result(
        state,
        np.full(k, 1.0 / k),
        "trimmed_mean",
        "trimmed_mean",
        details=details,
        weight_cap=_moot_cap(k, factor, "trimmed_mean"),
    )


def aggregate_median(
    global_state: StateReader,
    updates: Sequence[StateReader],
    *,
    max_client_weight_factor: float | None = DEFAULT_MAX_CLIENT_WEIGHT_FACTOR,
) -> AggregationResult:
    """Coordinate-wise median (the mean of the two middle values for even K).

    The weight cap is moot here: sample counts are not used and every client's value counts
    once (weight 1/K, never above the cap min(1, f / K) with f >= 1); one client can move a
    coordinate's median only within the range of the other clients' values. The cap is
    recorded (``weight_cap``, nothing capped) so every rule's result says which cap was in
    force.

    Parameters
    ----------
    global_state : StateReader
        theta_G (names, shapes, dtypes).
    updates : sequence of StateReader
        theta_k of each client.
    max_client_weight_factor : float or None, default=4.0
        f >= 1 (recorded only, see above); None: no cap recorded.

    Returns
    -------
    AggregationResult
        Rule ``"median"``; ``weights`` 1/K each.

    Raises
    ------
    InvalidParameterError
        If ``max_client_weight_factor`` is below 1.
    InvalidInputError
        If there is no update or a state does not match the global one.
    """
    factor = _check_factor(max_client_weight_factor)
    k = _check_updates(updates)
    state = coordinatewise(global_state, updates, None)
    details = {"weights_note": "weights are 1/K: the median is not a weighted average"}
    return _result(
        state,
        np.full(k, 1.0 / k),
        "median",
        "median",
        details=details,
        weight_cap=_moot_cap(k, factor, "median"),
    )


def aggregate_reliability_weighted(
    global_state: StateReader,
    updates: Sequence[StateReader],
    num_samples: Any,
    noisy_probability: Any,
    *,
    max_client_weight_factor: float | None = DEFAULT_MAX_CLIENT_WEIGHT_FACTOR,
    shared: RoundPass | None = None,
) -> AggregationResult:
    """Weights proportional to n_k (1 - p_k), p_k = the primary detector's noisy probability.

    Parameters
    ----------
    global_state : StateReader
        theta_G (names, shapes, dtypes).
    updates : sequence of StateReader
        theta_k of each client.
    num_samples : array-like of shape (n_clients,)
        n_k, positive.
    noisy_probability : array-like of shape (n_clients,), or None
        p_k in [0, 1]; None (undetermined) falls back to FedAvg.
    max_client_weight_factor : float or None, default=4.0
        f >= 1: no client's weight exceeds min(1, f / K) (:func:`cap_weights`); a client with
        p_k = 1 keeps weight 0; None: no cap.
    shared : RoundPass, optional
        The round's shared pass over these same states
        (:class:`~service.audit.blocks.RoundPass`): results it already computed are reused
        instead of reading the updates again.

    Returns
    -------
    AggregationResult
        Rule ``"reliability_weighted"``; falls back to ``"fedavg"`` when ``noisy_probability``
        is None or every p_k is 1 (all weights 0).

    Raises
    ------
    InvalidParameterError
        If ``max_client_weight_factor`` is below 1.
    InvalidInputError
        If a probability is outside [0, 1] or the lengths differ.
    """
    factor = _check_factor(max_client_weight_factor)
    k = _check_updates(updates)
    _check_shared(shared, global_state, updates)
    n = _num_samples(num_samples, k)
    requested = "reliability_weighted"
    if noisy_probability is None:
        return _fallback(
            global_state,
            updates,
            n,
            requested,
            "no noisy probability (detection undetermined)",
            factor=factor,
            shared=shared,
        )
    p = as_float_array("noisy_probability", noisy_probability, ndim=1, min_value=0.0)
    if p.size != k:
        raise InvalidInputError(f"noisy_probability: length {p.size} differs from the {k} updates")
    if (p > 1.0).any():
        raise InvalidInputError("noisy_probability: values must be <= 1")
    raw = n * (1.0 - p)
    if float(raw.sum()) <= 0.0:
        return _fallback(
            global_state,
            updates,
            n,
            requested,
            "every client has noisy probability 1",
            factor=factor,
            shared=shared,
        )
    weights, cap = _cap(_normalise(raw, "noisy_probability"), factor)
    state = _weighted_state(global_state, updates, weights, shared)
    return _result(
        state,
        weights,
        requested,
        requested,
        details={"noisy_probability": p.tolist()},
        weight_cap=cap,
    )


_RULE_PARAMS: dict[str, frozenset[str]] = {
    "fedavg": frozenset(),
    "daagg": frozenset({"variant"}),
    "fedncl_layerwise": frozenset({"tau", "t_k"}),
    "trimmed_mean": frozenset({"trim_fraction"}),
    "median": frozenset(),
    "reliability_weighted": frozenset(),
}


def aggregate(
    rule: str,
    global_state: StateReader,
    updates: Sequence[StateReader],
    num_samples: Any,
    *,
    noisy: Any = None,
    noisy_probability: Any = None,
    params: Mapping[str, Any] | None = None,
    round_index: int = 0,
    max_client_weight_factor: float | None = DEFAULT_MAX_CLIENT_WEIGHT_FACTOR,
    shared: RoundPass | None = None,
) -> AggregationResult:
    """Apply the aggregation rule called ``rule``.

    Parameters
    ----------
    rule : str
        One of :data:`AGGREGATION_RULES`.
    global_state : StateReader
        theta_G, the model broadcast this round.
    updates : sequence of StateReader
        theta_k of each client.
    num_samples : array-like of shape (n_clients,)
        n_k, positive (validated for every rule).
    noisy : array-like of bool, optional
        Primary detector flags (``daagg``, ``fedncl_layerwise``); None = undetermined.
    noisy_probability : array-like of float, optional
        Primary detector probabilities (``reliability_weighted``); None = undetermined.
    params : mapping, optional
        Rule hyper-parameters: ``daagg``: ``variant``; ``fedncl_layerwise``: ``tau``, ``t_k``;
        ``trimmed_mean``: ``trim_fraction``. Unknown keys are rejected.
    round_index : int, default=0
        0-based index of the round (``fedncl_layerwise`` penalty schedule).
    max_client_weight_factor : float or None, default=4.0
        f >= 1: no client's weight exceeds min(1, f / K) (:func:`cap_weights`; moot for
        ``trimmed_mean`` and ``median``, whose weights are 1/K); None: no cap.
    shared : RoundPass, optional
        The round's shared pass over these same states
        (:class:`~service.audit.blocks.RoundPass`): the weighted rules reuse what it computed
        instead of reading the updates again.

    Returns
    -------
    AggregationResult
        See the rule functions.

    Raises
    ------
    InvalidParameterError
        If ``rule`` is unknown, ``params`` holds a key the rule does not take, or
        ``max_client_weight_factor`` is below 1.
    InvalidInputError
        If the states or arrays are malformed.
    """
    check_choice("rule", rule, AGGREGATION_RULES)
    options = dict(params or {})
    unknown = sorted(set(options) - _RULE_PARAMS[rule])
    if unknown:
        raise InvalidParameterError(f"params: {rule!r} takes no parameter {unknown[0]!r}")
    factor = _check_factor(max_client_weight_factor)
    k = _check_updates(updates)
    n = _num_samples(num_samples, k)
    if rule == "fedavg":
        return aggregate_fedavg(
            global_state, updates, n, max_client_weight_factor=factor, shared=shared
        )
    if rule == "daagg":
        return aggregate_daagg(
            global_state,
            updates,
            n,
            noisy,
            max_client_weight_factor=factor,
            shared=shared,
            **options,
        )
    if rule == "fedncl_layerwise":
        return aggregate_fedncl_layerwise(
            global_state,
            updates,
            n,
            noisy,
            round_index=round_index,
            max_client_weight_factor=factor,
            shared=shared,
            **options,
        )
    if rule == "trimmed_mean":
        return aggregate_trimmed_mean(
            global_state, updates, max_client_weight_factor=factor, **options
        )
    if rule == "median":
        return aggregate_median(global_state, updates, max_client_weight_factor=factor)
    return aggregate_reliability_weighted(
        global_state,
        updates,
        n,
        noisy_probability,
        max_client_weight_factor=factor,
        shared=shared,
    )


def with_fallback_context(result: AggregationResult, context: str) -> AggregationResult:
    """Return ``result`` with ``context`` prepended to its fallback reason (if any)."""
    if result.fallback_reason is None:
        return result
    return replace(result, fallback_reason=f"{context}: {result.fallback_reason}")
