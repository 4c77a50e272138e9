"""Input checks and parameter constraints for the audit core.

Two exception types separate the two kinds of caller mistakes:

* :class:`InvalidParameterError` -- a hyper-parameter (constructor argument, configuration value,
  keyword argument) has the wrong type or an out-of-range value. It subclasses both
  :class:`ValueError` and :class:`TypeError`, as scikit-learn's parameter validation does, so
  callers can catch either.
* :class:`InvalidInputError` -- an input array or model state is malformed (wrong shape, NaN where
  none is allowed, mismatched tensor names, ...).

Every message starts with the name of the offending argument, then the reason.
Degenerate but well-formed statistics (too few clients, constant columns, ...) are *not* errors:
the detectors report them as "undetermined" instead.
"""

from __future__ import annotations

from collections.abc import Collection
from numbers import Integral, Real
from typing import Any

import numpy as np

from service.audit._typing import AnyArray, BoolArray, FloatArray, IntArray

__all__ = [
    "MAX_LOSS",
    "InvalidInputError",
    "InvalidParameterError",
    "as_bool_array",
    "as_float_array",
    "as_int_array",
    "check_bool",
    "check_choice",
    "check_float",
    "check_int",
]


MAX_LOSS = 1e6
"""The largest mean loss a site may report per class, in nats. A model's cross-entropy is a few
nats, and a few hundred where it has diverged; beyond about 1e154 the audit's squared
deviations overflow (a site reporting 1e155 made the round's close fail). The audit refuses
such input (:class:`InvalidInputError`); the coordinator refuses the update (422), and a spread
above it too (the audit itself caps a spread where it pools them)."""


class InvalidParameterError(ValueError, TypeError):
    """A hyper-parameter has a wrong type or an out-of-range value."""


class InvalidInputError(ValueError):
    """An input array or model state is malformed."""


def check_int(
    name: str, value: Any, *, min_value: int | None = None, max_value: int | None = None
) -> int:
    """Return ``value`` as ``int`` after checking its type and range (bool is rejected)."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, Integral):
        raise InvalidParameterError(f"{name}: expected an int, got {type(value).__name__}")
    result = int(value)
    if min_value is not None and result < min_value:
        raise InvalidParameterError(f"{name}: must be >= {min_value}, got {result}")
    if max_value is not None and result > max_value:
        raise InvalidParameterError(f"{name}: must be <= {max_value}, got {result}")
    return result


def check_float(
    name: str,
    value: Any,
    *,
    min_value: float | None = None,
    max_value: float | None = None,
    min_inclusive: bool = True,
    max_inclusive: bool = True,
) -> float:
    """Return ``value`` as a finite ``float`` after checking its type and range."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, Real):
        raise InvalidParameterError(f"{name}: expected a number, got {type(value).__name__}")
    result = float(value)
    if not np.isfinite(result):
        raise InvalidParameterError(f"{name}: must be finite, got {result}")
    if min_value is not None and (
        result < min_value or (not min_inclusive and result == min_value)
    ):
        op = ">=" if min_inclusive else ">"
        raise InvalidParameterError(f"{name}: must be {op} {min_value}, got {result}")
    if max_value is not None and (
        result > max_value or (not max_inclusive and result == max_value)
    ):
        op = "<=" if max_inclusive else "<"
        raise InvalidParameterError(f"{name}: must be {op} {max_value}, got {result}")
    return result


def check_bool(name: str, value: Any) -> bool:
    """Return ``value`` as ``bool``; only real booleans are accepted."""
    if not isinstance(value, bool | np.bool_):
        raise InvalidParameterError(f"{name}: expected a bool, got {type(value).__name__}")
    return bool(value)


def check_choice(name: str, value: Any, choices: Collection[str]) -> str:
    """Return ``value`` if it is one of ``choices``."""
    if not isinstance(value, str) or value not in choices:
        allowed = ", ".join(repr(c) for c in sorted(choices))
        raise InvalidParameterError(f"{name}: must be one of {allowed}, got {value!r}")
    return value


def _as_array(name: str, value: Any, dtype: type[np.generic]) -> AnyArray:
    try:
        return np.asarray(value, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(
            f"{name}: cannot be read as a {dtype.__name__} array ({exc})"
        ) from exc


def _check_ndim(name: str, array: AnyArray, ndim: int) -> None:
    if array.ndim != ndim:
        raise InvalidInputError(
            f"{name}: expected a {ndim}-D array, got shape {tuple(array.shape)}"
        )


def as_float_array(
    name: str,
    value: Any,
    *,
    ndim: int,
    allow_nan: bool = False,
    min_value: float | None = None,
) -> FloatArray:
    """Convert ``value`` to a float64 array of dimension ``ndim`` and check its values.

    Infinite values are always rejected; NaN only when ``allow_nan`` is false (``None`` entries
    of a nested list read as NaN). ``min_value`` bounds every non-NaN entry from below.
    """
    if isinstance(value, np.ndarray) and value.dtype.kind not in "biuf":
        raise InvalidInputError(f"{name}: expected numbers, got dtype {value.dtype}")
    array: FloatArray = _as_array(name, value, np.float64)
    _check_ndim(name, array, ndim)
    if np.isinf(array).any():
        raise InvalidInputError(f"{name}: contains infinite values")
    nan = np.isnan(array)
    if not allow_nan and nan.any():
        raise InvalidInputError(f"{name}: contains NaN")
    if min_value is not None and (array[~nan] < min_value).any():
        raise InvalidInputError(f"{name}: values must be >= {min_value}")
    return array


def as_int_array(name: str, value: Any, *, ndim: int, min_value: int | None = None) -> IntArray:
    """Convert ``value`` to an int64 array of dimension ``ndim``.

    Integer-valued floats are accepted (JSON has one number type); fractional values, NaN and
    booleans are rejected.
    """
    raw: AnyArray = np.asarray(value)
    if raw.dtype.kind == "b":
        raise InvalidInputError(f"{name}: expected integers, got booleans")
    if raw.dtype.kind not in "iuf":
        raw = _as_array(name, value, np.float64)
    _check_ndim(name, raw, ndim)
    if raw.dtype.kind == "f":
        if not np.isfinite(raw).all() or (raw != np.round(raw)).any():
            raise InvalidInputError(f"{name}: expected integer values")
    array: IntArray = raw.astype(np.int64)
    if min_value is not None and (array < min_value).any():
        raise InvalidInputError(f"{name}: values must be >= {min_value}")
    return array


def as_bool_array(name: str, value: Any, *, ndim: int) -> BoolArray:
    """Convert ``value`` to a boolean array; only booleans (not 0/1 numbers) are accepted."""
    raw: AnyArray = np.asarray(value)
    if raw.dtype.kind != "b" and raw.size > 0:
        raise InvalidInputError(f"{name}: expected booleans, got dtype {raw.dtype}")
    array: BoolArray = raw.astype(np.bool_)
    _check_ndim(name, array, ndim)
    return array
