"""One round's inputs: what each client reported (:class:`ClientRoundData`), what the server knows
of its past (:class:`StatusHistory`), and their validation into :class:`CheckedClients`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.audit._typing import FloatArray, IntArray
from service.audit._validation import (
    MAX_LOSS,
    InvalidInputError,
    InvalidParameterError,
    as_float_array,
    as_int_array,
    check_float,
)
from service.audit.error_evidence import checked_error_counts
from service.audit.state import StateReader

__all__ = ["ClientRoundData", "StatusHistory"]


@dataclass(frozen=True, kw_only=True)
class ClientRoundData:
    """What one client reported for the round (docs/algorithms.md, "Signals").

    Attributes
    ----------
    client_id : str
        Unique, non-empty.
    num_samples : int
        n_k, the size of the local training set (>= 1).
    class_counts : array-like of int of shape (n_classes,)
        Histogram of the client's (possibly noisy) labels.
    per_class_loss : array-like of shape (n_classes,), optional
        Mean loss per given label under theta_G; NaN/None where the count is 0 (FedNoRo).
    per_class_loss_sd : array-like of shape (n_classes,), optional
        Standard deviation (ddof 0) of the same per-sample losses; NaN/None where the count is
        0 (the calibrated evidence's within-site standard error, ``service.audit.evidence``).
    per_class_errors : array-like of int of shape (n_classes,), optional
        Samples per given label that theta_G assigns to another class, 0 to the class's count;
        NaN/None where the count is 0 (``service.audit.error_evidence``).
    per_class_confident_errors : array-like of int of shape (n_classes,), optional
        Of those, the samples theta_G gives the label a probability of at most 0.1 (at most the
        class's errors); NaN/None where the count is 0 (``service.audit.confident_errors``).
    train_loss : float, optional
        Mean training cross-entropy (Fed-NCL h_k).
    train_accuracy : float, optional
        Accuracy of theta_k on its own labels, in [0, 1] (FedRN expertise).
    probe_softmax : array-like of shape (n_probe_inputs, n_classes), optional
        theta_k's softmax on the round's probe (FedRN similarity).
    centroids : array-like of shape (n_classes, dim), optional
        RoFL local class centroids.
    state : StateReader
        theta_k.
    """

    client_id: str
    num_samples: int
    class_counts: IntArray | Sequence[int]
    state: StateReader
    per_class_loss: FloatArray | Sequence[float | None] | None = None
    per_class_loss_sd: FloatArray | Sequence[float | None] | None = None
    per_class_errors: FloatArray | Sequence[int | None] | None = None
    per_class_confident_errors: FloatArray | Sequence[int | None] | None = None
    train_loss: float | None = None
    train_accuracy: float | None = None
    probe_softmax: FloatArray | Sequence[Sequence[float]] | None = None
    centroids: FloatArray | Sequence[Sequence[float]] | None = None


@dataclass(frozen=True)
class StatusHistory:
    """What the server knows about a client before this round's audit.

    Attributes
    ----------
    status : {"trusted", "suspect", "noisy"}
        The client's status after its previous audited round ("trusted" when new).
    flags : sequence of bool or None
        The primary detector's flags for the client in earlier rounds after the warm-up, oldest
        first (None = undetermined); only the last ``status_w`` determined ones matter.
    by_geometry : bool
        The client's latest counted flag came from the update geometry alone
        (``flagged_by_geometry``; :mod:`service.audit.geometry_evidence`, "Carried flags").
    """

    status: str = "trusted"
    flags: Sequence[bool | None] = ()
    by_geometry: bool = False


@dataclass(frozen=True)
class CheckedClients:
    """Validated per-client inputs of one audit."""

    ids: list[str]
    num_samples: IntArray
    class_counts: IntArray
    per_class_loss: list[FloatArray | None]
    per_class_loss_sd: list[FloatArray | None]
    per_class_errors: list[IntArray | None]
    per_class_confident_errors: list[IntArray | None]
    train_loss: list[float | None]
    train_accuracy: list[float | None]
    probes: list[FloatArray | None]
    centroids: list[FloatArray | None]
    states: list[StateReader]


def _confident_errors(
    where: str, value: Any, errors: IntArray | None, counts: IntArray
) -> IntArray | None:
    """A site's confident error counts, checked like its error counts and at most them; they
    come only with the error counts."""
    if value is None:
        return None
    name = f"{where}.per_class_confident_errors"
    if errors is None:
        raise InvalidInputError(f"{name}: given without per_class_errors")
    confident = checked_error_counts(name, value, counts)
    if (confident > errors).any():
        raise InvalidInputError(f"{name}: a count exceeds the class's errors")
    return confident


def check_clients(clients: Sequence[ClientRoundData], label: str) -> CheckedClients:
    """Validate every client's report (``label`` names the sequence in errors)."""
    ids: list[str] = []
    n: list[int] = []
    counts: list[IntArray] = []
    losses: list[FloatArray | None] = []
    spreads: list[FloatArray | None] = []
    wrong: list[IntArray | None] = []
    confident: list[IntArray | None] = []
    train_loss: list[float | None] = []
    accuracy: list[float | None] = []
    probes: list[FloatArray | None] = []
    centroids: list[FloatArray | None] = []
    states: list[StateReader] = []
    for i, client in enumerate(clients):
        where = f"{label}[{i}]"
        if not isinstance(client, ClientRoundData):
            raise InvalidInputError(f"{where}: expected ClientRoundData")
        if not isinstance(client.client_id, str) or not client.client_id:
            raise InvalidInputError(f"{where}.client_id: expected a non-empty str")
        if client.client_id in ids:
            raise InvalidInputError(f"{where}.client_id: duplicate {client.client_id!r}")
        ids.append(client.client_id)
        if (
            isinstance(client.num_samples, bool)
            or not isinstance(client.num_samples, int | np.integer)
            or client.num_samples < 1
        ):
            raise InvalidInputError(f"{where}.num_samples: expected a positive int")
        n.append(int(client.num_samples))
        row = as_int_array(f"{where}.class_counts", client.class_counts, ndim=1, min_value=0)
        if counts and row.shape != counts[0].shape:
            raise InvalidInputError(
                f"{where}.class_counts: {row.size} classes, expected {counts[0].size}"
            )
        counts.append(row)
        losses.append(
            _optional_row(f"{where}.per_class_loss", client.per_class_loss, row.size, MAX_LOSS)
        )
        spreads.append(
            _optional_row(f"{where}.per_class_loss_sd", client.per_class_loss_sd, row.size)
        )
        wrong.append(
            None
            if client.per_class_errors is None
            else checked_error_counts(f"{where}.per_class_errors", client.per_class_errors, row)
        )
        confident.append(
            _confident_errors(where, client.per_class_confident_errors, wrong[-1], row)
        )
        train_loss.append(_optional_scalar(f"{where}.train_loss", client.train_loss, 0.0, None))
        accuracy.append(
            _optional_scalar(f"{where}.train_accuracy", client.train_accuracy, 0.0, 1.0)
        )
        probes.append(_optional_matrix(f"{where}.probe_softmax", client.probe_softmax))
        centroids.append(_optional_matrix(f"{where}.centroids", client.centroids))
        if not isinstance(client.state, StateReader):
            raise InvalidInputError(f"{where}.state: expected a StateReader")
        states.append(client.state)
    n_classes = counts[0].size if counts else 0
    return CheckedClients(
        ids=ids,
        num_samples=np.asarray(n, dtype=np.int64),
        class_counts=np.stack(counts) if counts else np.zeros((0, n_classes), dtype=np.int64),
        per_class_loss=losses,
        per_class_loss_sd=spreads,
        per_class_errors=wrong,
        per_class_confident_errors=confident,
        train_loss=train_loss,
        train_accuracy=accuracy,
        probes=probes,
        centroids=centroids,
        states=states,
    )


def _optional_row(
    name: str, value: Any, n_classes: int, max_value: float | None = None
) -> FloatArray | None:
    """A per-class float row (NaN allowed where the class is absent) of n_classes entries,
    at most ``max_value`` where given."""
    if value is None:
        return None
    array = as_float_array(name, value, ndim=1, allow_nan=True)
    if array.size != n_classes:
        raise InvalidInputError(f"{name}: {array.size} classes, expected {n_classes}")
    if max_value is not None and (np.abs(np.nan_to_num(array)) > max_value).any():
        raise InvalidInputError(f"{name}: a value above {max_value:g}")
    return array


def _optional_scalar(name: str, value: Any, lo: float, hi: float | None) -> float | None:
    if value is None:
        return None
    try:
        return check_float(name, value, min_value=lo, max_value=hi)
    except InvalidParameterError as exc:
        raise InvalidInputError(str(exc)) from None


def _optional_matrix(name: str, value: Any) -> FloatArray | None:
    if value is None:
        return None
    return as_float_array(name, value, ndim=2)


def missing(ids: list[str], values: Sequence[object | None]) -> list[str]:
    """The ids of the clients whose value is None."""
    return [cid for cid, v in zip(ids, values, strict=True) if v is None]


def check_history(history: Sequence[StatusHistory] | None, n_clients: int) -> None:
    """Refuse a status history that does not match the clients (the statuses themselves are
    checked by :func:`~service.audit.detection.next_status` where the rule runs)."""
    if history is None:
        return
    if len(history) != n_clients:
        raise InvalidInputError(f"status_history: {len(history)} entries for {n_clients} clients")
    for i, entry in enumerate(history):
        if not isinstance(entry, StatusHistory):
            raise InvalidInputError(f"status_history[{i}]: expected StatusHistory")
        if isinstance(entry.flags, str) or not isinstance(entry.flags, Sequence):
            raise InvalidInputError(f"status_history[{i}].flags: expected a sequence")
