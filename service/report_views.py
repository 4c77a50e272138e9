"""What the reports say, as typed values: the noisy-client report, a client's history and page,
its diagnostics, a round's view, and the dashboard's index of the federations.

:mod:`service.coordinator.reports` builds them from the stored audits (the index's rows,
:mod:`service.coordinator.queries` from the counts); the API converts them into
its wire types (``service.api.schemas.reports``, by :mod:`service.api.convert`), the report's CSV
(:mod:`service.coordinator.report_csv`) and the dashboard (``service.api.dashboard``) read their
attributes. They live here, beside the coordinator rather than in it, because the dashboard may
not import the coordinator (it renders strings; the routes call the use cases). Each value is the
one the wire type of the same field says; a ``None`` is a JSON null.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from typing_extensions import TypedDict

# The reports' neighbors are the audit's (re-exported for the coordinator and the API).
from service.audit.reliability import NeighborWeight as NeighborWeight
from service.audit_records.detection_summaries import FedNoRoSummary
from service.audit_records.stored_record import StoredRecord


class ClassEvidenceEntry(TypedDict):
    """One class of a client's ``class_evidence``."""

    index: int
    label: str
    evidence_z: float | None
    fednoro_normalised_loss: float | None
    noisy_by: list[str]


class DetectorEvidenceEntry(TypedDict):
    """A client's ``detector_evidence``: each detector's parts (None: no verdict on the client)."""

    evidence: dict[str, float | None] | None
    fednoro: dict[str, float | None] | None
    fedncl: dict[str, float | None] | None
    expertise: dict[str, float | None] | None


@dataclass(frozen=True)
class NamedNeighbor:
    """A reliable neighbor with its name (its id where the federation has no such client)."""

    client_id: str
    weight: float
    name: str


@dataclass(frozen=True)
class ClientRound:
    """What one stored audit says about one client (``reports._client_entry`` says how)."""

    round: int
    primary_flag: bool | None
    flag_basis: str | None
    flags: dict[str, bool | None]
    scores: dict[str, float | None]
    statuses: dict[str, str]
    noisy_classes: list[str]
    classes_by_detector: dict[str, list[str]]
    detector_evidence: DetectorEvidenceEntry
    class_evidence: list[ClassEvidenceEntry]
    reliability: float | None
    neighbors: list[NeighborWeight] | None
    weight: float | None
    epsilon_round: float | None
    epsilon_total: float | None


@dataclass(frozen=True)
class FlagRound:
    """One audited round of a client's flag history, as the report shows it."""

    round: int | None
    in_warmup: bool
    primary: bool | None
    verdict: str | None
    detectors: dict[str, bool | None]
    """Each detector's flag under its name, for those the stored entry holds (on the wire, one
    key per detector beside the others)."""


@dataclass(frozen=True)
class ReportRow:
    """One client's row of the noisy-client report (its latest audit's values None before
    its first audit)."""

    client_id: str
    name: str
    status: str
    detected_status: str
    pinned_status: str | None
    pin_reason: str | None
    anchor: bool
    anchor_reason: str | None
    num_samples: int | None
    times_flagged: int
    rounds_audited: int
    flag_history: list[FlagRound]
    latest_round: int | None
    latest_flags: dict[str, bool | None] | None
    flag_basis: str | None
    latest_scores: dict[str, float | None] | None
    latest_statuses: dict[str, str] | None
    noisy_classes: list[str]
    classes_by_detector: dict[str, list[str]]
    latest_detector_evidence: DetectorEvidenceEntry | None
    latest_class_evidence: list[ClassEvidenceEntry]
    reliability: float | None
    neighbors: list[NamedNeighbor] | None
    last_weight: float | None
    inconsistent_updates: int
    last_inconsistent_at: datetime | None
    epsilon_round: float | None
    epsilon_total: float | None
    attendance: str = "present"
    """Whether it takes part in the next rounds (``service.coordinator.attendance.state``)."""
    suspend_reason: str | None = None


@dataclass(frozen=True)
class DetectorState:
    """What one detector answered in an audit, and why when it did not answer ok."""

    status: str | None
    reason: str | None


@dataclass(frozen=True)
class LatestAudit:
    """The report's ``latest``: how the last audited round was judged and aggregated."""

    round: int
    primary_detector: str | None
    primary_status: str | None
    primary_reason: str | None
    # The primary detector's own figures, as its record (service.audit_records).
    primary_summary: StoredRecord | None
    aggregation_rule: str | None
    fallback_reason: str | None
    in_warmup: bool | None
    detectors: dict[str, DetectorState]
    warnings: list[str]

    @property
    def guard(self) -> str | None:
        """FedNoRo's note on its separation guard, where the summary has one."""
        summary = self.primary_summary
        guard = summary.guard if isinstance(summary, FedNoRoSummary) else None
        return guard if isinstance(guard, str) else None


@dataclass(frozen=True)
class SiteError:
    """A round a site could not do, in its own words."""

    at: datetime
    client_id: str | None
    name: str | None
    round: int | None
    stage: str | None
    error_type: str | None
    message: str


@dataclass(frozen=True)
class PrivacySummary:
    """The federation's Gaussian mechanism and the epsilon of one site's update in a round."""

    noise_multiplier: float
    clip_loss: float
    clip_probe: float | None
    delta: float
    accountant: str
    releases_per_update: int
    epsilon_per_round: float


@dataclass(frozen=True)
class FederationOverview:
    """One federation of the dashboard's index: its status and method, its rounds closed of
    those planned, its clients, and how many of them are noisy or suspect (a pin counting over
    the detected status)."""

    id: str
    name: str
    status: str
    method: str | None
    rounds_planned: int
    rounds_closed: int
    clients: int
    noisy: int
    suspect: int
    created_at: datetime


@dataclass(frozen=True)
class ReportView:
    """The noisy-client report of a federation (``latest`` None before its first audit)."""

    federation_id: str
    federation: str
    status: str
    status_reason: str | None
    rounds_audited: int
    warmup_rounds: int
    primary_detector: str
    latest: LatestAudit | None
    clients: list[ReportRow]
    site_errors: list[SiteError]
    privacy: PrivacySummary | None


@dataclass(frozen=True)
class RoundRow:
    """One update of a round, as the round's dashboard page shows it."""

    client_id: str
    name: str
    num_samples: int
    per_class_loss: list[float | None] | None
    weight: float | None
    primary_flag: bool | None
    pruned: bool


@dataclass(frozen=True)
class RoundView:
    """One round for the dashboard: state, the primary verdict, aggregation, its updates."""

    round: int
    state: str
    state_reason: str | None
    audited: bool
    in_warmup: bool | None
    primary_detector: str | None
    primary_status: str | None
    primary_reason: str | None
    guard: str | None
    aggregation_rule: str | None
    fallback_reason: str | None
    classes: list[str]
    clients: list[RoundRow]


@dataclass(frozen=True)
class ClientHistoryView:
    """Round by round, what the audit said about one client."""

    client_id: str
    name: str
    status: str
    detected_status: str
    pinned_status: str | None
    pin_reason: str | None
    pinned_by: str | None
    rounds: list[ClientRound]


@dataclass(frozen=True)
class PageRound:
    """A round of the client page: what the audit said, whether it was the warm-up, and the
    neighbors with their names."""

    audit: ClientRound
    in_warmup: bool
    neighbors: list[NamedNeighbor]


@dataclass(frozen=True)
class ClientPageView:
    """One client for the dashboard (``reports.client_page_view`` says what each part is)."""

    federation_id: str
    federation: str
    client_id: str
    name: str
    status: str
    detected_status: str
    pinned_status: str | None
    pin_reason: str | None
    pinned_by: str | None
    anchor: bool
    anchor_reason: str | None
    rounds: list[PageRound]
    classes: list[str]
    per_class_loss: dict[int, list[float | None]]
    class_counts: dict[int, list[int]]
    site_errors: list[SiteError]


@dataclass(frozen=True)
class DiagnosticsView:
    """What a client may learn about itself."""

    client_id: str
    name: str
    status: str
    latest_round: int | None
    flagged_rounds: list[int]
    rounds_audited: int
    noisy_classes: list[str]
    flag_basis: str | None
    scores: dict[str, float | None] | None
    advice: str
