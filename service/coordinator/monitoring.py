"""What the health and metrics routes read: readiness (the database answers and its schema is at
head) and the counts and figures of `/metrics`."""

from __future__ import annotations

from dataclasses import replace

from service.audit import PRIMARY_DETECTORS
from service.coordinator.resources import Services
from service.errors import MigrationsNotAtHeadError, NotReadyError
from service.store import repositories as repo
from service.store import stats
from service.store.migrate import check_at_head
from service.store.stats import RunningFederationStats
from service.store.tables import CLIENT_STATUSES, FEDERATION_STATUSES, ROUND_STATES


def readiness(services: Services) -> None:
    """Raise `NotReadyError` unless the database answers and its schema is at head."""
    try:
        with services.sessions() as session:
            repo.ping(session)
            bind = session.get_bind()
        check_at_head(bind.engine)
    except MigrationsNotAtHeadError as exc:
        raise NotReadyError(str(exc)) from None
    except Exception as exc:
        raise NotReadyError(f"database unreachable: {type(exc).__name__}: {exc}") from None


def running_federations(services: Services) -> list[RunningFederationStats]:
    """Per running federation, what its training-quality gauges show (``/metrics``): its sites
    by effective status (every known status present), its latest round, its latest closed
    round's close time and coordinator seconds, its latest audit's verdict and its count of
    site errors."""
    with services.sessions() as session:
        running = stats.running_federation_stats(session, PRIMARY_DETECTORS)
    return [
        replace(entry, sites={**dict.fromkeys(CLIENT_STATUSES, 0), **entry.sites})
        for entry in running
    ]


def metrics_snapshot(services: Services) -> dict[str, dict[str, int]]:
    """Aggregate counts read from the database, so every replica answers the same.

    Every known federation status, round state and client status is present (zero when there
    is none), so a series does not vanish when its count drops to zero.
    """
    with services.sessions() as session:
        counts = stats.status_counts(session)
    for key, known in (
        ("federations", FEDERATION_STATUSES),
        ("rounds", ROUND_STATES),
        ("clients", CLIENT_STATUSES),
    ):
        counts[key] = {**dict.fromkeys(known, 0), **counts[key]}
    return counts
