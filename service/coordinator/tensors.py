"""Safetensors on the server: header parsing, validation, streaming reads, atomic writes.

The header is parsed by hand (8-byte little-endian length, then JSON) so that a malformed or
hostile file is rejected before any tensor is touched; values are then read one tensor at a time.
No pickle is involved anywhere: safetensors holds only names, dtypes, shapes and raw bytes.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Mapping, Sequence
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

Manifest = dict[str, dict[str, Any]]


class SafetensorsFormatError(ValueError):
    """The bytes are not a well-formed safetensors file we can use."""


def read_manifest(path: Path) -> Manifest:
    """Parse and check the header of a safetensors file: ``{name: {"dtype", "shape"}}``."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise SafetensorsFormatError("file is shorter than a safetensors header")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
            raise SafetensorsFormatError("safetensors header length is out of range")
        try:
            header = json.loads(handle.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SafetensorsFormatError(f"safetensors header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise SafetensorsFormatError("safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    if not header:
        raise SafetensorsFormatError("the file holds no tensors")
    manifest: Manifest = {}
    spans: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        if not isinstance(entry, dict):
            raise SafetensorsFormatError(f"tensor {name!r}: header entry is not an object")
        dtype = entry.get("dtype")
        shape = entry.get("shape")
        offsets = entry.get("data_offsets")
        if dtype not in NUMPY_DTYPES:
            raise SafetensorsFormatError(
                f"tensor {name!r}: dtype {dtype!r} is not supported "
                f"(use one of {', '.join(sorted(NUMPY_DTYPES))}; convert bfloat16 to float32)"
            )
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise SafetensorsFormatError(f"tensor {name!r}: shape {shape!r} is invalid")
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) for o in offsets)
            and 0 <= offsets[0] <= offsets[1]
        ):
            raise SafetensorsFormatError(f"tensor {name!r}: data_offsets {offsets!r} are invalid")
        expected = int(np.prod(shape, dtype=np.int64)) * ITEM_SIZES[dtype]
        if offsets[1] - offsets[0] != expected:
            raise SafetensorsFormatError(
                f"tensor {name!r}: {offsets[1] - offsets[0]} bytes for shape {shape} {dtype}"
            )
        spans.append((offsets[0], offsets[1], name))
        manifest[name] = {"dtype": dtype, "shape": list(shape)}
    spans.sort()
    position = 0
    for start, end, name in spans:
        if start != position:
            raise SafetensorsFormatError(f"tensor {name!r}: data is not contiguous")
        position = end
    if 8 + header_len + position != size:
        raise SafetensorsFormatError("the file size does not match the tensors in its header")
    return dict(sorted(manifest.items()))


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


def read_header_names(path: Path) -> list[str]:
    """The tensor names of a safetensors file, from its header alone."""
    with path.open("rb") as handle:
        (header_len,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(header_len))
    header.pop("__metadata__", None)
    return list(header)


RELEASE_BYTES = 1 << 19
FAULT_AROUND_BYTES = 1 << 21
"""How far before a released range a fault may have mapped pages back in: the kernel maps cached
pages around a fault (64 KiB), and whole large page-cache folios (ext4 here: up to 2 MiB; measured:
with 64 KiB about 3 MB of every 11 MB update stayed resident after a pass, with 2 MiB none)."""
"""A reader hands finished pages of a tensor back to the kernel once this many are pending."""


class SafetensorsReader:
    """A model state read lazily from a safetensors file, one tensor at a time.

    ``get`` returns a copy (safetensors' own reader). ``view`` returns a read-only zero-copy
    view of a memory map of the file, and ``release`` drops the mapped pages a streaming pass
    has finished with (``madvise(MADV_DONTNEED)``: the pages leave this process's resident set
    and stay in the page cache), so a round close over K updates does not keep K files
    resident (:class:`service.audit.blocks.MappedStateReader`).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        # safe_open maps the file and touches its first pages (about 512 KiB resident per
        # update): opened only when ``get`` is called, the names come from the header here.
        self._handle: Any = None
        self._keys: list[str] = sorted(read_header_names(path))
        self._map: mmap.mmap | None = None
        self._layout: dict[str, tuple[np.dtype[Any], tuple[int, ...], int, int]] = {}
        self._released: dict[str, int] = {}

    def keys(self) -> Sequence[str]:
        return self._keys

    def get(self, name: str) -> np.ndarray:
        if self._handle is None:
            self._handle = safe_open(str(self.path), framework="numpy")
        return np.asarray(self._handle.get_tensor(name))

    def _mapped(self) -> mmap.mmap:
        if self._map is None:
            with self.path.open("rb") as handle:
                (header_len,) = struct.unpack("<Q", handle.read(8))
                header = json.loads(handle.read(header_len))
                self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            header.pop("__metadata__", None)
            for name, entry in header.items():
                start = 8 + header_len + int(entry["data_offsets"][0])
                dtype = np.dtype(NUMPY_DTYPES[entry["dtype"]]).newbyteorder("<")
                shape = tuple(entry["shape"])
                count = int(np.prod(shape, dtype=np.int64))
                self._layout[name] = (dtype, shape, start, count)
        return self._map

    def view(self, name: str) -> np.ndarray:
        mapped = self._mapped()
        try:
            dtype, shape, start, count = self._layout[name]
        except KeyError:
            raise KeyError(f"the state has no tensor {name!r}") from None
        return np.frombuffer(mapped, dtype=dtype, count=count, offset=start).reshape(shape)

    def offset(self, name: str) -> int:
        """Where ``name``'s data starts in the file."""
        self._mapped()
        return self._layout[name][2]

    def release(self, name: str, start: int, stop: int) -> None:
        """Drop the pages of ``name``'s entries ``[.., stop)`` not released yet, once at least
        ``RELEASE_BYTES`` are pending or the tensor is finished.

        A block that starts before the released mark begins a new pass over the tensor. The
        range is rounded outwards to whole pages and reaches back ``FAULT_AROUND_BYTES`` (a
        fault maps cached pages around it back in, released ones included): a page still to be
        read is simply read again from the page cache (dropping a page of a read-only file
        mapping never loses data).
        """
        if self._map is None or name not in self._layout:
            return
        dtype, _, offset, size = self._layout[name]
        begin = offset + start * dtype.itemsize
        done = self._released.get(name)
        if done is None or done > begin:
            done = begin
        end = offset + stop * dtype.itemsize
        if end - done < RELEASE_BYTES and stop < size:
            self._released[name] = done
            return
        first = max(0, done - FAULT_AROUND_BYTES) // mmap.PAGESIZE * mmap.PAGESIZE
        last = min(-(-end // mmap.PAGESIZE) * mmap.PAGESIZE, len(self._map))
        if last > first:
            self._map.madvise(mmap.MADV_DONTNEED, first, last - first)
        self._released[name] = end


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
