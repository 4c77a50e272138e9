"""Where a blocked pass reads a client's values from: a file read block by block, or an array.

The coordinator's updates are files (:class:`FileStateReader`, the safetensors reader): a pass
has the reader copy each block of a client's tensor into a small buffer of its own with one
positioned read (the reader does the I/O; this module only asks for byte ranges), so what the
process holds is that buffer, whatever the number of clients and the size of the model; the
file's pages stay in the kernel's page cache, outside the process's resident set. (Not memory
maps: a page fault maps up to a whole 2 MiB page-cache folio of every file the pass is reading,
so the resident set would grow with K.) Any other :class:`~service.audit.state.StateReader`
(in-memory states in tests and in Flower's in-process auditor) is read with ``get`` once per
tensor and handed out as views.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np

from service.audit._typing import AnyArray
from service.audit._validation import InvalidInputError
from service.audit.state import StateReader

__all__ = [
    "FileStateReader",
    "TensorSource",
    "file_readers",
    "global_order",
    "small_runs",
    "span_sources",
    "tensor_sources",
    "visit_plan",
]


@runtime_checkable
class FileStateReader(StateReader, Protocol):
    """A :class:`StateReader` over a file whose tensors can be read in parts."""

    def layout(self, name: str) -> tuple[np.dtype[Any], tuple[int, ...]]:
        """Return ``name``'s dtype and shape without reading its values."""

    def read_into(self, name: str, start: int, out: AnyArray) -> None:
        """Copy entries ``[start, start + out.size)`` of the flattened ``name`` into ``out``
        (C-contiguous, ``name``'s dtype)."""

    def read_at(self, position: int, out: AnyArray) -> None:
        """Fill ``out`` (C-contiguous) with the file's bytes from byte ``position`` on; raise
        ``EOFError`` when the file ends first (the reader does the I/O: this module stays pure
        of it)."""

    def offset(self, name: str) -> int:
        """Return where ``name``'s data starts in the file (a pass visits tensors in file order:
        the page cache reads ahead along it)."""


class TensorSource:
    """One client's values of one tensor, handed out block by block.

    ``shape`` and ``dtype`` are the tensor's (checked against the global model before any value
    is read). :meth:`block` returns entries ``[start, stop)`` of the flattened tensor: ``out``
    filled from the file, or a read-only view of the array; either way valid until ``out`` is
    written again.
    """

    __slots__ = ("dtype", "shape", "size")

    def __init__(self, dtype: np.dtype[Any], shape: tuple[int, ...]) -> None:
        self.dtype = dtype
        self.shape = shape
        self.size = math.prod(shape)  # np.prod costs microseconds per call: K x tensors calls

    def block(self, start: int, stop: int, out: AnyArray) -> AnyArray:
        """Return entries ``[start, stop)``; ``out`` has this dtype and room for them."""
        raise NotImplementedError

    def copy_into(self, start: int, stop: int, out: AnyArray, raw: AnyArray | None) -> None:
        """Write entries ``[start, stop)`` into ``out`` (``stop - start`` entries of any float
        dtype, converted); ``raw``, of this dtype, holds them on the way where dtypes differ."""
        raise NotImplementedError

    def whole(self) -> AnyArray:
        """The whole flattened tensor (a fresh array or a view): for error paths and the small
        non-float tensors a pass copies."""
        return self.block(0, self.size, np.empty(self.size, dtype=self.dtype))


class _ArraySource(TensorSource):
    __slots__ = ("flat",)

    def __init__(self, array: AnyArray) -> None:
        super().__init__(array.dtype, tuple(array.shape))
        self.flat = array.reshape(-1)

    def block(self, start: int, stop: int, out: AnyArray) -> AnyArray:
        return self.flat[start:stop]

    def copy_into(self, start: int, stop: int, out: AnyArray, raw: AnyArray | None) -> None:
        np.copyto(out, self.flat[start:stop], casting="same_kind")


class _FileSource(TensorSource):
    """Blocks read with positioned reads; the buffers are the pass's own (C-contiguous, of
    this dtype: checked here once, not per block). It keeps its reader, whose open file it
    reads (a reader collected would close it, and the number could name another file)."""

    __slots__ = ("item", "label", "name", "offset", "reader")

    def __init__(
        self,
        reader: FileStateReader,
        offset: int,
        dtype: np.dtype[Any],
        shape: tuple[int, ...],
        name: str,
        label: str,
    ) -> None:
        super().__init__(dtype, shape)
        self.reader, self.name, self.label = reader, name, label
        self.offset = offset
        self.item = dtype.itemsize

    @classmethod
    def of(cls, reader: FileStateReader, name: str, label: str) -> _FileSource:
        """Tensor ``name`` of ``reader``; errors name it as ``label``."""
        dtype, shape = reader.layout(name)
        return cls(reader, reader.offset(name), dtype, shape, name, label)

    def block(self, start: int, stop: int, out: AnyArray) -> AnyArray:
        target = out[: stop - start]
        self._read(start, target)
        return target

    def _read(self, start: int, target: AnyArray) -> None:
        if target.dtype != self.dtype or not target.flags.c_contiguous:
            raise ValueError(
                f"tensor {self.name!r}: a block buffer must be C-contiguous {self.dtype}"
            )
        if start < 0 or start + target.size > self.size:
            raise ValueError(f"tensor {self.name!r}: entries beyond its {self.size}")
        try:
            self.reader.read_at(self.offset + start * self.item, target)
        except EOFError:
            # a stored update cut short after it was checked: the audit's error, naming it
            raise InvalidInputError(
                f"{self.label}: the file ends inside tensor {self.name!r}"
            ) from None

    def copy_into(self, start: int, stop: int, out: AnyArray, raw: AnyArray | None) -> None:
        if out.dtype == self.dtype:
            self._read(start, out)
        else:
            if raw is None:
                raise ValueError("a buffer of the source's dtype is needed to convert")
            np.copyto(out, self.block(start, stop, raw), casting="same_kind")


def file_readers(readers: Sequence[StateReader]) -> list[bool]:
    """Which readers can be read in parts (checked once per pass: a Protocol check is slow)."""
    return [isinstance(reader, FileStateReader) for reader in readers]


def tensor_sources(
    readers: Sequence[StateReader], from_file: Sequence[bool], name: str, label: str = "updates"
) -> list[TensorSource]:
    """Each reader's source of tensor ``name`` (see :func:`file_readers`); errors name the
    reader as ``label[j]``."""
    return [
        _FileSource.of(cast(FileStateReader, reader), name, f"{label}[{j}]")
        if file
        else _ArraySource(np.asarray(reader.get(name)))
        for j, (reader, file) in enumerate(zip(readers, from_file, strict=True))
    ]


def small_runs(reader: FileStateReader, names: Sequence[str], limit: int) -> list[list[str]]:
    """``names`` (in ``reader``'s file order) cut into runs that a pass can read as one span:
    consecutive float tensors of one dtype, each under ``limit`` entries, back to back in the
    file, at most ``limit`` entries a run; every other tensor is a run of its own.

    A model has many small tensors (biases, normalisation parameters: 100 of ResNet-18's 122
    hold under 1,000 values), and reading them one by one costs a call per tensor and client.
    """
    runs: list[list[str]] = []
    run: list[str] = []
    total, end, kind = 0, -1, None
    for name in names:
        dtype, shape = reader.layout(name)
        size = math.prod(shape)
        offset = reader.offset(name)
        small = dtype.kind == "f" and size < limit
        if small and run and dtype == kind and offset == end and total + size <= limit:
            run.append(name)
            total += size
        else:
            if run:
                runs.append(run)
            run, total, kind = [name], size, dtype if small else None
            if not small:
                runs.append(run)
                run = []
        end = offset + size * dtype.itemsize
    if run:
        runs.append(run)
    return runs


def span_sources(
    readers: Sequence[StateReader], names: Sequence[str], label: str = "updates"
) -> list[TensorSource] | None:
    """Each file reader's tensors ``names`` as one flat source (their values in this order), or
    None where some reader does not hold them back to back, in this order, with one dtype."""
    sources: list[TensorSource] = []
    for j, reader in enumerate(readers):
        file = cast(FileStateReader, reader)
        first = file.offset(names[0])
        dtype = file.layout(names[0])[0]
        end = first
        for name in names:
            kind, shape = file.layout(name)
            if kind != dtype or file.offset(name) != end:
                return None
            end += math.prod(shape) * dtype.itemsize
        count = (end - first) // dtype.itemsize
        span = f"{names[0]}..{names[-1]}"
        sources.append(_FileSource(file, first, dtype, (count,), span, f"{label}[{j}]"))
    return sources


def visit_plan(
    names: list[str],
    updates: Sequence[StateReader],
    from_file: list[bool],
    spans: bool,
    span_limit: int,
) -> tuple[list[str], list[list[str]]]:
    """The order of the pass (the first update's file order when it is a file, so reads move
    forward through every file) and its runs (runs of small tensors read as one span where
    ``spans`` and every update is a file, at most ``span_limit`` entries; otherwise one tensor a
    run)."""
    if not (from_file and from_file[0]):
        return names, [[name] for name in names]
    first = updates[0]
    assert isinstance(first, FileStateReader)
    visit = sorted(names, key=first.offset)
    if spans and all(from_file):
        return visit, small_runs(first, visit, span_limit)
    return visit, [[name] for name in visit]


def global_order(names: Sequence[str], visited: Sequence[str]) -> list[int]:
    """Positions in ``visited`` (file order) of its names, in the global state's order."""
    rank = {name: i for i, name in enumerate(names)}
    return sorted(range(len(visited)), key=lambda i: rank[visited[i]])
