"""`Participant.preview()` against a real coordinator process (uvicorn on a loopback port): it
shows what the upload sends, byte for byte, and sends nothing."""

from __future__ import annotations

import json
from email.parser import BytesParser
from email.policy import HTTP
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import load as load_safetensors
from torch import nn

from client_sdk import AdminClient, FederationClient, Participant
from client_sdk.participant import state_to_bytes
from client_sdk.recipes import LocalData
from fedaudit_sim.coordinator_process import CoordinatorProcess

pytestmark = pytest.mark.slow


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def tiny_data(n: int = 30) -> LocalData:
    generator = torch.Generator().manual_seed(1)
    labels = torch.arange(n) % 3
    inputs = torch.randn(n, 4, generator=generator) + labels[:, None].float()
    return LocalData(inputs=inputs.float(), labels=labels.long())


def _metadata_part(request: httpx.Request) -> dict[str, Any]:
    """The JSON of the ``metadata`` part of a multipart request, as it went on the wire."""
    body = request.read()
    message = BytesParser(policy=HTTP).parsebytes(
        f"Content-Type: {request.headers['content-type']}\r\n\r\n".encode() + body
    )
    for part in message.iter_parts():
        if part.get_param("name", header="content-disposition") == "metadata":
            payload = part.get_payload(decode=True)
            assert isinstance(payload, bytes)
            return dict(json.loads(payload))
    raise AssertionError("no metadata part")


def test_preview_shows_the_upload_and_sends_nothing(tmp_path: Path) -> None:
    sent: list[httpx.Request] = []
    with (
        CoordinatorProcess(tmp_path / "coord") as server,
        AdminClient(server.url, server.admin_token) as admin,
    ):
        federation = admin.create_federation(
            {
                "name": "preview",
                "task": {"num_classes": 3, "input_shape": [4]},
                "plan": {"rounds": 2, "min_clients": 1},
                # evidence: per-class loss and its spread; fedrn: accuracy and probe softmax
                "config": {"method": "fedrn", "detectors": ["evidence", "fedncl"]},
                "seed": 5,
            }
        )
        admin.upload_initial_model(federation.id, state_to_bytes(tiny_model()))
        token = admin.add_client(federation.id, "site-a").token

        site_http = httpx.Client(base_url=server.url, event_hooks={"request": [sent.append]})
        with site_http:
            client = FederationClient(api_token=token, http_client=site_http)
            participant = Participant(client, federation.id, tiny_model(), tiny_data())
            before = {k: v.clone() for k, v in participant.model.state_dict().items()}

            # not joined yet: the join is shown, there is no round to train
            early = participant.preview()
            assert early["join"]["body"] == {"num_samples": 30, "class_counts": [10, 10, 10]}
            assert early["update"] is None
            assert early["round"]["status"] == "wait"
            # no privacy policy: nothing coarsened, no mechanism
            assert early["privacy"] == {"min_class_count": 0, "count_bucket": 1, "mechanism": None}

            participant.join()
            sent.clear()
            preview = participant.preview()
            json.dumps(preview)  # plain JSON
            assert {r.method for r in sent} == {"GET"}  # nothing went up
            rounds = admin.list_rounds(federation.id)
            assert rounds[0].submitted_clients == []
            assert "update.accepted" not in {e.kind for e in admin.list_events(federation.id)}
            # the site's model is untouched
            for key, value in participant.model.state_dict().items():
                assert torch.equal(value, before[key])

            update = preview["update"]
            assert update is not None
            metadata = update["metadata"]
            assert set(metadata) == {"num_samples", "sha256", "signals", "metrics"}
            assert set(metadata["signals"]) >= {
                "class_counts",
                "per_class_loss",
                "per_class_loss_sd",
                "train_loss",
                "train_accuracy",
                "probe_softmax",
            }
            assert update["state"]["sha256"] == metadata["sha256"]
            expected = load_safetensors(state_to_bytes(tiny_model()))
            assert {t["name"]: t["shape"] for t in update["state"]["tensors"]} == {
                name: list(tensor.shape) for name, tensor in expected.items()
            }
            assert all(t["dtype"] == "F32" for t in update["state"]["tensors"])

            # the real round: the request carries the previewed metadata, byte for byte the same
            sent.clear()
            current = client.get_current_round(federation.id)
            summary = participant.train_round(current)
            assert summary.accepted
            (upload,) = [r for r in sent if r.method == "POST"]
            assert upload.url.path == update["path"]
            assert upload.headers["idempotency-key"] == update["headers"]["Idempotency-Key"]
            assert _metadata_part(upload) == metadata
            assert summary.upload_bytes == update["state"]["size_bytes"]
            assert admin.get_round(federation.id, 0).submitted_clients != []


def test_preview_states_the_privacy_cost_of_the_gaussian_mechanism(tmp_path: Path) -> None:
    pytest.importorskip("dp_accounting", reason="the dp extra (fedaudit[dp]) is not installed")
    with (
        CoordinatorProcess(tmp_path / "coord") as server,
        AdminClient(server.url, server.admin_token) as admin,
    ):
        federation = admin.create_federation(
            {
                "name": "preview-dp",
                "task": {"num_classes": 3, "input_shape": [4]},
                "plan": {"rounds": 3, "min_clients": 1},
                # per-class loss and probe softmax: 2 noised releases per update
                "config": {
                    "method": "fedrn",
                    "detectors": ["evidence", "fedncl"],
                    "privacy": {"dp_noise_multiplier": 2.0, "dp_clip_loss": 3.0, "dp_delta": 1e-5},
                },
                "seed": 5,
            }
        )
        admin.upload_initial_model(federation.id, state_to_bytes(tiny_model()))
        token = admin.add_client(federation.id, "site-a").token
        with FederationClient(server.url, api_token=token) as client:
            participant = Participant(client, federation.id, tiny_model(), tiny_data())
            early = participant.preview()["privacy"]
            # the task states the mechanism; which signals it noises comes with a round
            assert early["mechanism"] == "gaussian"
            assert early["epsilon_round"] is None
            assert "round's instructions" in early["epsilon_unavailable"]

            participant.join()
            preview = participant.preview()
            privacy = preview["privacy"]
            assert privacy["releases_per_update"] == 2
            assert privacy["rounds"] == 3
            # sigma = 2, delta = 1e-5: the RDP bound of 2 releases is 3.189 (exact: 2.943), of
            # 6 releases 5.979 (exact: 5.545); tests/client_sdk/test_preview_privacy.py
            assert privacy["epsilon_round"] == pytest.approx(3.189, abs=0.01)
            assert privacy["epsilon_total"] == pytest.approx(5.979, abs=0.01)
            assert privacy["epsilon_unavailable"] is None
            # the update previewed is the one the mechanism sends: no spread
            assert "per_class_loss_sd" not in preview["update"]["metadata"]["signals"]
            # the coordinator states the same epsilon for a round
            report = admin.get_json(f"/federations/{federation.id}/report")
            assert report["privacy"]["epsilon_per_round"] == privacy["epsilon_round"]
