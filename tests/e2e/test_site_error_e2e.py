"""End to end (issue 21, point 2): a model that cannot fit is refused, a better one replaces the
first before round 0, and a site whose module does not match tells the coordinator why."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import torch
from torch import nn

from client_sdk import (
    AdminClient,
    FederationClient,
    Participant,
    SiteRoundError,
    UnprocessableEntityError,
)
from client_sdk.participant import state_to_bytes
from client_sdk.recipes import LocalData
from fedaudit_sim.coordinator_process import CoordinatorProcess

pytestmark = pytest.mark.slow


def test_a_model_that_cannot_fit_is_caught(tmp_path: Path) -> None:
    with CoordinatorProcess(tmp_path / "coord") as server:
        with AdminClient(server.url, server.admin_token) as admin:
            federation = admin.create_federation(
                {
                    "name": f"fit-{uuid.uuid4().hex[:6]}",
                    "task": {"num_classes": 10, "input_shape": [1, 8, 8]},
                    "plan": {"rounds": 1, "min_clients": 1, "round_deadline_s": 120},
                    "config": {"method": "fedavg"},
                    "seed": 3,
                }
            )
            issue_model = nn.Sequential(nn.Flatten(), nn.Linear(784, 2))
            with pytest.raises(UnprocessableEntityError) as refused:
                admin.upload_initial_model(federation.id, state_to_bytes(issue_model))
            assert "no tensor of the model has a dimension of 10" in str(refused.value)
            # 10 outputs, but a different body than the sites run: it loads nowhere
            other = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
            admin.upload_initial_model(federation.id, state_to_bytes(other))
            token = admin.add_client(federation.id, "site-a").token
            site_model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
            data = LocalData(inputs=torch.zeros(8, 1, 8, 8), labels=torch.arange(8) % 10)
            with FederationClient(server.url, token) as client:
                site = Participant(client, federation.id, site_model, data, device="cpu")
                with pytest.raises(SiteRoundError) as failed:
                    site.run(max_rounds=1)
            assert failed.value.stage == "load"
            assert failed.value.reported
            (event,) = admin.list_events(federation.id, kind="site.error")
            assert event.data["stage"] == "load"
            assert "Missing key" in event.data["error"] or "size mismatch" in event.data["error"]
            report = admin.get_json(f"/federations/{federation.id}/report")
            assert report["site_errors"][0]["name"] == "site-a"
