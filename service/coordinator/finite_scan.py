"""Which float tensors of an uploaded state hold NaN or infinity, found while it streams in.

An update's state is refused when a float tensor holds a non-finite value
(:func:`service.coordinator.tensors.non_finite_tensors`, which reads the stored file again, one
tensor at a time). :class:`FiniteScan` looks at the same bytes as they are written to disk, in
order (the upload's writer feeds it each batch), so the file need not be read a second time.
It parses the safetensors header itself and gives up, leaving the answer to the second read,
wherever the bytes are not a header it can follow (malformed, oversized, tensors not
contiguous, a tensor size that is not a whole number of elements); the upload's own checks then
refuse such a file with their usual message. It answers only for a file it followed to its last
byte; the caller checks the header it parsed is the file's (:func:`read_manifest` on the stored
file) before trusting the answer, which the header being part of the same bytes guarantees.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import numpy as np

from service.coordinator.tensors import MAX_HEADER_BYTES

_FLOATS: dict[str, np.dtype[np.floating]] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
}


@dataclass(frozen=True)
class _Span:
    """A float tensor's bytes in the file: [start, end) from the file's first byte."""

    start: int
    end: int
    dtype: np.dtype[np.floating]
    name: str


class FiniteScan:
    """Feed it a safetensors file's bytes in order (:meth:`feed`); :meth:`result` is then the
    sorted names of the float tensors holding NaN or infinity, or None where the scan gave up
    or did not see the whole file (module docstring)."""

    def __init__(self) -> None:
        self._head = bytearray()
        self._spans: list[_Span] | None = None
        self._next = 0  # the first span not finished
        self._carry = b""  # the start of an element cut by a batch's end
        self._position = 0  # bytes seen
        self._end = 0  # the file's size by its header
        self._bad: set[str] = set()
        self._failed = False

    def feed(self, data: bytes | memoryview) -> None:
        """The next bytes of the file."""
        if self._failed:
            return
        if self._spans is None:
            self._head += data
            if not self._parse_header():
                return
            data, self._head = bytes(self._head[self._position :]), bytearray()
        self._scan(memoryview(data))

    def result(self) -> list[str] | None:
        """The float tensors with a non-finite value (sorted), None when unknown."""
        if self._failed or self._spans is None or self._position != self._end or self._carry:
            return None
        return sorted(self._bad)

    def _parse_header(self) -> bool:
        """Whether the header is complete and understood (sets the spans and the position)."""
        if len(self._head) < 8:
            return False
        (length,) = struct.unpack("<Q", self._head[:8])
        if length > MAX_HEADER_BYTES:
            self._failed = True
            return False
        if len(self._head) < 8 + length:
            return False
        try:
            header = json.loads(bytes(self._head[8 : 8 + length]))
            spans, size = _spans_of(header, 8 + length)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
            self._failed = True
            return False
        self._spans, self._position, self._end = spans, 8 + length, 8 + length + size
        return True

    def _scan(self, data: memoryview) -> None:
        assert self._spans is not None
        start = self._position
        self._position += len(data)
        while self._next < len(self._spans):
            span = self._spans[self._next]
            low, high = max(span.start, start), min(span.end, self._position)
            if low >= high:
                if span.end <= start:  # finished before these bytes (not reached: spans
                    self._next += 1  # are passed as they finish)
                    continue
                return  # starts after these bytes, or no bytes (an empty piece)
            self._check(span, data[low - start : high - start])
            if high < span.end:
                return  # the batch ends inside this tensor
            if self._carry:
                self._failed = True  # not a whole number of elements
                return
            self._next += 1

    def _check(self, span: _Span, cut: memoryview) -> None:
        """Look at the next bytes of ``span``'s tensor: first the element the previous bytes
        cut (its start in the carry), then the whole elements, keeping a cut one's start."""
        size = span.dtype.itemsize
        if self._carry:
            head = self._carry + bytes(cut[: size - len(self._carry)])
            cut = cut[size - len(self._carry) :]
            if len(head) < size:
                self._carry = head
                return
            self._carry = b""
            self._look(span, head)
        whole = len(cut) - len(cut) % size
        self._look(span, cut[:whole])
        self._carry = bytes(cut[whole:])

    def _look(self, span: _Span, data: bytes | memoryview) -> None:
        values = np.frombuffer(data, dtype=span.dtype)
        if not np.isfinite(values).all():
            self._bad.add(span.name)


def _spans_of(header: object, data_start: int) -> tuple[list[_Span], int]:
    """The float tensors' spans, sorted, and the size of the data part; raises ValueError where
    the tensors do not tile the data part."""
    if not isinstance(header, dict):
        raise ValueError("not an object")
    tiles: list[tuple[int, int, str, str]] = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        first, last = entry["data_offsets"]
        if not (isinstance(first, int) and isinstance(last, int) and 0 <= first <= last):
            raise ValueError("bad offsets")
        tiles.append((first, last, str(entry["dtype"]), str(name)))
    tiles.sort()
    position = 0
    for first, last, _, _ in tiles:
        if first != position:
            raise ValueError("not contiguous")
        position = last
    spans = [
        _Span(data_start + first, data_start + last, _FLOATS[dtype], name)
        for first, last, dtype, name in tiles
        if dtype in _FLOATS and last > first
    ]
    return spans, position
