"""The audit's configuration: :class:`AuditConfig`, every hyper-parameter of one round's audit.

Defaults come from the papers (docs/algorithms.md); the federation configuration of the
coordinator is validated against it. :data:`DETECTORS` and :data:`PRIMARY_DETECTORS` name the
detectors it may select, read from the registry
:data:`~service.audit.detector_registry.DETECTOR_REGISTRY`, whose factories build each configured
detector from its ``<detector>_*`` fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from service.audit._json import to_jsonable
from service.audit._validation import (
    InvalidParameterError,
    check_bool,
    check_choice,
    check_float,
    check_int,
)
from service.audit.aggregation import AGGREGATION_RULES
from service.audit.aggregators.weight_cap import DEFAULT_MAX_CLIENT_WEIGHT_FACTOR
from service.audit.detector_registry import DETECTOR_REGISTRY
from service.audit.detectors.fednoro import SEPARATION_GROUPS, SEPARATION_STATISTICS

__all__ = [
    "AGGREGATION_FLAGS",
    "DETECTORS",
    "PRIMARY_DETECTORS",
    "PROBABILITY_DETECTORS",
    "AuditConfig",
]

DETECTORS = tuple(DETECTOR_REGISTRY)
"""Detector names accepted in :attr:`AuditConfig.detectors`, in the registry's order."""


PRIMARY_DETECTORS = tuple(name for name, spec in DETECTOR_REGISTRY.items() if spec.primary)
"""Detectors that flag clients and can therefore be primary."""

PROBABILITY_DETECTORS = tuple(
    name for name, spec in DETECTOR_REGISTRY.items() if spec.probabilities
)
"""Detectors that give each client a noisy probability (``reliability_weighted`` reads it)."""


AGGREGATION_FLAGS = ("status", "round")
"""What decides the aggregation's noisy set (:attr:`AuditConfig.aggregation_flags`)."""


@dataclass(frozen=True)
class AuditConfig:
    """Every hyper-parameter of an audit; defaults from the papers (docs/algorithms.md).

    Attributes
    ----------
    detectors : tuple of str or None
        Detectors to run, names of :data:`DETECTORS` (``"fednoro"``, ``"fedncl"``,
        ``"expertise"``, ``"evidence"``). None: every detector whose inputs some client sent;
        the primary detector always appears in the outcome.
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
evidence_max_flagged_fraction, evidence_max_heterogeneity, evidence_min_class_count, \
evidence_mixture_check, evidence_accuracy_check, evidence_min_accuracy_gap, \
evidence_error_check, evidence_min_error_excess, evidence_min_error_sites
        :class:`~service.audit.evidence.EvidenceDetector` parameters (``q``, ``min_clients``,
        ``min_informativeness``, ``max_flagged_fraction``, ``max_heterogeneity``,
        ``min_class_count``, ``mixture_check``, ``accuracy_check``, ``min_accuracy_gap``,
        ``error_check``, ``min_error_excess``, ``min_error_sites``): the
        calibrated evidence with a stated
        false-alarm rate, abstention and trust anchors.
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
    evidence_mixture_check: bool = True
    evidence_accuracy_check: bool = False
    evidence_min_accuracy_gap: float = 0.25
    evidence_error_check: bool = False
    evidence_min_error_excess: float = 0.05
    evidence_min_error_sites: int = 10
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
        self._check_methods()
        self._check_fednoro()
        self._check_ranges()
        self._check_rest()

    def _check_methods(self) -> None:
        """The detectors, the primary one and the aggregation rule, and how they fit together."""
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
        if (
            self.aggregation == "reliability_weighted"
            and self.primary_detector not in PROBABILITY_DETECTORS
        ):
            which = " or ".join(f"primary_detector={name!r}" for name in PROBABILITY_DETECTORS)
            raise InvalidParameterError(
                "aggregation: 'reliability_weighted' needs noisy probabilities, which only "
                f"{which} gives"
            )

    def _check_fednoro(self) -> None:
        """FedNoRo's seeds and separation guard."""
        set_ = object.__setattr__
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

    def _check_ranges(self) -> None:
        """The bounded floats, the FedNoRo minimum and the evidence parameters."""
        set_ = object.__setattr__
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
        # A detector validates its own parameters (EvidenceDetector does when it is built):
        # build each one to fail here, not at a round.
        for spec in DETECTOR_REGISTRY.values():
            if spec.build is not None:
                spec.build(self)

    def _check_rest(self) -> None:
        """Fed-NCL, FedRN, DaAgg, the status rule and the weight cap."""
        set_ = object.__setattr__
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
