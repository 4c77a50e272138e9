"""Fed-NCL detection (Tam et al., "Federated Noisy Client Learning"; docs/algorithms.md).

* :func:`fedncl_divergences` / :func:`fedncl_divergence` -- the model divergence e_k of each
  client from the global model (section V-A, eq. 7);
* :class:`FedNCLDetector` -- reliability score q = e * h / n and the mean + beta * sigma rule
  (section V-A, eq. 8-10);
* :func:`correction_candidates` -- the clients whose labels Fed-NCL corrects (eq. 17).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

import numpy as np
from sklearn.base import BaseEstimator

from service.audit._typing import BoolArray, FloatArray
from service.audit._validation import (
    InvalidInputError,
    InvalidParameterError,
    as_float_array,
    as_int_array,
    check_bool,
    check_choice,
    check_float,
    check_int,
)
from service.audit.blocks import stream_pass
from service.audit.detection import ClientVerdict, DetectionResult, FedNCLResult, undetermined
from service.audit.round_pass import RoundPass
from service.audit.state import StateReader
from service.audit.verdict_types import FedNCLSummary, FedNCLVerdictEvidence

__all__ = [
    "FedNCLDetector",
    "correction_candidates",
    "fedncl_divergence",
    "fedncl_divergences",
]

_DIVERGENCE_VARIANTS = ("paper", "reference")


def fedncl_divergences(
    global_state: StateReader,
    client_states: Sequence[StateReader],
    variant: str = "paper",
    shared: RoundPass | None = None,
) -> FloatArray:
    """Fed-NCL model divergence e_k of every client from the global model (eq. 7).

    One blocked pass (:func:`~service.audit.blocks.stream_pass`): each update is read once,
    block by block; differences in float32 blocks, totals in float64 (relative difference to a
    float64 computation about 1e-6).

    Parameters
    ----------
    global_state : StateReader
        theta_G, the model broadcast this round.
    client_states : sequence of StateReader
        theta_k for each client; same names, shapes and dtypes as ``global_state``.
    variant : {"paper", "reference"}, default="paper"
        ``"paper"``: squared L2 norm of the difference over all float tensors (one flattened
        vector). ``"reference"``: sum over float tensors of (L2 norm of the difference + 1), as
        the authors' code does (there over every state entry; here over float tensors only,
        integer counters carry no divergence).
    shared : RoundPass, optional
        The round's shared pass over these same states: the squared distances come from it
        (computed there together with what the aggregation needs).

    Returns
    -------
    ndarray of shape (n_clients,)
        Non-negative divergences.

    Raises
    ------
    InvalidParameterError
        If ``variant`` is unknown.
    InvalidInputError
        If a state lacks a tensor, has an extra one, or a tensor differs in shape or dtype
        or is not finite.
    """
    check_choice("variant", variant, _DIVERGENCE_VARIANTS)
    # One blocked pass (service.audit.blocks): float32 differences per block, float64 totals.
    if shared is not None:
        if shared.global_state is not global_state or len(shared.updates) != len(client_states):
            raise InvalidParameterError("shared: a pass over other states than these")
        _, squared = shared.squared()
    else:
        first = stream_pass(global_state, client_states, distances=True, label="client_states")
        assert first.squared is not None
        squared = first.squared
    if variant == "paper":
        result: FloatArray = squared.sum(axis=0)
    else:
        result = (np.sqrt(squared) + 1.0).sum(axis=0)
    return result


def fedncl_divergence(
    global_state: StateReader, client_state: StateReader, variant: str = "paper"
) -> float:
    """Fed-NCL model divergence e_k of one client (eq. 7); see :func:`fedncl_divergences`."""
    return float(fedncl_divergences(global_state, [client_state], variant)[0])


class FedNCLDetector(BaseEstimator):  # type: ignore[misc]
    """Fed-NCL reliability score and sigma rule (Fed-NCL section V-A, eq. 7-10).

    ``q_k = e_k * h_k / n_k`` (eq. 9) with ``h_k = train_loss_k * n_k`` (``loss_mode="sum"``,
    eq. 8 as printed) or ``h_k = train_loss_k`` (``"mean"``, the reference code). A client is
    flagged when ``q_k - mean(q) > beta * std(q)`` (eq. 10, one-sided) or, with
    ``two_sided=True`` (the reference code), when ``|q_k - mean(q)| > beta * std(q)``.

    ``std`` is the population standard deviation (ddof 0): the scores of this round's clients
    are the whole population being screened, not a sample of a larger one, and ddof 0 keeps
    the rule defined down to two clients. (The reference code uses torch's unbiased std, which
    makes its threshold slightly larger.) When every q is equal nobody is flagged.

    Parameters
    ----------
    beta : float, default=1.0
        Number of standard deviations (the paper also quotes 0.6).
    two_sided : bool, default=False
        Flag unusually low scores too.
    min_clients : int, default=3
        Fewer clients give an "undetermined" result.
    loss_mode : {"sum", "mean"}, default="sum"
        How h_k is formed from the mean training loss.

    Attributes
    ----------
    result_ : FedNCLResult
        The full result (method ``"fedncl"``); evidence per client: ``divergence``,
        ``data_quality`` (h_k), ``deviation`` ((q_k - mean) / std, 0 when std is 0).
    scores_ : ndarray of shape (n_clients,) or None
        q_k; None when undetermined.
    labels_ : ndarray of bool or None
        Flags; None when undetermined.
    threshold_ : float or None
        ``mean(q) + beta * std(q)``; None when undetermined.
    n_clients_seen_ : int
        Number of clients given to ``fit``.

    References
    ----------
    Tam et al., "Federated Noisy Client Learning", section V-A, eq. 7-10.
    """

    def __init__(
        self,
        beta: float = 1.0,
        two_sided: bool = False,
        min_clients: int = 3,
        loss_mode: str = "sum",
    ) -> None:
        self.beta = beta
        self.two_sided = two_sided
        self.min_clients = min_clients
        self.loss_mode = loss_mode

    def fit(self, divergence: Any, train_loss: Any, num_samples: Any) -> Self:
        """Score and flag clients.

        Parameters
        ----------
        divergence : array-like of shape (n_clients,)
            e_k (:func:`fedncl_divergences`), non-negative.
        train_loss : array-like of shape (n_clients,)
            Mean training cross-entropy of each client, non-negative.
        num_samples : array-like of int of shape (n_clients,)
            n_k, positive.

        Returns
        -------
        self : FedNCLDetector
            The fitted detector.

        Raises
        ------
        InvalidParameterError
            If a hyper-parameter is invalid.
        InvalidInputError
            If the arrays are not 1-D of equal length, or hold negative or non-finite values.
        """
        beta = check_float("beta", self.beta, min_value=0.0)
        two_sided = check_bool("two_sided", self.two_sided)
        min_clients = check_int("min_clients", self.min_clients, min_value=2)
        loss_mode = check_choice("loss_mode", self.loss_mode, ("sum", "mean"))
        e, loss, n = _checked_inputs(divergence, train_loss, num_samples)
        n_clients = e.size
        self.n_clients_seen_ = n_clients
        self.scores_: FloatArray | None = None
        self.labels_: BoolArray | None = None
        self.threshold_: float | None = None
        if n_clients < min_clients:
            self.result_: FedNCLResult = undetermined(
                "fedncl",
                n_clients,
                f"{n_clients} reporting client(s), fewer than min_clients={min_clients}",
                FedNCLSummary(),
            )
            return self
        h = loss * n if loss_mode == "sum" else loss
        with np.errstate(over="ignore"):
            q = e * h / n
        if not np.isfinite(q).all():
            reason = "reliability scores overflow"
            self.result_ = undetermined("fedncl", n_clients, reason, FedNCLSummary())
            return self
        mean, std, deviation, labels = _sigma_rule(q, beta, two_sided)
        self.scores_ = q
        self.labels_ = labels
        self.threshold_ = mean + beta * std
        verdicts: list[ClientVerdict[FedNCLVerdictEvidence] | None] = [
            ClientVerdict(
                score=float(q[k]),
                flag=bool(labels[k]),
                evidence=FedNCLVerdictEvidence(
                    divergence=float(e[k]),
                    data_quality=float(h[k]),
                    deviation=float(deviation[k]),
                ),
            )
            for k in range(n_clients)
        ]
        summary = FedNCLSummary(
            mean=mean,
            std=std,
            std_ddof=0,
            beta=beta,
            two_sided=two_sided,
            loss_mode=loss_mode,
            threshold=self.threshold_,
            lower_threshold=mean - beta * std if two_sided else None,
            n_flagged=int(labels.sum()),
        )
        self.result_ = DetectionResult("fedncl", "ok", None, verdicts, summary)
        return self


def _checked_inputs(
    divergence: Any, train_loss: Any, num_samples: Any
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """:meth:`FedNCLDetector.fit`'s arrays, checked: e_k, the mean training loss and n_k."""
    e = as_float_array("divergence", divergence, ndim=1, min_value=0.0)
    loss = as_float_array("train_loss", train_loss, ndim=1, min_value=0.0)
    n = as_int_array("num_samples", num_samples, ndim=1, min_value=1).astype(np.float64)
    if not e.shape == loss.shape == n.shape:
        raise InvalidInputError(
            f"train_loss, num_samples: lengths {loss.size}, {n.size} differ from "
            f"divergence {e.size}"
        )
    return e, loss, n


def _sigma_rule(
    q: FloatArray, beta: float, two_sided: bool
) -> tuple[float, float, FloatArray, BoolArray]:
    """Eq. 10: the scores' mean, population std, deviations and flags (none when all equal)."""
    n_clients = q.size
    # Scaling by max|q| keeps the variance computation from overflowing for huge scores.
    scale = float(np.max(np.abs(q)))
    if scale == 0.0 or float(np.ptp(q)) == 0.0:
        return float(q[0]), 0.0, np.zeros(n_clients), np.zeros(n_clients, dtype=bool)
    scaled = q / scale
    mean = float(scaled.mean()) * scale
    std = float(scaled.std()) * scale
    centred = q - mean
    labels: BoolArray = (np.abs(centred) if two_sided else centred) > beta * std
    return mean, std, centred / std, labels


def correction_candidates(flag_counts: Any, t_corr: int, alpha: float = 0.6) -> BoolArray:
    """Fed-NCL label-correction candidates (eq. 17).

    Parameters
    ----------
    flag_counts : array-like of int of shape (n_clients,)
        In how many of the first ``t_corr`` rounds each client was flagged (0..t_corr).
    t_corr : int
        T_corr, the number of rounds counted (>= 1).
    alpha : float, default=0.6
        Fraction in [0, 1] (the paper's value; the reference code uses 0.5).

    Returns
    -------
    ndarray of bool of shape (n_clients,)
        True where the client was flagged in MORE than ``alpha * t_corr`` rounds.

    Raises
    ------
    InvalidParameterError
        If ``t_corr`` or ``alpha`` is out of range.
    InvalidInputError
        If a count is negative, above ``t_corr`` or not an integer.
    """
    t = check_int("t_corr", t_corr, min_value=1)
    a = check_float("alpha", alpha, min_value=0.0, max_value=1.0)
    counts = as_int_array("flag_counts", flag_counts, ndim=1, min_value=0)
    if (counts > t).any():
        raise InvalidInputError(f"flag_counts: a count exceeds t_corr={t}")
    result: BoolArray = counts > a * t
    return result
