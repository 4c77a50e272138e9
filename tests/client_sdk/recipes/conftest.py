"""Fixtures for the recipe tests; CUDA-only tests carry ``gpu`` and skip without a device."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def cuda_device() -> torch.device:
    """The CUDA device; skips the test when there is none."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch.device("cuda")
