"""The audit's configuration: :class:`AuditConfig`, every hyper-parameter of one round's audit.

It holds the choice of methods (the detectors, the primary one, the aggregation rule) and one
group of parameters per concern (:mod:`service.audit.config_groups`); outside Python it is one
flat mapping (:data:`FLAT_KEYS`, :meth:`AuditConfig.to_json`, :meth:`AuditConfig.from_json`).
Defaults come from the papers (docs/algorithms.md); the federation configuration of the
coordinator is validated against it. :data:`DETECTORS` and :data:`PRIMARY_DETECTORS` name the
detectors it may select, read from the registry
:data:`~service.audit.detector_registry.DETECTOR_REGISTRY`, whose factories build each configured
detector from its group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from service.audit._json import to_jsonable
from service.audit._validation import InvalidParameterError, check_choice
from service.audit.aggregation import AGGREGATION_RULES
from service.audit.config_groups import (
    AGGREGATION_FLAGS,
    AggregationSettings,
    EvidenceSettings,
    FedNCLSettings,
    FedNoRoSettings,
    FedRNSettings,
    GeometrySettings,
    StatusRule,
)
from service.audit.detector_registry import DETECTOR_REGISTRY

__all__ = [
    "AGGREGATION_FLAGS",
    "DETECTORS",
    "FLAT_KEYS",
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


FLAT_KEYS: dict[str, tuple[str, str]] = {
    "fednoro_random_states": ("fednoro", "random_states"),
    "fednoro_require_separation": ("fednoro", "require_separation"),
    "fednoro_separation_threshold": ("fednoro", "separation_threshold"),
    "fednoro_separation_quantile": ("fednoro", "separation_quantile"),
    "fednoro_separation_statistic": ("fednoro", "separation_statistic"),
    "fednoro_min_clients": ("fednoro", "min_clients"),
    "evidence_q": ("evidence", "q"),
    "evidence_min_clients": ("evidence", "min_clients"),
    "evidence_min_informativeness": ("evidence", "min_informativeness"),
    "evidence_max_flagged_fraction": ("evidence", "max_flagged_fraction"),
    "evidence_max_heterogeneity": ("evidence", "max_heterogeneity"),
    "evidence_min_class_count": ("evidence", "min_class_count"),
    "evidence_mixture_check": ("evidence", "mixture_check"),
    "evidence_accuracy_check": ("evidence", "accuracy_check"),
    "evidence_min_accuracy_gap": ("evidence", "min_accuracy_gap"),
    "evidence_error_check": ("evidence", "error_check"),
    "evidence_min_error_excess": ("evidence", "min_error_excess"),
    "evidence_min_error_sites": ("evidence", "min_error_sites"),
    "evidence_min_error_dispersion": ("evidence", "min_error_dispersion"),
    "evidence_anchored_min_error_excess": ("evidence", "anchored_min_error_excess"),
    "fednoro_confirmed_groups": ("fednoro", "confirmed_groups"),
    "fednoro_separation_groups": ("fednoro", "separation_groups"),
    "fedncl_beta": ("fedncl", "beta"),
    "fedncl_two_sided": ("fedncl", "two_sided"),
    "fedncl_divergence_variant": ("fedncl", "divergence_variant"),
    "fedncl_loss_mode": ("fedncl", "loss_mode"),
    "fedncl_min_clients": ("fedncl", "min_clients"),
    "fedncl_tau": ("fedncl", "tau"),
    "fedncl_t_corr": ("fedncl", "t_corr"),
    "fedncl_t_k": ("fedncl", "t_k"),
    "fedncl_alpha": ("fedncl", "alpha"),
    "fedrn_k": ("fedrn", "k"),
    "fedrn_alpha": ("fedrn", "alpha"),
    "fedrn_similarity": ("fedrn", "similarity"),
    "neighbor_chunk_size": ("fedrn", "chunk_size"),
    "daagg_variant": ("aggregation_settings", "daagg_variant"),
    "trim_fraction": ("aggregation_settings", "trim_fraction"),
    "status_m": ("status", "m"),
    "status_w": ("status", "w"),
    "aggregation_flags": ("aggregation_settings", "flags"),
    "max_client_weight_factor": ("aggregation_settings", "max_client_weight_factor"),
    "anchor_lead": ("aggregation_settings", "anchor_lead"),
    "anchor_lead_only_rounds": ("aggregation_settings", "anchor_lead_only_rounds"),
    "geometry_check": ("geometry", "check"),
    "geometry_min_z": ("geometry", "min_z"),
    "geometry_min_sites": ("geometry", "min_sites"),
    "geometry_min_homogeneity_p": ("geometry", "min_homogeneity_p"),
}
"""The flat keys of the grouped parameters (the API's ``audit`` object, the stored configuration,
the simulator's ``--audit KEY=VALUE``), each to its group of :class:`AuditConfig` and its field
there, in the order :meth:`AuditConfig.to_json` writes them (the order stored configurations have
always had)."""

_GROUPS: dict[str, type[Any]] = {
    "fednoro": FedNoRoSettings,
    "evidence": EvidenceSettings,
    "fedncl": FedNCLSettings,
    "fedrn": FedRNSettings,
    "aggregation_settings": AggregationSettings,
    "status": StatusRule,
    "geometry": GeometrySettings,
}
_METHOD_KEYS = ("detectors", "primary_detector", "aggregation")


@dataclass(frozen=True)
class AuditConfig:
    """Every hyper-parameter of an audit, grouped by concern; defaults from the papers.

    In Python a group is set as a whole, e.g. ``AuditConfig(evidence=EvidenceSettings(q=0.05))``
    (:meth:`dataclasses.replace` on a group changes one value); :meth:`from_flat` and
    :meth:`from_json` take the flat keys (``evidence_q=0.05``) that the API, the stored
    configuration and the simulator use (:data:`FLAT_KEYS`).

    Attributes
    ----------
    detectors : tuple of str or None
        Detectors to run, names of :data:`DETECTORS` (``"fednoro"``, ``"fedncl"``,
        ``"expertise"``, ``"evidence"``). None: every detector whose inputs some client sent;
        the primary detector always appears in the outcome.
    primary_detector : str
        ``"evidence"`` (default: the calibrated per-site test of :mod:`service.audit.evidence`,
        which abstains rather than accuse when the consensus is suspect), ``"fednoro"`` or
        ``"fedncl"``: whose flags drive aggregation and roles (see
        :attr:`AggregationSettings.flags <service.audit.config_groups.AggregationSettings.flags>`).
    aggregation : str
        One of ``fedavg``, ``daagg``, ``fedncl_layerwise``, ``trimmed_mean``, ``median``,
        ``reliability_weighted`` (the last needs ``primary_detector="fednoro"``, the only
        detector giving probabilities).
    fednoro : FedNoRoSettings
        FedNoRo's mixture detector (``fednoro_*``).
    evidence : EvidenceSettings
        The calibrated evidence detector (``evidence_*``).
    fedncl : FedNCLSettings
        Fed-NCL's detector, layer-wise penalty and label correction (``fedncl_*``).
    fedrn : FedRNSettings
        FedRN's k-reliable neighbors (``fedrn_*``, ``neighbor_chunk_size``).
    aggregation_settings : AggregationSettings
        DaAgg's distance, the trimmed mean's fraction, which flags make the noisy set, the cap
        on a client's weight (``daagg_variant``, ``trim_fraction``, ``aggregation_flags``,
        ``max_client_weight_factor``).
    status : StatusRule
        The history rule from flags to status (``status_m``, ``status_w``).
    geometry : GeometrySettings
        The update-geometry evidence added to the evidence detector's (``geometry_*``).
    """

    detectors: tuple[str, ...] | None = None
    primary_detector: str = "evidence"
    aggregation: str = "fedavg"
    fednoro: FedNoRoSettings = FedNoRoSettings()
    evidence: EvidenceSettings = EvidenceSettings()
    fedncl: FedNCLSettings = FedNCLSettings()
    fedrn: FedRNSettings = FedRNSettings()
    aggregation_settings: AggregationSettings = AggregationSettings()
    status: StatusRule = StatusRule()
    geometry: GeometrySettings = GeometrySettings()

    def __post_init__(self) -> None:
        """Check the choice of methods and that each group is one; detectors become a tuple."""
        object.__setattr__(
            self,
            "detectors",
            _checked_methods(self.detectors, self.primary_detector, self.aggregation),
        )
        for name, group in _GROUPS.items():
            value = getattr(self, name)
            if not isinstance(value, group):
                raise InvalidParameterError(
                    f"{name}: expected {group.__name__}, got {type(value).__name__}"
                )

    def to_json(self) -> dict[str, Any]:
        """Return the configuration as flat plain JSON values (tuples become lists)."""
        flat = {name: getattr(self, name) for name in _METHOD_KEYS}
        for key, (group, field) in FLAT_KEYS.items():
            flat[key] = getattr(getattr(self, group), field)
        return cast(dict[str, Any], to_jsonable(flat))

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
        unknown = sorted(
            str(key) for key in data if key not in FLAT_KEYS and key not in _METHOD_KEYS
        )
        if unknown:
            raise InvalidParameterError(f"data: unknown configuration key(s) {unknown}")
        methods = {key: data[key] for key in _METHOD_KEYS if key in data}
        # The choice of methods is checked first, as it always was, then each group in turn.
        _checked_methods(
            methods.get("detectors"),
            methods.get("primary_detector", cls.primary_detector),
            methods.get("aggregation", cls.aggregation),
        )
        values: dict[str, dict[str, Any]] = {name: {} for name in _GROUPS}
        for key, value in data.items():
            if key in FLAT_KEYS:
                group, field = FLAT_KEYS[key]
                values[group][field] = value
        groups = {name: _GROUPS[name](**values[name]) for name in _GROUPS}
        return cls(**methods, **groups)

    @classmethod
    def from_flat(cls, **values: Any) -> AuditConfig:
        """Build a configuration from flat keywords, ``AuditConfig.from_flat(evidence_q=0.05)``.

        The keyword form of :meth:`from_json` (the same keys, defaults and errors).
        """
        return cls.from_json(values)


def _checked_methods(
    detectors: Any, primary_detector: Any, aggregation: Any
) -> tuple[str, ...] | None:
    """Check the detectors, the primary one and the aggregation rule, and how they fit together."""
    if detectors is not None:
        detectors = _str_tuple("detectors", detectors, DETECTORS)
        if len(set(detectors)) != len(detectors):
            raise InvalidParameterError("detectors: names must be unique")
    check_choice("primary_detector", primary_detector, PRIMARY_DETECTORS)
    if detectors is not None and primary_detector not in detectors:
        raise InvalidParameterError(
            f"detectors: must include primary_detector {primary_detector!r}"
        )
    check_choice("aggregation", aggregation, AGGREGATION_RULES)
    if aggregation == "reliability_weighted" and primary_detector not in PROBABILITY_DETECTORS:
        which = " or ".join(f"primary_detector={name!r}" for name in PROBABILITY_DETECTORS)
        raise InvalidParameterError(
            "aggregation: 'reliability_weighted' needs noisy probabilities, which only "
            f"{which} gives"
        )
    return cast(tuple[str, ...] | None, detectors)


def _str_tuple(name: str, value: Any, choices: Sequence[str]) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise InvalidParameterError(f"{name}: expected a sequence of names")
    return tuple(check_choice(f"{name}[{i}]", v, choices) for i, v in enumerate(value))
