"""End to end, on a real server: a site that stops is waited for twice, then left out (the
rounds close as soon as the others have sent), and is selected again once it polls."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest

from client_sdk import AdminClient, FederationClient, Participant, RoundSummary
from client_sdk.participant import state_to_bytes
from fedaudit_sim.coordinator_process import CoordinatorProcess
from tests.e2e.test_federation_e2e import tiny_data, tiny_model

pytestmark = pytest.mark.slow

DEADLINE_S = 3.0


def test_a_site_that_stops_is_left_out_and_comes_back_when_it_polls(tmp_path: Path) -> None:
    with (
        CoordinatorProcess(tmp_path / "coord") as server,
        AdminClient(server.url, server.admin_token) as admin,
    ):
        federation = admin.create_federation(
            {
                "name": f"attendance-{uuid.uuid4().hex[:6]}",
                "task": {"num_classes": 2, "input_shape": [4]},
                "plan": {"rounds": 8, "min_clients": 2, "round_deadline_s": DEADLINE_S},
                "config": {"method": "fedavg", "hyperparameters": {"lr": 0.1}},
                "seed": 3,
            }
        )
        fid = federation.id
        admin.upload_initial_model(fid, state_to_bytes(tiny_model()))
        tokens = {name: admin.add_client(fid, name).token for name in ("a", "b", "c")}
        errors: list[BaseException] = []
        came_back = threading.Event()

        def hold_after_round_3(summary: RoundSummary) -> None:
            # a waits after its round-3 update until c has polled: the federation cannot finish
            # before c's return, however slow the machine (round 4 needs a's update)
            if summary.round_index == 3:
                came_back.wait(timeout=120)

        def run(name: str, seed: int, max_rounds: int | None) -> None:
            try:
                with FederationClient(server.url, tokens[name]) as client:
                    site = Participant(
                        client,
                        fid,
                        tiny_model(seed),
                        tiny_data(seed),
                        device="cpu",
                        on_round=hold_after_round_3 if name == "a" else None,
                    )
                    site.run(max_rounds=max_rounds)
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        # c does round 0 and stops, as a site whose machine went down
        threads = [
            threading.Thread(target=run, args=("a", 0, None)),
            threading.Thread(target=run, args=("b", 1, None)),
            threading.Thread(target=run, args=("c", 2, 1)),
        ]
        for thread in threads:
            thread.start()
        c_id = {c.name: c.id for c in admin.list_clients(fid)}["c"]
        give_up = time.monotonic() + 120
        while not any(c.attendance == "absent" for c in admin.list_clients(fid)):
            assert time.monotonic() < give_up, "c never became absent"
            time.sleep(0.2)
        # c comes back: a restarted site's first step is a poll
        with FederationClient(server.url, tokens["c"]) as client:
            assert client.get_current_round(fid).status == "wait"
        came_back.set()
        for thread in threads:
            thread.join(timeout=300)
        assert not errors, errors

        rounds = admin.list_rounds(fid)
        events = admin.list_events(fid, client_id=str(c_id))
        absent_after = [e.data["round"] for e in events if e.kind == "client.absent"]
        (returned,) = [e for e in events if e.kind == "client.returned"]
        # waited for at its first two missed rounds (1 and 2), then absent
        assert absent_after[0] == 2
        for rnd in rounds[1:3]:
            assert c_id in rnd.selected_clients
            assert rnd.state_reason == "deadline"
        # left out while absent: those rounds close as soon as a and b have sent
        left_out = [r for r in rounds[3:] if c_id not in r.selected_clients]
        assert left_out
        for rnd in left_out:
            assert rnd.state_reason == "complete"
            assert rnd.closed_at is not None
            assert (rnd.closed_at - rnd.opened_at).total_seconds() < DEADLINE_S
        # selected again from the first round opened after its poll
        back = [r for r in rounds if r.opened_at > returned.created_at]
        assert back
        assert c_id in back[0].selected_clients
        assert admin.get_federation(fid).status == "finished"
