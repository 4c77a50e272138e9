"""LocalStateStore: persistence across a restart, atomic safetensors + JSON files, no pickle."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from client_sdk.local_state import (
    LocalStateCorruptError,
    LocalStateError,
    LocalStateKeyError,
    LocalStateStore,
)


def test_state_survives_a_new_store_on_the_same_directory(tmp_path: Path) -> None:
    # Prepare
    store = LocalStateStore(tmp_path / "client-7")
    s = torch.tensor([[0.25, 0.75], [0.5, 0.5]])
    store.put_tensor("flr/s", s)
    store.put_tensor("flr/seen", torch.tensor([True, False]))
    store.put_tensors("fedrn/prev_model/", {"0.weight": torch.ones(2, 3), "0.bias": torch.zeros(2)})
    store.put_json("fedncl/correction", {"active": True, "round_index": 61, "first": None})
    # Execute
    store.flush()
    reopened = LocalStateStore(tmp_path / "client-7")
    # Assert
    got = reopened.get_tensor("flr/s")
    assert got is not None
    assert torch.equal(got, s)
    seen = reopened.get_tensor("flr/seen")
    assert seen is not None
    assert seen.dtype == torch.bool
    assert seen.tolist() == [True, False]
    prev = reopened.get_tensors("fedrn/prev_model/")
    assert sorted(prev) == ["0.bias", "0.weight"]
    assert torch.equal(prev["0.weight"], torch.ones(2, 3))
    assert reopened.get_json("fedncl/correction") == {
        "active": True,
        "round_index": 61,
        "first": None,
    }
    assert not reopened.dirty


def test_nothing_reaches_disk_before_flush(tmp_path: Path) -> None:
    store = LocalStateStore(tmp_path / "d")
    store.put_tensor("a", torch.zeros(1))
    assert store.dirty
    assert not (tmp_path / "d").exists()
    assert LocalStateStore(tmp_path / "d").get_tensor("a") is None


def test_files_are_safetensors_and_json_without_pickle(tmp_path: Path) -> None:
    store = LocalStateStore(tmp_path)
    store.put_tensor("x", torch.ones(2))
    store.put_json("y", [1, 2])
    store.flush()
    names = sorted(p.name for p in tmp_path.iterdir())
    # no temporary file is left behind after the atomic renames
    assert names == ["state.json", "state.safetensors"]
    raw = (tmp_path / "state.safetensors").read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + header_len])
    assert header["x"]["dtype"] == "F32"
    assert header["x"]["shape"] == [2]
    assert b"\x80\x04" not in raw[:2]  # not a pickle stream
    document = json.loads((tmp_path / "state.json").read_text())
    assert document["values"] == {"y": [1, 2]}


def test_returned_and_stored_tensors_are_copies() -> None:
    store = LocalStateStore(None)
    original = torch.zeros(3)
    store.put_tensor("k", original)
    original += 1  # the caller mutates its tensor after storing it
    got = store.get_tensor("k")
    assert got is not None
    assert got.tolist() == [0.0, 0.0, 0.0]
    got += 5  # the caller mutates what it read
    again = store.get_tensor("k")
    assert again is not None
    assert again.tolist() == [0.0, 0.0, 0.0]


def test_in_memory_store_flush_is_a_no_op() -> None:
    store = LocalStateStore(None)
    store.put_json("k", 1)
    store.flush()
    assert store.directory is None
    assert store.get_json("k") == 1


def test_put_tensors_replaces_the_whole_prefix() -> None:
    store = LocalStateStore(None)
    store.put_tensors("p/", {"a": torch.zeros(1), "b": torch.zeros(1)})
    store.put_tensors("p/", {"c": torch.ones(1)})
    assert sorted(store.get_tensors("p/")) == ["c"]


def test_delete_and_delete_prefix(tmp_path: Path) -> None:
    store = LocalStateStore(tmp_path)
    store.put_tensor("a/1", torch.zeros(1))
    store.put_tensor("a/2", torch.zeros(1))
    store.put_json("b", True)
    store.flush()
    store.delete_prefix("a/")
    store.delete("b")
    store.delete("missing")  # not an error
    store.flush()
    assert list(LocalStateStore(tmp_path).keys()) == []


def test_overwrite_keeps_the_latest_value(tmp_path: Path) -> None:
    store = LocalStateStore(tmp_path)
    store.put_json("r", 1)
    store.flush()
    store.put_json("r", 2)
    store.flush()
    assert LocalStateStore(tmp_path).get_json("r") == 2


@pytest.mark.parametrize("key", ["", "has space", "a" * 201, "ünï", "x\n"])
def test_bad_keys_are_rejected(key: str) -> None:
    store = LocalStateStore(None)
    with pytest.raises(LocalStateKeyError, match="key"):
        store.put_json(key, 1)


def test_non_json_values_are_rejected() -> None:
    store = LocalStateStore(None)
    with pytest.raises(LocalStateError, match="value"):
        store.put_json("k", float("nan"))
    with pytest.raises(LocalStateError, match="value"):
        store.put_json("k", {1, 2})
    with pytest.raises(LocalStateError, match="tensor"):
        store.put_tensor("k", [1.0])  # type: ignore[arg-type]


def test_corrupt_files_raise_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "state.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(LocalStateCorruptError, match="state.safetensors"):
        LocalStateStore(tmp_path)
    os.remove(tmp_path / "state.safetensors")
    (tmp_path / "state.json").write_text('{"values": {}}')
    with pytest.raises(LocalStateCorruptError, match="state.json"):
        LocalStateStore(tmp_path)
