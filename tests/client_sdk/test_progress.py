"""What a site sees: its progress lines and its own verdict, against a real coordinator process
(uvicorn on a loopback port)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
import torch

from client_sdk import AdminClient, Diagnostics, FederationClient, Participant, RoundSummary
from client_sdk._progress import round_line
from client_sdk.participant import state_to_bytes
from fedaudit_sim.coordinator_process import CoordinatorProcess
from tests.client_sdk.test_lost_answer import (
    FlakyNetwork,
    one_site_federation,
    tiny_data,
    tiny_model,
)

pytestmark = pytest.mark.slow


def test_a_site_says_what_it_does_and_reads_its_verdict(tmp_path: Path) -> None:
    lines: list[str] = []
    with (
        CoordinatorProcess(tmp_path / "coord") as server,
        AdminClient(server.url, server.admin_token) as admin,
    ):
        federation, site = one_site_federation(admin, "progress", rounds=2)
        token = site.token
        # The network loses round 1's first upload: the site says the coordinator was
        # unreachable, then goes on.
        with httpx.Client(base_url=server.url, transport=FlakyNetwork("request")) as http:
            client = FederationClient(api_token=token, http_client=http, max_retries=0)
            participant = Participant(
                client,
                federation.id,
                tiny_model(),
                tiny_data(),
                device="cpu",
                poll_wait_s=0.5,
                sleep=lambda s: None,
                progress=lines.append,
            )
            participant.run()
            verdict = participant.diagnostics()

    assert isinstance(verdict, Diagnostics)
    assert verdict.name == "site-a"
    assert verdict.status == "trusted"
    assert verdict.flagged_rounds == []
    assert lines[0] == (
        f"joined federation {federation.id} as 'site-a': 24 samples in 2 of 2 classes, "
        "training on cpu"
    )
    assert lines[1] == "round 0 (1 of 2): training (fedavg)"
    # the local loss and, as the default detectors ask for it, the local accuracy
    assert re.fullmatch(
        r"round 0: trained in \d+\.\d s, loss \d\.\d{4}, accuracy [01]\.\d{3}, uploaded \d+ kB",
        lines[2],
    )
    accuracy = participant.rounds_done[0].train_accuracy
    assert accuracy is not None
    assert f"accuracy {accuracy:.3f}," in lines[2]
    assert "round 1 (2 of 2): training (fedavg)" in lines
    assert any(line.startswith("coordinator unreachable for 0 s") for line in lines)
    assert any(re.fullmatch(r"round 1: trained in .*", line) for line in lines)
    assert lines[-2] == "federation finished: 2 round(s) trained here; the final model is loaded"
    assert lines[-1] == f"this site's status: trusted. {verdict.advice}"


def test_progress_false_says_nothing_and_true_prints_to_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with (
        CoordinatorProcess(tmp_path / "coord") as server,
        AdminClient(server.url, server.admin_token) as admin,
    ):
        federation = admin.create_federation(
            {
                "name": "quiet",
                "task": {"num_classes": 2, "input_shape": [4]},
                "plan": {"rounds": 1, "min_clients": 1},
                "config": {"method": "fedavg"},
                "seed": 2,
            }
        )
        admin.upload_initial_model(federation.id, state_to_bytes(tiny_model()))
        tokens = [admin.add_client(federation.id, name).token for name in ("a", "b")]
        with FederationClient(server.url, tokens[0]) as client:
            Participant(
                client, federation.id, tiny_model(), tiny_data(), device="cpu", progress=False
            ).join()
        assert capsys.readouterr().err == ""
        with FederationClient(server.url, tokens[1]) as client:
            Participant(client, federation.id, tiny_model(), tiny_data(), device="cpu").join()
        err = capsys.readouterr().err
        assert err.startswith(f"fedaudit site: joined federation {federation.id} as 'b'")


def test_inputs_of_another_shape_are_refused_before_the_join(tmp_path: Path) -> None:
    # A first-use trial joined a site with [1, 8, 8] images to a [1, 28, 28] task: it joined,
    # then failed the round. The labels were already checked before the join; the shape is too.
    with (
        CoordinatorProcess(tmp_path / "coord") as server,
        AdminClient(server.url, server.admin_token) as admin,
    ):
        federation = admin.create_federation(
            {
                "name": "shapes",
                "task": {"num_classes": 2, "input_shape": [4]},
                "plan": {"rounds": 1, "min_clients": 1},
                "config": {"method": "fedavg"},
            }
        )
        admin.upload_initial_model(federation.id, state_to_bytes(tiny_model()))
        token = admin.add_client(federation.id, "wide").token
        wide = tiny_data()
        wide = type(wide)(inputs=torch.cat([wide.inputs, wide.inputs], dim=1), labels=wide.labels)
        with FederationClient(server.url, token) as client:
            site = Participant(client, federation.id, tiny_model(), wide, device="cpu")
            refused = r"shaped \[8\] but the federation's task expects \[4\]"
            with pytest.raises(ValueError, match=refused):
                site.join()
        assert [c.joined_at for c in admin.list_clients(federation.id)] == [None]


def test_the_round_line_leaves_out_an_accuracy_the_site_did_not_measure() -> None:
    summary = RoundSummary(
        round_index=3,
        recipe="fedavg",
        train_loss=0.51234,
        train_seconds=1.26,
        signal_seconds=0.1,
        upload_bytes=55_000,
        download_bytes=55_000,
    )
    assert round_line(summary) == "round 3: trained in 1.3 s, loss 0.5123, uploaded 55 kB"
    summary.train_accuracy = 0.8125
    assert round_line(summary) == (
        "round 3: trained in 1.3 s, loss 0.5123, accuracy 0.812, uploaded 55 kB"
    )
