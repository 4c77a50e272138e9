"""Running the configured detectors on one round's checked inputs.

Each detector runs on every client or not at all: one whose input is missing for some client is
"undetermined" with the reason (never run on a subset). Which detectors there are, what each
needs and how each is called is the registry
:data:`~service.audit.detector_registry.DETECTOR_REGISTRY`; the detectors themselves live in
:mod:`service.audit.detectors` and :mod:`service.audit.evidence`.
"""

from __future__ import annotations

from collections.abc import Sequence

from service.audit.audit_config import AuditConfig
from service.audit.detection import DetectionResult, not_run
from service.audit.detector_registry import DETECTOR_REGISTRY, DetectorCall
from service.audit.round_inputs import CheckedClients, StatusHistory, missing
from service.audit.round_pass import RoundPass

__all__: list[str] = []

_READ = frozenset(read for spec in DETECTOR_REGISTRY.values() for read in spec.reads)
"""Detectors whose result another reads: they run before the others."""


def _detector_present(name: str, data: CheckedClients) -> bool:
    """Whether some client sent the input the detector ``name`` needs."""
    values: Sequence[object | None] = getattr(data, DETECTOR_REGISTRY[name].input)
    return any(v is not None for v in values)


def run_detectors(
    data: CheckedClients,
    config: AuditConfig,
    shared: RoundPass,
    history: Sequence[StatusHistory] | None,
    anchors: Sequence[bool] | None,
    majority_rounds: int = 0,
    anchor_led: bool = False,
) -> dict[str, DetectionResult]:
    """Every configured detector's result, by name (``config.detectors``; None: the primary one
    and every detector whose inputs some client sent). ``majority_rounds``: earlier rounds the
    evidence detector abstained for a majority (:mod:`service.audit.majority_memory`);
    ``anchor_led``: the aggregate is led by the trust anchors (:mod:`service.audit.anchor_mode`)."""
    names = config.detectors
    if names is None:
        names = tuple(
            d
            for d in DETECTOR_REGISTRY
            if d == config.primary_detector or _detector_present(d, data)
        )
    detections: dict[str, DetectionResult] = {}
    # The detectors others read first (FedNoRo's mixture: the evidence detector's cross-check).
    for name in sorted(names, key=lambda n: n not in _READ):
        spec = DETECTOR_REGISTRY[name]
        absent = missing(data.ids, getattr(data, spec.input))
        if absent:
            reason = f"no {spec.input} from client(s) {absent}"
            detections[name] = not_run(name, len(data.ids), reason)
            continue
        call = DetectorCall(
            data, config, shared, history, anchors, dict(detections), majority_rounds, anchor_led
        )
        detections[name] = spec.run(call)
    return detections
