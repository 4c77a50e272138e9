"""Noisy-client reports, client histories and diagnostics, a round's view.

Everything here reads the stored audit results (through the typed reader,
:mod:`service.coordinator.stored_audit`) and updates and changes nothing; each function takes
the caller's ``Session`` and returns a typed value (:mod:`service.report_views`). An admin's
pins and anchors, and the re-runs of a past round, are in :mod:`service.coordinator.overrides`;
the report as CSV in :mod:`service.coordinator.report_csv`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any, cast

from sqlalchemy.orm import Session

from service.audit import DETECTORS
from service.coordinator import attendance
from service.coordinator.privacy_budget import report_privacy
from service.coordinator.report_evidence import class_evidence, detector_evidence
from service.coordinator.report_warnings import class_label, latest_warnings
from service.coordinator.rounds import effective_status, get_round
from service.coordinator.stored_audit import (
    CLASS_DETECTORS,
    ClientAudit,
    FlagEntry,
    StoredAudit,
    client_audit_in,
    flag_entries,
    read_audit,
    read_client_audit,
)
from service.errors import InconsistentUpdateError
from service.report_views import (
    ClientHistoryView,
    ClientPageView,
    ClientRound,
    DetectorState,
    DiagnosticsView,
    FlagRound,
    LatestAudit,
    NamedNeighbor,
    NeighborWeight,
    PageRound,
    ReportRow,
    ReportView,
    RoundRow,
    RoundView,
    SiteError,
)
from service.store import audit_json
from service.store import repositories as repo
from service.store.tables import AuditResult, Client, Event, Federation


def _flag_basis(client: ClientAudit) -> str | None:
    """What the primary flag rests on: ``update_direction`` (the update geometry, added or
    carried: service.audit.geometry_evidence), ``accuracy`` (the accuracy evidence), ``losses``
    (the reported losses and error counts); None when the site was not flagged."""
    if client.primary_flag is not True:
        return None
    if client.primary == "evidence":
        basis = client.evidence_basis
        if basis.flagged_by_geometry or basis.geometry_carried:
            return "update_direction"
        if basis.flagged_by_accuracy:
            return "accuracy"
    return "losses"


def _client_entry(federation: Federation, round_index: int, client: ClientAudit) -> ClientRound:
    """What one stored audit says about one client (:mod:`service.coordinator.stored_audit`):
    a detector the audit did not run is left out; one that ran but did not answer ``ok`` (or
    gave this client no verdict) has a None score and flag, and no classes; ``statuses`` says
    what each detector that ran answered (``ok``, ``undetermined``, ``inconclusive``).

    ``noisy_classes`` are the primary detector's classes where it judges per class (the
    evidence detector's classes significant alone, FedNoRo's classes on its noisy side), else
    FedNoRo's (a Fed-NCL primary judges the site only); none when the primary abstained.
    ``classes_by_detector``: each per-class detector's own list, side by side.
    ``detector_evidence`` and ``class_evidence``: each detector's evidence beside the verdict,
    per site and per class (:mod:`service.coordinator.report_evidence`), shown whatever the
    detector's status (an inconclusive detector computed them)."""
    scores: dict[str, float | None] = {}
    flags: dict[str, bool | None] = {}
    statuses: dict[str, str] = {}
    classes: dict[str, list[str]] = {}
    indices: dict[str, tuple[int, ...]] = {}
    for name, verdict in client.detectors.items():
        statuses[name] = verdict.status
        ok = verdict.status == "ok"
        scores[name] = verdict.score if ok else None
        flags[name] = verdict.flag if ok else None
        if ok and verdict.noisy_classes is not None:
            indices[name] = verdict.noisy_classes
            classes[name] = [class_label(federation, c) for c in verdict.noisy_classes]
    chosen = client.primary if client.primary in CLASS_DETECTORS else "fednoro"
    return ClientRound(
        round=round_index,
        primary_flag=client.primary_flag,
        flag_basis=_flag_basis(client),
        flags=flags,
        scores=scores,
        statuses=statuses,
        noisy_classes=classes.get(chosen, []),
        classes_by_detector=classes,
        detector_evidence=detector_evidence(client.evidence),
        class_evidence=class_evidence(
            client.evidence, lambda c: class_label(federation, c), indices
        ),
        reliability=client.reliability,
        neighbors=client.neighbors,
        weight=client.weight,
        epsilon_round=client.epsilon_round,
        epsilon_total=client.epsilon_total,
    )


def _client_view(
    federation: Federation, client: Client, audit: AuditResult, position: int
) -> ClientRound:
    """What one stored audit, already loaded, says about one client."""
    found = client_audit_in(audit.result, position, str(client.id))
    return _client_entry(federation, audit.round_index, found)


def _named(neighbors: list[NeighborWeight], names: Mapping[str, str]) -> list[NamedNeighbor]:
    """The neighbors with their names (the id where the federation has no such client)."""
    return [
        NamedNeighbor(
            client_id=n["client_id"],
            weight=n["weight"],
            name=names.get(n["client_id"], n["client_id"]),
        )
        for n in neighbors
    ]


def _flag_round(entry: FlagEntry) -> FlagRound:
    """One entry of a client's stored flag history, as the report shows it."""
    # Under each detector's name, FlagEntry holds that detector's flag.
    flags = cast(Mapping[str, bool | None], entry)
    return FlagRound(
        round=entry.get("round"),
        in_warmup=bool(entry.get("in_warmup")),
        primary=entry.get("primary"),
        verdict=entry.get("verdict"),
        detectors={d: flags.get(d) for d in DETECTORS if d in flags},
    )


def _report_row(
    federation: Federation,
    client: Client,
    found: tuple[AuditResult, int] | None,
    names: dict[str, str],
    inconsistent: dict[uuid.UUID, tuple[int, datetime]],
) -> ReportRow:
    """One client's row of the report; ``found``: its latest audit and its position there."""
    latest = None if found is None else _client_view(federation, client, *found)
    history = [_flag_round(h) for h in flag_entries(client.flag_history)]
    counted = [h for h in history if not h.in_warmup]
    refused, refused_at = inconsistent.get(client.id, (0, None))
    return ReportRow(
        client_id=str(client.id),
        name=client.name,
        status=effective_status(client),
        detected_status=client.status,
        pinned_status=client.pinned_status,
        pin_reason=client.pin_reason,
        anchor=bool(client.anchor),
        anchor_reason=client.anchor_reason,
        num_samples=client.num_samples,
        times_flagged=sum(1 for h in counted if h.primary is True),
        rounds_audited=len(counted),
        flag_history=history,
        latest_round=None if latest is None else latest.round,
        latest_flags=None if latest is None else latest.flags,
        flag_basis=None if latest is None else latest.flag_basis,
        latest_scores=None if latest is None else latest.scores,
        latest_statuses=None if latest is None else latest.statuses,
        noisy_classes=[] if latest is None else latest.noisy_classes,
        classes_by_detector={} if latest is None else latest.classes_by_detector,
        latest_detector_evidence=None if latest is None else latest.detector_evidence,
        latest_class_evidence=[] if latest is None else latest.class_evidence,
        reliability=None if latest is None else latest.reliability,
        neighbors=_named(latest.neighbors, names) if latest and latest.neighbors else None,
        last_weight=None if latest is None else latest.weight,
        inconsistent_updates=refused,
        last_inconsistent_at=refused_at,
        epsilon_round=None if latest is None else latest.epsilon_round,
        epsilon_total=None if latest is None else latest.epsilon_total,
        attendance=attendance.state(client),
        suspend_reason=client.suspend_reason,
    )


def _latest_summary(
    round_index: int, last: StoredAudit, federation: Federation, clients: list[Client]
) -> LatestAudit:
    """The report's ``latest``: how the last audited round was judged and aggregated."""
    detection = last.primary_detection
    return LatestAudit(
        round=round_index,
        primary_detector=last.primary,
        primary_status=detection.status,
        primary_reason=detection.reason,
        primary_summary=detection.summary,
        aggregation_rule=last.aggregation.rule,
        fallback_reason=last.aggregation.fallback_reason,
        in_warmup=last.in_warmup,
        detectors={
            name: DetectorState(status=d.status, reason=d.reason)
            for name, d in last.detections.items()
        },
        warnings=latest_warnings(round_index, last, federation, clients),
    )


def noisy_client_report(session: Session, federation: Federation) -> ReportView:
    """Per client: status, flag history, latest scores per detector, noisy classes, weights, and
    how many of its updates were refused as inconsistent with its join (and when the last was)."""
    clients = repo.list_clients(session, federation.id)
    inconsistent = repo.rejections_by_client(
        session, federation.id, InconsistentUpdateError.type_slug
    )
    names = {str(c.id): c.name for c in clients}
    # Each client's latest audit: walk back from the last round until every client is placed
    # (usually the last audit alone), indexing each audit's client positions once.
    latest_of: dict[str, tuple[AuditResult, int]] = {}
    last: tuple[int, StoredAudit] | None = None
    for audit in repo.audits_newest_first(session, federation.id):
        stored = read_audit(audit.result)
        last = last or (audit.round_index, stored)
        for cid, position in stored.positions.items():
            latest_of.setdefault(cid, (audit, position))
        if all(str(c.id) in latest_of for c in clients):
            break
    rows = [
        _report_row(federation, client, latest_of.get(str(client.id)), names, inconsistent)
        for client in clients
    ]
    return ReportView(
        federation_id=str(federation.id),
        federation=federation.name,
        status=federation.status,
        status_reason=federation.status_reason,
        rounds_audited=repo.count_audits(session, federation.id),
        warmup_rounds=federation.config["warmup_rounds"],
        primary_detector=federation.config["primary_detector"],
        latest=None if last is None else _latest_summary(*last, federation, clients),
        clients=rows,
        site_errors=site_errors(session, federation, names),
        privacy=report_privacy(federation.config),
    )


SITE_ERRORS_SHOWN = 10
"""How many of the latest ``site.error`` events the report shows."""


def site_errors(
    session: Session, federation: Federation, names: Mapping[str, str]
) -> list[SiteError]:
    """The federation's latest site errors, newest first (the sites' own words)."""
    return [
        _site_error(event, names)
        for event in repo.latest_events(
            session, federation.id, kind="site.error", limit=SITE_ERRORS_SHOWN
        )
    ]


def _site_error(event: Event, names: Mapping[str, str]) -> SiteError:
    """One ``site.error`` event as the report and the client page show it (the site's own
    words, its round and stage)."""
    data = event.data or {}
    client_id = str(event.client_id) if event.client_id is not None else None
    return SiteError(
        at=event.created_at,
        client_id=client_id,
        name=names.get(client_id or "", client_id),
        round=data.get("round_index"),
        stage=data.get("stage"),
        error_type=data.get("error_type"),
        message=data.get("error", event.message),
    )


def _held_losses(losses: list[Any], counts: list[int] | None) -> list[float | None]:
    """A per-class loss list with None where the site holds no sample of the class (or sent
    none)."""
    return [
        None if loss is None or (counts is not None and counts[c] == 0) else float(loss)
        for c, loss in enumerate(losses)
    ]


def round_view(session: Session, federation: Federation, index: int) -> RoundView:
    """One round for the dashboard: state, the primary detector's verdict (and its separation
    guard's note), aggregation, and per client its weight, primary flag and per-class losses
    (None where the client sent none or holds no sample of the class)."""
    rnd = get_round(session, federation.id, index)
    names = {c.id: c.name for c in repo.list_clients(session, federation.id)}
    updates = sorted(
        repo.updates_of_round(session, rnd.id), key=lambda u: (names[u.client_id], str(u.id))
    )
    audit = repo.audit_of_round(session, rnd.id)
    weights = rnd.aggregation_weights or {}
    stored = read_audit(None if audit is None else audit.result)
    positions = stored.positions
    rows = []
    for update in updates:
        losses = update.signals.get("per_class_loss")
        counts = update.signals.get("class_counts")
        per_class = None if losses is None else _held_losses(losses, counts)
        rows.append(
            RoundRow(
                client_id=str(update.client_id),
                name=names[update.client_id],
                num_samples=update.num_samples,
                per_class_loss=per_class,
                weight=weights.get(str(update.client_id)),
                primary_flag=stored.primary_flag_at(positions.get(str(update.client_id))),
                pruned=update.pruned_at is not None,
            )
        )
    detection = stored.primary_detection
    return RoundView(
        round=rnd.index,
        state=rnd.state,
        state_reason=rnd.state_reason,
        audited=audit is not None,
        in_warmup=stored.in_warmup,
        primary_detector=stored.primary,
        primary_status=detection.status,
        primary_reason=detection.reason,
        guard=detection.guard,
        aggregation_rule=rnd.aggregation_rule,
        fallback_reason=stored.aggregation.fallback_reason,
        classes=[class_label(federation, c) for c in range(federation.num_classes)],
        clients=rows,
    )


def client_history(session: Session, federation: Federation, client: Client) -> ClientHistoryView:
    """Round by round, what the audit said about one client. Each stored audit's client list
    gives the client's position; only the values at
    :func:`~service.coordinator.stored_audit.client_paths` are then read, in the
    database: the rest of each result (every other site's verdicts and neighbors, which grow
    with the federation) never leaves it."""
    cid = str(client.id)
    rounds = []
    for audit_id, round_index, client_ids in audit_json.audit_client_ids(session, federation.id):
        if cid in client_ids:
            found = read_client_audit(session, audit_id, client_ids.index(cid), cid)
            rounds.append(_client_entry(federation, round_index, found))
    return ClientHistoryView(
        client_id=cid,
        name=client.name,
        status=effective_status(client),
        detected_status=client.status,
        pinned_status=client.pinned_status,
        pin_reason=client.pin_reason,
        pinned_by=client.pinned_by,
        rounds=rounds,
    )


def client_page_view(session: Session, federation: Federation, client: Client) -> ClientPageView:
    """One client for the dashboard: its history (:func:`client_history`, each round with
    whether it was the warm-up and its neighbors' names), its per-class loss in
    every round it sent an update (None where it holds no sample of the class or sent none) and its
    class counts there (``class_counts``, by round), the class labels, whether it is a trust
    anchor, and its latest site errors (newest first)."""
    view = client_history(session, federation, client)
    names = {str(c.id): c.name for c in repo.list_clients(session, federation.id)}
    warmup = _warmup_rounds(client)
    rounds = [
        PageRound(
            audit=entry,
            in_warmup=entry.round in warmup,
            neighbors=_named(entry.neighbors or [], names),
        )
        for entry in view.rounds
    ]
    per_class: dict[int, list[float | None]] = {}
    class_counts: dict[int, list[int]] = {}
    for index, losses, counts in repo.per_class_losses_of_client(session, federation.id, client.id):
        if losses is not None:
            per_class[index] = _held_losses(losses, counts)
        if isinstance(counts, list):
            class_counts[index] = counts
    errors = [
        _site_error(event, {str(client.id): client.name})
        for event in repo.latest_client_events(
            session, federation.id, client.id, kind="site.error", limit=SITE_ERRORS_SHOWN
        )
    ]
    return ClientPageView(
        federation_id=str(federation.id),
        federation=federation.name,
        client_id=view.client_id,
        name=view.name,
        status=view.status,
        detected_status=view.detected_status,
        pinned_status=view.pinned_status,
        pin_reason=view.pin_reason,
        pinned_by=view.pinned_by,
        anchor=bool(client.anchor),
        anchor_reason=client.anchor_reason,
        rounds=rounds,
        classes=[class_label(federation, c) for c in range(federation.num_classes)],
        per_class_loss=per_class,
        class_counts=class_counts,
        site_errors=errors,
    )


def _warmup_rounds(client: Client) -> set[int | None]:
    """The rounds the client's flag history marks as the warm-up (their flags count toward no
    status)."""
    return {h.get("round") for h in flag_entries(client.flag_history) if h.get("in_warmup")}


def client_diagnostics(session: Session, client: Client) -> DiagnosticsView:
    """What a client may learn about itself: its status and which of its classes look noisy.
    ``flagged_rounds`` and ``rounds_audited`` leave the warm-up out, as the report's
    ``times_flagged`` and ``rounds_audited`` do: flags there count toward no status."""
    federation = repo.get_federation(session, client.federation_id)
    assert federation is not None
    history = client_history(session, federation, client)
    latest = history.rounds[-1] if history.rounds else None
    warmup = _warmup_rounds(client)
    counted = [r for r in history.rounds if r.round not in warmup]
    return DiagnosticsView(
        client_id=str(client.id),
        name=client.name,
        status=history.status,
        latest_round=None if latest is None else latest.round,
        flagged_rounds=[r.round for r in counted if r.primary_flag is True],
        rounds_audited=len(counted),
        noisy_classes=[] if latest is None else latest.noisy_classes,
        flag_basis=None if latest is None else latest.flag_basis,
        scores=None if latest is None else latest.scores,
        advice=_advice(
            history.status,
            [] if latest is None else latest.noisy_classes,
            None if latest is None else latest.flag_basis,
        ),
    )


def _advice(status: str, classes: list[str], basis: str | None = None) -> str:
    if status == "trusted":
        return "No label problem detected in your recent updates."
    where = f" Look first at the labels of class(es) {', '.join(classes)}." if classes else ""
    if basis == "update_direction":
        where = (
            " Your model updates move away from the other sites' while your reported losses "
            "look clean: check the labels your training actually uses."
        )
    if status == "suspect":
        return "Your last update looked noisier than the federation's." + where
    return "Your updates were repeatedly flagged as noisy; they count less in aggregation." + where
