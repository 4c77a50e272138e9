"""End to end: a real coordinator process (uvicorn on a loopback port) and real SDK clients."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load
from torch import nn

from client_sdk import AdminClient, FederationClient, Participant
from client_sdk.participant import state_to_bytes
from client_sdk.recipes import LocalData
from fedaudit_sim.coordinator_process import CoordinatorProcess

pytestmark = pytest.mark.slow


def tiny_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def tiny_data(seed: int, n: int = 40) -> LocalData:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (n,), generator=generator)
    inputs = torch.randn(n, 4, generator=generator) + labels[:, None].float() * 2.0
    return LocalData(inputs=inputs.float(), labels=labels.long())


def create_federation(admin: AdminClient, names: list[str], *, rounds: int, method: str = "fedavg"):
    federation = admin.create_federation(
        {
            "name": f"e2e-{uuid.uuid4().hex[:6]}",
            "task": {"num_classes": 2, "input_shape": [4]},
            "plan": {"rounds": rounds, "min_clients": 2, "round_deadline_s": 120},
            "config": {"method": method, "hyperparameters": {"lr": 0.1, "local_epochs": 1}},
            "seed": 3,
        }
    )
    admin.upload_initial_model(federation.id, state_to_bytes(tiny_model()))
    tokens = {name: admin.add_client(federation.id, name).token for name in names}
    return federation, tokens


def test_three_clients_three_rounds_over_http(tmp_path: Path) -> None:
    names = ["hospital-a", "hospital-b", "hospital-c"]
    with CoordinatorProcess(tmp_path / "coord") as server:
        with AdminClient(server.url, server.admin_token) as admin:
            federation, tokens = create_federation(admin, names, rounds=3)
            errors: list[BaseException] = []
            participants: dict[str, Participant] = {}

            def run(name: str, seed: int) -> None:
                try:
                    with FederationClient(server.url, tokens[name]) as client:
                        participant = Participant(
                            client, federation.id, tiny_model(seed), tiny_data(seed), device="cpu"
                        )
                        participants[name] = participant
                        participant.run()
                except BaseException as exc:  # surfaced below
                    errors.append(exc)

            threads = [threading.Thread(target=run, args=(n, i)) for i, n in enumerate(names)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=300)
            assert not errors, errors
            assert all(len(p.rounds_done) == 3 for p in participants.values())

            final = admin.get_federation(federation.id)
            assert final.status == "finished"
            rounds = admin.list_rounds(federation.id)
            assert [r.index for r in rounds] == [0, 1, 2]
            for rnd in rounds:
                assert rnd.state == "closed"
                assert sorted(map(str, rnd.submitted_clients)) == sorted(
                    map(str, rnd.selected_clients)
                )
                assert len(rnd.selected_clients) == 3
                assert sum(rnd.aggregation_weights.values()) == pytest.approx(1.0)
            # the global model changed, and every client ends on the final model
            initial = load(admin.download_model(rounds[0].model_in_id))
            assert final.current_model_id is not None
            last = load(admin.download_model(final.current_model_id))
            assert any(not np.array_equal(initial[k], last[k]) for k in initial)
            for participant in participants.values():
                local = {k: v.numpy() for k, v in participant.model.state_dict().items()}
                for key, value in last.items():
                    np.testing.assert_array_equal(local[key], value)
            # the events tell the story, in order
            events = admin.list_events(federation.id)
            kinds = [e.kind for e in events]
            assert kinds[0] == "federation.created"
            assert kinds.count("client.joined") == 3
            assert kinds.count("update.accepted") == 9
            assert kinds.count("round.closed") == 3
            assert kinds.index("federation.started") < kinds.index("update.accepted")
            assert kinds[-1] == "federation.finished"


def submit_round(server: CoordinatorProcess, federation_id, token: str, seed: int) -> int:
    """One client: join, train one round through the Participant, upload; returns its round."""
    with FederationClient(server.url, token, max_retries=0) as client:
        participant = Participant(
            client, federation_id, tiny_model(seed), tiny_data(seed), device="cpu"
        )
        participant.join()
        current = client.get_current_round(federation_id, wait_s=5)
        assert current.status == "train"
        summary = participant.train_round(current)
        assert summary.accepted
        return summary.round_index


def test_coordinator_crash_mid_round_loses_nothing(tmp_path: Path) -> None:
    names = ["a", "b", "c"]
    server = CoordinatorProcess(tmp_path / "coord", reaper_interval_s=0.2)
    server.start()
    try:
        with AdminClient(server.url, server.admin_token) as admin:
            federation, tokens = create_federation(admin, names, rounds=2)
        # everyone joins (with the counts of the data each trains on below: a running federation
        # refuses a rejoin that moves them beyond the drift); a and b upload round 0, then the
        # coordinator dies (SIGKILL)
        for seed, name in enumerate(names):
            counts = torch.bincount(tiny_data(seed).labels, minlength=2).tolist()
            with FederationClient(server.url, tokens[name]) as client:
                client.join(federation.id, num_samples=40, class_counts=counts)
        assert submit_round(server, federation.id, tokens["a"], 0) == 0
        assert submit_round(server, federation.id, tokens["b"], 1) == 0
        server.kill()
        assert not server.running
        server.start()  # same data directory and database
        with AdminClient(server.url, server.admin_token) as admin:
            round0 = admin.get_round(federation.id, 0)
            assert round0.state == "open"
            assert len(round0.submitted_clients) == 2  # both accepted uploads survived
            assert submit_round(server, federation.id, tokens["c"], 2) == 0
            # the round completes after the restart and the next one opens
            for _ in range(100):
                if admin.get_round(federation.id, 0).state == "closed":
                    break
                threading.Event().wait(0.1)
            round0 = admin.get_round(federation.id, 0)
            assert round0.state == "closed"
            assert len(round0.submitted_clients) == 3
            assert admin.get_round(federation.id, 1).state == "open"
            kinds = [e.kind for e in admin.list_events(federation.id)]
            assert kinds.count("update.accepted") == 3
            assert kinds.count("round.closed") == 1
    finally:
        server.stop()


def test_sites_wait_out_a_coordinator_outage(tmp_path: Path) -> None:
    # Two sites run the Participant loop; after round 0 the coordinator is killed and stays down
    # for several seconds (longer than the client's own retries), then comes back on the same
    # port. Both sites keep trying and finish the federation.
    names = ["a", "b"]
    server = CoordinatorProcess(tmp_path / "coord", reaper_interval_s=0.2)
    server.start()
    outcomes: dict[str, list] = {}
    errors: list[BaseException] = []
    waits: list[float] = []
    # The sites hold after round 0 until the coordinator is down: on a loaded machine they
    # could otherwise finish all three rounds before the kill and never see the outage.
    down = threading.Event()

    def hold_after_round_0(summary: object) -> None:
        if getattr(summary, "round_index", None) == 0:
            down.wait(60)

    try:
        with AdminClient(server.url, server.admin_token) as admin:
            federation, tokens = create_federation(admin, names, rounds=3)

        def site(seed: int, name: str) -> None:
            def sleep(seconds: float) -> None:
                waits.append(seconds)
                threading.Event().wait(seconds)

            try:
                with FederationClient(server.url, tokens[name], max_retries=1) as client:
                    participant = Participant(
                        client,
                        federation.id,
                        tiny_model(seed),
                        tiny_data(seed),
                        device="cpu",
                        poll_wait_s=1.0,
                        outage_backoff_max_s=2.0,
                        sleep=sleep,
                        on_round=hold_after_round_0,
                    )
                    outcomes[name] = participant.run()
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        threads = [threading.Thread(target=site, args=(i, n)) for i, n in enumerate(names)]
        for thread in threads:
            thread.start()
        with AdminClient(server.url, server.admin_token) as admin:
            for _ in range(600):
                rounds = admin.list_rounds(federation.id)
                if rounds and rounds[0].state == "closed":
                    break
                threading.Event().wait(0.1)
            else:
                raise AssertionError("round 0 did not close")
        server.kill()
        down.set()
        threading.Event().wait(6.0)  # down for 6 s: the sites' own retries give up earlier
        server.start()
        for thread in threads:
            thread.join(timeout=180)
        assert not errors, errors
        assert sorted(outcomes) == names
        for name in names:
            assert [s.round_index for s in outcomes[name]] == [0, 1, 2]
        assert waits, "the sites never had to wait: the outage was not observed"
        with AdminClient(server.url, server.admin_token) as admin:
            assert admin.get_federation(federation.id).status == "finished"
    finally:
        server.stop()
