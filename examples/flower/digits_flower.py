"""A small Flower simulation with fedaudit's strategy: digits, 10 sites, 3 with noisy labels.

scikit-learn's digits (1,797 8x8 images, shipped with the package: nothing is downloaded) are
split evenly over 10 Flower nodes; partitions 0, 1 and 2 have 80 % of their labels replaced by a
random other class. Every node trains a small MLP for one epoch per round and sends its model,
its metrics and fedaudit's signals (``fedaudit_flower.signals_record``). The ServerApp runs
``FedAuditStrategy`` around FedAvg and prints the noisy-site report at the end.

Run it (needs ``pip install "fedaudit[flower]" "flwr[simulation]"``, the Ray backend)::

    python examples/flower/digits_flower.py --rounds 5 --report flower-report.json

With ``--coordinator URL`` the strategy forwards every round to a running fedaudit coordinator
instead of auditing in process (its admin token from ``FEDAUDIT_ADMIN_TOKEN``); the rounds then
appear in that coordinator's report and dashboard, under the federation ``--federation-name``::

    FEDAUDIT_ADMIN_TOKEN=... python examples/flower/digits_flower.py --coordinator http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import copy
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation
from sklearn.datasets import load_digits
from torch import nn

from client_sdk.recipes.base import LocalData
from fedaudit_flower import SIGNALS_KEY, CoordinatorConnection, FedAuditStrategy, signals_record

NUM_SITES = 10
NOISY_PARTITIONS = (0, 1, 2)
NOISE_RATE = 0.8
SEED = 0


def make_model() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def partition(pid: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Partition ``pid`` of the digits: its inputs and its (possibly noisy) labels."""
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(SEED).permutation(len(y))
    part = order[pid::NUM_SITES]
    inputs = torch.tensor(x[part] / 16.0, dtype=torch.float32)
    labels = y[part].copy()
    if pid in NOISY_PARTITIONS:
        rng = np.random.default_rng(SEED + 1 + pid)
        flip = rng.random(len(labels)) < NOISE_RATE
        labels[flip] = (labels[flip] + rng.integers(1, 10, int(flip.sum()))) % 10
    return inputs, torch.tensor(labels, dtype=torch.int64)


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    pid = int(context.node_config["partition-id"])
    inputs, labels = partition(pid)
    model = make_model()
    model.load_state_dict(msg.content.array_records["arrays"].to_torch_state_dict())
    received = copy.deepcopy(model)  # theta_G, before training
    optimiser = torch.optim.SGD(model.parameters(), lr=0.5)
    generator = torch.Generator().manual_seed(SEED + pid)
    losses = []
    model.train()
    for batch in torch.randperm(len(labels), generator=generator).split(32):
        optimiser.zero_grad()
        loss = F.cross_entropy(model(inputs[batch]), labels[batch])
        loss.backward()
        optimiser.step()
        losses.append(loss.item() * len(batch))
    train_loss = sum(losses) / len(labels)
    signals = signals_record(
        global_model=received,
        local_model=model,
        data=LocalData(inputs, labels),
        num_classes=10,
        train_loss=train_loss,
    )
    content = RecordDict(
        {
            "arrays": ArrayRecord(model.state_dict()),
            "metrics": MetricRecord({"num-examples": len(labels), "train_loss": train_loss}),
            SIGNALS_KEY: signals,
            # FedAvg ignores ConfigRecords; the example reads this one to name the partitions
            "site": ConfigRecord({"partition-id": pid}),
        }
    )
    return Message(content=content, reply_to=msg)


class NamingFedAvg(FedAvg):
    """FedAvg that remembers which partition each node holds (for the printed report only)."""

    def __init__(self) -> None:
        super().__init__(fraction_evaluate=0.0)
        self.partitions: dict[int, int] = {}

    def aggregate_train(
        self, server_round: int, replies: Any
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        for m in replies:
            if m.has_content() and "site" in m.content.config_records:
                pid = int(m.content.config_records["site"]["partition-id"])
                self.partitions[m.metadata.src_node_id] = pid
        return super().aggregate_train(server_round, replies)


STATE: dict[str, Any] = {}
server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    wrapped = NamingFedAvg()
    # coordinator=None audits in process; a CoordinatorConnection forwards every round
    strategy = FedAuditStrategy(
        wrapped, report_path=STATE["report"], coordinator=STATE.get("coordinator")
    )
    STATE["strategy"] = strategy
    STATE["partitions"] = wrapped.partitions
    initial = ArrayRecord(make_model().state_dict())
    strategy.start(grid=grid, initial_arrays=initial, num_rounds=STATE["rounds"])


def run(
    rounds: int, report: Path, coordinator: CoordinatorConnection | None = None
) -> dict[str, Any]:
    """Run the simulation; return the report, with each node's partition id added (also in
    the file). With ``coordinator``, every round is forwarded to that coordinator."""
    STATE.update(rounds=rounds, report=report, coordinator=coordinator)
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=NUM_SITES,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    document: dict[str, Any] = json.loads(report.read_text())
    document["partitions"] = {str(k): v for k, v in STATE["partitions"].items()}
    report.write_text(json.dumps(document, indent=2) + "\n")
    return document


def print_report(document: dict[str, Any]) -> None:
    partitions = document["partitions"]
    print(f"{'round':>5}  {'decided':>7}  {'applied':>11}  flagged partitions")
    for entry in document["rounds"]:
        flagged = sorted(
            partitions[str(c["node_id"])] for c in entry.get("clients", []) if c["flag"]
        )
        print(f"{entry['round']:>5}  {entry['decided']!s:>7}  {entry['applied']:>11}  {flagged}")
    print(f"\nstatus after the last round (noisy partitions were {list(NOISY_PARTITIONS)}):")
    for node, status in sorted(document["statuses"].items(), key=lambda kv: partitions[kv[0]]):
        print(f"  partition {partitions[node]}: {status['status']}")
    if "coordinator" in document:
        where = document["coordinator"]
        print(f"\nforwarded to {where['url']}: federation {where['federation_id']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--report", type=Path, default=Path("flower-report.json"))
    parser.add_argument(
        "--coordinator",
        metavar="URL",
        help="forward every round to this fedaudit coordinator (admin token: FEDAUDIT_ADMIN_TOKEN)",
    )
    parser.add_argument("--federation-name", default="flower-digits")
    args = parser.parse_args()
    connection = None
    if args.coordinator:
        token = os.environ.get("FEDAUDIT_ADMIN_TOKEN", "")
        if not token:
            parser.error(
                "--coordinator needs the coordinator's admin token in FEDAUDIT_ADMIN_TOKEN"
            )
        connection = CoordinatorConnection(
            args.coordinator, token, federation_name=args.federation_name
        )
    print_report(run(args.rounds, args.report, connection))
