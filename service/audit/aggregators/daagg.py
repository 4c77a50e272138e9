"""FedNoRo distance-aware aggregation, DaAgg (Wu et al., IJCAI 2023, eq. 6-7).

A noisy client's weight shrinks with its distance to the nearest clean client:
``w_i`` proportional to ``n_i * exp(-d(i) / max d)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from service.audit._typing import AnyArray, FloatArray
from service.audit._validation import InvalidInputError, check_choice
from service.audit.aggregators.common import (
    AggregationResult,
    check_shared,
    check_updates,
    fallback,
    noisy_flags,
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
from service.audit.block_source import FileStateReader
from service.audit.blocks import stream_pass
from service.audit.round_pass import CleanPart, NoisySplit, RoundPass
from service.audit.state import StateReader

__all__ = ["aggregate_daagg", "daagg_split"]


_DAAGG_VARIANTS = ("paper", "reference")


def _pairwise_distances(
    global_state: StateReader,
    updates: Sequence[StateReader],
    noisy_idx: Sequence[int],
    clean_idx: Sequence[int],
    variant: str,
    shared: RoundPass | None,
    clean_n: FloatArray | None,
) -> tuple[FloatArray, CleanPart | None]:
    """Distances between each noisy and each clean client over float tensors, in one blocked
    pass: per block the Gram cross term of the differences to the global model (one matrix
    product) instead of one subtraction per pair (or from the shared pass: its split or its Gram
    matrices). Where that pass reads the updates and ``clean_n`` is given (the clean clients'
    shares of their samples, 0 for the others), it also computes their weighted mean (the
    shared pass's split: the mean of the clients outside its rows): :func:`_completion` then
    reads only the clients outside that mean."""
    squared: FloatArray | None
    clean_sum: CleanPart | None
    if shared is not None:
        squared, clean_sum = shared.pair_squared(noisy_idx, clean_idx, clean_n)
    else:
        first = stream_pass(
            global_state,
            updates,
            pairs=(noisy_idx, clean_idx),
            weights=clean_n,
            chosen=0 if clean_n is None else int(np.argmax(clean_n)),
        )
        squared = first.pair_squared
        clean_sum = None
        if first.state is not None and clean_n is not None:
            clean_sum = CleanPart(first.state, clean_n)
    assert squared is not None
    if variant == "paper":
        result: FloatArray = np.sqrt(squared.sum(axis=0))
        return result, clean_sum
    per_tensor: FloatArray = np.sqrt(squared).sum(axis=0)
    return per_tensor, clean_sum


def _nearest_clean(
    global_state: StateReader,
    updates: Sequence[StateReader],
    noisy_idx: list[int],
    clean_idx: list[int],
    variant: str,
    shared: RoundPass | None,
    details: dict[str, Any],
    n: FloatArray,
) -> tuple[FloatArray, CleanPart | None]:
    """d(i): each noisy client's distance to its nearest clean one (0 for a clean client), and
    a weighted mean of clients where the distances' pass made one (:class:`CleanPart`); the
    nearest clean client and the distances are written to ``details``."""
    distances = np.zeros(len(updates))
    clean_sum = None
    if noisy_idx:
        left_out = np.zeros(len(updates), dtype=bool)
        left_out[noisy_idx] = True
        clean_n = _mean_weights(global_state, n, left_out)
        pairwise, clean_sum = _pairwise_distances(
            global_state, updates, noisy_idx, clean_idx, variant, shared, clean_n
        )
        distances[noisy_idx] = pairwise.min(axis=1)
        nearest = [clean_idx[int(j)] for j in pairwise.argmin(axis=1)]
        details["nearest_clean"] = dict(zip([str(i) for i in noisy_idx], nearest, strict=True))
    else:
        details["note"] = "no noisy client: every d = 0, so the weights equal FedAvg's"
        clean_sum = None if shared is None else shared.clean_part()
    details["distances"] = distances.tolist()
    return distances, clean_sum


def _mean_weights(global_state: StateReader, n: FloatArray, left_out: Any) -> FloatArray | None:
    """Weights of the mean of the clients not ``left_out``: their sample counts over their total
    (a mean is no larger than the states themselves); None for a float16 model, whose sums
    overflow (no mean is made for it)."""
    if _has_float16(global_state):
        return None
    weights = np.where(left_out, 0.0, n)
    weights /= weights.sum()
    result: FloatArray = weights
    return result


def _has_float16(global_state: StateReader) -> bool:
    """Whether the model has a float16 tensor (from the header where the reader has one)."""
    for name in global_state.keys():
        dtype = (
            global_state.layout(name)[0]
            if isinstance(global_state, FileStateReader)
            else np.asarray(global_state.get(name)).dtype
        )
        if dtype == np.float16:
            return True
    return False


def _completion(
    global_state: StateReader,
    updates: Sequence[StateReader],
    weights: FloatArray,
    part: CleanPart,
) -> dict[str, AnyArray] | None:
    """sum_k w_k theta_k from a mean of some clients (``part``, weights p summing to 1) where
    their final weights are still a multiple a of p (no cap changed their proportions):
    ``a * part.state + sum over the others of w_i theta_i``, a pass over the others only (the
    noisy clients, and the clean ones the split kept out of its mean) that completes the mean
    in place. None where it does not apply, or where that pass finds an error (the pass over
    every client then names the client as always). The mean is summed as differences to the
    global model, as the shared FedAvg pass does: rounding relative to the global model's
    values."""
    covered = part.weights > 0.0
    rest = [int(i) for i in np.flatnonzero(~covered)]
    ratio = weights[covered] / part.weights[covered]
    chosen = int(np.argmax(weights))  # whose non-float tensors every pass copies
    if ratio.max() - ratio.min() > 1e-12 * ratio.max() or (
        covered[chosen] and chosen != int(np.argmax(part.weights))
    ):
        return None
    floats = {name: v for name, v in part.state.items() if v.dtype.kind == "f"}
    if not rest:  # every client in the mean: the weights are a multiple of its own
        for value in floats.values():
            value *= value.dtype.type(ratio.mean())
        return part.state
    try:
        completed = stream_pass(
            global_state,
            [updates[i] for i in rest],
            weights=weights[rest],
            chosen=rest.index(chosen) if chosen in rest else 0,
            base=floats,
            base_scale=float(ratio.mean()),
        ).state  # the float tensors are the mean's arrays, completed in place
    except InvalidInputError:
        return None
    assert completed is not None
    # non-float tensors: the largest weight's, from the pass that read it
    return {name: completed[name] if not covered[chosen] else v for name, v in part.state.items()}


def daagg_split(
    global_state: StateReader, num_samples: Any, possible_noisy: Any
) -> NoisySplit | None:
    """DaAgg's plan for the round's shared pass (:class:`NoisySplit`), from the clients that
    may be noisy this round; None where that is not known (``possible_noisy`` None) or where
    more than half of the clients may be (the distances of every such client to every client
    would cost more than DaAgg's own pass over the noisy x clean pairs)."""
    if possible_noisy is None:
        return None
    maybe = np.asarray(possible_noisy, dtype=bool)
    n = np.asarray(num_samples, dtype=np.float64)
    if maybe.shape != n.shape or 2 * int(maybe.sum()) > len(n):
        return None
    rows = tuple(int(i) for i in np.flatnonzero(maybe))
    return NoisySplit(rows, _mean_weights(global_state, n, maybe))


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
    factor = check_factor(max_client_weight_factor)
    k = check_updates(updates)
    check_shared(shared, global_state, updates)
    n = num_samples_array(num_samples, k)
    flags = noisy_flags(noisy, k)
    fall_back = partial(fallback, global_state, updates, n, "daagg", factor=factor, shared=shared)
    if flags is None:
        return fall_back("no noisy flags (detection undetermined)")
    noisy_idx = [int(i) for i in np.flatnonzero(flags)]
    clean_idx = [int(i) for i in np.flatnonzero(~flags)]
    if not clean_idx:
        return fall_back("every client is flagged noisy: no clean client")
    details: dict[str, Any] = {"variant": variant, "noisy": flags.tolist()}
    distances, clean_sum = _nearest_clean(
        global_state, updates, noisy_idx, clean_idx, variant, shared, details, n
    )
    max_d = float(distances.max())
    if noisy_idx and max_d == 0.0:
        clean_sum = None  # not held while the fallback makes its state
        return fall_back(
            "max distance is 0 (noisy models equal clean ones), D = d / max d undefined", details
        )
    normalised = distances / max_d if max_d > 0.0 else distances
    details["normalised_distances"] = normalised.tolist()
    weights, cap = apply_cap(normalise(n * np.exp(-normalised), "num_samples"), factor)
    state = None if clean_sum is None else _completion(global_state, updates, weights, clean_sum)
    clean_sum = None  # not held while the pass over every client makes its state
    if state is None:
        state = weighted_state(global_state, updates, weights, shared)
    return result(state, weights, "daagg", "daagg", details=details, weight_cap=cap)
