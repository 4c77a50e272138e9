"""Which float tensors of an uploaded state hold NaN or infinity, found while it streams in.

An update's state is refused when a float tensor holds a non-finite value
(:func:`service.coordinator.tensors.non_finite_tensors`, which reads the stored file again, one
tensor at a time). :class:`FiniteScan` looks at the same bytes as they are written to disk, in
order (the upload's writer feeds it each batch), so the file need not be read a second time.
It reads the safetensors header with the same parser as the stored file's check
(:func:`service.coordinator.tensors.parse_header`, which holds every rule of a header), and
gives up, leaving the answer to the second read, wherever that parser refuses the header; the
upload's own check (:func:`read_manifest`) then refuses such a file with the parser's message.
It answers only for a file it followed to its last byte, whose data section is the size its
header gives (:meth:`Header.check_data_size`, the stored file's check's own rule); the caller
checks the header it parsed is the file's (:func:`read_manifest` on the stored file) before
trusting the answer, which the header being part of the same bytes guarantees.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.coordinator.tensors import (
    Header,
    SafetensorsFormatError,
    header_length,
    parse_header,
)

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
        self._header: Header | None = None
        self._spans: list[_Span] | None = None  # the float tensors', in data order
        self._next = 0  # the first span not finished
        self._carry = b""  # the start of an element cut by a batch's end
        self._position = 0  # bytes seen
        self._data_start = 0  # the data section's first byte: 8 + the header's length
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
        if self._failed or self._header is None or self._carry:
            return None
        try:
            self._header.check_data_size(self._position - self._data_start)
        except SafetensorsFormatError:
            return None
        return sorted(self._bad)

    def _parse_header(self) -> bool:
        """Whether the header is complete and passed :func:`parse_header` (sets the spans and
        the position); a header it refuses ends the scan."""
        if len(self._head) < 8:
            return False
        try:
            length = header_length(bytes(self._head[:8]))
            if len(self._head) < 8 + length:
                return False
            header = parse_header(bytes(self._head[8 : 8 + length]))
        except SafetensorsFormatError:
            self._failed = True
            return False
        start = 8 + length
        self._header, self._position, self._data_start = header, start, start
        self._spans = [
            _Span(start + span.start, start + span.end, _FLOATS[span.dtype], span.name)
            for span in header.spans
            if span.dtype in _FLOATS and span.end > span.start
        ]
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
            if self._carry:  # not a whole number of elements (not reached: parse_header
                self._failed = True  # checks each tensor's bytes against its shape)
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
