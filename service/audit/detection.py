"""Noisy-client detectors, Fed-NCL persistence and the client status history rule.

The detectors of FedNoRo, Fed-NCL and FedRN (docs/algorithms.md, "Detectors"):

* :class:`FedNoRoDetector` -- per-class loss vectors, min-max normalisation and a 2-component
  Gaussian mixture (FedNoRo, Wu et al., IJCAI 2023, section 4.1 / eq. 2-3), plus a separation
  guard beyond the paper (Ashman's D between the two groups, by default on the
  class-standardised loss excess :func:`class_standardised_excess`, or on the unnormalised
  per-client mean loss, the plain guard's statistic).
* :class:`FedNCLDetector` -- reliability score q = e * h / n and the mean + beta * sigma rule
  (Fed-NCL, Tam et al., section V-A, eq. 7-10), with :func:`fedncl_divergence` /
  :func:`fedncl_divergences` for e (eq. 7) and :func:`correction_candidates` for eq. 17.
* :func:`expertise` -- FedRN data expertise (Kim et al., CIKM 2022, eq. 4).
* :func:`next_status` -- trusted / suspect / noisy from the flag history (2 flags in 3 rounds;
  docs/algorithms.md, "Status and warm-up").

Every detector returns a :class:`DetectionResult`: per client a score, a flag and evidence, or
"undetermined" with a reason. Degenerate statistics never raise; malformed arrays and invalid
hyper-parameters raise :class:`~service.audit._validation.InvalidInputError` /
:class:`~service.audit._validation.InvalidParameterError`.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Self, cast

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture
from threadpoolctl import threadpool_limits

from service.audit._json import to_jsonable
from service.audit._typing import BoolArray, FloatArray, IntArray
from service.audit._validation import (
    InvalidInputError,
    InvalidParameterError,
    as_bool_array,
    as_float_array,
    as_int_array,
    check_bool,
    check_choice,
    check_float,
    check_int,
)
from service.audit.blocks import RoundPass, stream_pass
from service.audit.state import StateReader

__all__ = [
    "ClientStatus",
    "ClientVerdict",
    "DetectionResult",
    "FedNCLDetector",
    "FedNoRoDetector",
    "SEPARATION_GROUPS",
    "SEPARATION_STATISTICS",
    "ashman_d",
    "class_standardised_excess",
    "correction_candidates",
    "expertise",
    "expertise_detection",
    "fedncl_divergence",
    "fedncl_divergences",
    "next_status",
    "null_separation_threshold",
]

ClientStatus = Literal["trusted", "suspect", "noisy"]
"""A client's status derived from its detection history."""

_RANGE_EPS = 1e-12
"""A min-max range at or below this carries no information (FedNoRo eq. 3's normalisation)."""

SEPARATION_STATISTICS = ("class_z", "mean_loss")
"""What the FedNoRo separation guard computes Ashman's D on (:class:`FedNoRoDetector`)."""

SEPARATION_GROUPS = ("all_fits", "majority")
"""Which of the mixture fits' noisy groups the FedNoRo separation guard judges
(:class:`FedNoRoDetector`, ``separation_groups``)."""

MIN_CLASS_HOLDERS = 3
"""A class enters :func:`class_standardised_excess` only when at least this many clients hold it
(two values give no usable spread estimate)."""


# --------------------------------------------------------------------------------------------
# Common result types
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientVerdict:
    """One client's detector output.

    Attributes
    ----------
    score : float or None
        A graded score that ranks the clients of one round: for the detectors, higher = noisier,
        defined for every client whether or not anybody is flagged -- the separation statistic
        (``fednoro``: by default the class-standardised loss excess, in standard errors) or
        the raw reliability score q_k (``fedncl``); for ``expertise`` the normalised expertise
        (higher = more reliable). None if undetermined.
    flag : bool or None
        True = noisy. None if undetermined, and always None for ``expertise``, which is a
        reliability signal and never flags anybody.
    evidence : dict
        JSON-serialisable facts behind the verdict (see each detector).
    probability : float or None
        Noisy probability in [0, 1] where the detector has one (``fednoro``: the GMM posterior
        of the noisy component, 0 when the separation guard withheld the flags); None
        otherwise.
    """

    score: float | None
    flag: bool | None
    evidence: dict[str, Any] = field(default_factory=dict)
    probability: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the verdict as plain JSON values."""
        return cast(
            dict[str, Any],
            to_jsonable(
                {
                    "score": self.score,
                    "probability": self.probability,
                    "flag": self.flag,
                    "evidence": self.evidence,
                }
            ),
        )


@dataclass(frozen=True)
class DetectionResult:
    """A detector's output for one round.

    Attributes
    ----------
    method : str
        ``"fednoro"``, ``"fedncl"`` or ``"expertise"``.
    status : {"ok", "undetermined", "inconclusive"}
        "undetermined" when the detector could not decide (then every verdict is None);
        "inconclusive" when it computed every site's evidence but abstains from flagging
        (the consensus it measures against is suspect; every flag None, ``reason`` says why:
        :mod:`service.audit.evidence`).
    reason : str or None
        Why the result is undetermined (human readable); None when ``status == "ok"``.
    verdicts : list of ClientVerdict or None
        Aligned with the input rows.
    summary : dict
        Federation-level facts, e.g. ``{"ashman_d": 9.7, "separation_passed": True}``.
    """

    method: str
    status: Literal["ok", "undetermined", "inconclusive"]
    reason: str | None
    verdicts: list[ClientVerdict | None]
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def flags(self) -> list[bool | None]:
        """Per-client flags (None where undetermined)."""
        return [None if v is None else v.flag for v in self.verdicts]

    @property
    def scores(self) -> list[float | None]:
        """Per-client scores (None where undetermined)."""
        return [None if v is None else v.score for v in self.verdicts]

    @property
    def probabilities(self) -> list[float | None]:
        """Per-client noisy probabilities (None where undetermined or the detector has none)."""
        return [None if v is None else v.probability for v in self.verdicts]

    def to_json(self) -> dict[str, Any]:
        """Return the result as plain JSON values (no NaN, no infinity)."""
        return {
            "method": self.method,
            "status": self.status,
            "reason": self.reason,
            "verdicts": [None if v is None else v.to_json() for v in self.verdicts],
            "summary": to_jsonable(self.summary, "$.summary"),
        }


def _undetermined(
    method: str, n_clients: int, reason: str, summary: dict[str, Any] | None = None
) -> DetectionResult:
    return DetectionResult(
        method=method,
        status="undetermined",
        reason=reason,
        verdicts=[None] * n_clients,
        summary={} if summary is None else summary,
    )


def _minmax(values: FloatArray) -> FloatArray:
    """Min-max normalise a 1-D array; a range <= 1e-12 gives all ones (no information)."""
    if values.size == 0:
        return values.copy()
    lo = float(values.min())
    spread = float(values.max()) - lo
    if spread <= _RANGE_EPS:
        return np.ones_like(values)
    result: FloatArray = (values - lo) / spread
    return result


# --------------------------------------------------------------------------------------------
# FedNoRo
# --------------------------------------------------------------------------------------------


def ashman_d(group_a: FloatArray, group_b: FloatArray) -> float | None:
    """Ashman's D between two groups of values.

    D = sqrt(2) * |m_a - m_b| / sqrt(s_a^2 + s_b^2) with population standard deviations
    (ddof 0, so a one-member group has spread 0 instead of an undefined one).

    Parameters
    ----------
    group_a, group_b : ndarray of shape (n_a,), (n_b,)
        The values of each group.

    Returns
    -------
    float or None
        None when a group is empty (no split). ``inf`` when both spreads are 0 and the means
        differ; 0.0 when both spreads are 0 and the means are equal.

    References
    ----------
    Ashman, Bird and Zepf (1994), "Detecting bimodality in astronomical datasets".
    """
    a = np.asarray(group_a, dtype=np.float64)
    b = np.asarray(group_b, dtype=np.float64)
    if a.size == 0 or b.size == 0:
        return None
    gap = abs(float(a.mean()) - float(b.mean()))
    spread = float(a.var()) + float(b.var())
    if spread == 0.0:
        return 0.0 if gap == 0.0 else math.inf
    return math.sqrt(2.0) * gap / math.sqrt(spread)


NULL_DRAWS = 100_000
"""Most draws of the parametric bootstrap behind :func:`null_separation_threshold` (small
federations, where D's null distribution has a long tail and its 99th percentile needs many)."""

NULL_VALUES = 10_000_000
"""Budget of normal values per threshold: ``NULL_VALUES // n_clients`` draws, between
``NULL_DRAWS_MIN`` and ``NULL_DRAWS`` (D is concentrated for large federations, so fewer draws
give the same precision there)."""

NULL_DRAWS_MIN = 2000
"""Fewest draws (federations of 5,000 clients and more)."""


def null_draws(n_clients: int) -> int:
    """How many federations of ``n_clients`` :func:`null_separation_threshold` simulates."""
    return max(NULL_DRAWS_MIN, min(NULL_DRAWS, NULL_VALUES // max(n_clients, 1)))


@functools.lru_cache(maxsize=512)
def null_separation_threshold(
    n_clients: int, n_flagged: int, quantile: float = 0.99, random_state: int = 0
) -> float:
    """The ``quantile`` of Ashman's D for a split of one normal population.

    Draws ``n_clients`` values from N(0, 1) (:func:`null_draws` times: 100,000 for up to 100
    clients; seeded, so the answer is deterministic) and computes D (population spreads, as
    :func:`ashman_d`) between the ``n_flagged`` largest values and the others: the most
    separated split of that size a single population offers. A D below this quantile is what a
    federation with no noisy client produces by chance when its mixture happens to split along
    the statistic (D is scale-free, so N(0, 1) stands for any normal population).

    Parameters
    ----------
    n_clients : int
        Clients in the federation (>= 2).
    n_flagged : int
        Size of the flagged group (1 .. n_clients - 1).
    quantile : float, default=0.99
        In (0, 1).
    random_state : int, default=0

    Returns
    -------
    float
        E.g. 7.1 for a single client among 10, 5.2 for 4 of 10, 5.8 for 1 of 20, 4.0 for 8 of
        20. The Monte Carlo error is about 1 % for up to 100 clients (it was up to 11 % with the
        2,000 draws used before: 6.3 instead of 7.1 for 1 of 10).
    """
    k = check_int("n_clients", n_clients, min_value=2)
    n = check_int("n_flagged", n_flagged, min_value=1, max_value=k - 1)
    q = check_float("quantile", quantile, min_value=0.0, max_value=1.0)
    rng = np.random.default_rng(random_state)
    draws = null_draws(k)
    # Blocks of draws keep memory near 16 MB even for 10,000 clients.
    block = max(1, 2_000_000 // k)
    values: list[FloatArray] = []
    for start in range(0, draws, block):
        rows = min(block, draws - start)
        x = rng.standard_normal((rows, k))
        top = np.partition(x, k - n, axis=1)[:, k - n :]
        total, total_sq = x.sum(axis=1), np.square(x).sum(axis=1)
        top_sum, top_sq = top.sum(axis=1), np.square(top).sum(axis=1)
        m_top, m_rest = top_sum / n, (total - top_sum) / (k - n)
        v_top = np.maximum(top_sq / n - m_top**2, 0.0)
        v_rest = np.maximum((total_sq - top_sq) / (k - n) - m_rest**2, 0.0)
        values.append(np.sqrt(2.0) * np.abs(m_top - m_rest) / np.sqrt(v_top + v_rest))
    return float(np.quantile(np.concatenate(values), q))


def class_standardised_excess(
    per_class_loss: FloatArray,
    class_counts: IntArray,
    min_holders: int = MIN_CLASS_HOLDERS,
    clip: float | None = None,
) -> tuple[FloatArray, IntArray]:
    """Each client's loss excess over the federation, class by class, in standard errors.

    For every class c held (count > 0) by at least ``min_holders`` clients:

    * mu_c = sum_k n_kc L_kc / sum_k n_kc, the federation's mean loss on class c;
    * sigma_c^2 = mean over the holders of n_kc (L_kc - mu_c)^2, the per-sample spread implied
      by the clients' class means (Var(L_kc) = sigma_c^2 / n_kc when all clients are alike);
    * z_kc = sqrt(n_kc) (L_kc - mu_c) / sigma_c.

    A client's statistic combines its classes with Stouffer's weights sqrt(n_kc):
    Z_k = sum_c sqrt(n_kc) z_kc / sqrt(sum_c n_kc), the sum over the classes that entered. When
    no client is noisy, each z_kc and so each Z_k is roughly standard normal *whatever the
    client's class mix and size*; the mean loss is not: under label skew it is high for a client
    holding hard classes and low for one holding easy classes.

    Parameters
    ----------
    per_class_loss : ndarray of shape (n_clients, n_classes)
        Mean loss per client and class; ignored (may be NaN) where the count is 0.
    class_counts : ndarray of int of shape (n_clients, n_classes)
    min_holders : int, default=3
    clip : float or None, default=None
        Clip each z_kc to [-clip, clip] before combining (bounds one class's influence); None,
        the detector's setting, clips nothing. Used by ``docs/eval/guard_whatif.py``.

    Returns
    -------
    excess : ndarray of shape (n_clients,)
        Z_k; 0.0 for a client none of whose classes entered (no evidence either way).
    classes : ndarray of int
        The classes that entered (held by ``min_holders`` or more clients with sigma_c > 0).
    """
    n_clients, n_classes = per_class_loss.shape
    numerator = np.zeros(n_clients)
    weight = np.zeros(n_clients)
    used: list[int] = []
    for c in range(n_classes):
        held = class_counts[:, c] > 0
        if int(held.sum()) < min_holders:
            continue
        n = class_counts[held, c].astype(np.float64)
        values = per_class_loss[held, c]
        mu = float((n * values).sum() / n.sum())
        sigma = math.sqrt(float((n * np.square(values - mu)).mean()))
        if sigma <= _RANGE_EPS:
            continue
        z = np.sqrt(n) * (values - mu) / sigma
        if clip is not None:
            z = np.clip(z, -clip, clip)
        numerator[held] += np.sqrt(n) * z
        weight[held] += n
        used.append(c)
    excess = np.divide(numerator, np.sqrt(weight), out=np.zeros(n_clients), where=weight > 0)
    return excess, np.asarray(used, dtype=np.int64)


@dataclass(frozen=True)
class _GroupVerdict:
    """The separation guard's verdict on one candidate noisy group (step 5)."""

    d_value: float | None
    threshold: float
    null_threshold: float | None
    confirmed_group: bool

    @property
    def separated(self) -> bool:
        """D reaches the threshold (False when D is undefined)."""
        return self.d_value is not None and self.d_value >= self.threshold


@dataclass(frozen=True)
class _GMMFit:
    labels: BoolArray
    noisy_probability: FloatArray
    noisy_mean: FloatArray
    clean_mean: FloatArray
    converged: bool


def _fit_gmm(features: FloatArray, seed: int) -> _GMMFit:
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
    return _GMMFit(
        labels=labels,
        noisy_probability=proba,
        noisy_mean=means[noisy],
        clean_mean=means[1 - noisy],
        converged=bool(mixture.converged_),
    )


def _noisy_classes(row: FloatArray, fit: _GMMFit, columns: IntArray) -> list[int]:
    """Classes whose normalised loss sits on the noisy side of the midpoint of the two means.

    Only classes where the noisy component's mean is above the clean one count (the noisy
    component is chosen by the sum of its means, so single classes can go the other way).
    Sorted by how far the loss is above the clean mean (largest first), then class index.
    """
    above = fit.noisy_mean > fit.clean_mean
    closer = row > 0.5 * (fit.noisy_mean + fit.clean_mean)
    chosen = np.flatnonzero(above & closer)
    excess = row[chosen] - fit.clean_mean[chosen]
    order = np.lexsort((columns[chosen], -excess))
    return [int(columns[chosen][i]) for i in order]


class FedNoRoDetector(BaseEstimator):  # type: ignore[misc]
    """FedNoRo noisy-client detection from per-class losses (FedNoRo section 4.1, eq. 2-3).

    Steps (``fit``):

    1. A missing entry (client has no sample of the class) is filled with the minimum of its
       column over the clients that have the class; a column missing for every client is dropped.
    2. Each column is min-max normalised across clients; a column whose range is <= 1e-12 is
       dropped. No column left: "undetermined".
    3. A 2-component ``GaussianMixture`` (full covariance, sklearn defaults) is fitted once per
       seed in ``random_states``.
    4. In each fit the noisy component is the one whose mean vector has the larger sum. The flag
       is the noisy set found most often over the fits (a tie goes to the set reached first, in
       seed order, as the reference code does); the reported probability is the noisy
       component's posterior averaged over the fits.
    5. Separation guard (``require_separation=True``): Ashman's D between the flagged and the
       other clients must be at least ``separation_threshold``; otherwise nobody is flagged
       (status "ok", the summary says why). D is undefined when the vote puts every client on
       one side; with the guard on that also flags nobody. The plain guard computes D on each
       client's unnormalised mean loss over its own samples
       ``sum_c counts[k, c] * loss[k, c] / sum_c counts[k, c]``
       (``separation_statistic="mean_loss"``). Beyond the plain guard:

       - ``separation_quantile`` (default 0.99): D must also reach the 99th percentile of D for
         the same split sizes drawn from one normal population
         (:func:`null_separation_threshold`). D >= 2 alone lets a clean federation through
         whenever the mixture splits along the statistic, because cutting one normal sample
         into its top n and the rest already gives D of about 2.7 (median), and a lone outlier
         has spread 0: measured on scenario V4 (20 clean clients), the plain guard flagged one
         to three clients in 12-23 of 27 rounds per seed, with D of 3-4 at the first false
         flag; the calibrated threshold there is 5.8 for one client and 4.0 for ten, while the
         noisy groups of V1 reach D of about 9.
       - ``separation_statistic="class_z"`` (the default): D is computed on
         :func:`class_standardised_excess`, which is close to standard normal for every client
         of a clean federation whatever its class mix, as the calibrated threshold assumes.
         Under label skew the mean loss is not: it mixes the classes a client happens to hold
         with its label quality. Measured on the stored signals of scenario V3 (50 clients,
         two classes each), the calibrated guard on the mean loss kept the flags back in about
         a fifth of the rounds (F1 0.71-0.88) although the mixture's vote was right; on this
         statistic F1 was 0.93-1.00, with no false alarm added on V1, V2, V4 or V5
         (``docs/algorithms.md``, "What we changed: the separation guard").
       - ``confirmed`` (an argument of ``fit``): when the vote's noisy group lies entirely
         within the clients already confirmed noisy (their status before this round), the
         quantile is not applied and D >= ``separation_threshold`` suffices. The quantile
         guards against a chance *start*; a group that earlier passed it often enough to be
         "noisy" keeps its flags on the plain guard's criterion. Without this, a group whose
         D hovers near the quantile (ten clients: 5.2 for four of them) is flagged in one
         round and not in the next although the scores still separate it perfectly
         (``docs/algorithms.md``, "What we changed: the separation guard").
    6. Fewer than ``min_clients`` clients: "undetermined".

    Each verdict's ``probability`` is the averaged posterior of step 4 (0 for everybody when
    the guard withheld the flags), and its ``score`` is the separation statistic itself
    (the class-standardised loss excess by default), for every client in every round. The
    posterior is a two-group membership: it sits near 0 or 1, and it says nothing when the
    federation has no two groups. The statistic ranks the clients on a continuous scale
    whether or not anybody is flagged. On scenario V6 (noise rates spread linearly over
    0-0.8, no two groups, nobody flagged), the statistic's Spearman correlation with the
    noise rate was 0.87-0.93, against 0.05-0.23 for the posterior (``docs/algorithms.md``,
    "What we changed: score and probability").

    Parameters
    ----------
    random_states : sequence of int, default=(0, 1, ..., 8)
        One GMM fit per seed (the reference fits 9 times with seeds 0..8).
    require_separation : bool, default=True
        Apply the separation guard of step 5. False gives the paper-exact detector.
    separation_threshold : float, default=2.0
        Minimum Ashman's D for two cleanly separated groups.
    min_clients : int, default=4
        Fewer reporting clients give an "undetermined" result.
    separation_quantile : float or None, default=0.99
        Also require D above this quantile of D for a split of one normal population with the
        same group sizes; None keeps only ``separation_threshold`` (the plain guard).
    separation_statistic : {"class_z", "mean_loss"}, default="class_z"
        What D is computed on, and what each verdict's ``score`` is: the class-standardised
        loss excess, or each client's mean loss (the plain guard).
    separation_groups : {"all_fits", "majority"}, default="all_fits"
        Which noisy sets the guard judges. ``"majority"``: the vote of step 4 only (the rule
        before this setting existed). ``"all_fits"`` (beyond the paper; with the guard on it
        needs ``separation_quantile``; without the guard the flags are the vote, as in the
        paper): every distinct noisy set the fits propose that splits the clients (neither
        side empty), each against the quantile corrected for their number m,
        1 - (1 - ``separation_quantile``) / m (Bonferroni; m = 1, every fit agreeing, is the
        majority rule); the first that passes is flagged, most votes first, and when none
        passes the verdict on the most voted of them is reported. A group within the
        ``confirmed`` clients needs only ``separation_threshold``, as in the majority rule.
        The summary gives ``groups_tested`` (m), ``group_rank`` (0 = the majority's group)
        and ``separation_quantile_judged``.
        Reason: on few clients the fits can disagree, and the majority can be the wrong one
        (``docs/algorithms.md``, the separation guard: ten clients, five fits for three of the four
        noisy clients, four fits for exactly the four).

    Attributes
    ----------
    result_ : DetectionResult
        The full result (method ``"fednoro"``).
    noisy_probability_ : ndarray of shape (n_clients,) or None
        Each client's noisy probability: the averaged posterior, or 0.0 for everybody when
        the guard withheld the flags (the raw posterior stays in the evidence as
        ``gmm_noisy_probability``). None when undetermined.
    labels_ : ndarray of bool of shape (n_clients,) or None
        The flags (True = noisy). None when undetermined.
    ashman_d_ : float or None
        Ashman's D of the vote's split (may be ``inf``); None when undefined or undetermined.
    columns_used_ : ndarray of int
        Original indices of the class columns the mixture was fitted on.
    n_clients_seen_ : int
        Number of rows given to ``fit``.

    Notes
    -----
    Evidence per client: ``normalised_loss`` (list over the original classes, ``None`` for a
    dropped column), ``noisy_classes`` (see below), ``mean_loss`` (unnormalised mean loss over
    the client's own samples), ``class_z`` (:func:`class_standardised_excess`),
    ``gmm_noisy_probability`` (averaged posterior, before the guard) and ``noisy_votes`` (in
    how many fits the client fell in the noisy component).

    ``noisy_classes`` uses the first fit (in seed order) whose noisy set equals the vote's: the
    classes c where that fit's noisy mean exceeds its clean mean and the client's normalised
    loss is above the midpoint of the two means (closer to the noisy mean), sorted by how far
    the loss is above the clean mean (largest first, ties by class index). It is computed for
    every client, flagged or not, as a statement about the fitted mixture.

    All GMM fits run with BLAS/OpenMP limited to one thread: on a shared machine the default
    thread pools made 9 fits of a 10,000 x 10 matrix ten times slower.

    References
    ----------
    Wu et al., "FedNoRo: Towards Noise-Robust Federated Learning by Addressing Class Imbalance
    and Label Noise Heterogeneity", IJCAI 2023, section 4.1.
    """

    def __init__(
        self,
        random_states: Sequence[int] = tuple(range(9)),
        require_separation: bool = True,
        separation_threshold: float = 2.0,
        min_clients: int = 4,
        separation_quantile: float | None = 0.99,
        separation_statistic: str = "class_z",
        separation_groups: str = "all_fits",
    ) -> None:
        self.random_states = random_states
        self.require_separation = require_separation
        self.separation_threshold = separation_threshold
        self.min_clients = min_clients
        self.separation_quantile = separation_quantile
        self.separation_statistic = separation_statistic
        self.separation_groups = separation_groups

    def _validated_params(self) -> tuple[list[int], bool, float, int]:
        seeds = self.random_states
        if isinstance(seeds, str | bytes) or not isinstance(seeds, Sequence):
            raise InvalidParameterError(
                f"random_states: expected a sequence of ints, got {type(seeds).__name__}"
            )
        if len(seeds) == 0:
            raise InvalidParameterError("random_states: needs at least one seed")
        checked = [
            check_int(f"random_states[{i}]", s, min_value=0, max_value=2**32 - 1)
            for i, s in enumerate(seeds)
        ]
        if self.separation_quantile is not None:
            check_float(
                "separation_quantile",
                self.separation_quantile,
                min_value=0.0,
                max_value=1.0,
                min_inclusive=False,
                max_inclusive=False,
            )
        check_choice("separation_statistic", self.separation_statistic, SEPARATION_STATISTICS)
        check_choice("separation_groups", self.separation_groups, SEPARATION_GROUPS)
        if (
            self.separation_groups == "all_fits"
            and self.require_separation is True
            and self.separation_quantile is None
        ):
            raise InvalidParameterError(
                "separation_groups: 'all_fits' needs separation_quantile (the levels of the "
                "groups judged are corrected for their number; D >= a fixed threshold is not); "
                "set separation_groups='majority' for the guard of ALGORITHMS.md as written"
            )
        return (
            checked,
            check_bool("require_separation", self.require_separation),
            check_float("separation_threshold", self.separation_threshold, min_value=0.0),
            check_int("min_clients", self.min_clients, min_value=2),
        )

    def fit(self, per_class_loss: Any, class_counts: Any, confirmed: Any = None) -> Self:
        """Detect noisy clients from their per-class losses.

        Parameters
        ----------
        per_class_loss : array-like of shape (n_clients, n_classes)
            Mean cross-entropy of each client's samples of each (given) class under the
            global model; NaN (or None) exactly where the client has no sample of the class.
        class_counts : array-like of int of shape (n_clients, n_classes)
            Number of samples of each class on each client.
        confirmed : array-like of bool of shape (n_clients,), optional
            Clients already confirmed noisy before this round (their status). A vote whose
            noisy group lies within them needs only D >= ``separation_threshold`` (step 5).
            None: nobody is.

        Returns
        -------
        self : FedNoRoDetector
            The fitted detector.

        Raises
        ------
        InvalidParameterError
            If a hyper-parameter is invalid.
        InvalidInputError
            If the arrays have different shapes, contain infinite or negative values, a loss is
            NaN where the count is positive (or finite where it is 0), or a client has no sample.
        """
        seeds, require_separation, threshold, min_clients = self._validated_params()
        loss = as_float_array(
            "per_class_loss", per_class_loss, ndim=2, allow_nan=True, min_value=0.0
        )
        counts = as_int_array("class_counts", class_counts, ndim=2, min_value=0)
        if loss.shape != counts.shape:
            raise InvalidInputError(
                f"class_counts: shape {counts.shape} differs from per_class_loss {loss.shape}"
            )
        known = None
        if confirmed is not None:
            known = as_bool_array("confirmed", confirmed, ndim=1)
            if known.shape != (loss.shape[0],):
                raise InvalidInputError(
                    f"confirmed: shape {known.shape}, expected ({loss.shape[0]},)"
                )
        missing = counts == 0
        if (np.isnan(loss) != missing).any():
            raise InvalidInputError("per_class_loss: must be NaN exactly where class_counts is 0")
        n_clients, n_classes = loss.shape
        totals = counts.sum(axis=1)
        if n_classes > 0 and (totals == 0).any():
            raise InvalidInputError(f"class_counts: client {int(np.argmin(totals))} has no sample")

        self.n_clients_seen_ = n_clients
        self.noisy_probability_: FloatArray | None = None
        self.labels_: BoolArray | None = None
        self.ashman_d_: float | None = None
        self.columns_used_: IntArray = np.zeros(0, dtype=np.int64)
        self.result_ = self._detect(
            loss, counts, missing, seeds, require_separation, threshold, min_clients, known
        )
        return self

    @staticmethod
    def _judge(
        group: BoolArray,
        statistic: FloatArray,
        usable: bool,
        confirmed: BoolArray | None,
        threshold: float,
        quantile: float | None,
    ) -> _GroupVerdict:
        """Step 5 for one candidate noisy group."""
        n_group = int(group.sum())
        splits = 0 < n_group < group.size
        d_value = ashman_d(statistic[group], statistic[~group]) if usable else None
        # A group of clients already confirmed noisy keeps its flags on D >= threshold alone.
        confirmed_group = bool(confirmed is not None and splits and confirmed[group].all())
        null_threshold: float | None = None
        if quantile is not None and splits:
            null_threshold = null_separation_threshold(group.size, n_group, quantile)
        if not confirmed_group:
            threshold = max(threshold, null_threshold or 0.0)
        return _GroupVerdict(
            d_value=d_value,
            threshold=threshold,
            null_threshold=null_threshold,
            confirmed_group=confirmed_group,
        )

    def _detect(
        self,
        loss: FloatArray,
        counts: IntArray,
        missing: BoolArray,
        seeds: list[int],
        require_separation: bool,
        threshold: float,
        min_clients: int,
        confirmed: BoolArray | None = None,
    ) -> DetectionResult:
        n_clients, n_classes = loss.shape
        if n_clients < min_clients:
            return _undetermined(
                "fednoro",
                n_clients,
                f"{n_clients} reporting client(s), fewer than min_clients={min_clients}",
            )

        # Step 1: a missing class cannot hold noisy samples, so it is filled as the cleanest
        # value seen for that class.
        present_any = ~missing.all(axis=0)
        filled = loss.copy()
        for c in np.flatnonzero(present_any):
            column = filled[:, c]
            column[missing[:, c]] = np.min(column[~missing[:, c]])
        # Step 2: per-class min-max; a constant column would divide by zero.
        lo = np.where(present_any, filled.min(axis=0, initial=np.inf, where=~np.isnan(filled)), 0.0)
        hi = np.where(
            present_any, filled.max(axis=0, initial=-np.inf, where=~np.isnan(filled)), 0.0
        )
        spread = hi - lo
        informative = present_any & (spread > _RANGE_EPS)
        columns = np.flatnonzero(informative).astype(np.int64)
        self.columns_used_ = columns
        column_summary = {
            "columns_used": columns.tolist(),
            "columns_dropped_missing": np.flatnonzero(~present_any).tolist(),
            "columns_dropped_constant": np.flatnonzero(present_any & ~informative).tolist(),
        }
        if columns.size == 0:
            return _undetermined(
                "fednoro",
                n_clients,
                "no informative class column (every column is missing or constant)",
                column_summary,
            )
        features = (filled[:, columns] - lo[columns]) / spread[columns]
        sums = (np.where(missing, 0.0, loss) * counts).sum(axis=1)
        mean_loss = sums / counts.sum(axis=1)

        # Step 3-4: one mixture per seed, then the reference's majority vote over noisy sets.
        try:
            with threadpool_limits(limits=1):
                fits = [_fit_gmm(features, seed) for seed in seeds]
        except (ValueError, np.linalg.LinAlgError, FloatingPointError) as exc:
            return _undetermined(
                "fednoro", n_clients, f"Gaussian mixture fit failed: {exc}", column_summary
            )
        votes: dict[bytes, int] = {}
        first_fit: dict[bytes, int] = {}
        for i, fit in enumerate(fits):
            key = fit.labels.tobytes()
            votes[key] = votes.get(key, 0) + 1
            first_fit.setdefault(key, i)
        # The fits' distinct noisy sets, most votes first; ties in seed order (the first is
        # the reference's majority vote).
        ranked = sorted(votes, key=lambda key: (-votes[key], first_fit[key]))
        probability = np.mean([f.noisy_probability for f in fits], axis=0)
        noisy_votes = np.sum([f.labels for f in fits], axis=0)

        # Step 5: the separation guard.
        class_z, z_classes = class_standardised_excess(loss, counts)
        if self.separation_statistic == "class_z":
            statistic = class_z
            # No class held by enough clients: there is nothing to standardise against.
            usable = z_classes.size > 0
        else:
            statistic, usable = mean_loss, True
        fit_of = {key: fits[i] for key, i in first_fit.items()}  # the first fit of each set
        candidates = ranked[:1]
        if self.separation_groups == "all_fits" and require_separation:
            proper = [k for k in ranked if 0 < int(fit_of[k].labels.sum()) < n_clients]
            candidates = proper or candidates
        quantile = self.separation_quantile
        if quantile is not None and len(candidates) > 1:
            # Bonferroni: each of the m groups tested at level (1 - quantile) / m.
            quantile = 1.0 - (1.0 - float(quantile)) / len(candidates)
        # The first group (most votes) that passes; when none does, the most voted one's
        # verdict. Groups after the first that passes are not judged (each new group size may
        # cost a null threshold).
        most_voted: tuple[bytes, _GroupVerdict] | None = None
        for key in candidates:
            verdict = self._judge(
                fit_of[key].labels, statistic, usable, confirmed, threshold, quantile
            )
            if verdict.separated:
                winner = key
                break
            most_voted = most_voted or (key, verdict)
        else:
            assert most_voted is not None  # candidates is never empty
            winner, verdict = most_voted
        chosen = fit_of[winner]
        vote_labels = chosen.labels.copy()
        noisy_group = statistic[vote_labels]
        clean_group = statistic[~vote_labels]
        d_value, n_vote = verdict.d_value, int(vote_labels.sum())
        confirmed_group, null_threshold = verdict.confirmed_group, verdict.null_threshold
        threshold, separated = verdict.threshold, verdict.separated
        flags_applied = separated or not require_separation
        labels = vote_labels if flags_applied else np.zeros(n_clients, dtype=bool)
        guarded_probability = probability if flags_applied else np.zeros(n_clients)
        if flags_applied and require_separation and confirmed_group:
            guard_note = (
                f"separation guard passed: the flagged clients were already noisy, so "
                f"D >= {threshold:.3g} suffices"
            )
        elif flags_applied:
            guard_note = "separation guard passed" if require_separation else "separation guard off"
        elif not usable:
            guard_note = (
                f"separation guard: no class is held by {MIN_CLASS_HOLDERS} or more clients, so "
                "the class-standardised loss is undefined; nobody flagged (the guard can use "
                "separation_statistic='mean_loss' instead)"
            )
        elif d_value is None:
            guard_note = (
                "separation guard: the mixture vote put every client on one side, "
                "so there are not two groups; nobody flagged"
            )
        else:
            guard_note = (
                f"separation guard: Ashman's D ({self.separation_statistic}) = {d_value:.3g} "
                f"< {threshold:.3g}, "
                "the two groups are not separated; nobody flagged"
            )
        if len(candidates) > 1:
            guard_note += (
                f" ({len(candidates)} different groups proposed by the {len(fits)} fits were "
                f"judged, most votes first, each at the {quantile:.4g} quantile; "
                + (
                    f"flagged: the group of {votes[winner]} fit(s))"
                    if flags_applied
                    else "none passed; the most voted of them is shown)"
                )
            )

        self.noisy_probability_ = guarded_probability
        self.labels_ = labels
        self.ashman_d_ = d_value
        verdicts: list[ClientVerdict | None] = []
        for k in range(n_clients):
            normalised: list[float | None] = [None] * n_classes
            for j, c in enumerate(columns):
                normalised[int(c)] = float(features[k, j])
            verdicts.append(
                ClientVerdict(
                    score=float(statistic[k]),
                    probability=float(guarded_probability[k]),
                    flag=bool(labels[k]),
                    evidence={
                        "normalised_loss": normalised,
                        "noisy_classes": _noisy_classes(features[k], chosen, columns),
                        "mean_loss": float(mean_loss[k]),
                        "class_z": float(class_z[k]),
                        "gmm_noisy_probability": float(probability[k]),
                        "noisy_votes": int(noisy_votes[k]),
                    },
                )
            )
        summary: dict[str, Any] = {
            **column_summary,
            "n_fits": len(fits),
            "vote_count": votes[winner],
            "separation_groups": self.separation_groups,
            "groups_tested": len(candidates),
            "group_rank": ranked.index(winner),
            "separation_quantile_judged": quantile,
            "fits_converged": [f.converged for f in fits],
            "ashman_d": d_value if d_value is not None and math.isfinite(d_value) else None,
            "ashman_d_infinite": d_value is not None and math.isinf(d_value),
            "separation_required": require_separation,
            "separation_threshold": threshold,
            "separation_null_threshold": null_threshold,
            "separation_passed": separated,
            "separation_confirmed_group": confirmed_group,
            "separation_statistic": self.separation_statistic,
            "class_z_classes": z_classes.tolist(),
            "guard": guard_note,
            "mixture_noisy_count": n_vote,
            "n_flagged": int(labels.sum()),
            "group_mean_loss": {
                "noisy": float(mean_loss[vote_labels].mean()) if n_vote else None,
                "clean": float(mean_loss[~vote_labels].mean()) if n_vote < n_clients else None,
            },
            "group_mean_statistic": {
                "noisy": float(noisy_group.mean()) if noisy_group.size else None,
                "clean": float(clean_group.mean()) if clean_group.size else None,
            },
        }
        return DetectionResult("fednoro", "ok", None, verdicts, summary)


# --------------------------------------------------------------------------------------------
# Fed-NCL
# --------------------------------------------------------------------------------------------

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
    result_ : DetectionResult
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
        e = as_float_array("divergence", divergence, ndim=1, min_value=0.0)
        loss = as_float_array("train_loss", train_loss, ndim=1, min_value=0.0)
        n = as_int_array("num_samples", num_samples, ndim=1, min_value=1).astype(np.float64)
        if not e.shape == loss.shape == n.shape:
            raise InvalidInputError(
                f"train_loss, num_samples: lengths {loss.size}, {n.size} differ from "
                f"divergence {e.size}"
            )
        n_clients = e.size
        self.n_clients_seen_ = n_clients
        self.scores_: FloatArray | None = None
        self.labels_: BoolArray | None = None
        self.threshold_: float | None = None
        if n_clients < min_clients:
            self.result_ = _undetermined(
                "fedncl",
                n_clients,
                f"{n_clients} reporting client(s), fewer than min_clients={min_clients}",
            )
            return self
        h = loss * n if loss_mode == "sum" else loss
        with np.errstate(over="ignore"):
            q = e * h / n
        if not np.isfinite(q).all():
            self.result_ = _undetermined("fedncl", n_clients, "reliability scores overflow")
            return self
        # Scaling by max|q| keeps the variance computation from overflowing for huge scores.
        scale = float(np.max(np.abs(q)))
        if scale == 0.0 or float(np.ptp(q)) == 0.0:
            mean, std = float(q[0]), 0.0
            deviation = np.zeros(n_clients)
            labels = np.zeros(n_clients, dtype=bool)
        else:
            scaled = q / scale
            mean = float(scaled.mean()) * scale
            std = float(scaled.std()) * scale
            centred = q - mean
            deviation = centred / std
            labels = (np.abs(centred) if two_sided else centred) > beta * std
        self.scores_ = q
        self.labels_ = labels
        self.threshold_ = mean + beta * std
        verdicts: list[ClientVerdict | None] = [
            ClientVerdict(
                score=float(q[k]),
                flag=bool(labels[k]),
                evidence={
                    "divergence": float(e[k]),
                    "data_quality": float(h[k]),
                    "deviation": float(deviation[k]),
                },
            )
            for k in range(n_clients)
        ]
        summary = {
            "mean": mean,
            "std": std,
            "std_ddof": 0,
            "beta": beta,
            "two_sided": two_sided,
            "loss_mode": loss_mode,
            "threshold": self.threshold_,
            "lower_threshold": mean - beta * std if two_sided else None,
            "n_flagged": int(labels.sum()),
        }
        self.result_ = DetectionResult("fedncl", "ok", None, verdicts, summary)
        return self


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


# --------------------------------------------------------------------------------------------
# FedRN expertise
# --------------------------------------------------------------------------------------------


def expertise(train_accuracy: Any) -> FloatArray:
    """FedRN data expertise: min-max normalised training accuracy (FedRN eq. 4).

    Parameters
    ----------
    train_accuracy : array-like of shape (n_clients,)
        Accuracy of each client's local model on its own (given) labels, in [0, 1].

    Returns
    -------
    ndarray of shape (n_clients,)
        Values in [0, 1]; all ones when the accuracies span 1e-12 or less (no information).

    Raises
    ------
    InvalidInputError
        If the array is not 1-D or a value is outside [0, 1].
    """
    acc = as_float_array("train_accuracy", train_accuracy, ndim=1, min_value=0.0)
    if (acc > 1.0).any():
        raise InvalidInputError("train_accuracy: values must be <= 1")
    return _minmax(acc)


def expertise_detection(train_accuracy: Any) -> DetectionResult:
    """Wrap :func:`expertise` as a :class:`DetectionResult` (method ``"expertise"``).

    Expertise is a reliability signal, not a detector (FedRN eq. 4): every verdict has
    ``flag=None``; ``score`` is the normalised expertise and the evidence holds the raw
    ``train_accuracy``. Undetermined only when there is no client.
    """
    acc = as_float_array("train_accuracy", train_accuracy, ndim=1, min_value=0.0)
    if acc.size == 0:
        return _undetermined("expertise", 0, "no client reported a training accuracy")
    values = expertise(acc)
    verdicts: list[ClientVerdict | None] = [
        ClientVerdict(float(values[k]), None, {"train_accuracy": float(acc[k])})
        for k in range(acc.size)
    ]
    summary = {
        "min_accuracy": float(acc.min()),
        "max_accuracy": float(acc.max()),
        "note": "expertise is a reliability signal and never flags a client",
    }
    return DetectionResult("expertise", "ok", None, verdicts, summary)


# --------------------------------------------------------------------------------------------
# Status history
# --------------------------------------------------------------------------------------------

_STATUSES = ("trusted", "suspect", "noisy")


def next_status(
    current: str,
    recent_flags: Sequence[bool | None],
    m: int = 2,
    w: int = 3,
) -> ClientStatus:
    """Next trusted / suspect / noisy status of a client from its flag history.

    Undetermined rounds (``None``) are removed first; they count neither for nor against the
    client. With ``D`` the remaining determined flags (oldest first) and ``last`` its final
    ``w`` entries, the first rule that applies decides:

    1. ``sum(last) >= m`` -> ``"noisy"`` (flagged in at least m of the last w determined rounds);
    2. ``len(D) >= w`` and no flag in ``last`` -> ``"trusted"`` (w consecutive clean rounds);
    3. the latest determined round is flagged -> ``"suspect"``, unless ``current`` is
       ``"noisy"``, which stays ``"noisy"``;
    4. otherwise ``current`` is kept (a suspect or noisy client needs w clean rounds in a row to
       become trusted again; an empty history changes nothing).

    Parameters
    ----------
    current : {"trusted", "suspect", "noisy"}
        The client's status before this round.
    recent_flags : sequence of bool or None
        The primary detector's flags for the client, oldest first, including this round.
    m : int, default=2
        Flags needed within the window (1 <= m <= w).
    w : int, default=3
        Window length, in determined rounds.

    Returns
    -------
    {"trusted", "suspect", "noisy"}

    Raises
    ------
    InvalidParameterError
        If ``current``, ``m`` or ``w`` is invalid.
    InvalidInputError
        If an entry of ``recent_flags`` is not a bool or None.
    """
    status = check_choice("current", current, _STATUSES)
    window = check_int("w", w, min_value=1)
    needed = check_int("m", m, min_value=1, max_value=window)
    determined: list[bool] = []
    for i, flag in enumerate(recent_flags):
        if flag is None:
            continue
        if not isinstance(flag, bool | np.bool_):
            raise InvalidInputError(
                f"recent_flags[{i}]: expected a bool or None, got {type(flag).__name__}"
            )
        determined.append(bool(flag))
    last = determined[-window:]
    if sum(last) >= needed:
        return "noisy"
    if len(determined) >= window and not any(last):
        return "trusted"
    if determined and determined[-1]:
        return "noisy" if status == "noisy" else "suspect"
    return cast(ClientStatus, status)
