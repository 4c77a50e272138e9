"""Aggregation rules: new global state plus the per-client weights actually used.

:func:`aggregate` applies a rule by name from the registry :data:`RULES` (how to call it, the
parameters it takes, whether it reads the noisy set); the rules live one family per module in
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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from service.audit._typing import FloatArray
from service.audit._validation import InvalidParameterError, check_choice
from service.audit.aggregators.common import AggregationResult, check_updates, num_samples_array
from service.audit.aggregators.daagg import aggregate_daagg
from service.audit.aggregators.fedavg import aggregate_fedavg, aggregate_reliability_weighted
from service.audit.aggregators.fedncl_layerwise import aggregate_fedncl_layerwise
from service.audit.aggregators.robust import aggregate_median, aggregate_trimmed_mean
from service.audit.aggregators.weight_cap import DEFAULT_MAX_CLIENT_WEIGHT_FACTOR, check_factor
from service.audit.round_pass import RoundPass
from service.audit.state import StateReader

__all__ = [
    "AGGREGATION_RULES",
    "NOISY_SET_RULES",
    "RULES",
    "Rule",
    "RuleCall",
    "aggregate",
    "with_fallback_context",
]


@dataclass(frozen=True)
class RuleCall:
    """What a rule is called with: the states, the checked sample counts, the primary
    detector's flags and probabilities, the rule's own parameters, the round, the cap and the
    round's shared pass (:func:`aggregate` documents each)."""

    global_state: StateReader
    updates: Sequence[StateReader]
    num_samples: FloatArray
    noisy: Any
    noisy_probability: Any
    options: dict[str, Any]
    round_index: int
    capping: dict[str, Any]
    shared: RoundPass | None


@dataclass(frozen=True)
class Rule:
    """One aggregation rule in the registry: how to run it, the parameters it takes, and
    whether it reads the primary detector's noisy set."""

    run: Callable[[RuleCall], AggregationResult]
    params: frozenset[str] = frozenset()
    reads_noisy_set: bool = False


RULES: dict[str, Rule] = {
    "fedavg": Rule(
        lambda c: aggregate_fedavg(
            c.global_state, c.updates, c.num_samples, **c.capping, shared=c.shared
        )
    ),
    "daagg": Rule(
        lambda c: aggregate_daagg(
            c.global_state,
            c.updates,
            c.num_samples,
            c.noisy,
            **c.capping,
            shared=c.shared,
            **c.options,
        ),
        params=frozenset({"variant"}),
        reads_noisy_set=True,
    ),
    "fedncl_layerwise": Rule(
        lambda c: aggregate_fedncl_layerwise(
            c.global_state,
            c.updates,
            c.num_samples,
            c.noisy,
            round_index=c.round_index,
            **c.capping,
            shared=c.shared,
            **c.options,
        ),
        params=frozenset({"tau", "t_k"}),
        reads_noisy_set=True,
    ),
    "trimmed_mean": Rule(
        lambda c: aggregate_trimmed_mean(c.global_state, c.updates, **c.capping, **c.options),
        params=frozenset({"trim_fraction"}),
    ),
    "median": Rule(lambda c: aggregate_median(c.global_state, c.updates, **c.capping)),
    "reliability_weighted": Rule(
        lambda c: aggregate_reliability_weighted(
            c.global_state,
            c.updates,
            c.num_samples,
            c.noisy_probability,
            **c.capping,
            shared=c.shared,
        )
    ),
}
"""The registry: a new rule is its module in :mod:`service.audit.aggregators`, one entry here,
its tests and its section in docs/algorithms.md."""

AGGREGATION_RULES = tuple(RULES)
"""Names accepted by :func:`aggregate`."""

NOISY_SET_RULES = tuple(name for name, rule in RULES.items() if rule.reads_noisy_set)
"""Rules that read the ``noisy`` flags (the others ignore them)."""


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
    spec = RULES[rule]
    options = dict(params or {})
    unknown = sorted(set(options) - spec.params)
    if unknown:
        raise InvalidParameterError(f"params: {rule!r} takes no parameter {unknown[0]!r}")
    capping: dict[str, Any] = {"max_client_weight_factor": check_factor(max_client_weight_factor)}
    n = num_samples_array(num_samples, check_updates(updates))
    call = RuleCall(
        global_state, updates, n, noisy, noisy_probability, options, round_index, capping, shared
    )
    return spec.run(call)


def with_fallback_context(result: AggregationResult, context: str) -> AggregationResult:
    """Return ``result`` with ``context`` prepended to its fallback reason (if any)."""
    if result.fallback_reason is None:
        return result
    return replace(result, fallback_reason=f"{context}: {result.fallback_reason}")
