"""The base of the typed parts of a stored audit (verdict evidence, round summaries, aggregation
details): every field optional and absent from the JSON where the stored record lacks it (the
``MISSING`` default), a stored null kept as null, an unknown key kept (``extra="allow"``)."""

from __future__ import annotations

from typing import Any

from pydantic import MISSING, BaseModel, ConfigDict, Field

__all__ = ["StoredRecord", "stored_key"]


class StoredRecord(BaseModel):
    """A part of a stored audit whose keys depend on the detector, the round and the version."""

    model_config = ConfigDict(extra="allow")


def stored_key(description: str) -> Any:
    """A field that is absent from the JSON when the stored record lacks it."""
    return Field(MISSING, description=description)
