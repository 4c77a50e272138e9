"""RoFL global class-centroid aggregation (RoFL eq. 11-12).

Yang et al., "Robust Federated Learning with Noisy Labels", eq. 11-12: the server combines
the clients' local class centroids f_k[c] into global ones,
``f_G[c] = sum_k s_k f_k[c] / sum_k s_k`` with ``s_k = max(cos(f_G_prev[c], f_k[c]), 0)``
(negative similarities count as 0, unlike the unofficial reference code). When every s_k of a
class is 0 the previous centroid is kept. The first round (no previous centroids) uses the
mean of the local centroids instead of the reference's random normals, which would make the
round-1 weights noise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from service.audit._typing import FloatArray
from service.audit._validation import InvalidInputError, as_bool_array, as_float_array

__all__ = ["aggregate_centroids"]


def aggregate_centroids(
    previous: Any,
    local: Any,
    present: Any = None,
) -> tuple[FloatArray, FloatArray]:
    """Aggregate local class centroids into global ones (RoFL eq. 11-12).

    Parameters
    ----------
    previous : array-like of shape (n_classes, dim), or None
        The global centroids of the previous round; None in the first round.
    local : array-like of shape (n_clients, n_classes, dim)
        Each client's local centroids.
    present : array-like of bool of shape (n_clients, n_classes), optional
        Whether the client holds the class; absent classes get weight 0. Default: all present.

    Returns
    -------
    new : ndarray of shape (n_classes, dim)
        The new global centroids.
    weights : ndarray of shape (n_clients, n_classes)
        Normalised weight of each client per class (each column sums to 1, or is all 0 where
        the previous centroid was kept or no client holds the class).

    Notes
    -----
    Without ``previous``: the mean over the clients holding the class. A class no client holds
    keeps its previous centroid, or gets a zero vector in the first round (all weights 0). A
    zero vector has cosine 0 with anything.

    Raises
    ------
    InvalidInputError
        If the shapes disagree, there is no client, or a value is not finite.
    """
    f_local = as_float_array("local", local, ndim=3)
    n_clients, n_classes, dim = f_local.shape
    if n_clients == 0:
        raise InvalidInputError("local: at least one client is needed")
    if present is None:
        mask = np.ones((n_clients, n_classes), dtype=bool)
    else:
        mask = as_bool_array("present", present, ndim=2)
        if mask.shape != (n_clients, n_classes):
            raise InvalidInputError(
                f"present: shape {mask.shape} differs from {(n_clients, n_classes)}"
            )
    if previous is None:
        raw = mask.astype(np.float64)
    else:
        f_prev = as_float_array("previous", previous, ndim=2)
        if f_prev.shape != (n_classes, dim):
            raise InvalidInputError(
                f"previous: shape {f_prev.shape} differs from {(n_classes, dim)}"
            )
        prev_norm = np.linalg.norm(f_prev, axis=1)
        local_norm = np.linalg.norm(f_local, axis=2)
        dots = np.einsum("cd,kcd->kc", f_prev, f_local)
        denom = prev_norm[None, :] * local_norm
        cosine = np.divide(dots, denom, out=np.zeros_like(dots), where=denom > 0.0)
        raw = np.where(mask, np.maximum(cosine, 0.0), 0.0)
    totals = raw.sum(axis=0)
    has_weight = totals > 0.0
    weights = np.divide(raw, totals[None, :], out=np.zeros_like(raw), where=has_weight[None, :])
    combined = np.einsum("kc,kcd->cd", weights, f_local)
    if previous is None:
        new = np.where(has_weight[:, None], combined, 0.0)
    else:
        new = np.where(has_weight[:, None], combined, f_prev)
    return new, weights
