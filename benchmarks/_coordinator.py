"""A federation on a real coordinator process, set up through the SDK for the HTTP benchmarks.

Everything goes through the public API, as an operator and sites would do it: the admin creates
the federation and uploads the initial model, registers K sites; each site joins with its class
counts, which opens round 0. Updates are well formed: the same tensor names, shapes and dtypes as
the initial model, finite values, class counts that sum to the sample count, a train loss.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import numpy as np
from numpy.typing import NDArray
from safetensors.numpy import save

from client_sdk import AdminClient, FederationClient, UpdateReceipt
from fedaudit_sim.coordinator_process import CoordinatorProcess
from service.store.blobs import DirectoryBlobStore

NUM_CLASSES = 10

# Only the Fed-NCL detector: its only signal is the train loss, so an update needs no model
# evaluation to be well formed. Aggregation is plain FedAvg.
FEDNCL_FEDAVG_CONFIG: dict[str, Any] = {
    "method": "fedavg",
    "detectors": ["fedncl"],
    "primary_detector": "fedncl",
}


# The full audit: FedNoRo's per-class-loss detector as the primary, Fed-NCL, FedRN's expertise
# and neighbors (probe softmax), DaAgg, from round 0 (no warm-up). The first 20 % of the sites
# report per-class losses far above the others' (noisy); from the third round their status is
# noisy, as in a federation past its warm-up.
FEDNORO_DAAGG_CONFIG: dict[str, Any] = {
    "method": "fednoro",
    "detectors": ["fednoro", "fedncl", "expertise"],
    "primary_detector": "fednoro",
    "warmup_rounds": 0,
}

CONFIGS: dict[str, dict[str, Any]] = {
    "fedncl-fedavg": FEDNCL_FEDAVG_CONFIG,
    "fednoro-daagg": FEDNORO_DAAGG_CONFIG,
}
"""The configurations the HTTP benchmarks offer (``--config``)."""


def state_bytes(state: Mapping[str, NDArray[Any]]) -> bytes:
    """A state as safetensors bytes (the SDK's wire format)."""
    return save(dict(state))


@contextmanager
def running_coordinator(data_dir: Path) -> Iterator[tuple[CoordinatorProcess, AdminClient]]:
    """A started coordinator and its admin client; the coordinator's log tail is printed when
    the body fails, and the coordinator is stopped either way."""
    server = CoordinatorProcess(data_dir)
    server.start()
    try:
        with AdminClient(server.url, server.admin_token) as admin:
            yield server, admin
    except BaseException:
        print(server.log_tail())
        raise
    finally:
        server.stop()


@dataclass
class Site:
    """One registered, joined site and its SDK client."""

    name: str
    client: FederationClient
    class_counts: list[int]
    train_loss: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_samples(self) -> int:
        return sum(self.class_counts)

    def signals(self) -> dict[str, Any]:
        return {"class_counts": self.class_counts, "train_loss": self.train_loss, **self.extra}

    def timed_submit(
        self, federation_id: uuid.UUID, round_index: int, payload: bytes
    ) -> tuple[UpdateReceipt, float]:
        """Upload ``payload`` as this site's update; the receipt and the seconds it took."""
        started = time.perf_counter()
        receipt = self.client.submit_update(
            federation_id,
            round_index,
            state=payload,
            num_samples=self.num_samples,
            signals=self.signals(),
        )
        return receipt, time.perf_counter() - started


@dataclass
class Federation:
    """A federation with ``sites`` joined (round 0 is open); closing it closes their clients."""

    id: uuid.UUID
    sites: list[Site] = field(default_factory=list)

    def close(self) -> None:
        for site in self.sites:
            site.client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def create_federation(
    server: CoordinatorProcess,
    admin: AdminClient,
    initial_state: bytes,
    *,
    clients: int,
    rounds: int,
    config: Mapping[str, Any] | None = None,
    seed: int = 0,
) -> Federation:
    """Create, upload the initial model, register and join ``clients`` sites."""
    federation = admin.create_federation(
        {
            "name": f"bench-{uuid.uuid4().hex[:8]}",
            "task": {"num_classes": NUM_CLASSES, "input_shape": [3, 32, 32]},
            "plan": {"rounds": rounds, "min_clients": clients, "round_deadline_s": 3600},
            "config": dict(config or FEDNCL_FEDAVG_CONFIG),
            "seed": seed,
        }
    )
    admin.upload_initial_model(federation.id, initial_state)
    result = Federation(id=federation.id)
    rng = np.random.default_rng(seed)
    stored = admin.get_federation(federation.id).config
    wanted = set(stored["signals"])
    for k in range(clients):
        name = f"site-{k:04d}"
        token = admin.add_client(federation.id, name).token
        counts = [int(c) for c in rng.integers(10, 60, size=NUM_CLASSES)]
        site = Site(
            name=name,
            client=FederationClient(server.url, token),
            class_counts=counts,
            train_loss=float(rng.uniform(0.2, 1.5)),
            extra=_audit_signals(wanted, k < max(1, clients // 5), stored, rng),
        )
        site.client.join(federation.id, num_samples=site.num_samples, class_counts=counts)
        result.sites.append(site)
    return result


def _audit_signals(
    wanted: set[str], noisy: bool, config: Mapping[str, Any], rng: np.random.Generator
) -> dict[str, Any]:
    """The signals beyond class counts and train loss that the federation asks for: per-class
    losses (a noisy site's about 2.0, a clean one's 0.5), a train accuracy, the probe softmax."""
    extra: dict[str, Any] = {}
    if "per_class_loss" in wanted:
        loss = rng.normal(2.0 if noisy else 0.5, 0.05, size=NUM_CLASSES)
        extra["per_class_loss"] = [round(float(v), 4) for v in loss]
    if "train_accuracy" in wanted:
        extra["train_accuracy"] = 0.5 if noisy else 0.9
    if "probe_softmax" in wanted:
        rows = rng.dirichlet(np.ones(NUM_CLASSES), size=int(config["probe_size"]))
        extra["probe_softmax"] = [[round(float(v), 6) for v in row / row.sum()] for row in rows]
    unknown = wanted - {"class_counts", "train_loss", *extra}
    if unknown:
        raise ValueError(f"the benchmark's sites cannot send {sorted(unknown)}")
    return extra


def blob_path(data_dir: Path, sha256: str) -> Path:
    """Where the coordinator's directory blob store keeps the blob ``sha256``."""
    return DirectoryBlobStore(data_dir / "blobs").local_path(sha256)
