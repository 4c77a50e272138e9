"""The signals on the wire: one ``ConfigRecord`` of flat lists in a Flower reply.

A Flower reply to a training message holds the site's model (one ``ArrayRecord``) and its
metrics (one ``MetricRecord``). The message-API strategies (``FedAvg`` and the others in
``flwr.serverapp.strategy``) refuse a reply with a second ``MetricRecord`` and weighted-average
every list a ``MetricRecord`` holds, so fedaudit's signals travel in a ``ConfigRecord`` under
its own key (:data:`SIGNALS_KEY`), which those strategies ignore. Flower's records hold flat,
homogeneous lists and no ``None``: a class without samples is NaN in ``per_class_loss`` and
``per_class_loss_sd`` and -1 in the two error counts, a class count the privacy policy
suppresses (``None``, "fewer than min_class_count") is -1 in ``class_counts``, and a matrix
(``probe_softmax``, ``centroids``) is sent row-major with its shape under ``<name>_shape``.

Entries (``num_samples`` and ``class_counts`` always; the others when computed):

==============================  =============  ====================================================
key                             type           meaning (``client_sdk.signals.Signals``)
==============================  =============  ====================================================
``format``                      str            :data:`SIGNALS_FORMAT`
``num_samples``                 int            n_k
``class_counts``                list of int    the given labels' histogram (-1: suppressed)
``per_class_loss``              list of float  theta_G's mean loss per given label (NaN: absent)
``per_class_loss_sd``           list of float  its standard deviation, ddof 0 (NaN: absent)
``per_class_errors``            list of int    theta_G's errors per given label (-1: absent)
``per_class_confident_errors``  list of int    of those, the confident ones (-1: absent)
``train_loss``                  float          mean training cross-entropy
``train_accuracy``              float          theta_k's accuracy on its own labels
``probe_softmax``               list of float  (P, C) softmax on the probe, row-major
``probe_softmax_shape``         list of int    [P, C]
``centroids``                   list of float  (C, d) RoFL centroids, row-major
``centroids_shape``             list of int    [C, d]
==============================  =============  ====================================================
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flwr.app import ConfigRecord

__all__ = [
    "PRIVACY_PREFIX",
    "SIGNALS_FORMAT",
    "SIGNALS_KEY",
    "SignalsFormatError",
    "WireSignals",
    "decode_signals",
    "encode_signals",
    "policy_entries",
]

SIGNALS_KEY = "fedaudit.signals"
"""Key of the signals' ``ConfigRecord`` in a reply's ``RecordDict``."""

SIGNALS_FORMAT = "fedaudit.signals/1"
"""Value of the record's ``format`` entry (a later layout gets a new number)."""

PRIVACY_PREFIX = "fedaudit.privacy."
"""Prefix of the privacy policy's entries in a training message's config
(``fedaudit.privacy.min_class_count``, ...; 0 for an unset clip or delta)."""

_MATRICES = ("probe_softmax", "centroids")
_COUNTS = ("per_class_errors", "per_class_confident_errors")


class SignalsFormatError(ValueError):
    """A reply's signals record is malformed (the message names the entry)."""


@dataclass(frozen=True)
class WireSignals:
    """The signals of one reply, decoded (``None`` where a class is absent or not sent).

    Attributes
    ----------
    num_samples : int
    class_counts : list of (int or None)
        None: suppressed by the privacy policy (fewer than its ``min_class_count``).
    per_class_loss, per_class_loss_sd : list of (float or None), or None
    per_class_errors, per_class_confident_errors : list of (int or None), or None
    train_loss, train_accuracy : float or None
    probe_softmax, centroids : list of list of float, or None
    """

    num_samples: int
    class_counts: list[int | None]
    per_class_loss: list[float | None] | None = None
    per_class_loss_sd: list[float | None] | None = None
    per_class_errors: list[int | None] | None = None
    per_class_confident_errors: list[int | None] | None = None
    train_loss: float | None = None
    train_accuracy: float | None = None
    probe_softmax: list[list[float]] | None = None
    centroids: list[list[float]] | None = None


def _nan_for_none(values: Sequence[float | None]) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


def encode_signals(signals: Any) -> ConfigRecord:
    """Return the ``ConfigRecord`` carrying ``signals``.

    Parameters
    ----------
    signals : client_sdk.signals.Signals or WireSignals
        Anything with the attributes of :class:`WireSignals`.

    Returns
    -------
    ConfigRecord
        The entries of the module docstring's table.
    """
    entries: dict[str, Any] = {
        "format": SIGNALS_FORMAT,
        "num_samples": int(signals.num_samples),
        "class_counts": [-1 if c is None else int(c) for c in signals.class_counts],
    }
    for name in ("per_class_loss", "per_class_loss_sd"):
        value = getattr(signals, name)
        if value is not None:
            entries[name] = _nan_for_none(value)
    for name in _COUNTS:
        errors = getattr(signals, name, None)
        if errors is not None:
            entries[name] = [-1 if v is None else int(v) for v in errors]
    for name in ("train_loss", "train_accuracy"):
        value = getattr(signals, name)
        if value is not None:
            entries[name] = float(value)
    for name in _MATRICES:
        rows = getattr(signals, name)
        if rows is not None:
            width = len(rows[0]) if rows else 0
            entries[name] = [float(x) for row in rows for x in row]
            entries[f"{name}_shape"] = [len(rows), width]
    return ConfigRecord(entries)


def _int(record: Mapping[str, Any], name: str) -> int:
    value = record.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SignalsFormatError(f"{name}: expected an int, got {value!r}")
    return value


def _floats(record: Mapping[str, Any], name: str) -> list[float] | None:
    value = record.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value
    ):
        raise SignalsFormatError(f"{name}: expected a list of numbers")
    return [float(v) for v in value]


def _float(record: Mapping[str, Any], name: str) -> float | None:
    value = record.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SignalsFormatError(f"{name}: expected a number, got {value!r}")
    return float(value)


def _matrix(record: Mapping[str, Any], name: str) -> list[list[float]] | None:
    flat = _floats(record, name)
    if flat is None:
        return None
    shape = record.get(f"{name}_shape")
    if (
        not isinstance(shape, list)
        or len(shape) != 2
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)
        or shape[0] * shape[1] != len(flat)
    ):
        raise SignalsFormatError(
            f"{name}_shape: expected [rows, columns] matching {len(flat)} values, got {shape!r}"
        )
    rows, width = shape
    return [flat[i * width : (i + 1) * width] for i in range(rows)]


def _counts(record: Mapping[str, Any], name: str, classes: int) -> list[int | None] | None:
    """A per-class count list (-1: absent, None in the result); None when not sent."""
    values = record.get(name)
    if values is None:
        return None
    if (
        not isinstance(values, list)
        or not all(isinstance(e, int) and not isinstance(e, bool) and e >= -1 for e in values)
        or len(values) != classes
    ):
        raise SignalsFormatError(f"{name}: expected {classes} ints, -1 or more (-1: absent)")
    return [None if e < 0 else e for e in values]


def decode_signals(record: Mapping[str, Any]) -> WireSignals:
    """Read a signals record written by :func:`encode_signals` (NaN becomes ``None``).

    Raises
    ------
    SignalsFormatError
        If the format is unknown or an entry has the wrong type or length.
    """
    if record.get("format") != SIGNALS_FORMAT:
        raise SignalsFormatError(
            f"format: expected {SIGNALS_FORMAT!r}, got {record.get('format')!r}"
        )
    counts = record.get("class_counts")
    if not isinstance(counts, list) or not all(
        isinstance(c, int) and not isinstance(c, bool) and c >= -1 for c in counts
    ):
        raise SignalsFormatError(
            "class_counts: expected a list of ints, -1 or more (-1: suppressed)"
        )
    per_class: dict[str, list[float | None] | None] = {}
    for name in ("per_class_loss", "per_class_loss_sd"):
        values = _floats(record, name)
        if values is not None and len(values) != len(counts):
            raise SignalsFormatError(f"{name}: {len(values)} classes, expected {len(counts)}")
        per_class[name] = None if values is None else [None if math.isnan(v) else v for v in values]
    errors = {name: _counts(record, name, len(counts)) for name in _COUNTS}
    return WireSignals(
        num_samples=_int(record, "num_samples"),
        class_counts=[None if c < 0 else c for c in counts],
        per_class_loss=per_class["per_class_loss"],
        per_class_loss_sd=per_class["per_class_loss_sd"],
        per_class_errors=errors["per_class_errors"],
        per_class_confident_errors=errors["per_class_confident_errors"],
        train_loss=_float(record, "train_loss"),
        train_accuracy=_float(record, "train_accuracy"),
        probe_softmax=_matrix(record, "probe_softmax"),
        centroids=_matrix(record, "centroids"),
    )


def policy_entries(policy: Any) -> dict[str, int | float]:
    """A privacy policy (``client_sdk.SignalPolicy``) as the entries of a training message's
    config (:data:`PRIVACY_PREFIX`; an unset clip or delta is 0: a record holds no None)."""
    return {
        f"{PRIVACY_PREFIX}min_class_count": int(policy.min_class_count),
        f"{PRIVACY_PREFIX}count_bucket": int(policy.count_bucket),
        f"{PRIVACY_PREFIX}dp_noise_multiplier": float(policy.dp_noise_multiplier),
        f"{PRIVACY_PREFIX}dp_clip_loss": float(policy.dp_clip_loss or 0.0),
        f"{PRIVACY_PREFIX}dp_clip_probe": float(policy.dp_clip_probe or 0.0),
        f"{PRIVACY_PREFIX}dp_delta": float(policy.dp_delta or 0.0),
    }
