"""Running the configured detectors on one round's checked inputs.

Each detector runs on every client or not at all: one whose inputs are missing for some client
is "undetermined" with the reason (never run on a subset). The detectors themselves live in
:mod:`service.audit.detectors` and :mod:`service.audit.evidence`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from service.audit._typing import FloatArray, IntArray
from service.audit.audit_config import DETECTORS, AuditConfig, evidence_detector
from service.audit.blocks import RoundPass
from service.audit.detection import DetectionResult
from service.audit.detectors.expertise import expertise_detection
from service.audit.detectors.fedncl import FedNCLDetector, fedncl_divergences
from service.audit.detectors.fednoro import FedNoRoDetector
from service.audit.round_inputs import CheckedClients, StatusHistory, missing

__all__: list[str] = []


def _undetermined(method: str, n_clients: int, reason: str) -> DetectionResult:
    return DetectionResult(method, "undetermined", reason, [None] * n_clients, {})


def _run_fednoro(
    data: CheckedClients, config: AuditConfig, history: Sequence[StatusHistory] | None
) -> DetectionResult:
    absent = missing(data.ids, data.per_class_loss)
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


def _run_evidence(
    data: CheckedClients,
    config: AuditConfig,
    anchors: Sequence[bool] | None,
    mixture: DetectionResult | None,
) -> DetectionResult:
    absent = missing(data.ids, data.per_class_loss)
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
    # The accuracy evidence likewise needs every client's accuracy (else it is left out).
    accuracy = None if missing(data.ids, data.train_accuracy) else data.train_accuracy
    # And the error counts every client's (a client without them leaves the round to the losses).
    wrong = (
        None
        if any(v is None for v in data.per_class_errors)
        else np.stack([cast(IntArray, v) for v in data.per_class_errors])
    )
    return evidence_detector(config).fit(
        loss,
        data.class_counts,
        spreads,
        anchors=anchors,
        mixture=mixture,
        train_accuracy=accuracy,
        num_samples=None if accuracy is None else data.num_samples,
        per_class_errors=wrong,
    )


def _run_fedncl(data: CheckedClients, config: AuditConfig, shared: RoundPass) -> DetectionResult:
    absent = missing(data.ids, data.train_loss)
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


def _run_expertise(data: CheckedClients) -> DetectionResult:
    absent = missing(data.ids, data.train_accuracy)
    if absent:
        return _undetermined(
            "expertise", len(data.ids), f"no train_accuracy from client(s) {absent}"
        )
    return expertise_detection(np.asarray(data.train_accuracy, dtype=np.float64))


def _detector_present(name: str, data: CheckedClients) -> bool:
    values: Sequence[object | None]
    if name in ("fednoro", "evidence"):
        values = data.per_class_loss
    elif name == "fedncl":
        values = data.train_loss
    else:
        values = data.train_accuracy
    return any(v is not None for v in values)


def run_detectors(
    data: CheckedClients,
    config: AuditConfig,
    shared: RoundPass,
    history: Sequence[StatusHistory] | None,
    anchors: Sequence[bool] | None,
) -> dict[str, DetectionResult]:
    """Every configured detector's result, by name (``config.detectors``; None: the primary one
    and every detector whose inputs some client sent)."""
    names = config.detectors
    if names is None:
        names = tuple(
            d for d in DETECTORS if d == config.primary_detector or _detector_present(d, data)
        )
    detections: dict[str, DetectionResult] = {}
    # FedNoRo's mixture first: the evidence detector reads it as a cross-check.
    for name in sorted(names, key=lambda n: n != "fednoro"):
        if name == "fednoro":
            detections[name] = _run_fednoro(data, config, history)
        elif name == "evidence":
            detections[name] = _run_evidence(data, config, anchors, detections.get("fednoro"))
        elif name == "fedncl":
            detections[name] = _run_fedncl(data, config, shared)
        else:
            detections[name] = _run_expertise(data)
    return detections
