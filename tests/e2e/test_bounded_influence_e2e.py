"""End to end (uvicorn on a loopback port, the SDK's HTTP client): a site that joined with 100
samples and claims 10^9 is refused with a problem the SDK surfaces, the refusal is an event and
shows in the report, and its honest update is then accepted."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from client_sdk import AdminClient, FederationClient, UnprocessableEntityError
from client_sdk.participant import state_to_bytes
from fedaudit_sim.coordinator_process import CoordinatorProcess
from tests.e2e.test_federation_e2e import tiny_model

pytestmark = pytest.mark.slow


def signals(n: int) -> dict:
    return {"class_counts": [n // 2, n - n // 2], "train_loss": 0.5}


def test_a_site_lying_about_its_size_is_refused_over_http(tmp_path: Path) -> None:
    with CoordinatorProcess(tmp_path / "coord") as server:
        with AdminClient(server.url, server.admin_token) as admin:
            federation = admin.create_federation(
                {
                    "name": f"e2e-{uuid.uuid4().hex[:6]}",
                    "task": {"num_classes": 2, "input_shape": [4]},
                    "plan": {"rounds": 1, "min_clients": 2, "round_deadline_s": 120},
                    "config": {
                        "method": "fedavg",
                        "detectors": ["fedncl"],
                        "primary_detector": "fedncl",
                    },
                    "seed": 3,
                }
            )
            admin.upload_initial_model(federation.id, state_to_bytes(tiny_model()))
            tokens = {name: admin.add_client(federation.id, name).token for name in ("liar", "ok")}
            for token in tokens.values():
                with FederationClient(server.url, token) as client:
                    client.join(federation.id, num_samples=100, class_counts=[50, 50])
            state = state_to_bytes(tiny_model(1))

            with FederationClient(server.url, tokens["liar"], max_retries=0) as liar:
                assert liar.get_current_round(federation.id, wait_s=5).status == "train"
                with pytest.raises(UnprocessableEntityError) as refused:
                    liar.submit_update(
                        federation.id, 0, state=state, num_samples=10**9, signals=signals(10**9)
                    )
                problem = refused.value.problem
                assert problem is not None
                assert problem.type == "/problems/update-inconsistent"
                assert refused.value.extensions["declared"]["num_samples"] == 100
                assert admin.get_round(federation.id, 0).submitted_clients == []

                receipt = liar.submit_update(
                    federation.id, 0, state=state, num_samples=100, signals=signals(100)
                )
                assert receipt.num_samples == 100
            with FederationClient(server.url, tokens["ok"], max_retries=0) as ok:
                ok.submit_update(
                    federation.id, 0, state=state, num_samples=100, signals=signals(100)
                )

            rejected = [e for e in admin.list_events(federation.id) if e.kind == "update.rejected"]
            assert [e.data["type"] for e in rejected] == ["update-inconsistent"]
            report = admin.get_json(f"/federations/{federation.id}/report")
            rows = {row["name"]: row for row in report["clients"]}
            assert rows["liar"]["inconsistent_updates"] == 1
            assert rows["liar"]["last_inconsistent_at"] is not None
            assert rows["ok"]["inconsistent_updates"] == 0
            # the round closes in the background once both updates are in
            deadline = time.monotonic() + 60
            while admin.get_round(federation.id, 0).state != "closed":
                assert time.monotonic() < deadline, "round 0 did not close"
                time.sleep(0.2)
