"""Each detector's evidence on one client, as a stored audit holds it, typed.

A detector's verdict on a site stores, beside its score and flag, its own ``evidence`` object
(docs/algorithms.md lists the fields): the evidence detector's parts (its p- and q-value, the
site-level z, Stouffer's z, the class z, the error counts', the accuracy's and the update
geometry's figures), FedNoRo's normalised per-class losses and separation statistics, Fed-NCL's
divergence and loss term, FedRN's raw accuracy. :func:`read_parts` reads one detector's object
(the value at :func:`service.coordinator.stored_audit.client_paths`' ``{name}.evidence``) into the
type here. An audit stored before a field was recorded, or a part the detector did not use that
round (no error counts sent, the geometry not made, the accuracy check off), gives None; a
detector that did not run, or gave the site no verdict, gives no object at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def _floats(value: object) -> tuple[float | None, ...]:
    return tuple(_float(v) for v in value) if isinstance(value, list) else ()


@dataclass(frozen=True)
class EvidenceParts:
    """The evidence detector's verdict on the site, part by part (docs/algorithms.md,
    "Calibrated evidence"; ``service.audit.evidence_verdicts.site_verdicts``)."""

    p_value: float | None = None
    q_value: float | None = None
    site_z: float | None = None
    site_factor: float | None = None
    stouffer_z: float | None = None
    mean_loss: float | None = None
    errors: int | None = None
    errors_expected: float | None = None
    errors_z: float | None = None
    errors_p_value: float | None = None
    confident_errors: int | None = None
    confident_errors_expected: float | None = None
    confident_errors_z: float | None = None
    confident_errors_p_value: float | None = None
    accuracy_z: float | None = None
    accuracy_p_value: float | None = None
    accuracy_gap: float | None = None
    geometry_cosine: float | None = None
    geometry_z: float | None = None
    geometry_p_value: float | None = None
    class_z: tuple[float | None, ...] = ()
    """Per class, the site's loss against the class's consensus in standard errors (None: a class
    the site does not hold); empty where not stored."""


@dataclass(frozen=True)
class FedNoRoParts:
    """FedNoRo's verdict on the site (``service.audit.detectors.fednoro``'s evidence)."""

    separation_score: float | None = None
    """The verdict's score: the statistic its separation guard reads (class_z by default)."""
    class_z: float | None = None
    mean_loss: float | None = None
    noisy_probability: float | None = None
    noisy_votes: int | None = None
    normalised_loss: tuple[float | None, ...] = ()
    """Per class, the site's loss min-max normalised over the round's sites (the mixture's
    features; None for a column dropped); empty where not stored."""


@dataclass(frozen=True)
class FedNCLParts:
    """Fed-NCL's verdict on the site: ``q = e * h / n`` (eq. 9) and its terms."""

    q: float | None = None
    divergence: float | None = None
    data_quality: float | None = None
    """h: the site's training loss, summed over its samples (``loss_mode="sum"``, eq. 8) or its
    mean (``"mean"``)."""
    deviation: float | None = None


@dataclass(frozen=True)
class ExpertiseParts:
    """FedRN's expertise of the site (eq. 4) and the accuracy it is normalised from."""

    expertise: float | None = None
    train_accuracy: float | None = None


@dataclass(frozen=True)
class ClientEvidence:
    """Each detector's evidence on the client; None where the detector did not run or gave the
    client no verdict."""

    evidence: EvidenceParts | None = None
    fednoro: FedNoRoParts | None = None
    fedncl: FedNCLParts | None = None
    expertise: ExpertiseParts | None = None


_EVIDENCE_NUMBERS = tuple(
    f.name for f in fields(EvidenceParts) if f.name not in ("errors", "confident_errors", "class_z")
)
"""The evidence detector's parts stored as plain numbers (read as floats)."""


def _evidence(found: dict[str, object]) -> EvidenceParts:
    return EvidenceParts(
        **{name: _float(found.get(name)) for name in _EVIDENCE_NUMBERS},
        errors=_int(found.get("errors")),
        confident_errors=_int(found.get("confident_errors")),
        class_z=_floats(found.get("class_z")),
    )


def _fednoro(found: dict[str, object], score: float | None) -> FedNoRoParts:
    return FedNoRoParts(
        separation_score=score,
        class_z=_float(found.get("class_z")),
        mean_loss=_float(found.get("mean_loss")),
        noisy_probability=_float(found.get("gmm_noisy_probability")),
        noisy_votes=_int(found.get("noisy_votes")),
        normalised_loss=_floats(found.get("normalised_loss")),
    )


def _fedncl(found: dict[str, object], score: float | None) -> FedNCLParts:
    return FedNCLParts(
        q=score,
        divergence=_float(found.get("divergence")),
        data_quality=_float(found.get("data_quality")),
        deviation=_float(found.get("deviation")),
    )


def read_parts(stored: Mapping[str, object], scores: Mapping[str, float | None]) -> ClientEvidence:
    """Each detector's evidence object (detector name -> the stored ``evidence``: a mapping, or
    None where there is none) with its verdict's score (name -> score), typed."""

    def found(name: str) -> dict[str, object] | None:
        value = stored.get(name)
        return value if isinstance(value, dict) else None

    evidence, fednoro = found("evidence"), found("fednoro")
    fedncl, expertise = found("fedncl"), found("expertise")
    return ClientEvidence(
        evidence=None if evidence is None else _evidence(evidence),
        fednoro=None if fednoro is None else _fednoro(fednoro, scores.get("fednoro")),
        fedncl=None if fedncl is None else _fedncl(fedncl, scores.get("fedncl")),
        expertise=None
        if expertise is None
        else ExpertiseParts(
            expertise=scores.get("expertise"),
            train_accuracy=_float(expertise.get("train_accuracy")),
        ),
    )
