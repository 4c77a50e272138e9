"""Two coordinator processes on one SQLite database wake each other's waiting sites through the
signal file beside it (service.coordinator.file_notify; issue 24: ``fedaudit serve --workers
N`` on SQLite). Without it (``FEDAUDIT_CHANGE_NOTIFIER=local``) a site waiting on one process
learns of a round the other opened or closed at its 15-second re-check, and this test fails."""

from __future__ import annotations

import httpx
import pytest

from client_sdk import AdminClient
from fedaudit_sim.coordinator_process import CoordinatorProcess
from tests.e2e.test_replicas import WAKE_S, join, setup_federation, upload, woken_on

pytestmark = [pytest.mark.slow]


def test_a_site_waiting_on_one_process_wakes_when_the_other_opens_and_closes_the_round(
    sqlite_replicas: tuple[CoordinatorProcess, ...],
) -> None:
    a, b = sqlite_replicas
    with AdminClient(b.url, b.admin_token) as admin:
        fid, tokens = setup_federation(admin, ["x", "y"])
    for process in (a, b):
        notifier = httpx.get(f"{process.url}/healthz", timeout=5).json()["change_notifier"]
        assert (notifier["kind"], notifier["listening"]) == ("file", True)
    join(b.url, fid, tokens["x"])

    answer, seconds = woken_on(a.url, fid, tokens["x"], lambda: join(b.url, fid, tokens["y"]))
    assert answer.status == "train"
    assert answer.round is not None
    assert answer.round.index == 0
    assert seconds < WAKE_S

    upload(b.url, fid, tokens["x"], "x", 0)
    answer, seconds = woken_on(
        a.url, fid, tokens["x"], lambda: upload(b.url, fid, tokens["y"], "y", 0)
    )
    assert answer.status == "train"
    assert answer.round is not None
    assert answer.round.index == 1
    assert seconds < WAKE_S
