"""The sample-weighted averages: FedAvg and its reliability-weighted variant.

* ``fedavg`` -- w_k = n_k / sum n (FedRN eq. 1, McMahan et al. 2017);
* ``reliability_weighted`` -- beyond the papers: w_k proportional to n_k (1 - p_k), p_k the
  primary detector's noisy probability.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from service.audit._typing import FloatArray
from service.audit._validation import InvalidInputError, as_float_array
from service.audit.aggregators.common import (
    AggregationResult,
    check_shared,
    check_updates,
    fallback,
    fedavg_weights,
    num_samples_array,
    result,
    weighted_state,
)
from service.audit.aggregators.weight_cap import (
    DEFAULT_MAX_CLIENT_WEIGHT_FACTOR,
    apply_cap,
    check_factor,
    normalise,
)
from service.audit.round_pass import RoundPass
from service.audit.state import StateReader

__all__ = ["aggregate_fedavg", "aggregate_reliability_weighted", "planned_fedavg_weights"]


def planned_fedavg_weights(num_samples: Any, max_client_weight_factor: float | None) -> FloatArray:
    """The capped FedAvg weights :func:`aggregate_fedavg` will use (for a shared pass)."""
    n = num_samples_array(num_samples, len(np.atleast_1d(num_samples)))
    weights, _ = apply_cap(fedavg_weights(n), check_factor(max_client_weight_factor))
    return weights


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
    factor = check_factor(max_client_weight_factor)
    k = check_updates(updates)
    check_shared(shared, global_state, updates)
    weights, cap = apply_cap(fedavg_weights(num_samples_array(num_samples, k)), factor)
    state = weighted_state(global_state, updates, weights, shared)
    return result(state, weights, "fedavg", "fedavg", weight_cap=cap)


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
    factor = check_factor(max_client_weight_factor)
    k = check_updates(updates)
    check_shared(shared, global_state, updates)
    n = num_samples_array(num_samples, k)
    requested = "reliability_weighted"
    fall_back = partial(fallback, global_state, updates, n, requested, factor=factor, shared=shared)
    if noisy_probability is None:
        return fall_back("no noisy probability (detection undetermined)")
    p = as_float_array("noisy_probability", noisy_probability, ndim=1, min_value=0.0)
    if p.size != k:
        raise InvalidInputError(f"noisy_probability: length {p.size} differs from the {k} updates")
    if (p > 1.0).any():
        raise InvalidInputError("noisy_probability: values must be <= 1")
    raw = n * (1.0 - p)
    if float(raw.sum()) <= 0.0:
        return fall_back("every client has noisy probability 1")
    weights, cap = apply_cap(normalise(raw, "noisy_probability"), factor)
    state = weighted_state(global_state, updates, weights, shared)
    return result(
        state,
        weights,
        requested,
        requested,
        details={"noisy_probability": p.tolist()},
        weight_cap=cap,
    )
