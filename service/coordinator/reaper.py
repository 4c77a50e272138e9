"""The deadline checker: a daemon thread that resumes and closes rounds.

It runs `rounds.check_rounds` once at start-up (so rounds left open by a crash resume without
operator action) and then every `reaper_interval_s`. Several replicas may each run one: closing is
guarded by the database, so at most one of them closes a given round.
"""

from __future__ import annotations

import logging
import threading

from service.coordinator import rounds
from service.coordinator.resources import Services

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
                closed = rounds.check_rounds(self._services)
                if closed:
                    log.info("deadline checker closed %d round(s)", len(closed))
            except Exception:
                log.exception("deadline checker failed; retrying")
            self._stop.wait(self._services.settings.reaper_interval_s)
