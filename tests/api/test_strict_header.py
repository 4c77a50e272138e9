"""A state's safetensors header is read only as the safetensors library reads it: what Python's
json alone would accept (a non-string ``__metadata__`` value, a repeated key, NaN literals, a
byte-order mark) is refused, by the route with 422 and nothing stored."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save

import tests.factories as factories
from service.coordinator.tensors import SafetensorsFormatError, read_manifest
from tests.api.conftest import make_federation
from tests.factories import tiny_state, update_parts

pytestmark = [pytest.mark.anyio, pytest.mark.db]


def _with_header(data: bytes, raw: bytes) -> bytes:
    (length,) = struct.unpack("<Q", data[:8])
    return struct.pack("<Q", len(raw)) + raw + data[8 + length :]


def _metadata_not_strings(state: dict[str, np.ndarray]) -> bytes:
    data = save(state)
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    header["__metadata__"] = {"k": 1}
    return _with_header(data, json.dumps(header).encode())


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (
            b'{"__metadata__":{"k":1},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
            "strings",
        ),
        (
            b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
            b'"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
            "twice",
        ),
        (b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"x":NaN}', "not JSON"),
        (b'\xef\xbb\xbf{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', "BOM"),
    ],
)
def test_read_manifest_refuses_what_the_library_refuses(
    tmp_path: Path, raw: bytes, needle: str
) -> None:
    path = tmp_path / "state.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\x00" * 4)
    with pytest.raises(SafetensorsFormatError, match=needle):
        read_manifest(path)


async def test_an_update_with_such_a_header_is_refused(api, monkeypatch) -> None:
    fed = await make_federation(api)
    monkeypatch.setattr(factories, "save", _metadata_not_strings)
    response = await api.post(
        f"/api/v1/federations/{fed.id}/rounds/0/updates",
        files=update_parts(tiny_state(1.0), num_samples=10),
        headers={**fed.headers("a"), "Idempotency-Key": "odd-header"},
    )
    assert response.status_code == 422, response.text
    assert "strings" in response.json()["detail"]
