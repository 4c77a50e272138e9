"""Model states as safetensors bytes: what a site uploads, downloads and writes to disk.

The `Participant` (``client_sdk.participant``) serialises theta_k with :func:`state_to_bytes`,
loads theta_G with :func:`load_state_bytes` and shows an upload's tensors with
:func:`safetensors_manifest`; an operator writes the federation's initial model with
:func:`save_initial_model`. All of them are importable from ``client_sdk.participant`` too.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from torch import nn

__all__ = [
    "load_state_bytes",
    "safetensors_manifest",
    "save_initial_model",
    "state_to_bytes",
]


def state_to_bytes(model: nn.Module) -> bytes:
    """The model's state as safetensors bytes (CPU, contiguous, no shared storage)."""
    state = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    return save_safetensors(state)


def save_initial_model(model: nn.Module, path: str | Path) -> int:
    """Write ``model``'s state as the federation's initial model file (safetensors, what
    ``AdminClient.upload_initial_model`` and ``fedaudit model upload`` send); returns its size
    in bytes. ``TypeError`` when ``model`` is not a ``torch.nn.Module``, ``ValueError`` when it
    has no state (no parameters or buffers) to train."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if not model.state_dict():
        raise ValueError(f"the {type(model).__name__} has no parameters or buffers to train")
    data = state_to_bytes(model)
    Path(path).write_bytes(data)
    return len(data)


def load_state_bytes(model: nn.Module, data: bytes) -> None:
    """Load safetensors bytes into `model` (names, shapes and dtypes must match exactly)."""
    state = load_safetensors(data)
    model.load_state_dict(state, strict=True)


def safetensors_manifest(data: bytes) -> list[dict[str, Any]]:
    """Each tensor of safetensors bytes as ``{"name", "dtype", "shape"}``, in file order, read
    from the file's own header (the values are not read)."""
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    return [
        {"name": name, "dtype": entry["dtype"], "shape": list(entry["shape"])}
        for name, entry in header.items()
        if name != "__metadata__"
    ]
