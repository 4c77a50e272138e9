"""A federation with the signal privacy policy on runs end to end: a real coordinator, five SDK
participants, real HTTP; what the sites send is read off the wire."""

from __future__ import annotations

import json
import uuid
from email.parser import BytesParser
from email.policy import HTTP
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

ROUNDS = 3
POLICY = {"min_class_count": 5, "count_bucket": 4}
# Per site, samples of classes 0, 1, 2: sites 0 and 1 hold 3 of class 2 (suppressed), site 4
# holds 2 of class 1 and 0 of class 2. Site 3's labels are noise.
HOLDINGS = [(20, 18, 3), (21, 15, 3), (14, 13, 13), (14, 13, 13), (30, 2, 0)]


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))


def data(seed: int, holding: tuple[int, ...], *, noisy: bool) -> LocalData:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.cat([torch.full((n,), c) for c, n in enumerate(holding)])
    inputs = torch.randn(len(labels), 4, generator=generator)
    inputs += nn.functional.one_hot(labels, 4).float() * 3
    given = labels[torch.randperm(len(labels), generator=generator)] if noisy else labels
    return LocalData(inputs=inputs, labels=given.long(), true_labels=labels.long())


def sent_json(request: httpx.Request) -> dict[str, Any] | None:
    """The JSON a request carried: a join's body, an update's metadata part; None otherwise."""
    if request.method != "POST":
        return None
    body = request.read()
    if request.url.path.endswith("/join"):
        return dict(json.loads(body))
    if not request.url.path.endswith("/updates"):
        return None
    message = BytesParser(policy=HTTP).parsebytes(
        f"Content-Type: {request.headers['content-type']}\r\n\r\n".encode() + body
    )
    for part in message.iter_parts():
        if part.get_param("name", header="content-disposition") == "metadata":
            payload = part.get_payload(decode=True)
            assert isinstance(payload, bytes)
            return dict(json.loads(payload))
    raise AssertionError("an update without a metadata part")


def test_a_federation_under_the_policy_runs_and_sends_only_coarse_counts(
    tmp_path: Path,
) -> None:
    sent: dict[str, list[dict[str, Any]]] = {}
    with (
        CoordinatorProcess(tmp_path / "coord") as server,
        AdminClient(server.url, server.admin_token) as admin,
    ):
        federation = admin.create_federation(
            {
                "name": f"privacy-{uuid.uuid4().hex[:6]}",
                "task": {"num_classes": 3, "input_shape": [4]},
                "plan": {"rounds": ROUNDS, "min_clients": 5, "round_deadline_s": 120},
                "config": {
                    "method": "fednoro",
                    "warmup_rounds": 1,
                    "detectors": ["fednoro", "evidence"],
                    "primary_detector": "evidence",
                    "hyperparameters": {"lr": 0.05, "batch_size": 16, "warmup_rounds": 1},
                    "privacy": POLICY,
                },
                "seed": 3,
            }
        )
        admin.upload_initial_model(federation.id, state_to_bytes(model()))
        participants, connections = [], []
        for i, holding in enumerate(HOLDINGS):
            name = f"site-{i}"
            token = admin.add_client(federation.id, name).token
            log = sent.setdefault(name, [])
            http = httpx.Client(
                base_url=server.url,
                timeout=60,
                event_hooks={"request": [lambda r, log=log: log.append(sent_json(r) or {})]},
            )
            connections.append(http)
            client = FederationClient(api_token=token, http_client=http)
            participant = Participant(
                client, federation.id, model(), data(i, holding, noisy=i == 3)
            )
            participant.join()
            participants.append(participant)
        for _ in range(ROUNDS):
            for participant in participants:
                current = participant.client.get_current_round(federation.id, wait_s=20)
                assert current.status == "train", current
                assert current.instructions is not None
                assert current.instructions.privacy.min_class_count == 5
                assert participant.train_round(current).accepted
        for participant in participants:
            assert (
                participant.client.get_current_round(federation.id, wait_s=20).status == "finished"
            )
            participant.client.close()
        for http in connections:
            http.close()

        fid = str(federation.id)
        assert admin.get_federation(fid).status == "finished"
        rounds = [admin.get_round(fid, index) for index in range(ROUNDS)]
        assert all(r.audit is not None and r.audit.detections for r in rounds)
        report = admin.get_json(f"/federations/{fid}/report")
        assert report["rounds_audited"] == ROUNDS
        declared = {c.name: c.class_counts for c in admin.list_clients(fid)}

    # What left the sites: the join and every update, counts rounded up to 4, classes of fewer
    # than 5 samples as null with no per-class signal.
    expected_counts: dict[str, list[int | None]] = {
        "site-0": [20, 20, None],
        "site-1": [24, 16, None],
        "site-2": [16, 16, 16],
        "site-3": [16, 16, 16],
        "site-4": [32, None, 0],
    }
    assert declared == expected_counts
    for name, requests in sent.items():
        bodies = [r for r in requests if r]
        joins = [b for b in bodies if "signals" not in b]
        updates = [b for b in bodies if "signals" in b]
        assert len(joins) == 1
        assert len(updates) == ROUNDS
        assert joins[0]["class_counts"] == expected_counts[name]
        assert joins[0]["num_samples"] % 4 == 0
        for update in updates:
            assert update["num_samples"] == joins[0]["num_samples"]
            signals = update["signals"]
            assert signals["class_counts"] == expected_counts[name]
            assert "per_class_loss" in signals
            for c, count in enumerate(expected_counts[name]):
                for key in (
                    "per_class_loss",
                    "per_class_loss_sd",
                    "per_class_errors",
                    "per_class_confident_errors",
                ):
                    if key in signals:
                        assert (signals[key][c] is None) == (count is None or count == 0), name
