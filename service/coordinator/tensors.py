"""Safetensors on the server: header parsing, validation, streaming reads, atomic writes.

The header is parsed by hand (8-byte little-endian length, then JSON) so that a malformed or
hostile file is rejected before any tensor is touched; values are then read one tensor at a time.
No pickle is involved anywhere: safetensors holds only names, dtypes, shapes and raw bytes.
"""

from __future__ import annotations

import json
import math
import os
import struct
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from service.store.blobs import sha256_file

MAX_HEADER_BYTES = 100 * 1024 * 1024
# dtypes numpy can read; bfloat16 and float8 models must be converted by the client first.
NUMPY_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
ITEM_SIZES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
FLOAT_DTYPES = frozenset({"F64", "F32", "F16"})
_LITTLE_ENDIAN = {code: np.dtype(kind).newbyteorder("<") for code, kind in NUMPY_DTYPES.items()}

Manifest = dict[str, dict[str, Any]]


class SafetensorsFormatError(ValueError):
    """The bytes are not a well-formed safetensors file we can use."""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object without a repeated key: json keeps the last, other readers may not."""
    found = dict(pairs)
    if len(found) != len(pairs):
        raise ValueError("a key appears twice")
    return found


@dataclass(frozen=True)
class TensorSpan:
    """Where a tensor's bytes lie in the data section (after the header): ``[start, end)``."""

    name: str
    dtype: str
    start: int
    end: int


@dataclass(frozen=True)
class Header:
    """A safetensors header that passed :func:`parse_header`: the manifest (sorted by name) and
    each tensor's span, in data order. The spans tile ``[0, data_size)`` with no gap and no
    overlap, and each holds exactly its shape's bytes."""

    manifest: Manifest
    spans: tuple[TensorSpan, ...]

    @property
    def data_size(self) -> int:
        """The bytes the tensors cover, which the data section must hold exactly."""
        return self.spans[-1].end

    def check_data_size(self, data_size: int) -> None:
        """Refuse a data section of another size than the tensors cover, as the safetensors
        library does: bytes past the last tensor would be stored and hashed but read by nobody,
        and a section cut short ends inside a tensor."""
        if data_size != self.data_size:
            raise SafetensorsFormatError("the file size does not match the tensors in its header")


def header_length(prefix: bytes) -> int:
    """The header's length, from a file's first 8 bytes (little-endian); refused past
    :data:`MAX_HEADER_BYTES`, so that a hostile length cannot make a reader hold or parse an
    unbounded header."""
    if len(prefix) < 8:
        raise SafetensorsFormatError("file is shorter than a safetensors header")
    (length,) = struct.unpack("<Q", prefix[:8])
    if length > MAX_HEADER_BYTES:
        raise SafetensorsFormatError("safetensors header length is out of range")
    return int(length)


def parse_header(header: bytes) -> Header:
    """Parse and check a safetensors header (the JSON after the 8-byte length), all of it that
    does not depend on the file's size: strict JSON, string metadata, at least one tensor, each
    a supported dtype with a valid shape and exactly its shape's bytes, the tensors contiguous
    from the data section's first byte. The data section's size is checked apart
    (:meth:`Header.check_data_size`), by a reader that knows it: :func:`read_manifest` at once,
    the upload's streaming scan once the last byte has come."""
    try:
        # strict UTF-8 (no BOM, no UTF-16/32 guess) and no NaN/Infinity literals: only what
        # the safetensors library itself reads (the upload's scan trusts this parse)
        parsed = json.loads(
            header.decode("utf-8"), parse_constant=_no_constant, object_pairs_hook=_unique_keys
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise SafetensorsFormatError(f"safetensors header is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise SafetensorsFormatError("safetensors header is not a JSON object")
    metadata = parsed.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise SafetensorsFormatError("__metadata__ must map strings to strings")
    if not parsed:
        raise SafetensorsFormatError("the file holds no tensors")
    manifest: Manifest = {}
    spans: list[TensorSpan] = []
    for name, entry in parsed.items():
        span, shape = _checked_entry(name, entry)
        spans.append(span)
        manifest[name] = {"dtype": span.dtype, "shape": shape}
    spans.sort(key=lambda span: (span.start, span.end, span.name))
    position = 0
    for span in spans:
        if span.start != position:
            raise SafetensorsFormatError(f"tensor {span.name!r}: data is not contiguous")
        position = span.end
    return Header(dict(sorted(manifest.items())), tuple(spans))


def _checked_entry(name: str, entry: Any) -> tuple[TensorSpan, list[int]]:
    """One tensor's header entry, checked: its span and its shape."""
    if not isinstance(entry, dict):
        raise SafetensorsFormatError(f"tensor {name!r}: header entry is not an object")
    dtype = entry.get("dtype")
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in NUMPY_DTYPES:
        raise SafetensorsFormatError(
            f"tensor {name!r}: dtype {dtype!r} is not supported "
            f"(use one of {', '.join(sorted(NUMPY_DTYPES))}; convert bfloat16 to float32)"
        )
    # Every number below 2**63 (the safetensors library reads them as 64-bit integers): JSON
    # integers may have thousands of digits, and their products cost time quadratic in them.
    if not (
        isinstance(shape, list) and all(type(d) is int and 0 <= d < _MAX_NUMBER for d in shape)
    ):
        raise SafetensorsFormatError(f"tensor {name!r}: shape {_brief(shape)} is invalid")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(type(o) is int for o in offsets)
        and 0 <= offsets[0] <= offsets[1] < _MAX_NUMBER
    ):
        raise SafetensorsFormatError(f"tensor {name!r}: data_offsets {_brief(offsets)} are invalid")
    span = offsets[1] - offsets[0]
    if _byte_count(shape, ITEM_SIZES[dtype], span) != span:
        raise SafetensorsFormatError(
            f"tensor {name!r}: {span} bytes for shape {_brief(shape)} {dtype}"
        )
    return TensorSpan(name, dtype, offsets[0], offsets[1]), list(shape)


_MAX_NUMBER = 2**63
"""Dimensions and offsets must be below it."""


def _byte_count(shape: list[int], item_size: int, span: int) -> int:
    """The bytes of a tensor of ``shape``, exact (numpy's int64 product wrapped: [2**32, 2**32]
    F32 counted 0 bytes), or ``span + 1`` as soon as the product passes ``span``: a header of
    many large dimensions costs a multiplication each of numbers below 2**126, not a product of
    them all."""
    if 0 in shape:
        return 0
    count = item_size
    for dim in shape:
        count *= dim
        if count > span:
            return span + 1
    return count


def _brief(value: object) -> str:
    """A shape or offsets for a message, at most 120 characters of it."""
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def read_manifest(path: Path) -> Manifest:
    """Parse and check the header of a safetensors file: ``{name: {"dtype", "shape"}}``
    (:func:`parse_header`, then the data section's size against the tensors')."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        length = header_length(handle.read(8))
        if 8 + length > size:
            raise SafetensorsFormatError("safetensors header length is out of range")
        header = parse_header(handle.read(length))
    header.check_data_size(size - 8 - length)
    return header.manifest


def manifest_differences(expected: Manifest, actual: Manifest) -> list[str]:
    """Human-readable differences between two manifests (empty when they match)."""
    problems: list[str] = []
    for name in sorted(set(expected) - set(actual)):
        problems.append(f"tensor {name!r} is missing")
    for name in sorted(set(actual) - set(expected)):
        problems.append(f"tensor {name!r} is not in the global model")
    for name in sorted(set(expected) & set(actual)):
        want, got = expected[name], actual[name]
        if want["dtype"] != got["dtype"]:
            problems.append(f"tensor {name!r}: dtype {got['dtype']}, expected {want['dtype']}")
        if list(want["shape"]) != list(got["shape"]):
            problems.append(f"tensor {name!r}: shape {got['shape']}, expected {want['shape']}")
    return problems


def non_finite_tensors(path: Path, manifest: Manifest) -> list[str]:
    """Names of float tensors holding NaN or infinity (read one tensor at a time)."""
    bad: list[str] = []
    with safe_open(str(path), framework="numpy") as handle:
        for name, entry in manifest.items():
            if entry["dtype"] in FLOAT_DTYPES and not np.isfinite(handle.get_tensor(name)).all():
                bad.append(name)
    return bad


class SafetensorsReader:
    """A model state read from a safetensors file in parts, with positioned reads.

    ``get`` returns a tensor as a fresh array; ``read_into`` copies a range of a tensor's
    entries into the caller's buffer (``os.preadv``), which is how a round close streams K
    updates through small buffers of its own (:class:`service.audit.block_source.FileStateReader`):
    nothing of the file is mapped, so the process's resident set does not grow with the number
    or the size of the updates (the pages stay in the kernel's page cache). The header is parsed
    when the reader is made; the file is opened at the first read and stays open until
    :meth:`close` (or until the reader is collected). The file is expected to have passed
    :func:`read_manifest` (the coordinator checks every stored update); a file that has since
    become shorter than its header says raises :class:`SafetensorsFormatError` from ``get`` and
    ``read_into``, and :class:`service.audit.InvalidInputError` naming the update and the tensor
    from a pass of the audit.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._layout: dict[str, tuple[np.dtype[Any], tuple[int, ...], int, int]] = {}
        with path.open("rb") as handle:
            (header_len,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(header_len))
        header.pop("__metadata__", None)
        for name, entry in header.items():
            start = 8 + header_len + int(entry["data_offsets"][0])
            dtype = _LITTLE_ENDIAN[entry["dtype"]]
            shape = tuple(int(d) for d in entry["shape"])
            # math.prod: np.prod costs microseconds a call, and a round close makes K x tensors
            self._layout[name] = (dtype, shape, start, math.prod(shape))
        self._keys: list[str] = sorted(self._layout)

    def keys(self) -> Sequence[str]:
        return self._keys

    def _entry(self, name: str) -> tuple[np.dtype[Any], tuple[int, ...], int, int]:
        try:
            return self._layout[name]
        except KeyError:
            raise KeyError(f"the state has no tensor {name!r}") from None

    def get(self, name: str) -> np.ndarray:
        dtype, shape, _, count = self._entry(name)
        out = np.empty(count, dtype=dtype)
        self.read_into(name, 0, out)
        return out.reshape(shape)

    def layout(self, name: str) -> tuple[np.dtype[Any], tuple[int, ...]]:
        """``name``'s dtype and shape, from the header."""
        dtype, shape, _, _ = self._entry(name)
        return dtype, shape

    def offset(self, name: str) -> int:
        """Where ``name``'s data starts in the file."""
        return self._entry(name)[2]

    def read_into(self, name: str, start: int, out: np.ndarray) -> None:
        """Copy entries ``[start, start + out.size)`` of the flattened ``name`` into ``out``
        (C-contiguous, of ``name``'s dtype)."""
        dtype, _, offset, count = self._entry(name)
        if out.dtype != dtype or not out.flags.c_contiguous:
            raise ValueError(f"tensor {name!r}: the buffer must be C-contiguous {dtype}")
        if start < 0 or start + out.size > count:
            raise ValueError(f"tensor {name!r}: entries [{start}, {start + out.size}) of {count}")
        try:
            self.read_at(offset + start * dtype.itemsize, out)
        except EOFError:
            raise SafetensorsFormatError(
                f"{self.path.name}: the file ends inside tensor {name!r}"
            ) from None

    def read_at(self, position: int, out: np.ndarray) -> None:
        """Fill ``out`` (C-contiguous) from byte ``position`` of the file: one ``os.preadv``,
        repeated after a short read; ``EOFError`` when the file ends first. The file is opened
        at the first read, once even when threads ask at the same time, and stays open until
        :meth:`close`."""
        if self._fd is None:
            with self._lock:
                if self._fd is None:
                    self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        view = out.data.cast("B")
        done = os.preadv(self._fd, [view], position)
        while done < len(view):
            got = os.preadv(self._fd, [view[done:]], position + done)
            if got == 0:
                raise EOFError(f"{self.path.name} ends at byte {position + done}")
            done += got

    def close(self) -> None:
        """Close the file (a later read opens it again)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()


def write_state(tensors: Mapping[str, np.ndarray], directory: Path) -> tuple[Path, str, int]:
    """Write a state as an fsynced temporary safetensors file; return (path, sha256, size)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"state-{os.getpid()}-{os.urandom(6).hex()}.safetensors.part"
    # np.require keeps 0-d tensors 0-d (np.ascontiguousarray would make them 1-d).
    save_file(
        {name: np.require(value, requirements="C") for name, value in tensors.items()}, str(path)
    )
    with path.open("rb+") as handle:
        os.fsync(handle.fileno())
    return path, sha256_file(path), path.stat().st_size
