"""Two coordinator processes on one SQLite database wake each other's waiting sites through the
signal file beside it (service.coordinator.file_notify; issue 24: ``fedaudit serve --workers
N`` on SQLite). Without it (``FEDAUDIT_CHANGE_NOTIFIER=local``) a site waiting on one process
learns of a round the other opened or closed at its 15-second re-check, and this test fails."""

from __future__ import annotations

import httpx
import pytest

from fedaudit_sim.coordinator_process import CoordinatorProcess
from tests.e2e.test_replicas import waiter_on_a_wakes_when_b_changes_the_round

pytestmark = [pytest.mark.slow]


def test_a_site_waiting_on_one_process_wakes_when_the_other_opens_and_closes_the_round(
    sqlite_replicas: tuple[CoordinatorProcess, ...],
) -> None:
    for process in sqlite_replicas:
        notifier = httpx.get(f"{process.url}/healthz", timeout=5).json()["change_notifier"]
        assert (notifier["kind"], notifier["listening"]) == ("file", True)
    waiter_on_a_wakes_when_b_changes_the_round(*sqlite_replicas)
