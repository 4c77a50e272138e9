"""The k largest entries: of one row of scores (:func:`top_k`, ties by index) and of every row
of a block (:func:`largest_in_rows`), for FedRN's neighbor search
(:mod:`service.audit.reliability`)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from service.audit._typing import BoolArray, FloatArray, IntArray

__all__ = ["largest_in_rows", "top_k"]


def top_k(scores: FloatArray, allowed: BoolArray, k: int) -> IntArray:
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


_ARGMAX_TAKE = 4
"""Up to this many neighbors per row, :func:`largest_in_rows` takes repeated row maxima (a pass over
the row each) instead of a partial sort of every row."""


def largest_in_rows(values: NDArray[np.float32], take: int) -> IntArray:
    """(b, take) column indices of ``take`` largest entries of each row (any order; ties
    between equal values broken either way). ``values`` is left as it was.

    A row with fewer than ``take`` finite entries may get repeated columns in place of the
    missing ones (their value -inf): the neighbor search sets such a row's k-th score itself
    and searches it entry by entry, never reading these columns."""
    n_rows, n_cols = values.shape
    if take == 0:
        return np.zeros((n_rows, 0), dtype=np.int64)
    if take > _ARGMAX_TAKE or take >= n_cols:
        top: IntArray = np.argpartition(values, n_cols - take, axis=1)[:, n_cols - take :]
        return top
    rows = np.arange(n_rows)
    picked = np.empty((n_rows, take), dtype=np.int64)
    saved = np.empty((n_rows, take), dtype=values.dtype)
    for j in range(take):
        picked[:, j] = np.argmax(values, axis=1)
        saved[:, j] = values[rows, picked[:, j]]
        values[rows, picked[:, j]] = -np.inf
    for j in range(take - 1, -1, -1):  # restore (in reverse: each cell was taken once)
        values[rows, picked[:, j]] = saved[:, j]
    return picked
