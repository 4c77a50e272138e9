"""Fed-NCL robust layer-wise aggregation with the noisy-client penalty (Tam et al., section
V-B, eq. 12-16).

Per float tensor l, w_l^k is proportional to n_k / (m_k (1 + ||theta_G[l] - theta_k[l]||^2)),
with the penalty m_k growing over the rounds for a client flagged noisy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from service.audit._typing import AnyArray, FloatArray
from service.audit._validation import check_float, check_int
from service.audit.aggregators.common import (
    AggregationResult,
    check_shared,
    check_updates,
    fallback,
    fedavg_weights,
    noisy_flags,
    num_samples_array,
    result,
)
from service.audit.aggregators.weight_cap import (
    DEFAULT_MAX_CLIENT_WEIGHT_FACTOR,
    WeightCapRecord,
    apply_cap,
    check_factor,
    client_weight_cap,
    normalise,
)
from service.audit.blocks import stream_pass
from service.audit.round_pass import RoundPass
from service.audit.state import StateReader

__all__ = ["aggregate_fedncl_layerwise"]


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
    factor = check_factor(max_client_weight_factor)
    k = check_updates(updates)
    check_shared(shared, global_state, updates)
    n = num_samples_array(num_samples, k)
    flags = noisy_flags(noisy, k)
    rule = "fedncl_layerwise"
    if flags is None:
        reason = "no noisy flags (detection undetermined)"
        return fallback(global_state, updates, n, rule, reason, factor=factor, shared=shared)
    big_t = rnd + 1
    penalty_noisy = min(max(tau_f * big_t / t_k_i, 1.0), tau_f)
    penalty = np.where(flags, penalty_noisy, 1.0)
    base = n / penalty
    chosen = int(np.argmax(base))
    per_tensor, uncapped = _layer_weights(global_state, updates, base, factor, shared)
    layer_weights = {name: weights.tolist() for name, weights in per_tensor.items()}
    if shared is not None:
        state = shared.layer_weighted(per_tensor, chosen)
    else:
        state = _layer_weighted_state(global_state, updates, per_tensor, chosen)
    if layer_weights:
        mean_weights: FloatArray = np.mean(np.array(list(layer_weights.values())), axis=0)
        cap = _layer_cap_record(np.array(uncapped), np.array(list(layer_weights.values())), factor)
    else:
        mean_weights, cap = apply_cap(fedavg_weights(n), factor)
    details = {"penalty": penalty.tolist(), "T": big_t, "tau": tau_f, "t_k": t_k_i}
    return result(
        state,
        mean_weights,
        rule,
        rule,
        layer_weights=layer_weights,
        details=details,
        weight_cap=cap,
    )


def _layer_weighted_state(
    global_state: StateReader,
    updates: Sequence[StateReader],
    per_tensor: dict[str, FloatArray],
    chosen: int,
) -> dict[str, AnyArray]:
    """sum_k w_l^k theta_k[l] per float tensor l, in one blocked pass over the updates."""
    weighted = stream_pass(global_state, updates, layer_weights=per_tensor, chosen=chosen)
    assert weighted.state is not None
    return weighted.state


def _layer_weights(
    global_state: StateReader,
    updates: Sequence[StateReader],
    base: FloatArray,
    factor: float | None,
    shared: RoundPass | None,
) -> tuple[dict[str, FloatArray], list[FloatArray]]:
    """Eq. 12-13 per float tensor: the capped weights (by tensor name) and the uncapped ones,
    from one pass over the squared distances ``||theta_G[l] - theta_k[l]||^2``."""
    if shared is not None:
        float_names, squared = shared.squared()
    else:
        first = stream_pass(global_state, updates, distances=True)
        assert first.squared is not None
        float_names, squared = first.float_names, first.squared
    per_tensor: dict[str, FloatArray] = {}
    uncapped: list[FloatArray] = []
    for name, row in zip(float_names, squared, strict=True):
        raw = normalise(base / (1.0 + row), "num_samples")
        uncapped.append(raw)
        per_tensor[name], _ = apply_cap(raw, factor)
    return per_tensor, uncapped


def _layer_cap_record(
    before: FloatArray, after: FloatArray, factor: float | None
) -> WeightCapRecord | None:
    """The cap record of layer-wise weights (tensors x clients): per client capped in some
    tensor, its mean weight over tensors before and after, and in how many tensors."""
    if factor is None:
        return None
    k = int(before.shape[1])
    lowered = after < before
    record: WeightCapRecord = {
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
