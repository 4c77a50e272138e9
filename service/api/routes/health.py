"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse, Response

from service import __version__
from service.api import prometheus
from service.api.deps import Credentials, ServicesDep, require_admin
from service.api.problems import PROBLEM_401, problem
from service.api.prometheus import MetricFamily, by_label
from service.api.schemas.health import ChangeNotifierState, Health
from service.coordinator import monitoring
from service.store.stats import RunningFederationStats

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is alive; the state of its change listener")
def healthz(services: ServicesDep) -> Health:
    """Always 200 while the process answers. ``change_notifier``: what wakes its long-polls
    (``kind`` local, file or postgres), whether its listener (the file's or PostgreSQL's)
    listens now, and the type and time of the listener's last failure (its message is in the
    log). A listener that does not
    listen leaves the process alive and ready: its waiting sites re-check every 15 s."""
    return Health(change_notifier=ChangeNotifierState(**services.notifier.state()))


@router.get(
    "/readyz",
    summary="Database reachable and migrations at head",
    responses={503: problem(503, "Not ready")},
)
def readyz(services: ServicesDep) -> dict[str, str]:
    monitoring.readiness(services)
    return {"status": "ready"}


def metrics_auth(request: Request, services: ServicesDep, credentials: Credentials) -> None:
    """The admin token, only when `metrics_require_admin` is set (scrapers usually send none)."""
    if services.settings.metrics_require_admin:
        require_admin(request, services, credentials)


def database_families(services: Any) -> list[MetricFamily]:
    """The families read from the database at a scrape (``prometheus.DatabaseCollector``)."""
    return metric_families(monitoring.metrics_snapshot(services)) + federation_families(
        monitoring.running_federations(services)
    )


AUDIT_VERDICTS = ("ok", "inconclusive", "undetermined")
"""The statuses a detection can have (``service.audit.detection``), one series each."""


def federation_families(running: list[RunningFederationStats]) -> list[MetricFamily]:
    """Training-quality gauges of the running federations only (a finished federation's
    sites leave the series), labelled ``federation`` (id) and ``name``."""
    sites: list[tuple[Mapping[str, str], float]] = []
    latest: list[tuple[Mapping[str, str], float]] = []
    closed_at: list[tuple[Mapping[str, str], float]] = []
    close_seconds: list[tuple[Mapping[str, str], float]] = []
    verdicts: list[tuple[Mapping[str, str], float]] = []
    site_errors: list[tuple[Mapping[str, str], float]] = []
    for fed in running:
        labels = {"federation": fed.id, "name": fed.name}
        site_errors.append((labels, float(fed.site_errors)))
        for status, n in sorted(fed.sites.items()):
            sites.append(({**labels, "status": status}, float(n)))
        if fed.latest_round is not None:
            latest.append((labels, float(fed.latest_round)))
        if fed.last_closed_at is not None:
            closed_at.append((labels, fed.last_closed_at.timestamp()))
        if fed.last_close_seconds is not None:
            close_seconds.append((labels, float(fed.last_close_seconds)))
        if fed.verdict is not None:
            for verdict in AUDIT_VERDICTS:
                verdicts.append(({**labels, "verdict": verdict}, float(fed.verdict == verdict)))
    return [
        MetricFamily(
            "fedaudit_federation_sites",
            "Sites of a running federation by effective status (trusted, suspect, noisy).",
            "gauge",
            sites,
        ),
        MetricFamily(
            "fedaudit_federation_round",
            "Index of a running federation's latest round (open or closed).",
            "gauge",
            latest,
        ),
        MetricFamily(
            "fedaudit_federation_last_round_closed_timestamp_seconds",
            "Unix time at which a running federation's latest closed round closed "
            "(time() minus it: the seconds since).",
            "gauge",
            closed_at,
        ),
        MetricFamily(
            "fedaudit_federation_last_round_close_seconds",
            "Coordinator seconds spent closing a running federation's latest closed round "
            "(aggregation and audit).",
            "gauge",
            close_seconds,
        ),
        MetricFamily(
            "fedaudit_federation_audit_verdict",
            "The primary detector's verdict in a running federation's latest audit: 1 for the "
            "verdict it gave (ok, inconclusive: it abstained, undetermined), 0 for the others.",
            "gauge",
            verdicts,
        ),
        MetricFamily(
            "fedaudit_federation_site_errors_total",
            "Rounds the sites of a running federation reported they could not do (its events "
            "of kind site.error); fedaudit_site_errors_total counts every federation's.",
            "counter",
            site_errors,
        ),
    ]


def metric_families(counts: dict[str, dict[str, int]]) -> list[MetricFamily]:
    """The exposition of one database snapshot (see `monitoring.metrics_snapshot`)."""
    rejected = counts["events"].get("update.rejected", 0)
    return [
        MetricFamily(
            "fedaudit_build_info",
            "Version of the coordinator answering.",
            "gauge",
            [({"version": __version__}, 1)],
        ),
        MetricFamily(
            "fedaudit_federations",
            "Federations by status.",
            "gauge",
            by_label("status", counts["federations"]),
        ),
        MetricFamily(
            "fedaudit_rounds", "Rounds by state.", "gauge", by_label("state", counts["rounds"])
        ),
        MetricFamily(
            "fedaudit_clients",
            "Sites of the running federations by effective status (a pin wins over the "
            "detectors); fedaudit_federation_sites has them per federation.",
            "gauge",
            by_label("status", counts["clients"]),
        ),
        MetricFamily(
            "fedaudit_updates_accepted_total",
            "Model updates accepted.",
            "counter",
            [({}, counts["updates"]["count"])],
        ),
        MetricFamily(
            "fedaudit_updates_rejected_total",
            "Model updates rejected (events of kind update.rejected).",
            "counter",
            [({}, rejected)],
        ),
        MetricFamily(
            "fedaudit_site_errors_total",
            "Rounds a site reported it could not do (events of kind site.error: the model did "
            "not load, training failed, ...), in every federation, finished ones included.",
            "counter",
            [({}, counts["events"].get("site.error", 0))],
        ),
        MetricFamily(
            "fedaudit_audits_abstained_total",
            "Rounds after the warm-up whose primary detector gave no verdict: inconclusive "
            "(the consensus is suspect, nobody flagged) or undetermined (too few sites or "
            "signals); events audit.inconclusive / audit.undetermined.",
            "counter",
            [
                ({"status": status}, counts["events"].get(f"audit.{status}", 0))
                for status in ("inconclusive", "undetermined")
            ],
        ),
        MetricFamily(
            "fedaudit_events_total",
            "Events in the audit trail by kind (rejected requests are events).",
            "counter",
            by_label("kind", counts["events"]),
        ),
        MetricFamily(
            "fedaudit_model_bytes",
            "Bytes of stored models as uploaded (kind=update) or aggregated (kind=global), "
            "before content-addressed deduplication.",
            "gauge",
            [
                ({"kind": "global"}, counts["model_versions"]["bytes"]),
                ({"kind": "update"}, counts["updates"]["bytes"]),
            ],
        ),
    ]


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    summary="Prometheus metrics (text format 0.0.4), read from the database",
    responses={**PROBLEM_401},
)
def metrics(request: Request, _: Annotated[None, Depends(metrics_auth)]) -> Response:
    return Response(
        prometheus.render(request.app.state.metrics_registry()),
        media_type=prometheus.CONTENT_TYPE,
    )
