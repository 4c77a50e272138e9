"""The coordinator helper's port: a port taken between its choice and the child's bind.

Two real coordinators (uvicorn child processes on loopback). The helper picks a free port and the
child binds it only after ``db upgrade``, seconds later; with parallel test workers or
simulations side by side another process can bind it in between. The helper must then neither
fail nor talk to the other coordinator.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from fedaudit_sim import coordinator_process
from fedaudit_sim.coordinator_process import CoordinatorProcess, PortTakenError


def _federation_count(server: CoordinatorProcess) -> int:
    response = httpx.get(
        f"{server.url}/api/v1/federations",
        headers={"Authorization": f"Bearer {server.admin_token}"},
        timeout=5,
    )
    assert response.status_code == 200, response.text
    return int(response.json()["total"])


def test_a_chosen_port_taken_in_between_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with CoordinatorProcess(tmp_path / "first") as first:
        taken = first.port
        real_free_port = coordinator_process.free_port
        offered = iter([taken])
        # the first choice is the port the first coordinator holds (the race, made certain),
        # later choices are really free
        monkeypatch.setattr(
            coordinator_process, "free_port", lambda: next(offered, None) or real_free_port()
        )
        with CoordinatorProcess(tmp_path / "second") as second:
            assert second.port != taken
            assert second.running
            # each answers with its own token: the second is not talking to the first
            assert _federation_count(second) == 0
            foreign = httpx.get(
                f"{first.url}/api/v1/federations",
                headers={"Authorization": f"Bearer {second.admin_token}"},
                timeout=5,
            )
            assert foreign.status_code == 401
        assert (
            "address already in use"
            in (tmp_path / "second" / "coordinator.log").read_text(errors="replace").lower()
        )


def test_a_given_port_that_is_taken_is_an_error(tmp_path: Path) -> None:
    with CoordinatorProcess(tmp_path / "first") as first:
        second = CoordinatorProcess(tmp_path / "second", port=first.port)
        with pytest.raises(PortTakenError, match=f"port {first.port} was taken"):
            second.start()
        assert not second.running
        assert second.port == first.port
