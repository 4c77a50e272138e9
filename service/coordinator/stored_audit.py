"""The one reader of a stored audit result (``AuditResult.result``).

A round's audit is stored as JSON: ``service.audit``'s ``AuditOutcome.to_json``, completed at the
close (:func:`service.coordinator.audits.audit_round`) with the round, the warm-up, the clients
and the privacy budget. The coordinator reads it back only through the types here:

- :class:`StoredAudit` (:func:`read_audit`): what the audit says of the round as a whole (the
  clients in order, the primary detector and its flags, each detector's status, reason and
  summary, the aggregation rule, the clients' sample counts); :class:`StoredNeighbors`
  (:func:`read_neighbors`): each client's reliable neighbors.
- :class:`ClientAudit` (:func:`client_audit`): what it says of one client, from the values at
  :func:`client_paths`: read in the database (:func:`read_client_audit`; the rest of the
  result, every other site's verdicts, never leaves it) or in a loaded result
  (:func:`client_audit_in`). Both go through the same paths and the same parsing; each
  detector's evidence on the client is typed in :mod:`service.coordinator.stored_evidence`.

An audit stored by an older version lacks the fields added since: every field here has the
default the reports always gave it (None, or an empty list or mapping where a stored null or a
missing key meant none). A field the coordinator does not read is not declared, so it is
neither checked nor copied. The complete result on the wire, as this version stores it, is the
API's ``AuditRecord`` (service.api.schemas.audits), which this layer may not import.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, cast

from pydantic import BaseModel, BeforeValidator, ConfigDict
from sqlalchemy.orm import Session
from typing_extensions import TypedDict

from service.audit import DETECTOR_REGISTRY, DETECTORS
from service.audit_records.detection_summaries import (
    EvidenceSummary,
    FedNoRoSummary,
    read_summary,
)
from service.audit_records.stored_record import StoredRecord
from service.coordinator.stored_evidence import ClientEvidence, read_parts
from service.report_views import NeighborWeight
from service.store.audit_json import JsonPath, audit_values

CLASS_DETECTORS = tuple(name for name, spec in DETECTOR_REGISTRY.items() if spec.classes)
"""The detectors whose verdicts name classes (the registry's ``classes``)."""

BASIS_KEYS = ("flagged_by_geometry", "geometry_carried", "flagged_by_accuracy")
"""What the evidence detector's flag rests on, in each of its verdicts' evidence."""


def _none_is_empty(value: object, empty: object) -> object:
    return empty if value is None else value


NoneIsEmptyList = BeforeValidator(lambda value: _none_is_empty(value, []))
"""A stored null read as an empty list, as the reports always read it."""
NoneIsEmptyDict = BeforeValidator(lambda value: _none_is_empty(value, {}))
"""A stored null read as an empty mapping, as the reports always read it."""


class _Stored(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class StoredDetection(_Stored):
    """One detector's result for the round (its verdicts are read per client)."""

    status: str | None = None
    reason: str | None = None
    summary: StoredRecord | None = None
    """The detector's own figures (docs/algorithms.md) as its record
    (:data:`~service.audit_records.detection_summaries.SUMMARY_MODELS`; a plain
    :class:`~service.audit_records.stored_record.StoredRecord` for a detector this version does
    not know)."""

    @property
    def guard(self) -> str | None:
        """FedNoRo's note on its separation guard, where the summary has one."""
        summary = self.summary
        guard = summary.guard if isinstance(summary, FedNoRoSummary) else None
        return guard if isinstance(guard, str) else None

    @property
    def majority_suspected(self) -> bool:
        """The evidence detector abstained for a noisy majority (its summary's
        ``majority_suspected``; False where the summary has no such key)."""
        summary = self.summary
        return isinstance(summary, EvidenceSummary) and summary.majority_suspected is True

    @property
    def disagreeing_classes(self) -> list[int]:
        """The evidence detector's classes of far disagreement in a round that flagged nobody
        (its summary's ``disagreeing_classes``; none where the summary has no such key)."""
        summary = self.summary
        classes = summary.disagreeing_classes if isinstance(summary, EvidenceSummary) else None
        return classes if isinstance(classes, list) else []


def _typed_detections(value: object) -> object:
    """The stored detections (name -> result) with each summary read as its detector's record
    (a stored null as no detections)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        return value
    return {
        name: {**found, "summary": _summary_record(name, found["summary"])}
        if isinstance(found, dict) and "summary" in found
        else found
        for name, found in value.items()
    }


def _summary_record(name: object, summary: object) -> object:
    record = read_summary(name if isinstance(name, str) else None, summary)
    return StoredRecord.model_validate(record) if isinstance(record, dict) else record


class StoredAggregation(_Stored):
    """How the round's updates were aggregated."""

    rule: str | None = None
    fallback_reason: str | None = None


class StoredClient(_Stored):
    """A client of the audited round, in the audit's order."""

    num_samples: int | None = None


class StoredAudit(_Stored):
    """What a stored audit says of the round as a whole."""

    client_ids: Annotated[list[str], NoneIsEmptyList] = []
    primary: str | None = None
    primary_flags: Annotated[list[bool | None], NoneIsEmptyList] = []
    in_warmup: bool | None = None
    detections: Annotated[dict[str, StoredDetection], BeforeValidator(_typed_detections)] = {}
    aggregation: Annotated[StoredAggregation, NoneIsEmptyDict] = StoredAggregation()
    clients: Annotated[list[StoredClient], NoneIsEmptyList] = []

    @property
    def positions(self) -> dict[str, int]:
        """Client id -> its position in the audit's per-client lists."""
        return {cid: i for i, cid in enumerate(self.client_ids)}

    @property
    def primary_detection(self) -> StoredDetection:
        """The primary detector's result (an empty one when the audit has none)."""
        found = None if self.primary is None else self.detections.get(self.primary)
        return StoredDetection() if found is None else found

    def primary_flag_at(self, position: int | None) -> bool | None:
        """The primary flag of the client at ``position`` (None: no such client, no flag)."""
        if position is None or not 0 <= position < len(self.primary_flags):
            return None
        return self.primary_flags[position]


def read_audit(result: Mapping[str, object] | None) -> StoredAudit:
    """A stored audit result, typed (an empty one for None: the round has no audit)."""
    return StoredAudit() if result is None else StoredAudit.model_validate(result)


class StoredNeighbors(_Stored):
    """Each client's reliable neighbors, as the next round's instructions hand them out (kept
    apart from :class:`StoredAudit`: K sites' lists are read only there)."""

    neighbors: Annotated[dict[str, list[NeighborWeight]], NoneIsEmptyDict] = {}
    """Client id -> its reliable neighbors, best first (none when the audit found none)."""
    self_weights: Annotated[dict[str, float], NoneIsEmptyDict] = {}
    """Client id -> R'(c, c)."""


def read_neighbors(result: Mapping[str, object]) -> StoredNeighbors:
    """The reliable neighbors of a stored audit result, typed."""
    return StoredNeighbors.model_validate(result)


# --- one client --------------------------------------------------------------------------------


@dataclass(frozen=True)
class DetectorVerdict:
    """What one detector that ran in the audit said about the client: its status for the round
    (``ok``, ``undetermined``, ``inconclusive``) and its verdict on the client (None where it
    gave none); ``noisy_classes`` for the detectors that judge per class."""

    status: str
    score: float | None
    flag: bool | None
    noisy_classes: tuple[int, ...] | None


@dataclass(frozen=True)
class EvidenceBasis:
    """What the evidence detector's verdict on the client rests on (None where not stored)."""

    flagged_by_geometry: bool | None = None
    geometry_carried: bool | None = None
    flagged_by_accuracy: bool | None = None


@dataclass(frozen=True)
class ClientAudit:
    """What one stored audit says about one client: ``detectors`` holds those that ran, in
    the registry's order; every other field is None where the audit holds no value."""

    primary: str | None
    primary_flag: bool | None
    weight: float | None
    reliability: float | None
    neighbors: list[NeighborWeight] | None
    epsilon_round: float | None
    epsilon_total: float | None
    detectors: dict[str, DetectorVerdict]
    evidence_basis: EvidenceBasis
    evidence: ClientEvidence = ClientEvidence()
    """Each detector's evidence on the client, beside its verdict
    (:mod:`service.coordinator.stored_evidence`)."""


def client_paths(position: int, client_id: str) -> dict[str, JsonPath]:
    """Where a stored audit result holds what it says about the client at ``position``, as
    typed JSON paths (read in the database by :func:`service.store.audit_json.audit_values`,
    or in memory by :func:`walk`), keyed as :func:`client_audit` reads them."""
    verdict = ("verdicts", position)
    paths: dict[str, JsonPath] = {
        "primary_flag": JsonPath(("primary_flags", position), "bool"),
        "weight": JsonPath(("aggregation", "weights", position), "float"),
        "reliability": JsonPath(("expertise", position), "float"),
        "neighbors": JsonPath(("neighbors", client_id)),
        "primary": JsonPath(("primary",), "str"),
        "epsilon_round": JsonPath(("privacy", "epsilon_round"), "float"),
        "epsilon_total": JsonPath(("privacy", "epsilon_total", position), "float"),
    }
    for name in DETECTORS:
        paths[f"{name}.status"] = JsonPath(("detections", name, "status"), "str")
        paths[f"{name}.score"] = JsonPath(("detections", name, *verdict, "score"), "float")
        paths[f"{name}.flag"] = JsonPath(("detections", name, *verdict, "flag"), "bool")
        paths[f"{name}.evidence"] = JsonPath(("detections", name, *verdict, "evidence"))
    for name in CLASS_DETECTORS:
        paths[f"{name}.noisy_classes"] = JsonPath(
            ("detections", name, *verdict, "evidence", "noisy_classes")
        )
    for key in BASIS_KEYS:
        paths[f"evidence.{key}"] = JsonPath(
            ("detections", "evidence", *verdict, "evidence", key), "bool"
        )
    return paths


def walk(value: object, path: JsonPath) -> object:
    """The value at ``path`` in a stored result, loaded; None where the path leads nowhere."""
    for step in path.steps:
        if isinstance(step, int) and isinstance(value, list) and 0 <= step < len(value):
            value = value[step]
        elif isinstance(step, str) and isinstance(value, dict):
            value = value.get(step)
        else:
            return None
    return value


def _bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _classes(value: object) -> tuple[int, ...]:
    return tuple(int(c) for c in value) if isinstance(value, list) else ()


def _neighbors(value: object) -> list[NeighborWeight] | None:
    if not isinstance(value, list):
        return None
    return [NeighborWeight(client_id=str(n["client_id"]), weight=float(n["weight"])) for n in value]


def client_audit(values: Mapping[str, object]) -> ClientAudit:
    """The values at :func:`client_paths` (a key missing reads as None), typed."""
    detectors: dict[str, DetectorVerdict] = {}
    for name in DETECTORS:
        status = _str(values.get(f"{name}.status"))
        if status is None:
            continue  # not run in this audit
        detectors[name] = DetectorVerdict(
            status=status,
            score=_float(values.get(f"{name}.score")),
            flag=_bool(values.get(f"{name}.flag")),
            noisy_classes=(
                _classes(values.get(f"{name}.noisy_classes")) if name in CLASS_DETECTORS else None
            ),
        )
    basis = {key: _bool(values.get(f"evidence.{key}")) for key in BASIS_KEYS}
    parts = read_parts(
        {name: values.get(f"{name}.evidence") for name in detectors},
        {name: verdict.score for name, verdict in detectors.items()},
    )
    return ClientAudit(
        primary=_str(values.get("primary")),
        primary_flag=_bool(values.get("primary_flag")),
        weight=_float(values.get("weight")),
        reliability=_float(values.get("reliability")),
        neighbors=_neighbors(values.get("neighbors")),
        epsilon_round=_float(values.get("epsilon_round")),
        epsilon_total=_float(values.get("epsilon_total")),
        detectors=detectors,
        evidence_basis=EvidenceBasis(**basis),
        evidence=parts,
    )


def client_audit_in(result: Mapping[str, object], position: int, client_id: str) -> ClientAudit:
    """What a loaded audit result says about the client at ``position``."""
    paths = client_paths(position, client_id)
    return client_audit({key: walk(result, path) for key, path in paths.items()})


def read_client_audit(
    session: Session, audit_id: uuid.UUID, position: int, client_id: str
) -> ClientAudit:
    """What a stored audit says about the client at ``position``, read in the database."""
    return client_audit(audit_values(session, audit_id, client_paths(position, client_id)))


# --- a client's flag history -------------------------------------------------------------------


class FlagEntry(TypedDict, total=False):
    """One audited round of a client's flag history (``Client.flag_history``, appended at each
    close by ``service.coordinator.rounds._update_statuses``). Every key is optional: an entry
    stored before a key was recorded lacks it, and each reader says what a missing key means."""

    round: int
    in_warmup: bool
    verdict: str | None
    """The primary detector's status that round (ok, inconclusive, undetermined)."""
    primary: bool | None
    """The primary detector's flag (None: no verdict)."""
    effective: bool | None
    """The flag after an admin's pin, where one applied."""
    geometry: bool
    """True where the primary flag rested on the update geometry alone."""
    fednoro: bool | None
    fedncl: bool | None
    expertise: bool | None
    evidence: bool | None
    """Each detector's flag, under its name (None: it gave no verdict), where it ran."""


def flag_entries(history: list[Any] | None) -> list[FlagEntry]:
    """A client's stored flag history, oldest first, typed. Not a copy and not checked: the
    status rule reads every site's whole history at each close (K sites x R rounds), where
    building an object per entry cost ten times the reading (1 us against 0.08 us)."""
    return cast(list[FlagEntry], history or [])
