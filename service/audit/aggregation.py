"""Aggregation rules: new global state plus the per-client weights actually used.

ALGORITHMS.md section 4:

* ``fedavg`` -- w_k = n_k / sum n (FedRN eq. 1, McMahan et al. 2017).
* ``daagg`` -- FedNoRo distance-aware aggregation (Wu et al., IJCAI 2023, eq. 6-7).
* ``fedncl_layerwise`` -- Fed-NCL robust layer-wise aggregation with the noisy-client penalty
  (Tam et al., section V-B, eq. 12-16).
* ``trimmed_mean`` and ``median`` -- coordinate-wise robust baselines (Fed-NCL section VI).
* ``reliability_weighted`` -- beyond the papers: w_k proportional to n_k (1 - p_k).

Streaming: every rule loops tensor by tensor over a
:class:`~service.audit.state.StateReader` per client, so at most K copies of one tensor (and
the output) are in memory, never K whole states. Float tensors are combined in float64 and
cast back to their dtype; every other tensor (e.g. ``num_batches_tracked``) is copied from the
client with the largest weight (ties: lowest index). DaAgg needs two passes (distances, then
the weighted sum); the other rules read each update once.

A rule that cannot be applied as asked (for example DaAgg without any clean client) falls back
to FedAvg and says so in ``AggregationResult.fallback_reason``; it never raises for that.
Malformed states or arguments raise :class:`~service.audit._validation.InvalidInputError` /
:class:`~service.audit._validation.InvalidParameterError`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
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
from service.audit.state import (
    StateReader,
    check_state_names,
    flat64,
    is_float_tensor,
    iter_client_tensors,
    read_global_tensor,
    read_tensor,
)

__all__ = [
    "AGGREGATION_RULES",
    "NOISY_SET_RULES",
    "AggregationResult",
    "aggregate",
    "aggregate_daagg",
    "aggregate_fedavg",
    "aggregate_fedncl_layerwise",
    "aggregate_median",
    "aggregate_reliability_weighted",
    "aggregate_trimmed_mean",
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
    """

    state: dict[str, AnyArray]
    weights: FloatArray
    layer_weights: dict[str, list[float]] | None
    rule: str
    requested_rule: str
    fallback_reason: str | None
    details: dict[str, Any] = field(default_factory=dict)

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
    global_state: StateReader, updates: Sequence[StateReader], weights: FloatArray
) -> dict[str, AnyArray]:
    """sum_k w_k theta_k per float tensor, reading one client tensor at a time."""
    names = check_state_names(global_state, updates)
    chosen = int(np.argmax(weights))
    state: dict[str, AnyArray] = {}
    for name in names:
        reference = read_global_tensor(global_state, name)
        if is_float_tensor(reference):
            acc = np.zeros(reference.shape, dtype=np.float64)
            for k, update in enumerate(updates):
                tensor = read_tensor(update, name, reference, f"updates[{k}]")
                acc += weights[k] * tensor.astype(np.float64, copy=False)
            state[name] = acc.astype(reference.dtype)
        else:
            for k, update in enumerate(updates):
                tensor = read_tensor(update, name, reference, f"updates[{k}]")
                if k == chosen:
                    state[name] = np.array(tensor, copy=True)
    return state


def _fedavg_weights(n: FloatArray) -> FloatArray:
    return _normalise(n, "num_samples")


def _result(
    state: dict[str, AnyArray],
    weights: FloatArray,
    rule: str,
    requested: str,
    *,
    fallback_reason: str | None = None,
    layer_weights: dict[str, list[float]] | None = None,
    details: dict[str, Any] | None = None,
) -> AggregationResult:
    return AggregationResult(
        state=state,
        weights=weights,
        layer_weights=layer_weights,
        rule=rule,
        requested_rule=requested,
        fallback_reason=fallback_reason,
        details={} if details is None else details,
    )


def _fallback(
    global_state: StateReader,
    updates: Sequence[StateReader],
    n: FloatArray,
    requested: str,
    reason: str,
    details: dict[str, Any] | None = None,
) -> AggregationResult:
    weights = _fedavg_weights(n)
    state = _weighted_state(global_state, updates, weights)
    return _result(state, weights, "fedavg", requested, fallback_reason=reason, details=details)


# --------------------------------------------------------------------------------------------
# Rules
# --------------------------------------------------------------------------------------------


def aggregate_fedavg(
    global_state: StateReader, updates: Sequence[StateReader], num_samples: Any
) -> AggregationResult:
    """FedAvg: w_k = n_k / sum n.

    Parameters
    ----------
    global_state : StateReader
        theta_G (defines names, shapes and dtypes; not averaged in).
    updates : sequence of StateReader
        theta_k of each client.
    num_samples : array-like of shape (n_clients,)
        n_k, positive.

    Returns
    -------
    AggregationResult
        Rule ``"fedavg"``.

    Raises
    ------
    InvalidInputError
        If there is no update, a state does not match the global one, or a count is not
        positive.
    """
    k = _check_updates(updates)
    weights = _fedavg_weights(_num_samples(num_samples, k))
    return _result(_weighted_state(global_state, updates, weights), weights, "fedavg", "fedavg")


_DAAGG_VARIANTS = ("paper", "reference")


SLICE_ENTRIES = 1 << 22
"""Float64 work arrays of the per-coordinate rules hold at most this many entries (32 MB):
a tensor is processed in slices of ``SLICE_ENTRIES // K`` coordinates."""


def _slices(size: int, n_rows: int) -> Iterator[slice]:
    step = max(1, SLICE_ENTRIES // max(n_rows, 1))
    for start in range(0, size, step):
        yield slice(start, min(start + step, size))


def _pairwise_distances(
    global_state: StateReader,
    updates: Sequence[StateReader],
    noisy_idx: Sequence[int],
    clean_idx: Sequence[int],
    variant: str,
) -> FloatArray:
    """Distances between each noisy and each clean client over float tensors, streamed.

    Per tensor, the K client copies are read once and compared slice by slice, so the float64
    work array never exceeds ``SLICE_ENTRIES`` entries whatever the model size.
    """
    clean = np.asarray(clean_idx, dtype=np.int64)
    squared_total = np.zeros((len(noisy_idx), clean.size))
    norm_total = np.zeros_like(squared_total)
    for _name, reference, tensors in iter_client_tensors(global_state, updates):
        if not is_float_tensor(reference):
            continue
        flats = [t.reshape(-1) for t in tensors]
        squared = np.zeros_like(squared_total)
        for part in _slices(reference.size, clean.size + 1):
            clean_stack = np.stack([flats[j][part].astype(np.float64) for j in clean])
            for row, i in enumerate(noisy_idx):
                diff = clean_stack - flats[i][part].astype(np.float64)
                squared[row] += np.einsum("cd,cd->c", diff, diff)
        squared_total += squared
        norm_total += np.sqrt(squared)
    if variant == "paper":
        result: FloatArray = np.sqrt(squared_total)
        return result
    return norm_total


def aggregate_daagg(
    global_state: StateReader,
    updates: Sequence[StateReader],
    num_samples: Any,
    noisy: Any,
    *,
    variant: str = "paper",
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
        If ``variant`` is unknown.
    InvalidInputError
        If the states, counts or flags are malformed.
    """
    check_choice("variant", variant, _DAAGG_VARIANTS)
    k = _check_updates(updates)
    n = _num_samples(num_samples, k)
    flags = _noisy_flags(noisy, k)
    if flags is None:
        return _fallback(
            global_state, updates, n, "daagg", "no noisy flags (detection undetermined)"
        )
    noisy_idx = [int(i) for i in np.flatnonzero(flags)]
    clean_idx = [int(i) for i in np.flatnonzero(~flags)]
    if not clean_idx:
        return _fallback(
            global_state, updates, n, "daagg", "every client is flagged noisy: no clean client"
        )
    distances = np.zeros(k)
    details: dict[str, Any] = {"variant": variant, "noisy": flags.tolist()}
    if noisy_idx:
        pairwise = _pairwise_distances(global_state, updates, noisy_idx, clean_idx, variant)
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
        )
    normalised = distances / max_d if max_d > 0.0 else distances
    details["normalised_distances"] = normalised.tolist()
    weights = _normalise(n * np.exp(-normalised), "num_samples")
    state = _weighted_state(global_state, updates, weights)
    return _result(state, weights, "daagg", "daagg", details=details)


def aggregate_fedncl_layerwise(
    global_state: StateReader,
    updates: Sequence[StateReader],
    num_samples: Any,
    noisy: Any,
    *,
    round_index: int = 0,
    tau: float = 50.0,
    t_k: int = 60,
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
        Rounds to reach the maximum penalty (T_k = T_corr in ALGORITHMS.md 4), >= 1.

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
        If ``round_index``, ``tau`` or ``t_k`` is out of range.
    InvalidInputError
        If the states, counts or flags are malformed.
    """
    rnd = check_int("round_index", round_index, min_value=0)
    tau_f = check_float("tau", tau, min_value=1.0)
    t_k_i = check_int("t_k", t_k, min_value=1)
    k = _check_updates(updates)
    n = _num_samples(num_samples, k)
    flags = _noisy_flags(noisy, k)
    if flags is None:
        return _fallback(
            global_state, updates, n, "fedncl_layerwise", "no noisy flags (detection undetermined)"
        )
    big_t = rnd + 1
    penalty_noisy = min(max(tau_f * big_t / t_k_i, 1.0), tau_f)
    penalty = np.where(flags, penalty_noisy, 1.0)
    base = n / penalty
    chosen = int(np.argmax(base))
    state: dict[str, AnyArray] = {}
    layer_weights: dict[str, list[float]] = {}
    for name, reference, tensors in iter_client_tensors(global_state, updates):
        if not is_float_tensor(reference):
            state[name] = np.array(tensors[chosen], copy=True)
            continue
        g = flat64(reference)
        dist = np.array([1.0 + float(np.sum((flat64(t) - g) ** 2)) for t in tensors])
        weights = _normalise(base / dist, "num_samples")
        acc = np.zeros(reference.shape, dtype=np.float64)
        for j, tensor in enumerate(tensors):
            acc += weights[j] * tensor.astype(np.float64, copy=False)
        state[name] = acc.astype(reference.dtype)
        layer_weights[name] = weights.tolist()
    if layer_weights:
        mean_weights: FloatArray = np.mean(np.array(list(layer_weights.values())), axis=0)
    else:
        mean_weights = _fedavg_weights(n)
    details = {"penalty": penalty.tolist(), "T": big_t, "tau": tau_f, "t_k": t_k_i}
    return _result(
        state,
        mean_weights,
        "fedncl_layerwise",
        "fedncl_layerwise",
        layer_weights=layer_weights,
        details=details,
    )


def _coordinatewise(
    global_state: StateReader,
    updates: Sequence[StateReader],
    trim: int | None,
) -> dict[str, AnyArray]:
    """Trimmed mean (``trim`` values cut per side) or median (``trim`` None), per coordinate.

    Each tensor is handled in slices of coordinates, so besides the K client copies of that
    tensor only a K x slice float64 array (at most ``SLICE_ENTRIES`` entries) is alive.
    """
    state: dict[str, AnyArray] = {}
    for name, reference, tensors in iter_client_tensors(global_state, updates):
        if not is_float_tensor(reference):
            # Uniform weights: the largest-weight tie goes to the lowest index.
            state[name] = np.array(tensors[0], copy=True)
            continue
        flats = [t.reshape(-1) for t in tensors]
        combined = np.empty(reference.size, dtype=np.float64)
        for part in _slices(reference.size, len(flats)):
            stack = np.stack([f[part].astype(np.float64) for f in flats])
            if trim is None:
                combined[part] = np.median(stack, axis=0)
            else:
                stack.sort(axis=0)
                combined[part] = stack[trim : stack.shape[0] - trim].mean(axis=0)
        state[name] = combined.reshape(reference.shape).astype(reference.dtype)
    return state


def aggregate_trimmed_mean(
    global_state: StateReader,
    updates: Sequence[StateReader],
    *,
    trim_fraction: float = 0.1,
) -> AggregationResult:
    """Coordinate-wise trimmed mean (Yin et al. 2018; the Fed-NCL baseline).

    Each coordinate: sort the K client values, drop ``floor(trim_fraction * K)`` from each end,
    average the rest (unweighted).

    Parameters
    ----------
    global_state : StateReader
        theta_G (names, shapes, dtypes).
    updates : sequence of StateReader
        theta_k of each client.
    trim_fraction : float, default=0.1
        Fraction trimmed per side, in [0, 0.5).

    Returns
    -------
    AggregationResult
        Rule ``"trimmed_mean"``; ``weights`` 1/K each (the kept clients differ per coordinate);
        ``details``: ``trimmed_per_side``, ``kept_per_coordinate``.

    Raises
    ------
    InvalidParameterError
        If ``trim_fraction`` is out of range.
    InvalidInputError
        If there is no update or a state does not match the global one.
    """
    fraction = check_float(
        "trim_fraction", trim_fraction, min_value=0.0, max_value=0.5, max_inclusive=False
    )
    k = _check_updates(updates)
    trim = math.floor(fraction * k)
    state = _coordinatewise(global_state, updates, trim)
    details = {
        "trim_fraction": fraction,
        "trimmed_per_side": trim,
        "kept_per_coordinate": k - 2 * trim,
        "weights_note": "weights are 1/K: which clients are kept differs per coordinate",
    }
    return _result(state, np.full(k, 1.0 / k), "trimmed_mean", "trimmed_mean", details=details)


def aggregate_median(
    global_state: StateReader, updates: Sequence[StateReader]
) -> AggregationResult:
    """Coordinate-wise median (the mean of the two middle values for even K).

    Returns
    -------
    AggregationResult
        Rule ``"median"``; ``weights`` 1/K each.

    Raises
    ------
    InvalidInputError
        If there is no update or a state does not match the global one.
    """
    k = _check_updates(updates)
    state = _coordinatewise(global_state, updates, None)
    details = {"weights_note": "weights are 1/K: the median is not a weighted average"}
    return _result(state, np.full(k, 1.0 / k), "median", "median", details=details)


def aggregate_reliability_weighted(
    global_state: StateReader,
    updates: Sequence[StateReader],
    num_samples: Any,
    noisy_probability: Any,
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

    Returns
    -------
    AggregationResult
        Rule ``"reliability_weighted"``; falls back to ``"fedavg"`` when ``noisy_probability``
        is None or every p_k is 1 (all weights 0).

    Raises
    ------
    InvalidInputError
        If a probability is outside [0, 1] or the lengths differ.
    """
    k = _check_updates(updates)
    n = _num_samples(num_samples, k)
    requested = "reliability_weighted"
    if noisy_probability is None:
        return _fallback(
            global_state, updates, n, requested, "no noisy probability (detection undetermined)"
        )
    p = as_float_array("noisy_probability", noisy_probability, ndim=1, min_value=0.0)
    if p.size != k:
        raise InvalidInputError(f"noisy_probability: length {p.size} differs from the {k} updates")
    if (p > 1.0).any():
        raise InvalidInputError("noisy_probability: values must be <= 1")
    raw = n * (1.0 - p)
    if float(raw.sum()) <= 0.0:
        return _fallback(
            global_state, updates, n, requested, "every client has noisy probability 1"
        )
    weights = _normalise(raw, "noisy_probability")
    state = _weighted_state(global_state, updates, weights)
    return _result(state, weights, requested, requested, details={"noisy_probability": p.tolist()})


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

    Returns
    -------
    AggregationResult
        See the rule functions.

    Raises
    ------
    InvalidParameterError
        If ``rule`` is unknown or ``params`` holds a key the rule does not take.
    InvalidInputError
        If the states or arrays are malformed.
    """
    check_choice("rule", rule, AGGREGATION_RULES)
    options = dict(params or {})
    unknown = sorted(set(options) - _RULE_PARAMS[rule])
    if unknown:
        raise InvalidParameterError(f"params: {rule!r} takes no parameter {unknown[0]!r}")
    k = _check_updates(updates)
    n = _num_samples(num_samples, k)
    if rule == "fedavg":
        return aggregate_fedavg(global_state, updates, n)
    if rule == "daagg":
        return aggregate_daagg(global_state, updates, n, noisy, **options)
    if rule == "fedncl_layerwise":
        return aggregate_fedncl_layerwise(
            global_state, updates, n, noisy, round_index=round_index, **options
        )
    if rule == "trimmed_mean":
        return aggregate_trimmed_mean(global_state, updates, **options)
    if rule == "median":
        return aggregate_median(global_state, updates)
    return aggregate_reliability_weighted(global_state, updates, n, noisy_probability)


def with_fallback_context(result: AggregationResult, context: str) -> AggregationResult:
    """Return ``result`` with ``context`` prepended to its fallback reason (if any)."""
    if result.fallback_reason is None:
        return result
    return replace(result, fallback_reason=f"{context}: {result.fallback_reason}")
