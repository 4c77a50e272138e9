"""FedNoRo's mixture: the per-class loss features and the vote of the Gaussian mixture fits
(Wu et al., IJCAI 2023, section 4.1 / eq. 2-3; steps 1-4 of
:class:`~service.audit.detectors.fednoro.FedNoRoDetector`).

* :func:`normalised_features` -- steps 1-2: a missing class filled with the cleanest value seen
  for it, then per-class min-max normalisation (eq. 3), constant columns dropped;
* :func:`fit_gmm` -- step 3: one 2-component ``GaussianMixture`` per seed, the noisy component
  being the one whose mean vector has the larger sum;
* :func:`vote_over` -- step 4: the fits' noisy sets, most votes first (the reference code's
  majority vote), and the posterior averaged over the fits;
* :func:`noisy_classes` -- the classes on the noisy side of a fit, of every client.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture

from service.audit._typing import BoolArray, FloatArray, IntArray
from service.audit.detection import RANGE_EPS
from service.audit.verdict_types import FedNoRoSummary

__all__: list[str] = []


@dataclass(frozen=True)
class GMMFit:
    """One mixture fit: the noisy labels, posterior and the two components' means."""

    labels: BoolArray
    noisy_probability: FloatArray
    noisy_mean: FloatArray
    clean_mean: FloatArray
    converged: bool


def fit_gmm(features: FloatArray, seed: int) -> GMMFit:
    """Step 3: one 2-component mixture fitted with ``seed``; EM stopping at max_iter is recorded."""
    mixture = GaussianMixture(n_components=2, random_state=seed)
    # EM may stop at max_iter; the fit is still usable, so the warning is recorded via
    # `converged_` in the result summary instead of being raised.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mixture.fit(features)
    means = np.asarray(mixture.means_, dtype=np.float64)
    noisy = int(np.argmax(means.sum(axis=1)))
    labels = np.asarray(mixture.predict(features)) == noisy
    proba = np.asarray(mixture.predict_proba(features), dtype=np.float64)[:, noisy]
    return GMMFit(
        labels=labels,
        noisy_probability=proba,
        noisy_mean=means[noisy],
        clean_mean=means[1 - noisy],
        converged=bool(mixture.converged_),
    )


def noisy_classes(features: FloatArray, fit: GMMFit, columns: IntArray) -> list[list[int]]:
    """Per client (row of ``features``) the classes whose normalised loss sits on the noisy side
    of the midpoint of the two means.

    Only classes where the noisy component's mean is above the clean one count (the noisy
    component is chosen by the sum of its means, so single classes can go the other way).
    Sorted by how far the loss is above the clean mean (largest first), then class index.
    """
    above = fit.noisy_mean > fit.clean_mean
    closer = features > 0.5 * (fit.noisy_mean + fit.clean_mean)
    rows, j = np.nonzero(above[None, :] & closer)
    excess = features[rows, j] - fit.clean_mean[j]
    order = np.lexsort((columns[j], -excess, rows))
    starts = np.searchsorted(rows[order], np.arange(features.shape[0] + 1))
    classes, bounds = columns[j][order].astype(np.int64).tolist(), starts.tolist()
    return [classes[bounds[k] : bounds[k + 1]] for k in range(features.shape[0])]


def normalised_features(
    loss: FloatArray, missing: BoolArray
) -> tuple[FloatArray, IntArray, FedNoRoSummary]:
    """Steps 1-2: the min-max normalised informative columns, their indices and a summary."""
    # Step 1: a missing class cannot hold noisy samples, so it is filled as the cleanest
    # value seen for that class.
    present_any = ~missing.all(axis=0)
    filled = loss.copy()
    for c in np.flatnonzero(present_any):
        column = filled[:, c]
        column[missing[:, c]] = np.min(column[~missing[:, c]])
    # Step 2: per-class min-max; a constant column would divide by zero.
    lo = np.where(present_any, filled.min(axis=0, initial=np.inf, where=~np.isnan(filled)), 0.0)
    hi = np.where(present_any, filled.max(axis=0, initial=-np.inf, where=~np.isnan(filled)), 0.0)
    spread = hi - lo
    informative = present_any & (spread > RANGE_EPS)
    columns = np.flatnonzero(informative).astype(np.int64)
    column_summary = FedNoRoSummary(
        columns_used=columns.tolist(),
        columns_dropped_missing=np.flatnonzero(~present_any).tolist(),
        columns_dropped_constant=np.flatnonzero(present_any & ~informative).tolist(),
    )
    features: FloatArray = (filled[:, columns] - lo[columns]) / spread[columns]
    return features, columns, column_summary


@dataclass(frozen=True)
class MixtureVote:
    """Steps 3-4: the fits and the majority vote over their noisy sets."""

    fits: list[GMMFit]
    votes: dict[bytes, int]
    ranked: list[bytes]
    """The fits' distinct noisy sets, most votes first; ties in seed order (the first is the
    reference's majority vote)."""
    fit_of: dict[bytes, GMMFit]
    """The first fit (in seed order) of each noisy set."""
    probability: FloatArray
    noisy_votes: IntArray


def vote_over(fits: list[GMMFit]) -> MixtureVote:
    """Step 4: the fits' noisy sets, their votes, and the averaged posterior."""
    votes: dict[bytes, int] = {}
    first_fit: dict[bytes, int] = {}
    for i, fit in enumerate(fits):
        key = fit.labels.tobytes()
        votes[key] = votes.get(key, 0) + 1
        first_fit.setdefault(key, i)
    return MixtureVote(
        fits=fits,
        votes=votes,
        ranked=sorted(votes, key=lambda key: (-votes[key], first_fit[key])),
        fit_of={key: fits[i] for key, i in first_fit.items()},
        probability=np.mean([f.noisy_probability for f in fits], axis=0),
        noisy_votes=np.sum([f.labels for f in fits], axis=0),
    )
