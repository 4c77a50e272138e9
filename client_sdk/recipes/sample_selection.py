"""The per-sample-loss Gaussian mixture of FedRN's sample selection (FedRN section 4.2, eq. 6).

:func:`per_sample_loss_gmm` fits a 2-component mixture to the per-sample losses, with the fit
settings of the authors' code (tol 1e-2, reg_covar 5e-4) and ``random_state`` from ``ctx.seed``;
the clean probability is the posterior of the lower-mean component (:class:`GmmSelection`).
:func:`selection_metrics` scores a selection against the true labels when they are known.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture

from client_sdk.recipes.errors import RecipeError

__all__ = ["GmmSelection", "per_sample_loss_gmm", "selection_metrics"]


@dataclass(frozen=True)
class GmmSelection:
    """Clean probabilities from a 2-component GMM on per-sample losses.

    Attributes
    ----------
    clean_probability : numpy.ndarray
        ``(N,)`` posterior of the lower-mean component, float64.
    converged : bool
        False when scikit-learn reported that EM did not converge (the result is still used).
    fallback : str or None
        Why no GMM was fitted (every probability is then 1.0: no evidence of noise).
    """

    clean_probability: npt.NDArray[np.float64]
    converged: bool
    fallback: str | None = None


def per_sample_loss_gmm(
    losses: torch.Tensor | npt.ArrayLike,
    *,
    tol: float = 1e-2,
    reg_covar: float = 5e-4,
    max_iter: int = 100,
    random_state: int = 0,
) -> GmmSelection:
    """Fit a 2-component GMM to min-max normalised per-sample losses (FedRN eq. 6).

    Parameters
    ----------
    losses : tensor or array-like
        ``(N,)`` per-sample losses.
    tol, reg_covar, max_iter : float, float, int
        ``GaussianMixture`` settings (FedRN's authors use tol 1e-2, reg_covar 5e-4).
    random_state : int
        Seed of the k-means initialisation (the authors leave it unseeded).

    Returns
    -------
    GmmSelection
        Clean probability = posterior of the component with the smaller mean. With fewer than
        2 samples, or all losses equal (max - min < 1e-12), no GMM is fitted: every probability
        is 1.0 and ``fallback`` says why. A ``ConvergenceWarning`` is caught and reported as
        ``converged=False``.

    Raises
    ------
    RecipeError
        If ``losses`` is not 1-D or holds a non-finite value.
    """
    if isinstance(losses, torch.Tensor):
        values = losses.detach().to("cpu", torch.float64).numpy()
    else:
        values = np.asarray(losses, dtype=np.float64)
    if values.ndim != 1:
        raise RecipeError(f"losses: expected a 1-D array, got shape {values.shape}")
    if not np.isfinite(values).all():
        raise RecipeError("losses: contains a non-finite value")
    n = values.shape[0]
    if n < 2:
        return GmmSelection(np.ones(n), converged=True, fallback="fewer than 2 samples")
    low, high = float(values.min()), float(values.max())
    if high - low < 1e-12:
        return GmmSelection(np.ones(n), converged=True, fallback="all losses are equal")
    scaled = ((values - low) / (high - low)).reshape(-1, 1)
    gmm = GaussianMixture(
        n_components=2,
        max_iter=max_iter,
        tol=tol,
        reg_covar=reg_covar,
        random_state=random_state % (2**32),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        gmm.fit(scaled)
        posterior = gmm.predict_proba(scaled)
    converged = bool(gmm.converged_) and not any(
        issubclass(w.category, ConvergenceWarning) for w in caught
    )
    for w in caught:
        if not issubclass(w.category, ConvergenceWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    clean = int(np.argmin(gmm.means_.reshape(-1)))
    return GmmSelection(posterior[:, clean].astype(np.float64), converged=converged)


def selection_metrics(
    selected: torch.Tensor, labels: torch.Tensor, true_labels: torch.Tensor | None
) -> dict[str, float]:
    """Label precision/recall of a clean-sample selection against the true labels.

    Precision = |selected and correctly labelled| / |selected|; recall = |selected and correctly
    labelled| / |correctly labelled|. Only the counts are returned when the truth is unknown,
    and recall is left out when no label is correct.
    """
    sel = selected.to(torch.bool)
    out = {"num_selected": float(int(sel.sum().item())), "num_samples": float(sel.numel())}
    if true_labels is None:
        return out
    correct = labels == true_labels
    hit = int((sel & correct).sum().item())
    n_sel = int(sel.sum().item())
    n_correct = int(correct.sum().item())
    if n_sel > 0:
        out["label_precision"] = hit / n_sel
    if n_correct > 0:
        out["label_recall"] = hit / n_correct
    return out
