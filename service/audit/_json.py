"""Conversion of audit results to plain JSON values (dict, list, str, int, float, bool, None)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["to_jsonable"]


def to_jsonable(value: Any, path: str = "$") -> Any:
    """Return ``value`` with numpy types, tuples and mappings turned into JSON values.

    Raises
    ------
    ValueError
        If a float is NaN or infinite (the audit core promises NaN-free output, so this is a
        bug, reported with the JSON path of the value), or a value has no JSON form.
    """
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        result = float(value)
        if not math.isfinite(result):
            raise ValueError(f"{path}: non-finite float {result} in audit output")
        return result
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist(), path)
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v, f"{path}[{i}]") for i, v in enumerate(value)]
    raise ValueError(f"{path}: {type(value).__name__} has no JSON form")
