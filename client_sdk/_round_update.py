"""One round's update on a site: what the recipe trains with and what is uploaded.

The `Participant` (``client_sdk.participant``) downloads the round's models, then builds here
the inputs of ``recipe.train`` (:func:`frozen_global_copy`, :func:`neighbor_model`,
:func:`round_context`, docs/design/recipes-api.md) and, once trained and measured, the update
(:class:`PreparedUpdate`): what :meth:`Participant.train_round` uploads and
:meth:`Participant.preview` shows.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load as load_safetensors
from torch import nn

from client_sdk._client import update_metadata, update_path
from client_sdk._responses import Instructions, Neighbor
from client_sdk.local_state import LocalStateStore
from client_sdk.model_files import safetensors_manifest
from client_sdk.recipes import NeighborModel, RoundContext, TrainReport
from client_sdk.signals import Signals

__all__ = [
    "PreparedUpdate",
    "frozen_global_copy",
    "neighbor_model",
    "reported_signals",
    "round_context",
]


@dataclass
class PreparedUpdate:
    """One round's update, trained and ready: what is uploaded, and what the summary needs."""

    round_index: int
    recipe: str
    idempotency_key: str
    state: bytes
    num_samples: int
    signals: dict[str, Any]
    metrics: dict[str, float]
    report: TrainReport
    train_seconds: float
    signal_seconds: float
    download_bytes: int
    train_accuracy: float | None = None  # measured here, before any privacy noise

    def metadata(self) -> dict[str, Any]:
        """The update's ``metadata`` part, built by the function the upload uses."""
        return update_metadata(
            self.state, num_samples=self.num_samples, signals=self.signals, metrics=self.metrics
        )

    def request_preview(self, federation_id: str) -> dict[str, Any]:
        """The upload request as :meth:`Participant.preview` shows it: method, path, the
        ``Idempotency-Key`` header, the ``metadata`` part exactly as sent, and the ``state``
        part described (format, size, sha256, each tensor's name, dtype and shape)."""
        return {
            "method": "POST",
            "path": update_path(federation_id, self.round_index),
            "headers": {"Idempotency-Key": self.idempotency_key},
            "metadata": self.metadata(),
            "state": {
                "format": "safetensors",
                "size_bytes": len(self.state),
                "sha256": hashlib.sha256(self.state).hexdigest(),
                "tensors": safetensors_manifest(self.state),
            },
        }


def neighbor_model(neighbor: Neighbor, blob: bytes, device: torch.device) -> NeighborModel:
    """A neighbor the coordinator assigned (FedRN), its downloaded state moved to ``device``."""
    return NeighborModel(
        client_id=str(neighbor.client_id),
        state_dict={k: v.to(device) for k, v in load_safetensors(blob).items()},
        weight=float(neighbor.weight),
    )


def frozen_global_copy(model: nn.Module) -> nn.Module:
    """theta_G as the recipes receive it: a copy of ``model`` (just loaded with the global
    model) in eval mode, its parameters frozen."""
    global_model = copy.deepcopy(model)
    global_model.eval()
    for parameter in global_model.parameters():
        parameter.requires_grad_(False)
    return global_model


def round_context(
    instructions: Instructions,
    neighbors: list[NeighborModel],
    state: LocalStateStore,
    *,
    device: torch.device,
    amp: bool,
) -> RoundContext:
    """The `RoundContext` a recipe trains with, from the round's instructions (the global
    centroids, when sent, as a float32 tensor on ``device``)."""
    return RoundContext(
        round_index=instructions.round_index,
        total_rounds=instructions.total_rounds,
        num_classes=instructions.num_classes,
        hyperparameters=instructions.hyperparameters,
        role=instructions.role,
        label_correction=instructions.label_correction,
        neighbors=neighbors,
        self_weight=instructions.self_weight,
        global_centroids=(
            torch.tensor(instructions.centroids, dtype=torch.float32, device=device)
            if instructions.centroids is not None
            else None
        ),
        device=device,
        amp=amp,
        seed=instructions.seed,
        state=state,
        distil_classes=instructions.distil_classes,
    )


def reported_signals(signals: Signals) -> dict[str, Any]:
    """The signals as the update's metadata carries them: ``num_samples`` is sent once, at the
    top of the metadata, not among the signals."""
    reported = signals.to_json()
    reported.pop("num_samples", None)
    return reported
