"""The coordinate-wise robust baselines: trimmed mean (Yin et al. 2018) and median (Fed-NCL
section VI).

Neither is a weighted average: each coordinate sorts the K client values
(:func:`~service.audit.sorted_blocks.coordinatewise`), so the weight cap is moot and only
recorded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from service.audit._validation import check_float
from service.audit.aggregators.common import (
    AggregationResult,
    check_updates,
    result,
)
from service.audit.aggregators.weight_cap import (
    DEFAULT_MAX_CLIENT_WEIGHT_FACTOR,
    check_factor,
    moot_cap,
)
from service.audit.sorted_blocks import coordinatewise
from service.audit.state import StateReader

__all__ = ["aggregate_median", "aggregate_trimmed_mean"]


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
    factor = check_factor(max_client_weight_factor)
    k = check_updates(updates)
    trim = math.floor(fraction * k)
    state = coordinatewise(global_state, updates, trim)
    details = {
        "trim_fraction": fraction,
        "trimmed_per_side": trim,
        "kept_per_coordinate": k - 2 * trim,
        "weights_note": "weights are 1/K: which clients are kept differs per coordinate",
    }
    return result(
        state,
        np.full(k, 1.0 / k),
        "trimmed_mean",
        "trimmed_mean",
        details=details,
        weight_cap=moot_cap(k, factor, "trimmed_mean"),
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
    factor = check_factor(max_client_weight_factor)
    k = check_updates(updates)
    state = coordinatewise(global_state, updates, None)
    details = {"weights_note": "weights are 1/K: the median is not a weighted average"}
    return result(
        state,
        np.full(k, 1.0 / k),
        "median",
        "median",
        details=details,
        weight_cap=moot_cap(k, factor, "median"),
    )
