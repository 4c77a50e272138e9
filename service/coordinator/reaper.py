"""The deadline checker: a daemon thread that resumes and closes rounds.

It runs `check_rounds` once at start-up (so rounds left open by a crash resume without
operator action) and then every `reaper_interval_s`. Several replicas may each run one: closing is
guarded by the database, so at most one of them closes a given round.
"""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import timedelta

from service.coordinator.resources import Services
from service.coordinator.rounds import close_round, round_is_complete
from service.store import repositories as repo

log = logging.getLogger(__name__)


class DeadlineReaper:
    def __init__(self, services: Services) -> None:
        self._services = services
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fedaudit-reaper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                closed = check_rounds(self._services)
                if closed:
                    log.info("deadline checker closed %d round(s)", len(closed))
            except Exception:
                log.exception("deadline checker failed; retrying")
            self._stop.wait(self._services.settings.reaper_interval_s)


def check_rounds(services: Services) -> list[uuid.UUID]:
    """The deadline checker: close complete or expired rounds, extend starved ones.

    Runs at start-up (so open rounds resume after a restart) and then periodically.
    Returns the ids of rounds it closed.
    """
    closed: list[uuid.UUID] = []
    with services.sessions() as session:
        candidates = [(r.id, r.federation_id) for r in repo.all_open_rounds(session)]
    for round_id, _ in candidates:
        action = _deadline_action(services, round_id)
        if action is not None and close_round(services, round_id, reason=action):
            closed.append(round_id)
    return closed


def _deadline_action(services: Services, round_id: uuid.UUID) -> str | None:
    """'complete' or 'deadline' when the round should close now; extends it when starved."""
    now = services.clock()
    with services.sessions.begin() as session:
        rnd = repo.get_round(session, round_id)
        if rnd is None or rnd.state != "open":
            return None
        if round_is_complete(session, rnd):
            return "complete"
        if now < rnd.deadline_at:
            return None
        federation = repo.get_federation(session, rnd.federation_id)
        assert federation is not None
        submitted = repo.count_updates_of_round(session, rnd.id)
        if submitted >= federation.min_clients:
            return "deadline"
        if not repo.touch_open_round(session, rnd.id):
            return None
        # Locked now; another replica's checker may have extended it since it was read.
        session.refresh(rnd)
        if now < rnd.deadline_at:
            return None
        old = rnd.deadline_at
        rnd.deadline_at = now + timedelta(seconds=federation.round_deadline_s)
        rnd.deadline_extensions += 1
        repo.add_event(
            session,
            kind="round.deadline_extended",
            actor="system",
            message=(
                f"round {rnd.index}: {submitted} of {federation.min_clients} required updates at "
                f"the deadline; extended to {rnd.deadline_at.isoformat()}"
            ),
            federation_id=federation.id,
            round_id=rnd.id,
            data={"old_deadline": old.isoformat(), "new_deadline": rnd.deadline_at.isoformat()},
        )
        return None
