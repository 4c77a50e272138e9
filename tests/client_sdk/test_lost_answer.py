"""A site's upload that gets no answer, against a real coordinator process (uvicorn on a
loopback port): the network between them drops the answer (the update arrived) or the request
(it did not). Either way the round counts once and the site knows it took part."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from torch import nn

from client_sdk import AdminClient, FederationClient, Participant
from client_sdk.participant import state_to_bytes
from client_sdk.recipes import LocalData
from fedaudit_sim.coordinator_process import CoordinatorProcess

pytestmark = pytest.mark.slow


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def tiny_data(n: int = 24) -> LocalData:
    generator = torch.Generator().manual_seed(1)
    labels = torch.arange(n) % 2
    inputs = torch.randn(n, 4, generator=generator) + labels[:, None].float()
    return LocalData(inputs=inputs, labels=labels.long())


class FlakyNetwork(httpx.HTTPTransport):
    """A real HTTP transport that loses round 1's first upload: its answer (`lose="answer"`,
    the coordinator got and stored the update) or the request itself (`lose="request"`)."""

    def __init__(self, lose: str) -> None:
        super().__init__()
        self.lose = lose
        self.dropped = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        upload = request.method == "POST" and request.url.path.endswith("/rounds/1/updates")
        if not upload or self.dropped:
            return super().handle_request(request)
        self.dropped += 1
        if self.lose == "request":
            raise httpx.ConnectError("connection refused (dropped by the test's network)")
        response = super().handle_request(request)
        response.read()
        response.close()
        raise httpx.ReadError("connection reset before the answer (dropped by the test's network)")


def one_site_federation(admin: AdminClient, name: str, *, rounds: int) -> tuple[Any, Any]:
    """A fedavg federation of one site ("site-a") on the tiny model: (federation, site)."""
    federation = admin.create_federation(
        {
            "name": name,
            "task": {"num_classes": 2, "input_shape": [4]},
            "plan": {"rounds": rounds, "min_clients": 1},
            "config": {"method": "fedavg", "hyperparameters": {"lr": 0.1, "local_epochs": 1}},
            "seed": 2,
        }
    )
    admin.upload_initial_model(federation.id, state_to_bytes(tiny_model()))
    return federation, admin.add_client(federation.id, "site-a")


@pytest.mark.parametrize("lose", ["answer", "request"])
def test_an_upload_without_answer_counts_once(tmp_path: Path, lose: str) -> None:
    with (
        CoordinatorProcess(tmp_path / "coord") as server,
        AdminClient(server.url, server.admin_token) as admin,
    ):
        federation, site = one_site_federation(admin, f"lost-{lose}", rounds=3)
        token = site.token
        network = FlakyNetwork(lose)
        waits: list[float] = []
        with httpx.Client(base_url=server.url, transport=network) as http:
            client = FederationClient(api_token=token, http_client=http, max_retries=0)
            participant = Participant(
                client,
                federation.id,
                tiny_model(),
                tiny_data(),
                poll_wait_s=0.5,
                sleep=waits.append,
            )
            done = participant.run()

        assert network.dropped == 1
        assert waits == [1.0]  # one outage wait, then the same upload went through
        assert [s.round_index for s in done] == [0, 1, 2]
        assert all(s.accepted for s in done)
        events = admin.list_events(federation.id)
        accepted = [e for e in events if e.kind == "update.accepted"]
        assert len(accepted) == 3  # round 1's update stored once, not twice
        for index in range(3):
            assert admin.get_round(federation.id, index).submitted_clients == [site.id]
        assert admin.get_federation(federation.id).status == "finished"
