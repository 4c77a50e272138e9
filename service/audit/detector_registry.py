"""The registry of detectors: :data:`DETECTOR_REGISTRY`, one :class:`DetectorSpec` per detector.

Everything that used to name the detectors by hand reads this registry: the names an
:class:`~service.audit.audit_config.AuditConfig` accepts (``DETECTORS``) and those that may be
primary (``PRIMARY_DETECTORS``), which detectors run when a round's inputs are present
(:func:`~service.audit.round_detectors.run_detectors`), and which signals a federation must ask
of its sites (:func:`required_signals`). A new detector is its module (numpy in, a
:class:`~service.audit.detection.DetectionResult` out), its parameters as a group of
``AuditConfig`` (:mod:`service.audit.config_groups`), one entry here (how to run it from a
:class:`DetectorCall`, the input it needs, whether it can be primary, the signals a federation
requires for it; its runner builds the detector from its group), its tests and its section in
docs/algorithms.md.

A detector runs on every client or not at all: where a client did not send its ``input``, the
detector is "undetermined" with that reason (never run on a subset), and it is not called.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from service.audit._typing import BoolArray, FloatArray, IntArray
from service.audit.detection import (
    DetectionResult,
    EvidenceResult,
    ExpertiseResult,
    FedNCLResult,
    FedNoRoResult,
)
from service.audit.detectors.expertise import expertise_detection
from service.audit.detectors.fedncl import FedNCLDetector, fedncl_divergences
from service.audit.detectors.fednoro import FedNoRoDetector
from service.audit.evidence import EvidenceDetector
from service.audit.geometry_evidence import (
    GeometryEvidence,
    add_geometry,
    carry_flags,
    geometry_evidence,
    leave_one_out_cosines,
    peer_groups,
)
from service.audit.majority_memory import remember_majority
from service.audit.round_inputs import CheckedClients, StatusHistory, missing
from service.audit.round_pass import RoundPass
from service.audit.verdict_types import or_none

if TYPE_CHECKING:  # audit_config reads the registry's names: only the types are needed here
    from service.audit.audit_config import AuditConfig
    from service.audit.config_groups import EvidenceSettings, FedNCLSettings, FedNoRoSettings

__all__ = [
    "DETECTOR_REGISTRY",
    "DetectorCall",
    "DetectorSpec",
    "evidence_detector",
    "fedncl_detector",
    "fednoro_detector",
    "required_signals",
]


@dataclass(frozen=True)
class DetectorCall:
    """What a detector is run with: the round's checked inputs (every client sent the
    detector's ``input``), the configuration, the round's shared pass over the states, the
    clients' status before the round, the trust anchors, the results of the detectors that
    ran before it this round (those named in some detector's ``reads`` run first), and the
    federation's memory of abstentions for a majority."""

    data: CheckedClients
    config: AuditConfig
    shared: RoundPass
    history: Sequence[StatusHistory] | None
    anchors: Sequence[bool] | None
    earlier: Mapping[str, DetectionResult]
    majority_rounds: int = 0
    """Earlier rounds (after the warm-up) in which the evidence detector abstained because the
    group it would flag was not a clear minority (:mod:`service.audit.majority_memory`)."""
    anchor_led: bool = False
    """The federation's aggregate is led by the trust anchors: the evidence detector takes them as
    its reference (:mod:`service.audit.anchor_mode`)."""


@dataclass(frozen=True)
class DetectorSpec:
    """One detector in the registry.

    Attributes
    ----------
    run : callable
        Its result for one round, from a :class:`DetectorCall`.
    input : str
        The per-client input it cannot run without (a field of
        :class:`~service.audit.round_inputs.ClientRoundData`): with ``detectors=None`` it runs
        when some client sent it, and it is "undetermined" when some client did not.
    signals : callable
        The signals a federation running it requires of every site, given its configuration.
    primary : bool
        Whether it flags clients and can therefore be the primary detector.
    reads : tuple of str
        Detectors whose result this one reads (from ``DetectorCall.earlier``); they run first.
    probabilities : bool
        Whether its result gives each client a noisy probability (``reliability_weighted``
        needs such a primary detector).
    classes : bool
        Whether its verdicts name the classes that look noisy (``evidence["noisy_classes"]``):
        the report shows them beside the verdict.
    """

    run: Callable[[DetectorCall], DetectionResult]
    input: str
    signals: Callable[[AuditConfig], frozenset[str]]
    primary: bool = False
    reads: tuple[str, ...] = ()
    probabilities: bool = False
    classes: bool = False


def fednoro_detector(settings: FedNoRoSettings) -> FedNoRoDetector:
    """FedNoRo's mixture detector with its settings (``config.fednoro``)."""
    return FedNoRoDetector(
        random_states=settings.random_states,
        require_separation=settings.require_separation,
        separation_threshold=settings.separation_threshold,
        separation_quantile=settings.separation_quantile,
        separation_statistic=settings.separation_statistic,
        separation_groups=settings.separation_groups,
        min_clients=settings.min_clients,
    )


def fedncl_detector(settings: FedNCLSettings) -> FedNCLDetector:
    """Fed-NCL's sigma-rule detector with its settings (``config.fedncl``)."""
    return FedNCLDetector(
        beta=settings.beta,
        two_sided=settings.two_sided,
        min_clients=settings.min_clients,
        loss_mode=settings.loss_mode,
    )


def evidence_detector(settings: EvidenceSettings) -> EvidenceDetector:
    """The calibrated evidence detector with its settings (``config.evidence``; same names)."""
    return EvidenceDetector(**asdict(settings))


def _losses(data: CheckedClients) -> FloatArray:
    return np.stack([cast(FloatArray, v) for v in data.per_class_loss])


def _run_fednoro(call: DetectorCall) -> FedNoRoResult:
    config, history = call.config, call.history
    confirmed = None
    if (
        config.fednoro.confirmed_groups
        and config.primary_detector == "fednoro"
        and history is not None
    ):
        confirmed = np.array([entry.status == "noisy" for entry in history], dtype=bool)
    detector = fednoro_detector(config.fednoro)
    result: DetectionResult = detector.fit(
        _losses(call.data), call.data.class_counts, confirmed
    ).result_
    return result


def _count_rows(rows: list[IntArray | None], width: int) -> FloatArray | None:
    """The round's counts as one matrix, a NaN row for a client that sent none; None when no
    client sent any."""
    if all(v is None for v in rows):
        return None
    return np.stack([np.full(width, np.nan) if v is None else v.astype(np.float64) for v in rows])


def _run_evidence(call: DetectorCall) -> EvidenceResult:
    data = call.data
    # The reported spreads are used only when every client sent them (a round mixes no models).
    spreads = (
        None
        if any(v is None for v in data.per_class_loss_sd)
        else np.stack([cast(FloatArray, v) for v in data.per_class_loss_sd])
    )
    # The accuracy evidence likewise needs every client's accuracy (else it is left out).
    accuracy = None if missing(data.ids, data.train_accuracy) else data.train_accuracy
    # The error counts of the clients that sent them (NaN rows for the others: judged on their
    # losses alone, service.audit.error_evidence.reported_counts).
    wrong = _count_rows(data.per_class_errors, data.class_counts.shape[1])
    confident = _count_rows(data.per_class_confident_errors, data.class_counts.shape[1])
    result = evidence_detector(call.config.evidence).fit(
        _losses(data),
        data.class_counts,
        spreads,
        anchors=call.anchors,
        mixture=call.earlier.get("fednoro"),
        train_accuracy=accuracy,
        num_samples=None if accuracy is None else data.num_samples,
        per_class_errors=wrong,
        per_class_confident_errors=confident,
        anchor_led=call.anchor_led,
    )
    return _with_geometry(call, remember_majority(result, call.majority_rounds))


def _with_geometry(call: DetectorCall, result: EvidenceResult) -> EvidenceResult:
    """The evidence with the update geometry's flags added and carried (``config.geometry``);
    the states are read (the round's shared pass) only when some site can be judged."""
    settings, data = call.config.geometry, call.data
    if not settings.check or result.status != "ok":
        return result
    k = len(data.ids)
    mode = or_none(result.summary.mode)
    in_noisy_role = noisy_role(call.history, k)
    groups = geometry_peers(data, call.config, call.history)
    anchors = None if call.anchors is None else np.asarray(call.anchors, dtype=bool)
    totals = call.shared.consensus() if (groups >= 0).any() and mode == "consensus" else None
    if mode != "consensus":
        geometry = GeometryEvidence.not_made(k, f"the loss evidence is in {mode} mode")
    elif (groups >= 0).any() and totals is None:
        geometry = GeometryEvidence.not_made(k, "the round's pass computed no consensus")
    else:
        cosines = np.full(k, np.nan)  # nobody can be judged: geometry_evidence says why
        if totals is not None:
            cosines = leave_one_out_cosines(*totals, data.num_samples)
        geometry = geometry_evidence(
            cosines,
            data.class_counts,
            data.num_samples,
            q=call.config.evidence.q,
            min_z=settings.min_z,
            min_sites=settings.min_sites,
            min_homogeneity_p=settings.min_homogeneity_p,
            never=anchors,
            exclude=in_noisy_role,
        )
    sizes = np.asarray(data.num_samples, dtype=np.float64)
    cap = call.config.evidence.max_flagged_fraction
    result = add_geometry(result, geometry, sizes, cap)
    if call.history is None:
        return result
    carried = in_noisy_role & np.array([h.by_geometry for h in call.history], dtype=bool)
    if anchors is not None:
        carried &= ~anchors
    return carry_flags(result, carried, sizes, cap)


def geometry_peers(
    data: CheckedClients, config: AuditConfig, history: Sequence[StatusHistory] | None
) -> IntArray:
    """Each site's group of peers for the update geometry (-1: not judged), as
    :func:`~service.audit.geometry_evidence.peer_groups` forms them with ``config.geometry``; the
    round's pass reads the updates' consensus only where some site has a group."""
    return peer_groups(
        data.class_counts,
        data.num_samples,
        min_sites=config.geometry.min_sites,
        min_homogeneity_p=config.geometry.min_homogeneity_p,
        exclude=noisy_role(history, len(data.ids)),
    )


def noisy_role(history: Sequence[StatusHistory] | None, k: int) -> BoolArray:
    """The sites that trained in the noisy role this round (noisy before it)."""
    if history is None:
        return np.zeros(k, dtype=bool)
    return np.array([entry.status == "noisy" for entry in history], dtype=bool)


def _run_fedncl(call: DetectorCall) -> FedNCLResult:
    data, config, shared = call.data, call.config, call.shared
    if len(data.ids) < config.fedncl.min_clients:
        # Too few clients to decide: skip reading every state for the divergence.
        divergence = np.zeros(len(data.ids))
    else:
        divergence = fedncl_divergences(
            shared.global_state, data.states, config.fedncl.divergence_variant, shared=shared
        )
    result: DetectionResult = (
        fedncl_detector(config.fedncl)
        .fit(divergence, np.asarray(data.train_loss, dtype=np.float64), data.num_samples)
        .result_
    )
    return result


def _run_expertise(call: DetectorCall) -> ExpertiseResult:
    return expertise_detection(np.asarray(call.data.train_accuracy, dtype=np.float64))


def _evidence_signals(config: AuditConfig) -> frozenset[str]:
    if config.evidence.accuracy_check:  # the accuracy evidence reads every site's accuracy
        return frozenset({"per_class_loss", "train_accuracy"})
    return frozenset({"per_class_loss"})


DETECTOR_REGISTRY: dict[str, DetectorSpec] = {
    "fednoro": DetectorSpec(
        _run_fednoro,
        input="per_class_loss",
        signals=lambda config: frozenset({"per_class_loss"}),
        primary=True,
        probabilities=True,
        classes=True,
    ),
    "fedncl": DetectorSpec(
        _run_fedncl,
        input="train_loss",
        signals=lambda config: frozenset({"train_loss"}),
        primary=True,
    ),
    "expertise": DetectorSpec(
        _run_expertise,
        input="train_accuracy",
        # FedRN's expertise comes with its probes (the neighbors' similarity).
        signals=lambda config: frozenset({"train_accuracy", "probe_softmax"}),
    ),
    "evidence": DetectorSpec(
        _run_evidence,
        input="per_class_loss",
        signals=_evidence_signals,
        primary=True,
        # FedNoRo's loss mixture is its cross-check (``mixture_check``).
        reads=("fednoro",),
        classes=True,
    ),
}
"""The registry, in table order: a new detector is its module, one entry here, its parameters
as a group of ``AuditConfig``, its tests and its section in docs/algorithms.md."""


def required_signals(detectors: Iterable[str], config: AuditConfig) -> frozenset[str]:
    """The signals every site must send for these detectors to run with ``config``."""
    return frozenset().union(*(DETECTOR_REGISTRY[name].signals(config) for name in detectors))
