"""Reports, pins and recomputations on the wire."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class PinRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: Literal["trusted", "suspect", "noisy"]
    reason: str = Field(min_length=1, max_length=2000)


class RecomputeRequest(BaseModel):
    """Re-run a past round's audit with other settings, or a what-if aggregation."""

    model_config = ConfigDict(extra="forbid")

    audit: dict[str, Any] = Field(
        default_factory=dict,
        description="Audit settings to change, e.g. {'aggregation': 'median'} or "
        "{'fednoro_require_separation': false}",
    )
    exclude_clients: list[uuid.UUID] = Field(default_factory=list)
