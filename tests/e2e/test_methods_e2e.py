"""Every method preset runs end to end: a real coordinator, four SDK participants, real HTTP."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from client_sdk import AdminClient, FederationClient, Participant
from client_sdk.participant import state_to_bytes
from client_sdk.recipes import LocalData
from fedaudit_sim.coordinator_process import CoordinatorProcess

pytestmark = pytest.mark.slow

ROUNDS = 3
NAMES = ("site-0", "site-1", "site-2", "site-3")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorProcess]:
    with CoordinatorProcess(tmp_path_factory.mktemp("methods")) as process:
        yield process


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))


def data(seed: int, *, noisy: bool) -> LocalData:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(48) % 3
    inputs = torch.randn(48, 4, generator=generator) + nn.functional.one_hot(labels, 4).float() * 3
    given = torch.randint(0, 3, (48,), generator=generator) if noisy else labels
    return LocalData(inputs=inputs, labels=given.long(), true_labels=labels.long())


def run_federation(
    server: CoordinatorProcess,
    method: str,
    state_root: Path | None = None,
    *,
    device: str = "cpu",
    amp: bool = False,
) -> tuple[AdminClient, str, dict]:
    admin = AdminClient(server.url, server.admin_token)
    federation = admin.create_federation(
        {
            "name": f"{method}-{uuid.uuid4().hex[:6]}",
            "task": {"num_classes": 3, "input_shape": [4]},
            "plan": {"rounds": ROUNDS, "min_clients": 4, "round_deadline_s": 120},
            "config": {
                "method": method,
                "warmup_rounds": 1,
                # warmup_rounds only for the recipes that read it: another is refused (422)
                "hyperparameters": {
                    "lr": 0.05,
                    "batch_size": 16,
                    **({"warmup_rounds": 1} if method in ("fednoro", "fedrn", "flr") else {}),
                },
            },
            "seed": 11,
        }
    )
    admin.upload_initial_model(federation.id, state_to_bytes(model()))
    participants = []
    for i, name in enumerate(NAMES):
        token = admin.add_client(federation.id, name).token
        client = FederationClient(server.url, token)
        participant = Participant(
            client,
            federation.id,
            model(),
            data(i, noisy=i == 3),
            device=device,
            amp=amp,
            state_dir=None if state_root is None else state_root / name,
        )
        participant.join()
        participants.append(participant)
    instructions: dict[int, list] = {}
    for _ in range(ROUNDS):
        for participant in participants:
            current = participant.client.get_current_round(federation.id, wait_s=20)
            assert current.status == "train", current
            instructions.setdefault(current.round.index, []).append(current.instructions)
            summary = participant.train_round(current)
            assert summary.accepted
            assert summary.train_loss >= 0
    for participant in participants:
        assert participant.client.get_current_round(federation.id, wait_s=20).status == "finished"
        participant.client.close()
    return admin, str(federation.id), instructions


@pytest.mark.parametrize(
    ("method", "recipe", "rule"),
    [
        ("fedavg", "fedavg", "fedavg"),
        ("fedprox", "fedprox", "fedavg"),
        ("fednoro", "fednoro", "daagg"),
        ("fedrn", "fedrn", "fedavg"),
        ("fedncl", "fedncl_correction", "fedncl_layerwise"),
        ("rofl", "rofl", "fedavg"),
        ("flr", "flr", "fedavg"),
    ],
)
def test_method_runs_end_to_end(
    server: CoordinatorProcess, method: str, recipe: str, rule: str
) -> None:
    admin, fid, instructions = run_federation(server, method)
    with admin:
        federation = admin.get_federation(fid)
        assert federation.status == "finished"
        assert federation.config["recipe"] == recipe
        rounds = admin.list_rounds(fid)
        assert [r.state for r in rounds] == ["closed"] * ROUNDS
        assert all(len(r.submitted_clients) == 4 for r in rounds)
        assert all(i.recipe == recipe for batch in instructions.values() for i in batch)
        # warm-up (round 0) aggregates with FedAvg; afterwards the method's rule is requested
        first, last = admin.get_round(fid, 0), admin.get_round(fid, ROUNDS - 1)
        assert first.audit is not None
        assert last.audit is not None
        assert first.audit.aggregation.requested_rule == "fedavg"
        assert last.audit.aggregation.requested_rule == rule
        assert last.audit.detections, "every round is audited"
        if method == "fedrn":
            # after round 0 every client is told its k = 2 reliable neighbors and their models
            later = [i for batch in list(instructions.values())[1:] for i in batch]
            assert all(len(i.neighbors) == 2 for i in later)
            assert all(i.self_weight is not None for i in later)
        if method == "rofl":
            later = [i for batch in list(instructions.values())[1:] for i in batch]
            assert all(i.centroids is not None and len(i.centroids) == 3 for i in later)
            assert last.audit.centroids is not None
        report = admin.get_json(f"/federations/{fid}/report")
        assert {row["name"] for row in report["clients"]} == set(NAMES)
        assert report["rounds_audited"] == ROUNDS


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    "method", ["fedavg", "fedprox", "fednoro", "fedrn", "fedncl", "rofl", "flr"]
)
def test_method_runs_end_to_end_on_cuda(
    server: CoordinatorProcess, method: str, tmp_path: Path
) -> None:
    # the sites train on CUDA in mixed precision and keep their state on disk; what they send
    # (safetensors on the CPU, centroids as JSON) is what the coordinator takes from CPU sites
    admin, fid, _ = run_federation(server, method, tmp_path, device="cuda", amp=True)
    with admin:
        assert admin.get_federation(fid).status == "finished"
        rounds = admin.list_rounds(fid)
        assert [r.state for r in rounds] == ["closed"] * ROUNDS
        assert all(len(r.submitted_clients) == 4 for r in rounds)


def test_flr_state_is_on_disk_for_a_restarted_participant(
    server: CoordinatorProcess, tmp_path: Path
) -> None:
    """FLR's per-sample averages live on the client; a restarted script finds them on disk."""
    from client_sdk.local_state import LocalStateStore

    admin, _, _ = run_federation(server, "flr", state_root=tmp_path)
    admin.close()
    for name in NAMES:
        restarted = LocalStateStore(tmp_path / name)  # what a new Participant would open
        s_avg = restarted.get_tensor("flr/s")
        assert s_avg is not None
        assert tuple(s_avg.shape) == (48, 3)  # one running average per local sample and class
        assert restarted.get_json("flr/meta", {})["last_round"] == ROUNDS - 1
