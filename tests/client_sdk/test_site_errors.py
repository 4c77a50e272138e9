"""A site that cannot load the global model (or train) tells the coordinator, then raises."""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import torch
from safetensors.torch import save
from torch import nn

from client_sdk import FederationClient, SiteRoundError
from client_sdk._responses import CurrentRound
from client_sdk.participant import Participant
from client_sdk.recipes import LocalData

FID = "00000000-0000-0000-0000-000000000001"
MODEL_ID = "00000000-0000-0000-0000-0000000000aa"


def the_issue_model_bytes() -> bytes:
    """784 inputs, 2 outputs: what the coordinator of the issue accepted for [1, 8, 8] x 10."""
    return save({"weight": torch.zeros(2, 784), "bias": torch.zeros(2)})


def current(data: bytes) -> CurrentRound:
    deadline = (datetime.now(UTC) + timedelta(minutes=5)).isoformat()
    return CurrentRound.model_validate(
        {
            "status": "train",
            "round": {"id": str(uuid.uuid4()), "index": 0, "deadline_at": deadline},
            "instructions": {
                "recipe": "fedavg",
                "hyperparameters": {},
                "global_model_id": MODEL_ID,
                "global_model_sha256": hashlib.sha256(data).hexdigest(),
                "round_index": 0,
                "total_rounds": 2,
                "num_classes": 10,
                "input_shape": [1, 8, 8],
                "signals": [],
                "deadline_at": deadline,
                "seed": 1,
            },
        }
    )


def participant(handler) -> Participant:
    http = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://coord")
    client = FederationClient(api_token="fa_c_token", http_client=http, max_retries=0)
    data = LocalData(inputs=torch.zeros(4, 1, 8, 8), labels=torch.tensor([0, 1, 2, 3]))
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    return Participant(client, FID, model, data, device="cpu", poll_wait_s=0)


def test_a_model_that_does_not_load_is_reported_then_raised() -> None:
    data = the_issue_model_bytes()
    reports: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == f"/api/v1/models/{MODEL_ID}":
            return httpx.Response(200, content=data)
        if request.url.path == f"/api/v1/federations/{FID}/rounds/0/error":
            reports.append(json.loads(request.content))
            return httpx.Response(202, json={"recorded": True, "event_id": 7})
        return httpx.Response(500)

    site = participant(handler)
    with pytest.raises(SiteRoundError) as raised:
        site.train_round(current(data))
    error = raised.value
    assert (error.stage, error.round_index, error.reported) == ("load", 0, True)
    assert isinstance(error.__cause__, RuntimeError)
    assert "loading the global model" in str(error)
    assert len(reports) == 1
    assert reports[0]["stage"] == "load"
    assert reports[0]["error_type"] == "RuntimeError"
    assert "size mismatch" in reports[0]["message"] or "Missing key" in reports[0]["message"]
    assert len(reports[0]["message"]) <= 2000


def test_the_error_is_said_once_by_the_exception(caplog: pytest.LogCaptureFixture) -> None:
    data = the_issue_model_bytes()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == f"/api/v1/models/{MODEL_ID}":
            return httpx.Response(200, content=data)
        return httpx.Response(202, json={"recorded": True, "event_id": 7})

    caplog.set_level(logging.DEBUG, logger="client_sdk.participant")
    with pytest.raises(SiteRoundError) as raised:
        participant(handler).train_round(current(data))
    assert raised.value.reported is True  # the coordinator is still told
    failed = [r for r in caplog.records if "round 0 failed" in r.getMessage()]
    # a DEBUG record only: with logging unconfigured Python prints WARNING and above itself,
    # and the uncaught exception prints the same message once more
    assert [r.levelno for r in failed] == [logging.DEBUG]


def test_the_error_is_raised_even_when_the_report_fails() -> None:
    data = the_issue_model_bytes()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == f"/api/v1/models/{MODEL_ID}":
            return httpx.Response(200, content=data)
        return httpx.Response(503)

    with pytest.raises(SiteRoundError) as raised:
        participant(handler).train_round(current(data))
    assert raised.value.reported is False
    assert "not reported" in str(raised.value)


def test_a_long_message_with_control_characters_is_cleaned_before_it_is_sent() -> None:
    sent: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(202, json={"recorded": True, "event_id": 1})

    http = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://coord")
    client = FederationClient(api_token="fa_c_token", http_client=http, max_retries=0)
    assert client.report_error(
        FID, 3, stage="train", error_type="Bad\nName", message="a\x00b\x1b[31m\nline\t" + "x" * 5000
    )
    assert sent[0]["error_type"] == "Bad Name"
    assert sent[0]["message"].startswith("a?b?[31m\nline\t")
    assert len(sent[0]["message"]) == 2000
