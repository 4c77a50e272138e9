"""The streaming check for NaN and infinity (``FiniteScan``) against the check that reads the
stored file (``tensors.non_finite_tensors``): literal cases, then random states, dtypes, bad
values and batch cuts (a fixed seed), then the bytes it must give up on: every header the
stored file's check refuses, since both read it with the same ``parse_header``."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save

from service.coordinator.finite_scan import FiniteScan
from service.coordinator.tensors import (
    SafetensorsFormatError,
    non_finite_tensors,
    parse_header,
    read_manifest,
)


def _scanned(data: bytes, cuts: list[int]) -> list[str] | None:
    scan = FiniteScan()
    edges = [0, *sorted(cuts), len(data)]
    for low, high in zip(edges, edges[1:], strict=False):
        scan.feed(data[low:high])
    return scan.result()


def _raw(header: bytes, data_bytes: int) -> bytes:
    """A safetensors-shaped file: the header's length, the header, zeros."""
    return struct.pack("<Q", len(header)) + header + b"\x00" * data_bytes


def test_literal_states() -> None:
    state: dict[str, np.ndarray] = {
        "a.weight": np.array([[1.0, np.nan], [2.0, 3.0]], dtype=np.float32),
        "b.bias": np.array([0.5, -np.inf], dtype=np.float16),
        "c.steps": np.array([7], dtype=np.int64),
        "d.scale": np.array([1e300, -1e300], dtype=np.float64),
        "e.empty": np.zeros((0, 3), dtype=np.float32),
    }
    data = save(state)
    for cuts in ([], [1], [8], [9, 10, 11], list(range(1, len(data)))):
        assert _scanned(data, cuts) == ["a.weight", "b.bias"]
    clean = save({"w": np.ones((3, 5), dtype=np.float32), "n": np.arange(4, dtype=np.int32)})
    assert _scanned(clean, [13]) == []


def test_random_states_agree_with_the_second_read(tmp_path: Path) -> None:
    rng = np.random.default_rng(20261127)
    kinds = [np.float32, np.float16, np.float64, np.int32, np.uint8]
    for case in range(60):
        state = {}
        for index in range(int(rng.integers(1, 7))):
            kind = kinds[int(rng.integers(len(kinds)))]
            shape = tuple(int(d) for d in rng.integers(0, 9, size=int(rng.integers(1, 3))))
            values = rng.normal(size=shape).astype(kind)
            if values.size and np.issubdtype(kind, np.floating) and rng.random() < 0.4:
                values.flat[int(rng.integers(values.size))] = rng.choice([np.nan, np.inf, -np.inf])
            state[f"t{index}.{case}"] = values
        data = save(state)
        path = tmp_path / f"{case}.safetensors"
        path.write_bytes(data)
        expected = non_finite_tensors(path, read_manifest(path))
        cuts = [int(c) for c in rng.integers(1, len(data), size=int(rng.integers(0, 6)))]
        assert _scanned(data, cuts) == expected, (case, cuts)


@pytest.mark.parametrize(
    "data",
    [
        b"",  # nothing
        b"\x05\x00\x00",  # a cut length
        struct.pack("<Q", 200 * 1024 * 1024) + b"{}",  # a header beyond the limit
        struct.pack("<Q", 4) + b"nope",  # not JSON
        struct.pack("<Q", 2) + b"[]",  # not an object
        # not contiguous: the second tensor starts past the first's end
        _raw(
            b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
            b'"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}',
            12,
        ),
        # a float tensor of 6 bytes: not a whole number of F32 elements
        _raw(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,6]}}', 6),
        # a dimension past int64 (2**70)
        _raw(b'{"a":{"dtype":"F32","shape":[1180591620717411303424],"data_offsets":[0,4]}}', 4),
    ],
)
def test_it_gives_up_where_it_cannot_follow(data: bytes) -> None:
    assert _scanned(data, []) is None
    assert _scanned(data, [max(1, len(data) // 2)]) is None


def test_the_same_bytes_well_formed_are_answered() -> None:
    """The give-up cases above differ from these only where they say."""
    contiguous = _raw(
        b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
        b'"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}',
        12,
    )
    assert _scanned(contiguous, []) == []
    assert _scanned(_raw(b'{"a":{"dtype":"F16","shape":[3],"data_offsets":[0,6]}}', 6), []) == []


def test_a_file_cut_short_is_not_answered() -> None:
    data = save({"w": np.ones(100, dtype=np.float32)})
    assert _scanned(data[:-4], [50]) is None
    assert _scanned(data + b"\x00" * 4, [50]) is None


def test_an_empty_piece_inside_a_tensor_changes_nothing() -> None:
    data = save({"w": np.array([1.0, 2.0, 3.0, np.nan], dtype=np.float32)})
    middle = len(data) - 8  # inside w's data
    scan = FiniteScan()
    scan.feed(data[:middle])
    scan.feed(b"")
    scan.feed(memoryview(data)[middle:middle])
    scan.feed(data[middle:])
    assert scan.result() == ["w"]


_A = b'"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'


@pytest.mark.parametrize(
    ("header", "data_bytes", "message"),
    [
        # a gap: b starts 4 bytes past a's end
        (b"{" + _A + b',"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}', 12, "'b'.*not"),
        # an overlap: b starts inside a
        (b"{" + _A + b',"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}}', 6, "'b'.*not"),
        (b'{"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}}', 2, "not supported"),
        (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', 4, "4 bytes for shape"),
        # 2**32 x 2**32 elements: 0 bytes in int64 arithmetic, which wrapped and accepted it
        (
            b'{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}',
            0,
            "0 bytes for shape",
        ),
        # a dimension past int64 (2**70): refused, not an OverflowError
        (
            b'{"a":{"dtype":"F32","shape":[1180591620717411303424],"data_offsets":[0,4]}}',
            4,
            "shape .* is invalid",
        ),
        # 300 dimensions of 4,000 digits (a product quadratic in them took minutes): refused
        (
            b'{"a":{"dtype":"F32","shape":[' + b",".join([b"9" * 4000] * 300) + b"],"
            b'"data_offsets":[0,4]}}',
            4,
            "shape .* is invalid",
        ),
        # 3,000 dimensions just below 2**63: the byte count stops as soon as it passes the span
        (
            b'{"a":{"dtype":"F32","shape":[' + b",".join([b"4611686018427387904"] * 3000) + b"],"
            b'"data_offsets":[0,4]}}',
            4,
            "4 bytes for shape",
        ),
        # offsets past 2**63
        (
            b'{"a":{"dtype":"U8","shape":[0],"data_offsets":[9223372036854775808,'
            b"9223372036854775808]}}",
            0,
            "data_offsets",
        ),
        (b'{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', 4, "shape"),
        (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}}', 4, "data_offsets"),
        (b'{"a":[]}', 4, "not an object"),
        (b'{"__metadata__":{"k":"v"}}', 0, "no tensors"),
        (b'{"__metadata__":{"k":1},' + _A + b"}", 4, "strings"),
        (b"{" + _A + b"," + _A + b"}", 4, "twice"),
        (b"{" + _A + b',"x":NaN}', 4, "not JSON"),
        (b"\xef\xbb\xbf{" + _A + b"}", 4, "not valid JSON"),
        (b"[]", 0, "not a JSON object"),
    ],
)
def test_a_header_refused_is_refused_by_both_paths(
    tmp_path: Path, header: bytes, data_bytes: int, message: str
) -> None:
    """One parser, one message: the stored file's check and the streaming scan refuse the same
    headers (the scan by giving up, which leaves the answer to the stored file's check)."""
    with pytest.raises(SafetensorsFormatError, match=message) as parsed:
        parse_header(header)
    path = tmp_path / "state.safetensors"
    path.write_bytes(_raw(header, data_bytes))
    with pytest.raises(SafetensorsFormatError) as read:
        read_manifest(path)
    assert str(read.value) == str(parsed.value)
    assert _scanned(_raw(header, data_bytes), []) is None


def test_parse_header_gives_the_spans_in_data_order() -> None:
    header = parse_header(
        b'{"__metadata__":{"k":"v"},"z":{"dtype":"F16","shape":[3],"data_offsets":[0,6]},'
        b'"e":{"dtype":"I64","shape":[0,2],"data_offsets":[6,6]},'
        b'"a":{"dtype":"U8","shape":[],"data_offsets":[6,7]}}'
    )
    assert header.manifest == {
        "a": {"dtype": "U8", "shape": []},
        "e": {"dtype": "I64", "shape": [0, 2]},
        "z": {"dtype": "F16", "shape": [3]},
    }
    assert [(s.name, s.dtype, s.start, s.end) for s in header.spans] == [
        ("z", "F16", 0, 6),
        ("e", "I64", 6, 6),
        ("a", "U8", 6, 7),
    ]
    assert header.data_size == 7
    header.check_data_size(7)
    for wrong in (6, 8):
        with pytest.raises(SafetensorsFormatError, match="size does not match"):
            header.check_data_size(wrong)


def test_a_data_section_of_another_size_is_refused_by_both_paths(tmp_path: Path) -> None:
    header = b"{" + _A + b"}"
    path = tmp_path / "state.safetensors"
    for data_bytes in (3, 5):
        path.write_bytes(_raw(header, data_bytes))
        with pytest.raises(SafetensorsFormatError, match="size does not match"):
            read_manifest(path)
        assert _scanned(_raw(header, data_bytes), [9]) is None
    path.write_bytes(_raw(header, 4))
    assert read_manifest(path) == {"a": {"dtype": "F32", "shape": [1]}}
    assert _scanned(_raw(header, 4), [9]) == []
