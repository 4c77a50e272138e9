"""The audit of one round: detectors, reliability, neighbors, aggregation and centroids.

:func:`run_audit` composes the pure algorithms of this package in the order the coordinator
needs them at a round close (docs/algorithms.md):

1. every configured detector (FedNoRo per-class-loss GMM, Fed-NCL reliability score, FedRN
   expertise), each kept separately in the outcome;
2. the primary detector's flags (``None`` per client when it is undetermined), and the set of
   clients the aggregation treats as noisy: by default those whose status after this round
   (:func:`~service.audit.detection.next_status` over their flag history) is "noisy", so one
   chance flag does not change the aggregate (``AuditConfig.aggregation_flags``);
3. FedRN k-reliable neighbors of every client (when probes and accuracies are present);
4. the configured aggregation rule, streamed tensor by tensor, with a recorded FedAvg
   fallback when the rule needs flags or probabilities the primary detector could not give;
5. RoFL global centroids (when clients sent local centroids).

An audit that cannot decide never raises: the detector says "undetermined" with the reason
and the aggregation falls back to FedAvg with the reason recorded. Invalid configuration or
malformed client data raise :class:`~service.audit._validation.InvalidParameterError` /
:class:`~service.audit._validation.InvalidInputError`.

The Fed-NCL divergence and the aggregation share the round's reads of the updates
(:class:`~service.audit.blocks.RoundPass`): one blocked pass computes the divergences together
with, for FedAvg, the new state and, for DaAgg, the Gram matrices its distances need; DaAgg and the
layer-wise rule then read the updates once more for their weighted sum. Never all states at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from service.audit._json import to_jsonable
from service.audit._typing import FloatArray, IntArray
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
from service.audit.aggregation import (
    AGGREGATION_RULES,
    NOISY_SET_RULES,
    aggregate,
    with_fallback_context,
)
from service.audit.aggregators.common import AggregationResult
from service.audit.aggregators.fedavg import planned_fedavg_weights
from service.audit.aggregators.weight_cap import DEFAULT_MAX_CLIENT_WEIGHT_FACTOR
from service.audit.blocks import RoundPass
from service.audit.centroids import aggregate_centroids
from service.audit.detection import ClientStatus, DetectionResult, next_status
from service.audit.detectors.expertise import expertise_detection
from service.audit.detectors.fedncl import FedNCLDetector, fedncl_divergences
from service.audit.detectors.fednoro import (
    SEPARATION_GROUPS,
    SEPARATION_STATISTICS,
    FedNoRoDetector,
)
from service.audit.evidence import EvidenceDetector
from service.audit.reliability import k_reliable_neighbors
from service.audit.state import StateReader

__all__ = [
    "DETECTORS",
    "PRIMARY_DETECTORS",
    "AuditConfig",
    "AuditOutcome",
    "ClientRoundData",
    "StatusHistory",
    "run_audit",
]

DETECTORS = ("fednoro", "fedncl", "expertise", "evidence")
"""Detector names accepted in :attr:`AuditConfig.detectors`."""

PRIMARY_DETECTORS = ("fednoro", "fedncl", "evidence")
"""Detectors that flag clients and can therefore be primary."""

AGGREGATION_FLAGS = ("status", "round")
"""What decides the aggregation's noisy set (:attr:`AuditConfig.aggregation_flags`)."""

EXACT_NEIGHBOR_LIMIT = 2048
"""Up to this many neighbor candidates the exact K x K search is used (a few MB)."""

AUTO_NEIGHBOR_CHUNK_ENTRIES = 1 << 18
"""Beyond it, target rows go in chunks of ``AUTO_NEIGHBOR_CHUNK_ENTRIES // K`` rows, so each
chunk x K temporary holds about 262,000 entries (2 MB; the search keeps a handful of them, about
15 MB in all) whatever K is."""


@dataclass(frozen=True, kw_only=True)
class ClientRoundData:
    """What one client reported for the round (docs/algorithms.md, "Signals").

    Attributes
    ----------
    client_id : str
        Unique, non-empty.
    num_samples : int
        n_k, the size of the local training set (>= 1).
    class_counts : array-like of int of shape (n_classes,)
        Histogram of the client's (possibly noisy) labels.
    per_class_loss : array-like of shape (n_classes,), optional
        Mean loss per given label under theta_G; NaN/None where the count is 0 (FedNoRo).
    per_class_loss_sd : array-like of shape (n_classes,), optional
        Standard deviation (ddof 0) of the same per-sample losses; NaN/None where the count is
        0 (the calibrated evidence's within-site standard error, ``service.audit.evidence``).
    train_loss : float, optional
        Mean training cross-entropy (Fed-NCL h_k).
    train_accuracy : float, optional
        Accuracy of theta_k on its own labels, in [0, 1] (FedRN expertise).
    probe_softmax : array-like of shape (n_probe_inputs, n_classes), optional
        theta_k's softmax on the round's probe (FedRN similarity).
    centroids : array-like of shape (n_classes, dim), optional
        RoFL local class centroids.
    state : StateReader
        theta_k.
    """

    client_id: str
    num_samples: int
    class_counts: IntArray | Sequence[int]
    state: StateReader
    per_class_loss: FloatArray | Sequence[float | None] | None = None
    per_class_loss_sd: FloatArray | Sequence[float | None] | None = None
    train_loss: float | None = None
    train_accuracy: float | None = None
    probe_softmax: FloatArray | Sequence[Sequence[float]] | None = None
    centroids: FloatArray | Sequence[Sequence[float]] | None = None


@dataclass(frozen=True)
class StatusHistory:
    """What the server knows about a client before this round's audit.

    Attributes
    ----------
    status : {"trusted", "suspect", "noisy"}
        The client's status after its previous audited round ("trusted" when new).
    flags : sequence of bool or None
        The primary detector's flags for the client in earlier rounds after the warm-up, oldest
        first (None = undetermined); only the last ``status_w`` determined ones matter.
    """

    status: str = "trusted"
    flags: Sequence[bool | None] = ()


@dataclass(frozen=True)
class AuditConfig:
    """Every hyper-parameter of an audit; defaults from the papers (docs/algorithms.md).

    Attributes
    ----------
    detectors : tuple of str or None
        Detectors to run (``"fednoro"``, ``"fedncl"``, ``"expertise"``, ``"evidence"``). None:
        every detector whose inputs some client sent; the primary detector always appears in the
        outcome.
    primary_detector : str
        ``"evidence"`` (default: the calibrated per-site test of :mod:`service.audit.evidence`,
        which abstains rather than accuse when the consensus is suspect), ``"fednoro"`` or
        ``"fedncl"``: whose flags drive aggregation and roles (see ``aggregation_flags``).
    aggregation : str
        One of ``fedavg``, ``daagg``, ``fedncl_layerwise``, ``trimmed_mean``, ``median``,
        ``reliability_weighted`` (the last needs ``primary_detector="fednoro"``, the only
        detector giving probabilities).
    fednoro_random_states, fednoro_require_separation, fednoro_separation_threshold, \
fednoro_separation_quantile, fednoro_separation_statistic, fednoro_min_clients
        :class:`~service.audit.detectors.fednoro.FedNoRoDetector` parameters.
    evidence_q, evidence_min_clients, evidence_min_informativeness, \
evidence_max_flagged_fraction, evidence_max_heterogeneity, evidence_min_class_count
        :class:`~service.audit.evidence.EvidenceDetector` parameters (``q``, ``min_clients``,
        ``min_informativeness``, ``max_flagged_fraction``, ``max_heterogeneity``,
        ``min_class_count``): the calibrated evidence with a stated false-alarm rate,
        abstention and trust anchors.
    fednoro_confirmed_groups : bool
        True (default): when FedNoRo is the primary detector, the clients whose status before
        the round is "noisy" (from the :class:`StatusHistory` given to :func:`run_audit`) are
        its ``confirmed`` clients, and a vote whose noisy group lies within them needs only
        ``fednoro_separation_threshold``, not the calibrated quantile
        (:meth:`~service.audit.detectors.fednoro.FedNoRoDetector.fit`). False: the quantile every
        round.
    fednoro_separation_groups : str
        ``"all_fits"`` (default): the separation guard judges every distinct noisy set the
        mixture's fits propose, each at the quantile corrected for their number (Bonferroni),
        and flags the first that passes, most votes first; ``"majority"``: only the noisy set
        most fits agree on (the reference's vote)
        (:class:`~service.audit.detectors.fednoro.FedNoRoDetector`, ``separation_groups``).
    fedncl_beta, fedncl_two_sided, fedncl_loss_mode, fedncl_min_clients
        :class:`~service.audit.detectors.fedncl.FedNCLDetector` parameters.
    fedncl_divergence_variant : str
        ``"paper"`` or ``"reference"`` (:func:`~service.audit.detectors.fedncl.fedncl_divergences`).
    fedncl_tau : float
        Maximum layer-wise penalty (tau, 50).
    fedncl_t_corr : int
        T_corr (60 of the paper's 150 rounds; scale it with
        :func:`~service.audit.schedules.scale_rounds`).
    fedncl_t_k : int or None
        Rounds for the penalty to reach tau; None = ``fedncl_t_corr`` (Fed-NCL eq. 14).
    fedncl_alpha : float
        Persistence fraction for label-correction candidates (eq. 17).
    fedrn_k, fedrn_alpha, fedrn_similarity
        k-reliable neighbors: k, alpha, and whether probes are ``"softmax"`` or ``"logit"``.
    neighbor_chunk_size : int or None
        None: automatic (exact K x K search up to ``EXACT_NEIGHBOR_LIMIT`` candidates, chunks of
        ``AUTO_NEIGHBOR_CHUNK_ENTRIES // K`` rows beyond); an int: always chunked (memory
        ``chunk x K``). Both give identical neighbors.
    daagg_variant : str
        ``"paper"`` or ``"reference"`` distance for DaAgg.
    trim_fraction : float
        Trimmed mean: fraction trimmed per side, in [0, 0.5).
    status_m, status_w : int
        History rule of :func:`~service.audit.detection.next_status` (noisy after m flags in
        the last w determined rounds).
    aggregation_flags : str
        Which clients the noisy-set rules (``daagg``, ``fedncl_layerwise``) treat as noisy.
        ``"status"`` (default): those whose status after this round is "noisy" (the rule of
        ``status_m`` / ``status_w`` applied to the :class:`StatusHistory` given to
        :func:`run_audit` plus this round's flag), the same status that decides the clients'
        training roles, so one chance flag does not down-weight a client. ``"round"``: this
        round's primary flags as they are (as the papers write it). Either way an
        admin's pin wins. ``reliability_weighted`` reads the round's probabilities in both
        modes.
    max_client_weight_factor : float or None
        Bounded influence: no client's aggregation weight exceeds min(1, f / K) for the K
        clients of the round (f = 4.0 by default: nothing changes up to 4 clients; >= 1);
        the excess goes to the others by water-filling
        (:func:`~service.audit.aggregators.weight_cap.cap_weights`). None: no cap.
    """

    detectors: tuple[str, ...] | None = None
    primary_detector: str = "evidence"
    aggregation: str = "fedavg"
    fednoro_random_states: tuple[int, ...] = tuple(range(9))
    fednoro_require_separation: bool = True
    fednoro_separation_threshold: float = 2.0
    fednoro_separation_quantile: float | None = 0.99
    fednoro_separation_statistic: str = "class_z"
    fednoro_min_clients: int = 4
    evidence_q: float = 0.01
    evidence_min_clients: int = 5
    evidence_min_informativeness: float = 0.05
    evidence_max_flagged_fraction: float = 0.5
    evidence_max_heterogeneity: float = 0.9
    evidence_min_class_count: int = 5
    fednoro_confirmed_groups: bool = True
    fednoro_separation_groups: str = "all_fits"
    fedncl_beta: float = 1.0
    fedncl_two_sided: bool = False
    fedncl_divergence_variant: str = "paper"
    fedncl_loss_mode: str = "sum"
    fedncl_min_clients: int = 3
    fedncl_tau: float = 50.0
    fedncl_t_corr: int = 60
    fedncl_t_k: int | None = None
    fedncl_alpha: float = 0.6
    fedrn_k: int = 2
    fedrn_alpha: float = 0.6
    fedrn_similarity: str = "softmax"
    neighbor_chunk_size: int | None = None
    daagg_variant: str = "paper"
    trim_fraction: float = 0.1
    status_m: int = 2
    status_w: int = 3
    aggregation_flags: str = "status"
    max_client_weight_factor: float | None = DEFAULT_MAX_CLIENT_WEIGHT_FACTOR

    def __post_init__(self) -> None:
        """Validate every field; lists become tuples and ints become floats where needed."""
        set_ = object.__setattr__
        if self.detectors is not None:
            detectors = _str_tuple("detectors", self.detectors, DETECTORS)
            set_(self, "detectors", detectors)
            if len(set(detectors)) != len(detectors):
                raise InvalidParameterError("detectors: names must be unique")
        check_choice("primary_detector", self.primary_detector, PRIMARY_DETECTORS)
        if self.detectors is not None and self.primary_detector not in self.detectors:
            raise InvalidParameterError(
                f"detectors: must include primary_detector {self.primary_detector!r}"
            )
        check_choice("aggregation", self.aggregation, AGGREGATION_RULES)
        if self.aggregation == "reliability_weighted" and self.primary_detector != "fednoro":
            raise InvalidParameterError(
                "aggregation: 'reliability_weighted' needs noisy probabilities, which only "
                "primary_detector='fednoro' gives"
            )
        seeds = self.fednoro_random_states
        if isinstance(seeds, str) or not isinstance(seeds, Sequence) or len(seeds) == 0:
            raise InvalidParameterError(
                "fednoro_random_states: expected a non-empty sequence of ints"
            )
        set_(
            self,
            "fednoro_random_states",
            tuple(
                check_int(f"fednoro_random_states[{i}]", s, min_value=0, max_value=2**32 - 1)
                for i, s in enumerate(seeds)
            ),
        )
        check_bool("fednoro_require_separation", self.fednoro_require_separation)
        check_bool("fednoro_confirmed_groups", self.fednoro_confirmed_groups)
        if self.fednoro_separation_quantile is not None:
            set_(
                self,
                "fednoro_separation_quantile",
                check_float(
                    "fednoro_separation_quantile",
                    self.fednoro_separation_quantile,
                    min_value=0.0,
                    max_value=1.0,
                    min_inclusive=False,
                    max_inclusive=False,
                ),
            )
        check_choice(
            "fednoro_separation_statistic",
            self.fednoro_separation_statistic,
            SEPARATION_STATISTICS,
        )
        check_choice("fednoro_separation_groups", self.fednoro_separation_groups, SEPARATION_GROUPS)
        if (
            self.fednoro_separation_groups == "all_fits"
            and self.fednoro_require_separation
            and self.fednoro_separation_quantile is None
        ):
            raise InvalidParameterError(
                "fednoro_separation_groups: 'all_fits' needs fednoro_separation_quantile (the "
                "levels of the groups judged are corrected for their number); set "
                "fednoro_separation_groups to 'majority' for the guard of ALGORITHMS.md as written"
            )
        floats = {
            "fednoro_separation_threshold": (0.0, None),
            "fedncl_beta": (0.0, None),
            "fedncl_tau": (1.0, None),
            "fedncl_alpha": (0.0, 1.0),
            "fedrn_alpha": (0.0, 1.0),
        }
        for name, (lo, hi) in floats.items():
            set_(self, name, check_float(name, getattr(self, name), min_value=lo, max_value=hi))
        set_(
            self,
            "trim_fraction",
            check_float(
                "trim_fraction",
                self.trim_fraction,
                min_value=0.0,
                max_value=0.5,
                max_inclusive=False,
            ),
        )
        check_int("fednoro_min_clients", self.fednoro_min_clients, min_value=2)
        # EvidenceDetector validates its own parameters; build one to fail here, not at a round.
        _evidence_detector(self)
        check_bool("fedncl_two_sided", self.fedncl_two_sided)
        check_choice(
            "fedncl_divergence_variant", self.fedncl_divergence_variant, ("paper", "reference")
        )
        check_choice("fedncl_loss_mode", self.fedncl_loss_mode, ("sum", "mean"))
        check_int("fedncl_min_clients", self.fedncl_min_clients, min_value=2)
        check_int("fedncl_t_corr", self.fedncl_t_corr, min_value=1)
        if self.fedncl_t_k is not None:
            check_int("fedncl_t_k", self.fedncl_t_k, min_value=1)
        check_int("fedrn_k", self.fedrn_k, min_value=1)
        check_choice("fedrn_similarity", self.fedrn_similarity, ("softmax", "logit"))
        if self.neighbor_chunk_size is not None:
            check_int("neighbor_chunk_size", self.neighbor_chunk_size, min_value=1)
        check_choice("daagg_variant", self.daagg_variant, ("paper", "reference"))
        window = check_int("status_w", self.status_w, min_value=1)
        check_int("status_m", self.status_m, min_value=1, max_value=window)
        check_choice("aggregation_flags", self.aggregation_flags, AGGREGATION_FLAGS)
        if self.max_client_weight_factor is not None:
            set_(
                self,
                "max_client_weight_factor",
                check_float(
                    "max_client_weight_factor", self.max_client_weight_factor, min_value=1.0
                ),
            )

    def to_json(self) -> dict[str, Any]:
        """Return the configuration as plain JSON values (tuples become lists)."""
        return cast(dict[str, Any], to_jsonable(dataclasses.asdict(self)))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AuditConfig:
        """Build a configuration from :meth:`to_json` output; missing keys take defaults.

        Raises
        ------
        InvalidParameterError
            If ``data`` is not a mapping, holds an unknown key, or a value is invalid.
        """
        if not isinstance(data, Mapping):
            raise InvalidParameterError(f"data: expected a mapping, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(key) for key in data if key not in known)
        if unknown:
            raise InvalidParameterError(f"data: unknown configuration key(s) {unknown}")
        return cls(**dict(data))


def _str_tuple(name: str, value: Any, choices: Sequence[str]) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise InvalidParameterError(f"{name}: expected a sequence of names")
    return tuple(check_choice(f"{name}[{i}]", v, choices) for i, v in enumerate(value))


@dataclass(frozen=True)
class AuditOutcome:
    """Everything one audit decided.

    Attributes
    ----------
    detections : dict of str to DetectionResult
        Per detector name, each kept separately (never merged).
    primary : str
        The primary detector's name.
    primary_flags : list of bool or None
        Aligned with the clients; None = undetermined.
    expertise : list of float or None
        FedRN expertise per client, when every client reported an accuracy.
    neighbors : dict or None
        client_id -> list of ``{"client_id", "weight"}`` (R'), best neighbor first.
    self_weights : dict or None
        client_id -> R'(c, c).
    aggregation : AggregationResult
        The new global state and the weights used.
    centroids : ndarray of shape (n_classes, dim) or None
        New RoFL global centroids.
    client_ids : list of str
        The clients, in input order (what the per-client lists are aligned with).
    centroid_weights : ndarray of shape (n_clients, n_classes) or None
        Weights of the centroid aggregation.
    effective_flags : list of bool or None, optional
        The primary flags with the caller's overrides (an admin's pins) applied. None when no
        override was given.
    aggregation_flags : list of bool or None, optional
        The noisy set the aggregation rule was given (see :attr:`AuditConfig.aggregation_flags`;
        pins applied). None when the rule reads no noisy set or the primary detector is
        undetermined.
    """

    detections: dict[str, DetectionResult]
    primary: str
    primary_flags: list[bool | None]
    expertise: list[float] | None
    neighbors: dict[str, list[dict[str, Any]]] | None
    self_weights: dict[str, float] | None
    aggregation: AggregationResult
    centroids: FloatArray | None
    client_ids: list[str] = field(default_factory=list)
    centroid_weights: FloatArray | None = None
    effective_flags: list[bool | None] | None = None
    aggregation_flags: list[bool] | None = None

    def to_json(self) -> dict[str, Any]:
        """Return everything but the aggregated state as plain JSON values (NaN-free)."""
        return {
            "client_ids": list(self.client_ids),
            "detections": {name: r.to_json() for name, r in self.detections.items()},
            "primary": self.primary,
            "primary_flags": list(self.primary_flags),
            "expertise": to_jsonable(self.expertise, "$.expertise"),
            "neighbors": to_jsonable(self.neighbors, "$.neighbors"),
            "self_weights": to_jsonable(self.self_weights, "$.self_weights"),
            "aggregation": self.aggregation.to_json(),
            "centroids": to_jsonable(self.centroids, "$.centroids"),
            "centroid_weights": to_jsonable(self.centroid_weights, "$.centroid_weights"),
            "effective_flags": (
                None if self.effective_flags is None else list(self.effective_flags)
            ),
            "aggregation_flags": (
                None if self.aggregation_flags is None else list(self.aggregation_flags)
            ),
        }


# --------------------------------------------------------------------------------------------
# run_audit
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Checked:
    """Validated per-client inputs of one audit."""

    ids: list[str]
    num_samples: IntArray
    class_counts: IntArray
    per_class_loss: list[FloatArray | None]
    per_class_loss_sd: list[FloatArray | None]
    train_loss: list[float | None]
    train_accuracy: list[float | None]
    probes: list[FloatArray | None]
    centroids: list[FloatArray | None]
    states: list[StateReader]


def _check_clients(clients: Sequence[ClientRoundData], label: str) -> _Checked:
    ids: list[str] = []
    n: list[int] = []
    counts: list[IntArray] = []
    losses: list[FloatArray | None] = []
    spreads: list[FloatArray | None] = []
    train_loss: list[float | None] = []
    accuracy: list[float | None] = []
    probes: list[FloatArray | None] = []
    centroids: list[FloatArray | None] = []
    states: list[StateReader] = []
    for i, client in enumerate(clients):
        where = f"{label}[{i}]"
        if not isinstance(client, ClientRoundData):
            raise InvalidInputError(f"{where}: expected ClientRoundData")
        if not isinstance(client.client_id, str) or not client.client_id:
            raise InvalidInputError(f"{where}.client_id: expected a non-empty str")
        if client.client_id in ids:
            raise InvalidInputError(f"{where}.client_id: duplicate {client.client_id!r}")
        ids.append(client.client_id)
        if (
            isinstance(client.num_samples, bool)
            or not isinstance(client.num_samples, int | np.integer)
            or client.num_samples < 1
        ):
            raise InvalidInputError(f"{where}.num_samples: expected a positive int")
        n.append(int(client.num_samples))
        row = as_int_array(f"{where}.class_counts", client.class_counts, ndim=1, min_value=0)
        if counts and row.shape != counts[0].shape:
            raise InvalidInputError(
                f"{where}.class_counts: {row.size} classes, expected {counts[0].size}"
            )
        counts.append(row)
        losses.append(_optional_row(f"{where}.per_class_loss", client.per_class_loss, row.size))
        spreads.append(
            _optional_row(f"{where}.per_class_loss_sd", client.per_class_loss_sd, row.size)
        )
        train_loss.append(_optional_scalar(f"{where}.train_loss", client.train_loss, 0.0, None))
        accuracy.append(
            _optional_scalar(f"{where}.train_accuracy", client.train_accuracy, 0.0, 1.0)
        )
        probes.append(_optional_matrix(f"{where}.probe_softmax", client.probe_softmax))
        centroids.append(_optional_matrix(f"{where}.centroids", client.centroids))
        if not isinstance(client.state, StateReader):
            raise InvalidInputError(f"{where}.state: expected a StateReader")
        states.append(client.state)
    n_classes = counts[0].size if counts else 0
    return _Checked(
        ids=ids,
        num_samples=np.asarray(n, dtype=np.int64),
        class_counts=np.stack(counts) if counts else np.zeros((0, n_classes), dtype=np.int64),
        per_class_loss=losses,
        per_class_loss_sd=spreads,
        train_loss=train_loss,
        train_accuracy=accuracy,
        probes=probes,
        centroids=centroids,
        states=states,
    )


def _optional_row(name: str, value: Any, n_classes: int) -> FloatArray | None:
    """A per-class float row (NaN allowed where the class is absent) of n_classes entries."""
    if value is None:
        return None
    array = as_float_array(name, value, ndim=1, allow_nan=True)
    if array.size != n_classes:
        raise InvalidInputError(f"{name}: {array.size} classes, expected {n_classes}")
    return array


def _optional_scalar(name: str, value: Any, lo: float, hi: float | None) -> float | None:
    if value is None:
        return None
    try:
        return check_float(name, value, min_value=lo, max_value=hi)
    except InvalidParameterError as exc:
        raise InvalidInputError(str(exc)) from None


def _optional_matrix(name: str, value: Any) -> FloatArray | None:
    if value is None:
        return None
    return as_float_array(name, value, ndim=2)


def _missing(ids: list[str], values: Sequence[object | None]) -> list[str]:
    return [cid for cid, v in zip(ids, values, strict=True) if v is None]


def _undetermined(method: str, n_clients: int, reason: str) -> DetectionResult:
    return DetectionResult(method, "undetermined", reason, [None] * n_clients, {})


def _run_fednoro(
    data: _Checked, config: AuditConfig, history: Sequence[StatusHistory] | None
) -> DetectionResult:
    absent = _missing(data.ids, data.per_class_loss)
    if absent:
        return _undetermined("fednoro", len(data.ids), f"no per_class_loss from client(s) {absent}")
    detector = FedNoRoDetector(
        random_states=config.fednoro_random_states,
        require_separation=config.fednoro_require_separation,
        separation_threshold=config.fednoro_separation_threshold,
        separation_quantile=config.fednoro_separation_quantile,
        separation_statistic=config.fednoro_separation_statistic,
        separation_groups=config.fednoro_separation_groups,
        min_clients=config.fednoro_min_clients,
    )
    loss = np.stack([cast(FloatArray, v) for v in data.per_class_loss])
    confirmed = None
    if (
        config.fednoro_confirmed_groups
        and config.primary_detector == "fednoro"
        and history is not None
    ):
        confirmed = np.array([entry.status == "noisy" for entry in history], dtype=bool)
    result: DetectionResult = detector.fit(loss, data.class_counts, confirmed).result_
    return result


def _evidence_detector(config: AuditConfig) -> EvidenceDetector:
    return EvidenceDetector(
        q=config.evidence_q,
        min_clients=config.evidence_min_clients,
        min_informativeness=config.evidence_min_informativeness,
        max_flagged_fraction=config.evidence_max_flagged_fraction,
        max_heterogeneity=config.evidence_max_heterogeneity,
        min_class_count=config.evidence_min_class_count,
    )


def _run_evidence(
    data: _Checked, config: AuditConfig, anchors: Sequence[bool] | None
) -> DetectionResult:
    absent = _missing(data.ids, data.per_class_loss)
    if absent:
        return _undetermined(
            "evidence", len(data.ids), f"no per_class_loss from client(s) {absent}"
        )
    loss = np.stack([cast(FloatArray, v) for v in data.per_class_loss])
    # The reported spreads are used only when every client sent them (a round mixes no models).
    spreads = (
        None
        if any(v is None for v in data.per_class_loss_sd)
        else np.stack([cast(FloatArray, v) for v in data.per_class_loss_sd])
    )
    return _evidence_detector(config).fit(loss, data.class_counts, spreads, anchors=anchors)


def _run_fedncl(data: _Checked, config: AuditConfig, shared: RoundPass) -> DetectionResult:
    absent = _missing(data.ids, data.train_loss)
    if absent:
        return _undetermined("fedncl", len(data.ids), f"no train_loss from client(s) {absent}")
    detector = FedNCLDetector(
        beta=config.fedncl_beta,
        two_sided=config.fedncl_two_sided,
        min_clients=config.fedncl_min_clients,
        loss_mode=config.fedncl_loss_mode,
    )
    if len(data.ids) < config.fedncl_min_clients:
        # Too few clients to decide: skip reading every state for the divergence.
        divergence = np.zeros(len(data.ids))
    else:
        divergence = fedncl_divergences(
            shared.global_state, data.states, config.fedncl_divergence_variant, shared=shared
        )
    result: DetectionResult = detector.fit(
        divergence, np.asarray(data.train_loss, dtype=np.float64), data.num_samples
    ).result_
    return result


def _run_expertise(data: _Checked) -> DetectionResult:
    absent = _missing(data.ids, data.train_accuracy)
    if absent:
        return _undetermined(
            "expertise", len(data.ids), f"no train_accuracy from client(s) {absent}"
        )
    return expertise_detection(np.asarray(data.train_accuracy, dtype=np.float64))


def _detector_present(name: str, data: _Checked) -> bool:
    values: Sequence[object | None]
    if name in ("fednoro", "evidence"):
        values = data.per_class_loss
    elif name == "fedncl":
        values = data.train_loss
    else:
        values = data.train_accuracy
    return any(v is not None for v in values)


def _neighbors(
    data: _Checked, candidates: _Checked, config: AuditConfig
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, float]] | None:
    if _missing(data.ids, data.probes) or _missing(data.ids, data.train_accuracy):
        return None
    own = {cid: i for i, cid in enumerate(data.ids)}
    pool_ids: list[str] = []
    pool_probes: list[FloatArray] = []
    pool_acc: list[float] = []
    for i, cid in enumerate(candidates.ids):
        source, j = (data, own[cid]) if cid in own else (candidates, i)
        probe, acc = source.probes[j], source.train_accuracy[j]
        if probe is None or acc is None:
            continue  # a candidate without the signals cannot be compared
        pool_ids.append(cid)
        pool_probes.append(probe)
        pool_acc.append(acc)
    n_candidates = len(pool_ids)
    in_pool = set(pool_ids)
    for i, cid in enumerate(data.ids):
        if cid not in in_pool:
            pool_ids.append(cid)
            pool_probes.append(cast(FloatArray, data.probes[i]))
            pool_acc.append(cast(float, data.train_accuracy[i]))
    shape = pool_probes[0].shape
    for cid, probe in zip(pool_ids, pool_probes, strict=True):
        if probe.shape != shape:
            raise InvalidInputError(
                f"probe_softmax: client {cid!r} has shape {probe.shape}, expected {shape}"
            )
    index = {cid: i for i, cid in enumerate(pool_ids)}
    sets = k_reliable_neighbors(
        np.stack(pool_probes),
        np.asarray(pool_acc, dtype=np.float64),
        k=config.fedrn_k,
        alpha=config.fedrn_alpha,
        targets=[index[cid] for cid in data.ids],
        candidates=list(range(n_candidates)),
        chunk_size=(
            config.neighbor_chunk_size
            if config.neighbor_chunk_size is not None
            else (
                None
                if len(pool_ids) <= EXACT_NEIGHBOR_LIMIT
                else max(1, AUTO_NEIGHBOR_CHUNK_ENTRIES // len(pool_ids))
            )
        ),
        variant=config.fedrn_similarity,
    )
    neighbors: dict[str, list[dict[str, Any]]] = {}
    self_weights: dict[str, float] = {}
    for t, cid in enumerate(data.ids):
        neighbors[cid] = [
            {"client_id": pool_ids[j], "weight": w}
            for j, w in zip(sets.neighbors[t], sets.weights[t], strict=True)
        ]
        self_weights[cid] = sets.self_weight[t]
    return neighbors, self_weights


def _centroids(data: _Checked, previous: Any) -> tuple[FloatArray, FloatArray] | None:
    given = [c for c in data.centroids if c is not None]
    if not given:
        return None
    n_classes = data.class_counts.shape[1]
    shape = given[0].shape
    if shape[0] != n_classes:
        raise InvalidInputError(f"centroids: {shape[0]} classes, expected {n_classes}")
    local = np.zeros((len(data.ids), *shape))
    present = data.class_counts > 0
    for i, c in enumerate(data.centroids):
        if c is None:
            present[i] = False
        elif c.shape != shape:
            raise InvalidInputError(
                f"centroids: client {data.ids[i]!r} has shape {c.shape}, expected {shape}"
            )
        else:
            local[i] = c
    return aggregate_centroids(previous, local, present)


def run_audit(
    global_state: StateReader,
    clients: Sequence[ClientRoundData],
    config: AuditConfig,
    *,
    round_index: int,
    previous_centroids: FloatArray | None = None,
    neighbor_candidates: Sequence[ClientRoundData] | None = None,
    flag_overrides: Sequence[bool | None] | None = None,
    status_history: Sequence[StatusHistory] | None = None,
    anchors: Sequence[bool] | None = None,
) -> AuditOutcome:
    """Audit one round and aggregate its updates.

    Parameters
    ----------
    global_state : StateReader
        theta_G, the model broadcast this round.
    clients : sequence of ClientRoundData
        This round's reports (at least one).
    config : AuditConfig
        Hyper-parameters.
    round_index : int
        0-based index of the round (Fed-NCL layer-wise penalty schedule).
    previous_centroids : ndarray of shape (n_classes, dim), optional
        Last round's global RoFL centroids.
    neighbor_candidates : sequence of ClientRoundData, optional
        Clients whose latest local model is stored and may serve as FedRN neighbors (default:
        ``clients``). Matched by ``client_id``; a client present in both uses its ``clients``
        entry (this round's signals). Candidates without probe or accuracy are skipped; a
        client missing from the candidates is a target only. Only their probes and
        accuracies are read.
    flag_overrides : sequence of bool or None, optional
        Aligned with ``clients``: True/False forces that client's flag (and its noisy
        probability to 1/0) for the aggregation, None keeps the primary detector's verdict.
        This is how an admin's pin reaches the aggregation; the detectors' own results are
        reported unchanged. Ignored for the aggregation when the primary detector is
        undetermined (FedAvg fallback).
    status_history : sequence of StatusHistory, optional
        Aligned with ``clients``: each client's status and earlier flags, from which
        ``aggregation_flags="status"`` decides the noisy set. None: every client is new
        (trusted, no earlier flag), so with the default ``status_m = 2`` nobody is noisy for
        the aggregation in a single call; pass ``aggregation_flags="round"`` to aggregate on
        this round's flags alone.
    anchors : sequence of bool, optional
        Aligned with ``clients``: True for a trust anchor (a site an admin marked as curated),
        used by the ``evidence`` detector (:mod:`service.audit.evidence`, "Trust anchors").

    Returns
    -------
    AuditOutcome
        Detector results, primary flags, expertise, neighbors, aggregation and centroids.
        A detector whose inputs are missing for some client is "undetermined" (never run on
        a subset). Neighbors are computed when every client sent a probe and an accuracy.
        Centroids when at least one client sent them (classes a client does not hold, or
        clients without centroids, get weight 0).

    Raises
    ------
    InvalidParameterError
        If ``config`` is not an :class:`AuditConfig` or ``round_index`` is negative.
    InvalidInputError
        If there is no client, an id repeats, a client's arrays or state are malformed, or
        ``status_history`` does not match the clients.
    """
    if not isinstance(config, AuditConfig):
        raise InvalidParameterError(f"config: expected AuditConfig, got {type(config).__name__}")
    rnd = check_int("round_index", round_index, min_value=0)
    if len(clients) == 0:
        raise InvalidInputError("clients: at least one client is needed")
    data = _check_clients(clients, "clients")
    _check_history(status_history, len(data.ids))
    if anchors is not None and len(anchors) != len(data.ids):
        raise InvalidInputError(f"anchors: {len(anchors)} entries for {len(data.ids)} clients")

    shared = _round_pass(global_state, data, config)
    names = config.detectors
    if names is None:
        names = tuple(
            d for d in DETECTORS if d == config.primary_detector or _detector_present(d, data)
        )
    detections: dict[str, DetectionResult] = {}
    for name in names:
        if name == "fednoro":
            detections[name] = _run_fednoro(data, config, status_history)
        elif name == "evidence":
            detections[name] = _run_evidence(data, config, anchors)
        elif name == "fedncl":
            detections[name] = _run_fedncl(data, config, shared)
        else:
            detections[name] = _run_expertise(data)
    primary = detections[config.primary_detector]
    primary_flags = primary.flags

    expertise_result = detections.get("expertise")
    expertise_values = (
        [cast(float, s) for s in expertise_result.scores]
        if expertise_result is not None and expertise_result.status == "ok"
        else None
    )

    candidates = (
        data
        if neighbor_candidates is None
        else _check_clients(neighbor_candidates, "neighbor_candidates")
    )
    neighbor_info = _neighbors(data, candidates, config)

    effective_flags: list[bool | None] | None = None
    noisy = _noisy_set(primary, config, status_history, len(data.ids))
    probability = (
        np.asarray(primary.probabilities, dtype=np.float64)
        if primary.status == "ok" and primary.method == "fednoro"
        else None
    )
    if flag_overrides is not None:
        if len(flag_overrides) != len(data.ids):
            raise InvalidInputError(
                f"flag_overrides: {len(flag_overrides)} entries for {len(data.ids)} clients"
            )
        effective_flags = list(primary_flags)
        for i, override in enumerate(flag_overrides):
            if override is None:
                continue
            check_bool(f"flag_overrides[{i}]", override)
            effective_flags[i] = override
            if noisy is not None:
                noisy[i] = override
            if probability is not None:
                probability[i] = 1.0 if override else 0.0
    params: dict[str, Any] = {}
    if config.aggregation == "daagg":
        params["variant"] = config.daagg_variant
    elif config.aggregation == "fedncl_layerwise":
        params["tau"] = config.fedncl_tau
        params["t_k"] = (
            config.fedncl_t_k if config.fedncl_t_k is not None else (config.fedncl_t_corr)
        )
    elif config.aggregation == "trimmed_mean":
        params["trim_fraction"] = config.trim_fraction
    aggregation = aggregate(
        config.aggregation,
        global_state,
        data.states,
        data.num_samples,
        noisy=noisy,
        noisy_probability=probability,
        params=params,
        round_index=rnd,
        max_client_weight_factor=config.max_client_weight_factor,
        shared=shared,
    )
    if primary.status != "ok":
        aggregation = with_fallback_context(
            aggregation, f"primary detector {primary.method!r} {primary.status} ({primary.reason})"
        )

    centroid_result = _centroids(data, previous_centroids)
    return AuditOutcome(
        detections=detections,
        primary=config.primary_detector,
        primary_flags=primary_flags,
        expertise=expertise_values,
        neighbors=None if neighbor_info is None else neighbor_info[0],
        self_weights=None if neighbor_info is None else neighbor_info[1],
        aggregation=aggregation,
        centroids=None if centroid_result is None else centroid_result[0],
        client_ids=data.ids,
        centroid_weights=None if centroid_result is None else centroid_result[1],
        effective_flags=effective_flags,
        aggregation_flags=(
            noisy.tolist() if noisy is not None and config.aggregation in NOISY_SET_RULES else None
        ),
    )


GRAM_MAX_CLIENTS = 32
"""Up to this many clients a DaAgg round computes the K x K Gram matrices in the shared pass
(about K / 2 multiply-adds per value read); above it, a pass of DaAgg's own (noisy x clean
products) costs less than the full Gram matrix (measured: at K = 20 the Gram matrices cost about
as much as one more pass, at K = 64 more)."""


def _round_pass(global_state: StateReader, data: _Checked, config: AuditConfig) -> RoundPass:
    """The round's shared pass, planned for what the configured aggregation will ask."""
    if config.aggregation == "fedavg":
        weights = planned_fedavg_weights(data.num_samples, config.max_client_weight_factor)
        return RoundPass(global_state, data.states, weights=weights, chosen=int(np.argmax(weights)))
    gram = config.aggregation == "daagg" and len(data.states) <= GRAM_MAX_CLIENTS
    return RoundPass(global_state, data.states, gram=gram)


def _check_history(history: Sequence[StatusHistory] | None, n_clients: int) -> None:
    """Refuse a status history that does not match the clients (the statuses themselves are
    checked by :func:`~service.audit.detection.next_status` where the rule runs)."""
    if history is None:
        return
    if len(history) != n_clients:
        raise InvalidInputError(f"status_history: {len(history)} entries for {n_clients} clients")
    for i, entry in enumerate(history):
        if not isinstance(entry, StatusHistory):
            raise InvalidInputError(f"status_history[{i}]: expected StatusHistory")
        if isinstance(entry.flags, str) or not isinstance(entry.flags, Sequence):
            raise InvalidInputError(f"status_history[{i}].flags: expected a sequence")


def _noisy_set(
    primary: DetectionResult,
    config: AuditConfig,
    history: Sequence[StatusHistory] | None,
    n_clients: int,
) -> np.ndarray | None:
    """The clients the aggregation treats as noisy, before pins; None when undetermined."""
    if primary.status != "ok":
        return None
    if config.aggregation_flags == "round":
        return np.asarray(primary.flags, dtype=bool)
    noisy = np.zeros(n_clients, dtype=bool)
    for i, flag in enumerate(primary.flags):
        before = StatusHistory() if history is None else history[i]
        try:
            after: ClientStatus = next_status(
                before.status,
                [*before.flags, flag],
                m=config.status_m,
                w=config.status_w,
            )
        except (InvalidInputError, InvalidParameterError) as exc:
            raise InvalidInputError(f"status_history[{i}]: {exc}") from None
        noisy[i] = after == "noisy"
    return noisy
