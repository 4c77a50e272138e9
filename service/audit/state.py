"""The streaming seam for model states.

Aggregation and divergence code never holds K whole model states: it loops over tensor names and,
for each name, reads that one tensor from each client, computes, and drops it (docs/algorithms.md,
"Aggregation"). A :class:`StateReader` gives that one-tensor-at-a-time access; the
coordinator backs it with its safetensors reader, which the blocked passes also read in parts
(:class:`service.audit.block_source.FileStateReader`), and tests use :class:`DictStateReader`.

"Float tensors" are those of dtype kind ``'f'`` (float16/32/64). Every other tensor (for example
BatchNorm's ``num_batches_tracked``) is never averaged.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike

from service.audit._typing import AnyArray, FloatArray
from service.audit._validation import InvalidInputError

__all__ = [
    "DictStateReader",
    "StateReader",
    "check_state_names",
    "flat64",
    "is_float_tensor",
    "iter_client_tensors",
    "read_global_tensor",
    "read_tensor",
]


@runtime_checkable
class StateReader(Protocol):
    """Read-only access to one model state, one tensor at a time."""

    def keys(self) -> Sequence[str]:
        """Return the tensor names, in a stable order."""

    def get(self, name: str) -> AnyArray:
        """Return the tensor called ``name`` as a numpy array (any dtype)."""


class DictStateReader:
    """In-memory :class:`StateReader` over a mapping of names to arrays.

    Parameters
    ----------
    tensors : Mapping[str, ArrayLike]
        Tensor name to array. Arrays are converted with :func:`numpy.asarray` (no copy when
        already an array); :meth:`get` hands out read-only views so no consumer can modify them.

    Raises
    ------
    InvalidInputError
        If a name is not a string or a value is not array-like.
    """

    def __init__(self, tensors: Mapping[str, ArrayLike]) -> None:
        self._tensors: dict[str, AnyArray] = {}
        for name, value in tensors.items():
            if not isinstance(name, str):
                raise InvalidInputError(f"tensors: names must be str, got {type(name).__name__}")
            array = np.asarray(value)
            if array.dtype == object:
                raise InvalidInputError(f"tensors[{name!r}]: not a numeric array")
            self._tensors[name] = array

    def keys(self) -> list[str]:
        """Return the tensor names in insertion order."""
        return list(self._tensors)

    def get(self, name: str) -> AnyArray:
        """Return a read-only view of the tensor called ``name``.

        Raises
        ------
        InvalidInputError
            If the state has no tensor of that name.
        """
        try:
            array = self._tensors[name]
        except KeyError:
            raise InvalidInputError(f"name: the state has no tensor {name!r}") from None
        view = array.view()
        view.flags.writeable = False
        return view


def is_float_tensor(array: AnyArray) -> bool:
    """Return True for float16/32/64 tensors (the only ones that are ever averaged)."""
    return bool(array.dtype.kind == "f")


def check_state_names(global_state: StateReader, updates: Sequence[StateReader]) -> list[str]:
    """Return the global state's tensor names after checking every update has exactly those.

    Raises
    ------
    InvalidInputError
        If the global state repeats a name, or an update lacks a tensor or has an extra one
        (the message names the client index and the tensor).
    """
    names = list(global_state.keys())
    if len(set(names)) != len(names):
        raise InvalidInputError("global_state: tensor names are not unique")
    expected = set(names)
    for k, update in enumerate(updates):
        got = list(update.keys())
        got_set = set(got)
        missing = [n for n in names if n not in got_set]
        if missing:
            raise InvalidInputError(f"updates[{k}]: missing tensor {missing[0]!r}")
        extra = [n for n in got if n not in expected]
        if extra:
            raise InvalidInputError(f"updates[{k}]: unexpected tensor {extra[0]!r}")
    return names


def read_tensor(reader: StateReader, name: str, reference: AnyArray, label: str) -> AnyArray:
    """Read ``name`` from ``reader`` and check it matches ``reference`` in shape and dtype.

    Float tensors must also be finite. ``label`` names the reader in error messages.
    """
    array = np.asarray(reader.get(name))
    if array.shape != reference.shape:
        raise InvalidInputError(
            f"{label}: tensor {name!r} has shape {tuple(array.shape)}, "
            f"expected {tuple(reference.shape)}"
        )
    if array.dtype != reference.dtype:
        raise InvalidInputError(
            f"{label}: tensor {name!r} has dtype {array.dtype}, expected {reference.dtype}"
        )
    if is_float_tensor(array) and not np.isfinite(array).all():
        raise InvalidInputError(f"{label}: tensor {name!r} contains NaN or infinite values")
    return array


def read_global_tensor(global_state: StateReader, name: str) -> AnyArray:
    """Read one tensor of the global state, checking float tensors are finite."""
    array = np.asarray(global_state.get(name))
    if array.dtype == object:
        raise InvalidInputError(f"global_state: tensor {name!r} is not a numeric array")
    if is_float_tensor(array) and not np.isfinite(array).all():
        raise InvalidInputError(f"global_state: tensor {name!r} contains NaN or infinite values")
    return array


def iter_client_tensors(
    global_state: StateReader, updates: Sequence[StateReader]
) -> Iterator[tuple[str, AnyArray, list[AnyArray]]]:
    """Yield ``(name, global tensor, [client tensors])`` one tensor name at a time.

    At most K copies of one tensor are alive per step (plus whatever the caller keeps). Names
    are checked up front; shapes, dtypes and finiteness as each tensor is read.
    """
    names = check_state_names(global_state, updates)
    for name in names:
        reference = read_global_tensor(global_state, name)
        tensors = [
            read_tensor(update, name, reference, f"updates[{k}]")
            for k, update in enumerate(updates)
        ]
        yield name, reference, tensors


def flat64(array: AnyArray) -> FloatArray:
    """Return ``array`` flattened as float64 (a copy only when the dtype differs)."""
    result: FloatArray = np.asarray(array, dtype=np.float64).reshape(-1)
    return result
