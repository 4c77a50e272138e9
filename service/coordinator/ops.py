"""Readiness and metrics."""

from __future__ import annotations

from service.coordinator.services import Services
from service.errors import MigrationsNotAtHeadError, NotReadyError
from service.store import repositories as repo
from service.store.migrate import check_at_head


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


def prometheus_metrics(services: Services) -> str:
    with services.sessions() as session:
        counts = repo.status_counts(session)
    lines = [
        "# HELP fedaudit_federations Federations by status.",
        "# TYPE fedaudit_federations gauge",
        *(
            f'fedaudit_federations{{status="{s}"}} {n}'
            for s, n in sorted(counts["federations"].items())
        ),
        "# HELP fedaudit_rounds Rounds by state.",
        "# TYPE fedaudit_rounds gauge",
        *(f'fedaudit_rounds{{state="{s}"}} {n}' for s, n in sorted(counts["rounds"].items())),
        "# HELP fedaudit_updates_accepted_total Updates accepted.",
        "# TYPE fedaudit_updates_accepted_total counter",
        f"fedaudit_updates_accepted_total {counts['updates']['accepted']}",
        "# HELP fedaudit_updates_rejected_total Updates rejected.",
        "# TYPE fedaudit_updates_rejected_total counter",
        f"fedaudit_updates_rejected_total {counts['updates']['rejected']}",
    ]
    return "\n".join(lines) + "\n"
