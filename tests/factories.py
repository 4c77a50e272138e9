"""Typed helpers that build states, federations and updates for tests."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
from safetensors.numpy import save

ADMIN = {"Authorization": "Bearer test-admin-token-0123456789"}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def tiny_state(value: float = 0.0, *, steps: int = 0) -> dict[str, np.ndarray]:
    """A small model state: two float tensors and one integer buffer."""
    return {
        "layer.weight": np.full((3, 2), value, dtype=np.float32),
        "layer.bias": np.full((2,), value, dtype=np.float32),
        "norm.num_batches_tracked": np.asarray(steps, dtype=np.int64),
    }


def state_bytes(state: dict[str, np.ndarray]) -> bytes:
    return save(state)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def federation_spec(
    name: str = "fed",
    *,
    num_classes: int = 2,
    rounds: int = 2,
    min_clients: int = 1,
    deadline_s: float = 600.0,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "name": name,
        "task": {"num_classes": num_classes, "input_shape": [2]},
        "plan": {
            "rounds": rounds,
            "min_clients": min_clients,
            "round_deadline_s": deadline_s,
        },
        "config": config
        or {"method": "fedavg", "detectors": ["fedncl"], "primary_detector": "fedncl"},
        "seed": 7,
    }


def signals(num_samples: int, num_classes: int = 2, **overrides: Any) -> dict[str, Any]:
    """Well-formed signals: counts split evenly, losses for every class."""
    counts = [num_samples // num_classes] * num_classes
    counts[0] += num_samples - sum(counts)
    base: dict[str, Any] = {
        "class_counts": counts,
        "per_class_loss": [0.5] * num_classes,
        "train_loss": 0.4,
        "train_accuracy": 0.9,
    }
    base.update(overrides)
    return base


def update_parts(
    state: dict[str, np.ndarray],
    *,
    num_samples: int,
    signal_overrides: dict[str, Any] | None = None,
    declared_sha: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The multipart `files=` argument of an update upload."""
    data = state_bytes(state)
    metadata: dict[str, Any] = {
        "num_samples": num_samples,
        "sha256": declared_sha or sha256(data),
        "signals": signals(num_samples, **(signal_overrides or {})),
        "metrics": {},
    }
    metadata.update(extra or {})
    return {
        "metadata": (None, json.dumps(metadata), "application/json"),
        "state": ("state.safetensors", data, "application/octet-stream"),
    }
