"""FedRN reliability scores and k-reliable neighbor sets (FedRN section 4.1, eq. 4-7).

For a target client c and a candidate neighbor n (FedRN, Kim et al., CIKM 2022, section 4.1):

* ``Sim(c, n)`` = cosine of the two clients' flattened probe outputs (eq. 5: softmax; the
  reference code compares raw logits, ``variant="logit"``), min-max normalised over the
  candidate neighbors of c (c itself excluded); ``Sim(c, c) = 1``.
* ``Exp(n)`` = training accuracy min-max normalised over {c} and its candidates (eq. 4; when c
  is itself a candidate of the federation this is simply "over all candidates").
* ``R(c, n) = alpha * Exp(n) + (1 - alpha) * Sim(c, n)`` (eq. 3), ``R(c, c) = alpha * Exp(c) +
  (1 - alpha)``.
* The k-reliable neighbors are the k candidates with the largest R (ties: lower index), and
  ``R'(c, x) = R(c, x) / sum over {c} and the neighbors`` (eq. 7).

A min-max range of 1e-12 or less carries no information and normalises to all ones (so equal
inputs give equal, NaN-free scores).

Exactness and memory. :func:`reliability_scores` and :func:`probe_similarity` accumulate the
cosines one flattened coordinate at a time with element-wise numpy operations, so every entry is
computed by the same sequence of roundings. :func:`k_reliable_neighbors` ranks each block of
target rows by one float32 matrix product (fast, but its rounding depends on the block's shape)
and keeps, with a margin sixteen times its worst rounding error, only the entries that can be
a row's smallest or largest cosine or among its k best; those are recomputed in float64
element by element, and the choice is made on them. Where the sites' probes nearly agree, so
that more than ``DENSE_SHARE`` of a block lies within the margin, the block is scored densely
as :func:`reliability_scores` does (as slow as before the float32 pass, never wrong). Its
neighbors and R are therefore those of the full float64 matrix, bit for bit
(``tests/audit/test_reliability_search.py``), for any block.
With ``chunk_size=None`` all target rows are scored at once (a T x K matrix, K x K for all
targets); with an int the target rows are processed ``chunk_size`` at a time, never holding more
than a few ``chunk_size x K`` arrays, with the same result. The cost is O(T K P C) either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray
from typing_extensions import TypedDict

from service.audit._blas import one_blas_thread
from service.audit._json import to_jsonable
from service.audit._typing import BoolArray, FloatArray, IntArray
from service.audit._validation import (
    InvalidInputError,
    as_float_array,
    check_choice,
    check_float,
    check_int,
)
from service.audit.top_k import largest_in_rows, top_k

__all__ = [
    "NeighborSets",
    "NeighborWeight",
    "k_reliable_neighbors",
    "probe_similarity",
    "reliability_scores",
]

_RANGE_EPS = 1e-12
_EPS32 = float(np.finfo(np.float32).eps) / 2.0  # 2^-24, float32's unit roundoff
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_VARIANTS = ("softmax", "logit")


class NeighborWeight(TypedDict):
    """One of a client's reliable neighbors with its weight R'(c, n) (FedRN eq. 7), as the
    audit stores it and the next round's instructions and the reports hand it on."""

    client_id: str
    weight: float


@dataclass(frozen=True)
class NeighborSets:
    """k-reliable neighbors of each target client.

    Every list is aligned with ``targets`` (all clients in index order when no targets were
    given); client references are row indices of the ``probes`` array.

    Attributes
    ----------
    targets : list of int
        The target clients.
    neighbors : list of list of int
        ``neighbors[i]``: the neighbors of ``targets[i]``, by decreasing R (ties: lower index).
    weights : list of list of float
        ``R'(c, n)`` for those neighbors.
    self_weight : list of float
        ``R'(c, c)``.
    scores : list of list of float
        The raw ``R(c, n)`` of the neighbors.
    self_score : list of float
        The raw ``R(c, c)``.
    """

    targets: list[int]
    neighbors: list[list[int]]
    weights: list[list[float]]
    self_weight: list[float]
    scores: list[list[float]]
    self_score: list[float]

    def to_json(self) -> dict[str, Any]:
        """Return the neighbor sets as plain JSON values."""
        return cast(dict[str, Any], to_jsonable(self.__dict__))


def _validated_probes(probes: Any, variant: str) -> FloatArray:
    check_choice("variant", variant, _VARIANTS)
    array = as_float_array("probes", probes, ndim=3)
    if variant == "softmax" and array.size > 0:
        if (array < 0.0).any() or (array > 1.0 + 1e-6).any():
            raise InvalidInputError("probes: softmax outputs must lie in [0, 1]")
        if (np.abs(array.sum(axis=2) - 1.0) > 1e-2).any():
            raise InvalidInputError("probes: each softmax output must sum to 1")
    return array


def _validated_accuracy(train_accuracy: Any, n_clients: int) -> FloatArray:
    acc = as_float_array("train_accuracy", train_accuracy, ndim=1, min_value=0.0)
    if (acc > 1.0).any():
        raise InvalidInputError("train_accuracy: values must be <= 1")
    if acc.size != n_clients:
        raise InvalidInputError(
            f"train_accuracy: length {acc.size} differs from the {n_clients} probe rows"
        )
    return acc


def _unit_columns(probes: FloatArray) -> FloatArray:
    """Return the flattened probes as unit vectors, stored column-major (D x K).

    A zero vector stays zero (its cosine with anything is 0).
    """
    flat = probes.reshape(probes.shape[0], -1)
    norms = np.sqrt(np.einsum("kd,kd->k", flat, flat))
    safe = np.where(norms > 0.0, norms, 1.0)
    return np.ascontiguousarray((flat / safe[:, None]).T)


def _cosine_rows(unit_t: FloatArray, rows: IntArray) -> FloatArray:
    """Cosines of ``rows`` against every client, accumulated coordinate by coordinate.

    Each entry is ``((u_r0 * v_0) + u_r1 * v_1) + ...`` rounded step by step, independent of
    which other rows share the block (see the module docstring).
    """
    n_dims, n_clients = unit_t.shape
    out = np.zeros((rows.size, n_clients))
    tmp = np.empty_like(out)
    for d in range(n_dims):
        np.multiply(unit_t[d, rows][:, None], unit_t[d][None, :], out=tmp)
        out += tmp
    result: FloatArray = np.clip(out, -1.0, 1.0, out=out)
    return result


def _min_max(values: FloatArray, lo: FloatArray, spread: FloatArray, flat: BoolArray) -> FloatArray:
    """``(values - lo) / spread``, 1 where the range is ``flat`` (min-max normalisation, FedRN
    eq. 4-5; arguments broadcast together)."""
    result: FloatArray = np.where(flat, 1.0, (values - lo) / np.where(flat, 1.0, spread))
    return result


def _expertise_range(
    acc: FloatArray, candidate_mask: BoolArray, rows: IntArray
) -> tuple[FloatArray, FloatArray, BoolArray]:
    """Per target row: the minimum, the range and whether the range is flat of the accuracies
    of {c} and its candidates (Exp's min-max normalisation, FedRN eq. 4)."""
    if candidate_mask.any():
        cand_lo = float(acc[candidate_mask].min())
        cand_hi = float(acc[candidate_mask].max())
    else:
        cand_lo, cand_hi = np.inf, -np.inf
    exp_lo = np.minimum(cand_lo, acc[rows])
    exp_spread = np.maximum(cand_hi, acc[rows]) - exp_lo
    return exp_lo, exp_spread, exp_spread <= _RANGE_EPS


@dataclass(frozen=True)
class _Block:
    scores: FloatArray  # (b, K) R(c, n), -inf where n is not a candidate of c
    self_scores: FloatArray  # (b,) R(c, c)
    allowed: BoolArray  # (b, K)


def _score_block(
    unit_t: FloatArray,
    acc: FloatArray,
    candidate_mask: BoolArray,
    rows: IntArray,
    alpha: float,
) -> _Block:
    n_rows = rows.size
    sim = _cosine_rows(unit_t, rows)
    allowed = np.repeat(candidate_mask[None, :], n_rows, axis=0)
    allowed[np.arange(n_rows), rows] = False
    has_any = allowed.any(axis=1)

    sim_lo = np.where(allowed, sim, np.inf).min(axis=1, initial=np.inf)
    sim_hi = np.where(allowed, sim, -np.inf).max(axis=1, initial=-np.inf)
    sim_spread = np.where(has_any, sim_hi - np.where(has_any, sim_lo, 0.0), 0.0)
    sim_flat = sim_spread <= _RANGE_EPS
    sim_norm = np.where(
        sim_flat[:, None],
        1.0,
        (sim - np.where(has_any, sim_lo, 0.0)[:, None])
        / np.where(sim_flat, 1.0, sim_spread)[:, None],
    )

    exp_lo, exp_spread, exp_flat = _expertise_range(acc, candidate_mask, rows)
    exp_all = _min_max(acc[None, :], exp_lo[:, None], exp_spread[:, None], exp_flat[:, None])
    exp_self = _min_max(acc[rows], exp_lo, exp_spread, exp_flat)

    scores = alpha * exp_all + (1.0 - alpha) * sim_norm
    scores[~allowed] = -np.inf
    self_scores = alpha * exp_self + (1.0 - alpha)
    return _Block(scores=scores, self_scores=self_scores, allowed=allowed)


def _pair_cosines(unit_t: FloatArray, rows: IntArray, cols: IntArray) -> FloatArray:
    """The cosines of the pairs (rows[i], cols[i]), by the same sequence of roundings as
    :func:`_cosine_rows` gives each entry."""
    out = np.zeros(rows.size)
    left, right = unit_t[:, rows], unit_t[:, cols]  # gathered once, summed d by d as before
    for d in range(unit_t.shape[0]):
        out += left[d] * right[d]
    result: FloatArray = np.clip(out, -1.0, 1.0, out=out)
    return result


def _pool(
    values: NDArray[np.floating[Any]],
    picked: IntArray,
    bound: FloatArray,
    margin: FloatArray,
    *,
    low: bool,
) -> tuple[IntArray, IntArray]:
    """(row, column) of every entry within ``margin`` of its row's ``bound`` (at or below
    ``bound + margin`` when ``low``, at or above ``bound - margin`` otherwise; disallowed
    entries hold +-inf and never qualify). ``picked`` (b, m) are entries known to qualify; a
    row with exactly m qualifying entries is taken from it, the others are searched."""
    edge = (bound + margin if low else bound - margin).astype(values.dtype)[:, None]
    near = values <= edge if low else values >= edge
    counts = np.count_nonzero(near, axis=1)
    plain = counts == picked.shape[1]
    r = np.repeat(np.flatnonzero(plain), picked.shape[1])
    c = picked[plain].ravel()
    if not plain.all():
        extra_r, extra_c = np.nonzero(near[~plain])
        r = np.concatenate([r, np.flatnonzero(~plain)[extra_r]])
        c = np.concatenate([c, extra_c])
    return r.astype(np.int64), c.astype(np.int64)


def _exact_extremes(
    unit_t: FloatArray,
    rows: IntArray,
    low: tuple[IntArray, IntArray],
    high: tuple[IntArray, IntArray],
) -> tuple[FloatArray, FloatArray]:
    """Per block row the smallest exact cosine among its ``low`` pairs and the largest among
    its ``high`` pairs (one pass over both)."""
    r = np.concatenate([low[0], high[0]])
    exact = _pair_cosines(unit_t, rows[r], np.concatenate([low[1], high[1]]))
    lo, hi = np.full(rows.size, np.inf), np.full(rows.size, -np.inf)
    np.minimum.at(lo, low[0], exact[: low[0].size])
    np.maximum.at(hi, high[0], exact[low[0].size :])
    return lo, hi


def _dense_block(
    unit_t: FloatArray,
    acc: FloatArray,
    candidate_mask: BoolArray,
    rows: IntArray,
    alpha: float,
    k: int,
) -> list[tuple[IntArray, FloatArray, float]]:
    """The block scored entry by entry in float64 (:func:`_score_block`, as
    :func:`reliability_scores`): for rows whose cosines nearly agree, where the float32 pass
    would leave most entries within its margin."""
    block = _score_block(unit_t, acc, candidate_mask, rows, alpha)
    out = []
    for i in range(rows.size):
        chosen = top_k(block.scores[i], block.allowed[i], k)
        out.append((chosen, block.scores[i, chosen], float(block.self_scores[i])))
    return out


DENSE_SHARE = 0.05
"""A block goes dense (:func:`_dense_block`) when the entries within the float32 pass's margin
exceed this share of it: picking and recomputing them one by one would cost more."""


def _neighbors_of_block(
    unit_t: FloatArray,
    unit32: NDArray[np.float32],
    unit_margin: float,
    acc: FloatArray,
    candidate_mask: BoolArray,
    rows: IntArray,
    alpha: float,
    k: int,
) -> list[tuple[IntArray, FloatArray, float]]:
    """Per target row of the block: (neighbors, their R, R(c, c)).

    The cosines of the block come from one float32 matrix product of ``unit32`` (the unit
    vectors rounded to float32): off by at most about (D + 2) * 2^-24 for D probe values, by an
    amount that may also depend on the block's shape. They only pick, with a margin sixteen
    times that bound, the few entries that can be a row's smallest or largest cosine or among
    its k largest R. Those entries' cosines and R are then computed in float64 exactly as
    :func:`reliability_scores` computes them, and the choice among them is made on the exact
    values (ties: lower index): the result does not depend on the blocks or on the float32
    pass.
    """
    n_rows, n_clients = rows.size, acc.size
    at_self = (np.arange(n_rows), rows)
    outside = np.flatnonzero(~candidate_mask)
    n_allowed = int(candidate_mask.sum()) - candidate_mask[rows].astype(np.int64)
    has_any = n_allowed > 0
    # (b, K) in float32, clipped as the exact cosines are (so that entries the clip makes equal
    # are equal here too and the exact values break their ties)
    sim = unit32[:, rows].T @ unit32
    np.clip(sim, -1.0, 1.0, out=sim)
    margin = np.full(n_rows, unit_margin)
    pools = []
    for low, fill in ((True, np.inf), (False, -np.inf)):
        sim[at_self] = fill
        sim[:, outside] = fill
        best = (np.argmin if low else np.argmax)(sim, axis=1)
        value = np.where(has_any, sim[np.arange(n_rows), best], np.nan)  # NaN: none qualifies
        pools.append(_pool(sim, best[:, None], value, margin, low=low))
        if pools[-1][0].size > DENSE_SHARE * sim.size:
            return _dense_block(unit_t, acc, candidate_mask, rows, alpha, k)
    sim_lo, sim_hi = _exact_extremes(unit_t, rows, pools[0], pools[1])
    sim_spread = np.where(has_any, sim_hi - np.where(has_any, sim_lo, 0.0), 0.0)
    sim_flat = sim_spread <= _RANGE_EPS
    exp_lo, exp_spread, exp_flat = _expertise_range(acc, candidate_mask, rows)
    # The ranking key a_c * acc_n + b_c * cos(c, n): R(c, n) up to a constant per row.
    a = np.where(exp_flat, 0.0, alpha / np.where(exp_flat, 1.0, exp_spread))
    b = np.where(sim_flat, 0.0, (1.0 - alpha) / np.where(sim_flat, 1.0, sim_spread))
    key = sim
    key[at_self] = 0.0
    key[:, outside] = 0.0
    key *= b[:, None]
    key += a.astype(np.float32)[:, None] * acc.astype(np.float32)[None, :]
    key[at_self] = -np.inf
    key[:, outside] = -np.inf
    take = min(k, n_clients)
    top = largest_in_rows(key, take)
    kth = key[np.arange(n_rows)[:, None], top].min(axis=1)
    kth[n_allowed <= k] = -_FLOAT32_MAX  # every allowed candidate is a neighbor
    pool_r, pool_c = _pool(key, top, kth, unit_margin * (1.0 + a + b), low=False)
    if pool_r.size > DENSE_SHARE * key.size + n_rows * k:
        return _dense_block(unit_t, acc, candidate_mask, rows, alpha, k)

    exact = _pair_cosines(unit_t, rows[pool_r], pool_c)
    sim_norm = _min_max(exact, sim_lo[pool_r], sim_spread[pool_r], sim_flat[pool_r])
    exp_n = _min_max(acc[pool_c], exp_lo[pool_r], exp_spread[pool_r], exp_flat[pool_r])
    r_pool = alpha * exp_n + (1.0 - alpha) * sim_norm
    order = np.lexsort((pool_c, -r_pool, pool_r))
    self_scores = alpha * _min_max(acc[rows], exp_lo, exp_spread, exp_flat) + (1.0 - alpha)
    starts = np.searchsorted(pool_r[order], np.arange(n_rows + 1))
    return [
        (
            pool_c[order[starts[i] : starts[i + 1]][:k]],
            r_pool[order[starts[i] : starts[i + 1]][:k]],
            float(self_scores[i]),
        )
        for i in range(n_rows)
    ]


def probe_similarity(probes: Any, variant: str = "softmax") -> FloatArray:
    """Cosine similarity of every pair of clients' flattened probe outputs (FedRN eq. 5).

    Parameters
    ----------
    probes : array-like of shape (n_clients, n_probe_inputs, n_classes)
        Each client's outputs on the shared probe: probabilities for ``"softmax"`` (each row
        in [0, 1] summing to 1), raw logits for ``"logit"`` (any finite values).
    variant : {"softmax", "logit"}, default="softmax"
        What the probes hold; both are compared with the same cosine.

    Returns
    -------
    ndarray of shape (n_clients, n_clients)
        Symmetric, in [-1, 1], diagonal 1 (``Sim(c, c) = 1`` by definition). A zero vector has
        cosine 0 with every other client.

    Raises
    ------
    InvalidParameterError
        If ``variant`` is unknown.
    InvalidInputError
        If ``probes`` is not 3-D and finite, or a softmax row is not a distribution.
    """
    array = _validated_probes(probes, variant)
    unit_t = _unit_columns(array)
    sim = _cosine_rows(unit_t, np.arange(array.shape[0], dtype=np.int64))
    np.fill_diagonal(sim, 1.0)
    return sim


def _validated_indices(name: str, values: Sequence[int] | None, n_clients: int) -> IntArray | None:
    if values is None:
        return None
    checked = [
        check_int(f"{name}[{i}]", v, min_value=0, max_value=n_clients - 1)
        for i, v in enumerate(values)
    ]
    return np.asarray(checked, dtype=np.int64)


def reliability_scores(
    probes: Any,
    train_accuracy: Any,
    alpha: float = 0.6,
    *,
    variant: str = "softmax",
) -> FloatArray:
    """FedRN reliability scores R(c, n) of every pair of clients (exact, builds K x K).

    Parameters
    ----------
    probes : array-like of shape (n_clients, n_probe_inputs, n_classes)
        See :func:`probe_similarity`.
    train_accuracy : array-like of shape (n_clients,)
        Each client's training accuracy on its own labels, in [0, 1].
    alpha : float, default=0.6
        Weight of expertise against similarity, in [0, 1].
    variant : {"softmax", "logit"}, default="softmax"
        What the probes hold.

    Returns
    -------
    ndarray of shape (n_clients, n_clients)
        Row c holds R(c, n) for every other client n (every other client is a candidate) and
        R(c, c) on the diagonal.

    Raises
    ------
    InvalidParameterError
        If ``alpha`` or ``variant`` is invalid.
    InvalidInputError
        If the arrays are malformed or their lengths differ.
    """
    a = check_float("alpha", alpha, min_value=0.0, max_value=1.0)
    array = _validated_probes(probes, variant)
    acc = _validated_accuracy(train_accuracy, array.shape[0])
    n_clients = acc.size
    rows = np.arange(n_clients, dtype=np.int64)
    block = _score_block(_unit_columns(array), acc, np.ones(n_clients, dtype=bool), rows, a)
    scores = block.scores
    scores[rows, rows] = block.self_scores
    return scores


def k_reliable_neighbors(
    probes: Any,
    train_accuracy: Any,
    k: int = 2,
    alpha: float = 0.6,
    *,
    targets: Sequence[int] | None = None,
    candidates: Sequence[int] | None = None,
    chunk_size: int | None = None,
    variant: str = "softmax",
) -> NeighborSets:
    """FedRN k-reliable neighbors of each target client with ensemble weights R'.

    Parameters
    ----------
    probes : array-like of shape (n_clients, n_probe_inputs, n_classes)
        Probe outputs of every client involved (targets and candidates); see
        :func:`probe_similarity`.
    train_accuracy : array-like of shape (n_clients,)
        Training accuracy of each client, in [0, 1].
    k : int, default=2
        Number of neighbors (>= 1). With fewer candidates, all of them are neighbors.
    alpha : float, default=0.6
        Weight of expertise against similarity, in [0, 1].
    targets : sequence of int, optional
        Rows to find neighbors for; default every row.
    candidates : sequence of int, optional
        Rows that may be neighbors (clients whose latest model is stored); default every row.
        A target is never its own neighbor.
    chunk_size : int, optional
        None: score all targets at once (T x K memory). An int: score ``chunk_size`` targets
        at a time (``chunk_size x K`` memory); the result is identical.
    variant : {"softmax", "logit"}, default="softmax"
        What the probes hold.

    Returns
    -------
    NeighborSets
        Per target: neighbors, R' weights, self weight, raw R values. With one client only
        (or no candidate besides the target) the target has no neighbor and self weight 1.

    Raises
    ------
    InvalidParameterError
        If ``k``, ``alpha``, ``chunk_size``, ``variant`` or an index is invalid.
    InvalidInputError
        If the arrays are malformed or their lengths differ.
    """
    kk = check_int("k", k, min_value=1)
    a = check_float("alpha", alpha, min_value=0.0, max_value=1.0)
    chunk = None if chunk_size is None else check_int("chunk_size", chunk_size, min_value=1)
    array = _validated_probes(probes, variant)
    acc = _validated_accuracy(train_accuracy, array.shape[0])
    n_clients = acc.size
    target_rows = _validated_indices("targets", targets, n_clients)
    if target_rows is None:
        target_rows = np.arange(n_clients, dtype=np.int64)
    candidate_rows = _validated_indices("candidates", candidates, n_clients)
    candidate_mask = np.ones(n_clients, dtype=bool)
    if candidate_rows is not None:
        candidate_mask[:] = False
        candidate_mask[candidate_rows] = True

    unit_t = _unit_columns(array)
    unit32 = unit_t.astype(np.float32)
    # The float32 products' worst rounding, times sixteen: (D + 2) 2^-24 times the largest
    # |u_c| |u_n| (1 for unit vectors; more where tiny probes' norms were rounded in subnormals).
    scale = max(1.0, float(np.square(unit_t).sum(axis=0).max(initial=0.0)))
    unit_margin = 16.0 * (unit_t.shape[0] + 2) * _EPS32 * scale
    step = max(target_rows.size, 1) if chunk is None else chunk
    result = NeighborSets([], [], [], [], [], [])
    blocks = []
    with one_blas_thread():
        for start in range(0, target_rows.size, step):
            rows = target_rows[start : start + step]
            blocks.append(
                _neighbors_of_block(unit_t, unit32, unit_margin, acc, candidate_mask, rows, a, kk)
            )
    for row, (chosen, raw, self_raw) in zip(
        target_rows, (entry for block in blocks for entry in block), strict=True
    ):
        # The total is > 0: R(c, c) >= 1 - alpha, and with alpha = 1 the best candidate
        # (or c itself) has Exp = 1, so no division by zero can occur.
        scores = raw.tolist()
        # numpy sums fewer than 8 values one after the other, as sum() does (and faster
        # on a few values); from 8 on it keeps 8 partial sums, so it sums those itself.
        total = self_raw + (sum(scores) if len(scores) < 8 else float(raw.sum()))
        result.targets.append(int(row))
        result.neighbors.append(chosen.tolist())
        result.weights.append([v / total for v in scores])
        result.self_weight.append(self_raw / total)
        result.scores.append(scores)
        result.self_score.append(self_raw)
    return result
