"""The aggregate queries of the operators' view: what ``/metrics`` counts at a scrape (a handful
of GROUP BY queries, no rows) and the training-quality figures of the running federations.

Like :mod:`service.store.repositories`, these functions only read and leave the session to the
caller; they live apart because they read across the whole database, not one federation's rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.store.repositories import client_status_counts
from service.store.tables import (
    AuditResult,
    Client,
    Event,
    Federation,
    ModelUpdate,
    ModelVersion,
    Round,
)

__all__ = ["RunningFederationStats", "running_federation_stats", "status_counts"]


@dataclass(frozen=True)
class RunningFederationStats:
    """The training-quality figures of one running federation (``/metrics`` shows them as
    gauges labelled with its id and name)."""

    id: str
    name: str
    sites: dict[str, int]
    """Its sites by effective status (a pin counting over the detected status); a status no
    site has is absent here (the metrics show it at zero)."""
    latest_round: int | None
    """The index of its latest round, open or closed; None before round 0."""
    last_closed_at: datetime | None
    """When its latest closed round closed; None before the first."""
    last_close_seconds: float | None
    """The coordinator's seconds spent closing that round (aggregation and audit)."""
    verdict: str | None
    """The status of the primary detector in its latest audit; None before the first."""
    site_errors: int
    """How many ``site.error`` events it holds."""


def status_counts(session: Session) -> dict[str, dict[str, int]]:
    """Aggregate counts for the metrics endpoint: a handful of GROUP BY queries, no rows.

    ``clients``: the sites of the running federations only, by effective status (a pin wins
    over the detectors); a finished, failed or stopped federation's sites leave the count.
    """
    federations = session.execute(
        select(Federation.status, func.count()).group_by(Federation.status)
    ).all()
    rounds = session.execute(select(Round.state, func.count()).group_by(Round.state)).all()
    client_status = func.coalesce(Client.pinned_status, Client.status)
    clients = session.execute(
        select(client_status, func.count())
        .join(Federation, Client.federation_id == Federation.id)
        .where(Federation.status == "running")
        .group_by(client_status)
    ).all()
    events = session.execute(select(Event.kind, func.count()).group_by(Event.kind)).all()
    updates = session.execute(
        select(func.count(), func.coalesce(func.sum(ModelUpdate.size_bytes), 0))
    ).one()
    versions = session.execute(
        select(func.count(), func.coalesce(func.sum(ModelVersion.size_bytes), 0))
    ).one()
    return {
        "federations": {str(s): int(n) for s, n in federations},
        "rounds": {str(s): int(n) for s, n in rounds},
        "clients": {str(s): int(n) for s, n in clients},
        "events": {str(k): int(n) for k, n in events},
        "updates": {"count": int(updates[0]), "bytes": int(updates[1])},
        "model_versions": {"count": int(versions[0]), "bytes": int(versions[1])},
    }


def running_federation_stats(
    session: Session, primary_detectors: Sequence[str]
) -> list[RunningFederationStats]:
    """Per running federation: id, name, its sites by effective status, the index of its latest
    round, the close time and coordinator seconds of its latest closed round (None before the
    first), its latest audit's verdict: the status of its primary detector, one of
    ``primary_detectors`` (the audit's names; the store does not import the audit), and how
    many ``site.error`` events it holds. Four grouped queries and one row per running
    federation."""
    running = session.execute(
        select(Federation.id, Federation.name)
        .where(Federation.status == "running")
        .order_by(Federation.name, Federation.id)
    ).all()
    if not running:
        return []
    ids = [fid for fid, _ in running]
    sites = client_status_counts(session, ids)
    latest = dict(
        session.execute(
            select(Round.federation_id, func.max(Round.index))
            .where(Round.federation_id.in_(ids))
            .group_by(Round.federation_id)
        ).all()
    )
    last_closed = (
        select(Round.federation_id, func.max(Round.index).label("index"))
        .where(Round.federation_id.in_(ids), Round.state == "closed")
        .group_by(Round.federation_id)
        .subquery()
    )
    closed = {
        fid: (closed_at, seconds)
        for fid, closed_at, seconds in session.execute(
            select(Round.federation_id, Round.closed_at, Round.coordinator_seconds).join(
                last_closed,
                (Round.federation_id == last_closed.c.federation_id)
                & (Round.index == last_closed.c.index),
            )
        ).all()
    }
    verdicts = _latest_verdicts(session, ids, primary_detectors)
    site_errors = dict(
        session.execute(
            select(Event.federation_id, func.count())
            .where(Event.kind == "site.error", Event.federation_id.in_(ids))
            .group_by(Event.federation_id)
        ).all()
    )
    return [
        RunningFederationStats(
            id=str(fid),
            name=name,
            sites=sites.get(fid, {}),
            latest_round=latest.get(fid),
            last_closed_at=closed.get(fid, (None, None))[0],
            last_close_seconds=closed.get(fid, (None, None))[1],
            verdict=verdicts.get(fid),
            site_errors=int(site_errors.get(fid, 0)),
        )
        for fid, name in running
    ]


def _latest_verdicts(
    session: Session, ids: Sequence[uuid.UUID], detectors: Sequence[str]
) -> dict[uuid.UUID, str]:
    """Per federation, the primary detector's status in its latest audit (``ok``,
    ``inconclusive``, ``undetermined``), read with JSON paths in the database: the audit's
    verdicts, which grow with the sites, never leave it."""
    newest = (
        select(AuditResult.federation_id, func.max(AuditResult.round_index).label("index"))
        .where(AuditResult.federation_id.in_(ids))
        .group_by(AuditResult.federation_id)
        .subquery()
    )
    columns = [AuditResult.result["primary"].as_string()] + [
        AuditResult.result["detections"][name]["status"].as_string() for name in detectors
    ]
    rows = session.execute(
        select(AuditResult.federation_id, *columns).join(
            newest,
            (AuditResult.federation_id == newest.c.federation_id)
            & (AuditResult.round_index == newest.c.index),
        )
    ).all()
    verdicts: dict[uuid.UUID, str] = {}
    for fid, primary, *statuses in rows:
        status = dict(zip(detectors, statuses, strict=True)).get(primary)
        if status is not None:
            verdicts[fid] = str(status)
    return verdicts
