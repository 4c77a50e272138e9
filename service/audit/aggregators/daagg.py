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
from service.audit.round_pass import RoundPass
from service.audit.state import StateReader

__all__ = ["aggregate_daagg"]


_DAAGG_VARIANTS = ("paper", "reference")


def _pairwise_distances(
    global_state: StateReader,
    updates: Sequence[StateReader],
    noisy_idx: Sequence[int],
    clean_idx: Sequence[int],
    variant: str,
    shared: RoundPass | None,
    clean_n: FloatArray | None,
) -> tuple[FloatArray, dict[str, AnyArray] | None]:
    """Distances between each noisy and each clean client over float tensors, in one blocked
    pass: per block the Gram cross term of the differences to the global model (one matrix
    product) instead of one subtraction per pair (or from the shared pass's Gram matrices).
    Where that pass reads the updates and ``clean_n`` is given (the clean clients' shares of
    their samples, 0 for the others), it also computes their weighted mean:
    :func:`_noisy_completion` then reads only the noisy clients."""
    squared: FloatArray | None
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
        squared, clean_sum = first.pair_squared, first.state
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
) -> tuple[FloatArray, dict[str, AnyArray] | None]:
    """d(i): each noisy client's distance to its nearest clean one (0 for a clean client), and
    the clean clients' state weighted by their sample counts where the distances' pass made it;
    the nearest clean client and the distances are written to ``details``."""
    distances = np.zeros(len(updates))
    clean_sum = None
    if noisy_idx:
        clean_n = None  # a float16 model: its clean sum would not be used (float16 overflows)
        if not _has_float16(global_state):
            clean_n = n.copy()
            clean_n[noisy_idx] = 0.0
            clean_n /= clean_n.sum()  # a weighted mean: no larger than the states themselves
        pairwise, clean_sum = _pairwise_distances(
            global_state, updates, noisy_idx, clean_idx, variant, shared, clean_n
        )
        distances[noisy_idx] = pairwise.min(axis=1)
        nearest = [clean_idx[int(j)] for j in pairwise.argmin(axis=1)]
        details["nearest_clean"] = dict(zip([str(i) for i in noisy_idx], nearest, strict=True))
    else:
        details["note"] = "no noisy client: every d = 0, so the weights equal FedAvg's"
    details["distances"] = distances.tolist()
    return distances, clean_sum


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


def _noisy_completion(
    global_state: StateReader,
    updates: Sequence[StateReader],
    weights: FloatArray,
    n: FloatArray,
    noisy_idx: list[int],
    clean_sum: dict[str, AnyArray],
) -> dict[str, AnyArray] | None:
    """sum_k w_k theta_k from the clean clients' weighted mean (``clean_sum``, weights n / their
    total n) where their weights are still a multiple a of n (no cap changed their proportions):
    ``a * total * clean_sum + sum over noisy i of w_i theta_i``, a pass over the noisy clients
    only that completes ``clean_sum`` in place. None where it does not apply, or where the noisy
    clients' pass finds an error (the pass over every client then names the client as always).
    Its clean part is summed as differences to the global model, as the shared FedAvg pass
    does: rounding relative to the global model's values."""
    clean = np.ones(len(updates), dtype=bool)
    clean[noisy_idx] = False
    ratio = weights[clean] / n[clean]
    chosen = int(np.argmax(weights))  # whose non-float tensors every pass copies
    clean_chosen = int(np.argmax(np.where(clean, n, 0.0)))  # the clean mean's
    if ratio.max() - ratio.min() > 1e-12 * ratio.max() or (
        clean[chosen] and chosen != clean_chosen
    ):
        return None
    try:
        part = stream_pass(
            global_state,
            [updates[i] for i in noisy_idx],
            weights=weights[noisy_idx],
            chosen=noisy_idx.index(chosen) if chosen in noisy_idx else 0,
            base={name: v for name, v in clean_sum.items() if v.dtype.kind == "f"},
            base_scale=float(ratio.mean() * n[clean].sum()),
        ).state  # the float tensors are clean_sum's arrays, completed in place
    except InvalidInputError:
        return None
    assert part is not None
    # non-float tensors: the largest weight's, from the pass that read it
    return {name: part[name] if not clean[chosen] else v for name, v in clean_sum.items()}


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
    state = (
        None
        if clean_sum is None
        else _noisy_completion(global_state, updates, weights, n, noisy_idx, clean_sum)
    )
    clean_sum = None  # not held while the pass over every client makes its state
    if state is None:
        state = weighted_state(global_state, updates, weights, shared)
    return result(state, weights, "daagg", "daagg", details=details, weight_cap=cap)
