"""Pure audit algorithms (no I/O): detection, reliability, neighbors, aggregation.

Implements the detection, reliability and aggregation of FedNoRo, Fed-NCL, FedRN and RoFL
(docs/algorithms.md) over numpy arrays and streamed model states; see each
module for the paper sections (FedNoRo, Fed-NCL, FedRN, RoFL). Nothing here imports the web,
database or configuration layers, and nothing reads settings: the coordinator passes every
hyper-parameter explicitly (:class:`AuditConfig`).
"""

from service.audit._blas import one_blas_thread_in_this_process
from service.audit._typing import AnyArray, BoolArray, FloatArray, IntArray
from service.audit._validation import MAX_LOSS, InvalidInputError, InvalidParameterError
from service.audit.aggregation import AGGREGATION_RULES, NOISY_SET_RULES, aggregate
from service.audit.aggregators.common import AggregationResult
from service.audit.aggregators.daagg import aggregate_daagg
from service.audit.aggregators.fedavg import aggregate_fedavg, aggregate_reliability_weighted
from service.audit.aggregators.fedncl_layerwise import aggregate_fedncl_layerwise
from service.audit.aggregators.robust import aggregate_median, aggregate_trimmed_mean
from service.audit.aggregators.weight_cap import (
    DEFAULT_MAX_CLIENT_WEIGHT_FACTOR,
    cap_weights,
    client_weight_cap,
)
from service.audit.audit_config import DETECTORS, PRIMARY_DETECTORS, AuditConfig
from service.audit.centroids import aggregate_centroids
from service.audit.class_null import benjamini_hochberg
from service.audit.config_groups import (
    AggregationSettings,
    EvidenceSettings,
    FedNCLSettings,
    FedNoRoSettings,
    FedRNSettings,
    GeometrySettings,
    StatusRule,
)
from service.audit.detection import ClientStatus, ClientVerdict, DetectionResult, next_status
from service.audit.detector_registry import (
    DETECTOR_REGISTRY,
    DetectorCall,
    DetectorSpec,
    required_signals,
)
from service.audit.detectors.expertise import expertise, expertise_detection
from service.audit.detectors.fedncl import (
    FedNCLDetector,
    correction_candidates,
    fedncl_divergence,
    fedncl_divergences,
)
from service.audit.detectors.fednoro import FedNoRoDetector
from service.audit.detectors.separation import (
    ashman_d,
    class_standardised_excess,
    null_separation_threshold,
)
from service.audit.evidence import EvidenceDetector
from service.audit.geometry_evidence import raised_by_geometry
from service.audit.pipeline import AuditOutcome, run_audit
from service.audit.reliability import (
    NeighborSets,
    NeighborWeight,
    k_reliable_neighbors,
    probe_similarity,
    reliability_scores,
)
from service.audit.round_inputs import ClientRoundData, StatusHistory
from service.audit.schedules import scale_rounds
from service.audit.state import DictStateReader, StateReader, is_float_tensor

__all__ = [
    "AGGREGATION_RULES",
    "DEFAULT_MAX_CLIENT_WEIGHT_FACTOR",
    "DETECTORS",
    "DETECTOR_REGISTRY",
    "NOISY_SET_RULES",
    "NeighborWeight",
    "PRIMARY_DETECTORS",
    "AggregationResult",
    "AggregationSettings",
    "AnyArray",
    "AuditConfig",
    "AuditOutcome",
    "BoolArray",
    "ClientRoundData",
    "ClientStatus",
    "ClientVerdict",
    "DetectionResult",
    "DetectorCall",
    "DetectorSpec",
    "DictStateReader",
    "EvidenceDetector",
    "EvidenceSettings",
    "FedNCLDetector",
    "FedNCLSettings",
    "FedNoRoDetector",
    "FedNoRoSettings",
    "FedRNSettings",
    "FloatArray",
    "GeometrySettings",
    "IntArray",
    "InvalidInputError",
    "MAX_LOSS",
    "InvalidParameterError",
    "NeighborSets",
    "StateReader",
    "StatusHistory",
    "StatusRule",
    "aggregate",
    "aggregate_centroids",
    "aggregate_daagg",
    "aggregate_fedavg",
    "aggregate_fedncl_layerwise",
    "aggregate_median",
    "aggregate_reliability_weighted",
    "aggregate_trimmed_mean",
    "ashman_d",
    "benjamini_hochberg",
    "cap_weights",
    "class_standardised_excess",
    "client_weight_cap",
    "correction_candidates",
    "expertise",
    "expertise_detection",
    "fedncl_divergence",
    "fedncl_divergences",
    "is_float_tensor",
    "k_reliable_neighbors",
    "next_status",
    "null_separation_threshold",
    "one_blas_thread_in_this_process",
    "probe_similarity",
    "raised_by_geometry",
    "reliability_scores",
    "required_signals",
    "run_audit",
    "scale_rounds",
]
