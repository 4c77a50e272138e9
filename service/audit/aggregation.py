"""Aggregation rules: new global state plus the per-client weights actually used.

:func:`aggregate` applies a rule by name; the rules live one family per module in
:mod:`service.audit.aggregators`. The papers' rules (docs/algorithms.md, "Aggregation"):

* ``fedavg`` -- w_k = n_k / sum n (FedRN eq. 1, McMahan et al. 2017)
  (:mod:`~service.audit.aggregators.fedavg`).
* ``daagg`` -- FedNoRo distance-aware aggregation (Wu et al., IJCAI 2023, eq. 6-7)
  (:mod:`~service.audit.aggregators.daagg`).
* ``fedncl_layerwise`` -- Fed-NCL robust layer-wise aggregation with the noisy-client penalty
  (Tam et al., section V-B, eq. 12-16) (:mod:`~service.audit.aggregators.fedncl_layerwise`).
* ``trimmed_mean`` and ``median`` -- coordinate-wise robust baselines (Fed-NCL section VI)
  (:mod:`~service.audit.aggregators.robust`).
* ``reliability_weighted`` -- beyond the papers: w_k proportional to n_k (1 - p_k)
  (:mod:`~service.audit.aggregators.fedavg`).

What the rules share -- :class:`~service.audit.aggregators.common.AggregationResult`, the input
checks, the fall-back to FedAvg -- is in :mod:`~service.audit.aggregators.common`, the weight
cap in :mod:`~service.audit.aggregators.weight_cap`.

Streaming: every rule reads the updates through :func:`~service.audit.blocks.stream_pass`, in
parameter blocks (zero-copy from the coordinator's memory maps, pages released as the pass moves
on), so the process never holds K whole states nor K copies of one tensor. Float tensors are
combined in float32 blocks (float64 for float64 tensors) with float64 totals across blocks;
:mod:`service.audit.blocks` says where float64 is kept and why. Every other tensor (e.g.
``num_batches_tracked``) is copied from the client with the largest weight (ties: lowest index).
DaAgg and the layer-wise rule need two passes (distances, then the weighted sum); the other rules
read each update once.

Bounded influence: every rule takes ``max_client_weight_factor`` f (default 4, None = off) and no
client's normalised weight exceeds ``cap = min(1, f / K)`` for K participating clients
(water-filling, :mod:`~service.audit.aggregators.weight_cap`), so a site that overstates its
sample count gains at most the cap, whatever it claims.

A rule that cannot be applied as asked (for example DaAgg without any clean client) falls back
to FedAvg and says so in ``AggregationResult.fallback_reason``; it never raises for that.
Malformed states or arguments raise :class:`~service.audit._validation.InvalidInputError` /
:class:`~service.audit._validation.InvalidParameterError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from service.audit._validation import InvalidParameterError, check_choice
from service.audit.aggregators.common import AggregationResult, check_updates, num_samples_array
from service.audit.aggregators.daagg import aggregate_daagg
from service.audit.aggregators.fedavg import aggregate_fedavg, aggregate_reliability_weighted
from service.audit.aggregators.fedncl_layerwise import aggregate_fedncl_layerwise
from service.audit.aggregators.robust import aggregate_median, aggregate_trimmed_mean
from service.audit.aggregators.weight_cap import DEFAULT_MAX_CLIENT_WEIGHT_FACTOR, check_factor
from service.audit.blocks import RoundPass
from service.audit.state import StateReader

__all__ = ["AGGREGATION_RULES", "NOISY_SET_RULES", "aggregate", "with_fallback_context"]


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
    capping: dict[str, Any] = {"max_client_weight_factor": check_factor(max_client_weight_factor)}
    weighted = {**capping, "shared": shared}
    n = num_samples_array(num_samples, check_updates(updates))
    if rule == "fedavg":
        return aggregate_fedavg(global_state, updates, n, **weighted)
    if rule == "daagg":
        return aggregate_daagg(global_state, updates, n, noisy, **weighted, **options)
    if rule == "fedncl_layerwise":
        return aggregate_fedncl_layerwise(
            global_state, updates, n, noisy, round_index=round_index, **weighted, **options
        )
    if rule == "trimmed_mean":
        return aggregate_trimmed_mean(global_state, updates, **capping, **options)
    if rule == "median":
        return aggregate_median(global_state, updates, **capping)
    return aggregate_reliability_weighted(global_state, updates, n, noisy_probability, **weighted)


def with_fallback_context(result: AggregationResult, context: str) -> AggregationResult:
    """Return ``result`` with ``context`` prepended to its fallback reason (if any)."""
    if result.fallback_reason is None:
        return result
    return replace(result, fallback_reason=f"{context}: {result.fallback_reason}")
