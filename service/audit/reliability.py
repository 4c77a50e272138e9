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

Exactness and memory. Cosines are accumulated one flattened coordinate at a time with
element-wise numpy operations, so every entry is computed by the same sequence of roundings
whatever the block of rows it is computed in (a BLAS matrix product does not promise that: its
blocking, and so its rounding, depends on the shape). With ``chunk_size=None`` all target rows
are scored at once (a T x K matrix, K x K for all targets); with an int the target rows are
processed ``chunk_size`` at a time against all candidates, never materialising more than
``chunk_size x K`` scores, and the results are bit-for-bit identical. The cost is O(T K P C)
either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from service.audit._json import to_jsonable
from service.audit._typing import BoolArray, FloatArray, IntArray
from service.audit._validation import (
    InvalidInputError,
    as_float_array,
    check_choice,
    check_float,
    check_int,
)

__all__ = [
    "NeighborSets",
    "k_reliable_neighbors",
    "probe_similarity",
    "reliability_scores",
]

_RANGE_EPS = 1e-12
_VARIANTS = ("softmax", "logit")


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

    # Exp is normalised over {c} and its candidates (FedRN eq. 4).
    if candidate_mask.any():
        cand_lo = float(acc[candidate_mask].min())
        cand_hi = float(acc[candidate_mask].max())
    else:
        cand_lo, cand_hi = np.inf, -np.inf
    exp_lo = np.minimum(cand_lo, acc[rows])
    exp_hi = np.maximum(cand_hi, acc[rows])
    exp_spread = exp_hi - exp_lo
    exp_flat = exp_spread <= _RANGE_EPS
    safe_spread = np.where(exp_flat, 1.0, exp_spread)
    exp_all = np.where(
        exp_flat[:, None], 1.0, (acc[None, :] - exp_lo[:, None]) / safe_spread[:, None]
    )
    exp_self = np.where(exp_flat, 1.0, (acc[rows] - exp_lo) / safe_spread)

    scores = alpha * exp_all + (1.0 - alpha) * sim_norm
    scores[~allowed] = -np.inf
    self_scores = alpha * exp_self + (1.0 - alpha)
    return _Block(scores=scores, self_scores=self_scores, allowed=allowed)


def _top_k(scores: FloatArray, allowed: BoolArray, k: int) -> IntArray:
    """Indices of the k largest allowed scores, by decreasing score then increasing index."""
    n_allowed = int(allowed.sum())
    kk = min(k, n_allowed)
    if kk == 0:
        return np.zeros(0, dtype=np.int64)
    if kk == n_allowed:
        selected = np.flatnonzero(allowed)
    else:
        kth = np.partition(scores, scores.size - kk)[scores.size - kk]
        above = np.flatnonzero(scores > kth)
        tied = np.flatnonzero(scores == kth)[: kk - above.size]
        selected = np.concatenate([above, tied])
    order = np.lexsort((selected, -scores[selected]))
    result: IntArray = selected[order].astype(np.int64)
    return result


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
    step = max(target_rows.size, 1) if chunk is None else chunk
    result = NeighborSets([], [], [], [], [], [])
    for start in range(0, target_rows.size, step):
        rows = target_rows[start : start + step]
        block = _score_block(unit_t, acc, candidate_mask, rows, a)
        for i, row in enumerate(rows):
            chosen = _top_k(block.scores[i], block.allowed[i], kk)
            raw = block.scores[i, chosen]
            self_raw = float(block.self_scores[i])
            # The total is > 0: R(c, c) >= 1 - alpha, and with alpha = 1 the best candidate
            # (or c itself) has Exp = 1, so no division by zero can occur.
            total = self_raw + float(raw.sum())
            result.targets.append(int(row))
            result.neighbors.append([int(j) for j in chosen])
            result.weights.append([float(v) / total for v in raw])
            result.self_weight.append(self_raw / total)
            result.scores.append([float(v) for v in raw])
            result.self_score.append(self_raw)
    return result
