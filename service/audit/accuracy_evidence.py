"""Evidence from each site's accuracy on its own labels: what a site that lies about its losses
still gives away.

The per-class loss evidence (:mod:`service.audit.evidence`) reads losses the site reports. A
site that trains on wrong labels but reports the losses a clean site would (issue 20's attack;
``fedaudit_sim.lying``) is invisible to it. Its local model, though, cannot fit its wrong
labels as well as a clean site's model fits its right ones: the local model's accuracy on the
site's own labels (FedRN's data expertise, Kim et al., CIKM 2022, eq. 4, before its min-max
normalisation) stays low. This module turns that accuracy into a calibrated per-site test with
the same null model as the loss evidence.

**Null model.** The error ``e_k = 1 - a_k`` of site k's model on its ``n_k`` samples is modelled
as ``e_k = mu + u_k + eps_k`` with ``u_k ~ N(0, tau^2)`` the between-site spread of clean sites
and ``eps_k`` the binomial sampling error, variance ``p_k (1 - p_k) / n_k`` at the centre,
``p_k = (mu0 n_k + 1) / (n_k + 2)`` (the centre ``mu0``, the plain median, shrunk away from 0 and 1
by one success and one failure, so that a federation whose sites all fit perfectly still has a
sampling variance). ``mu`` and ``tau^2`` are fitted robustly with
:func:`service.audit.class_null.fit_class_null` (weighted median, Paule-Mandel with the median),
so that a minority of noisy sites moves neither, and

    z_k = (e_k - mu) / sqrt(tau^2 + p_k (1 - p_k) / n_k + var(mu)),

one-sided ``p_k = 1 - Phi(z_k)``.

**Flags.** Benjamini-Hochberg at the loss evidence's ``q`` over the sites, and an error at least
``min_gap`` above the centre. The floor does more than mark practical significance: the binomial
null is too narrow for local models that memorise their data in some rounds and not in others
(small sites, CNNs): on 6 clean BreastMNIST sites one site's error stood up to 0.21 above the
others' with z up to 20, while sites with 40-50 % flipped labels, when significant, stood at
least 0.26 above, hence the detector's default floor of 0.25 (docs/algorithms.md). The loss
evidence's detector adds these flags to its own (:class:`service.audit.evidence.EvidenceDetector`,
``accuracy``), so the per-round false-alarm bound of the two together is the sum of the two
levels (Bonferroni over the two tests).

**Limits.** The accuracy is reported by the site too: a site that lies about it as well is not
caught here. Local models that fit their labels perfectly whatever they are (many local epochs
on few samples) leave no gap. A site whose data are harder (not its labels) has a lower accuracy
for that reason; ``tau`` absorbs a spread shared by many sites, not one outlying site.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import norm

from service.audit._typing import BoolArray, FloatArray
from service.audit._validation import InvalidInputError, as_float_array
from service.audit.class_null import benjamini_hochberg, fit_class_null

__all__ = ["AccuracyEvidence", "accuracy_evidence"]


@dataclass(frozen=True)
class AccuracyEvidence:
    """Per-site accuracy evidence of one round (module docstring)."""

    z: FloatArray
    """(K,) standardised excess error; higher is worse."""
    p_value: FloatArray
    """(K,) one-sided p-values."""
    gap: FloatArray
    """(K,) error minus the fitted centre."""
    flags: BoolArray
    """(K,) significant at ``q`` (Benjamini-Hochberg) and at least ``min_gap`` above the centre."""
    centre: float
    """The fitted centre of the error."""
    tau: float
    """The fitted between-site spread of the error."""


def accuracy_evidence(
    train_accuracy: Any,
    num_samples: Any,
    *,
    q: float,
    min_gap: float,
    never: Any = None,
) -> AccuracyEvidence:
    """Judge each site's accuracy on its own labels (module docstring).

    Parameters
    ----------
    train_accuracy : array-like of shape (K,)
        Each site's local model's accuracy on its own labels, in [0, 1].
    num_samples : array-like of shape (K,)
        Each site's sample count (>= 1).
    q : float
        Benjamini-Hochberg level.
    min_gap : float
        Smallest excess error (absolute, in [0, 1]) that can flag a site.
    never : array-like of bool of shape (K,), optional
        Sites never flagged (trust anchors); still part of the fit.

    Raises
    ------
    InvalidInputError
        Shapes differ, an accuracy is outside [0, 1], a count is below 1, or fewer than 3 sites.
    """
    acc = as_float_array("train_accuracy", train_accuracy, ndim=1, min_value=0.0)
    n = as_float_array("num_samples", num_samples, ndim=1, min_value=1.0)
    if (acc > 1.0).any():
        raise InvalidInputError("train_accuracy: values must be <= 1")
    if n.shape != acc.shape:
        raise InvalidInputError(f"num_samples: {n.size} entries for {acc.size} sites")
    if acc.size < 3:
        raise InvalidInputError(f"accuracy evidence needs at least 3 sites, got {acc.size}")
    error = 1.0 - acc
    centre0 = float(np.median(error))
    shrunk = (centre0 * n + 1.0) / (n + 2.0)
    within = shrunk * (1.0 - shrunk) / n
    null = fit_class_null(error, within)
    z = (error - null.mu) / np.sqrt(null.tau2 + within + null.var_mu)
    p = norm.sf(z)
    blocked = np.zeros(acc.size, dtype=bool) if never is None else np.asarray(never, dtype=bool)
    if blocked.shape != acc.shape:
        raise InvalidInputError(f"never: {blocked.size} entries for {acc.size} sites")
    significant, _ = benjamini_hochberg(np.where(blocked, 1.0, p), q)
    gap = error - null.mu
    return AccuracyEvidence(
        z=z,
        p_value=p,
        gap=gap,
        flags=significant & (gap >= min_gap) & ~blocked,
        centre=float(null.mu),
        tau=math.sqrt(null.tau2),
    )
