"""Each detector's evidence beside the verdict, per site and per class, as the reports show it.

:func:`detector_evidence` turns what a stored audit says of one client
(:class:`~service.coordinator.stored_evidence.ClientEvidence`) into the report's
``detector_evidence`` (one object per detector that gave the client a verdict, each field null
where the audit holds no value: an older audit, a part not used that round); :func:`class_evidence`
into its ``class_evidence`` (per class: the evidence detector's class z, FedNoRo's normalised loss,
and which detectors name the class noisy). The API's ``DetectorEvidence`` and ``ClassEvidence``
(service.api.schemas.evidence) are their wire types; ``ClassEvidenceEntry`` and
``DetectorEvidenceEntry`` (:mod:`service.report_views`) their types here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

from service.coordinator.stored_evidence import ClientEvidence
from service.report_views import ClassEvidenceEntry, DetectorEvidenceEntry


def detector_evidence(found: ClientEvidence) -> DetectorEvidenceEntry:
    """Each detector's parts of its verdict on the client, as plain values (the per-class lists
    are left to :func:`class_evidence`)."""
    evidence = None if found.evidence is None else asdict(found.evidence)
    fednoro = None if found.fednoro is None else asdict(found.fednoro)
    if evidence is not None:
        del evidence["class_z"]
    if fednoro is not None:
        del fednoro["normalised_loss"]
    return DetectorEvidenceEntry(
        evidence=evidence,
        fednoro=fednoro,
        fedncl=None if found.fedncl is None else asdict(found.fedncl),
        expertise=None if found.expertise is None else asdict(found.expertise),
    )


def class_evidence(
    found: ClientEvidence, label: Callable[[int], str], noisy: dict[str, tuple[int, ...]]
) -> list[ClassEvidenceEntry]:
    """Per class (in class order, only those of which some detector says something): the
    evidence detector's class z, FedNoRo's normalised loss, and the detectors whose noisy
    classes include it (``noisy``: detector -> class indices, those that answered ok);
    ``label`` names a class index."""
    class_z = () if found.evidence is None else found.evidence.class_z
    normalised = () if found.fednoro is None else found.fednoro.normalised_loss
    width = max(len(class_z), len(normalised), *(max(c, default=-1) + 1 for c in noisy.values()))
    rows: list[ClassEvidenceEntry] = []
    for c in range(width):
        z = class_z[c] if c < len(class_z) else None
        loss = normalised[c] if c < len(normalised) else None
        by = [name for name, classes in noisy.items() if c in classes]
        if z is None and loss is None and not by:
            continue
        rows.append(
            ClassEvidenceEntry(
                index=c, label=label(c), evidence_z=z, fednoro_normalised_loss=loss, noisy_by=by
            )
        )
    return rows
