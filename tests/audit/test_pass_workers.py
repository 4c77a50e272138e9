"""The threads of a blocked pass (``service.audit.pass_workers``): results in order, errors
where a serial loop raises them, and a pass whose every result is the same, to the bit,
whatever the number of threads."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from service.audit import blocks, pass_workers
from service.audit.blocks import stream_pass
from service.audit.pass_workers import in_order
from tests.audit.test_blocks import open_states, random_states, readers, save_states


def test_results_come_in_the_items_order_from_several_threads() -> None:
    seen: set[str] = set()

    def work(i: int) -> int:
        seen.add(threading.current_thread().name)
        time.sleep(0.02 if i % 2 == 0 else 0.0)  # later items finish first
        return i * i

    assert list(in_order(work, list(range(8)), workers=3)) == [i * i for i in range(8)]
    assert len(seen) > 1  # really spread over threads
    assert list(in_order(work, list(range(5)), workers=1)) == [0, 1, 4, 9, 16]
    assert list(in_order(work, [], workers=2)) == []


def test_an_error_is_raised_after_the_results_before_it() -> None:
    def work(i: int) -> int:
        if i in (2, 4):
            raise ValueError(f"item {i}")
        return i

    def collect(workers: int, got: list[int]) -> None:
        for value in in_order(work, list(range(6)), workers=workers):
            got.append(value)

    for workers in (1, 2):
        got: list[int] = []
        with pytest.raises(ValueError, match="item 2"):
            collect(workers, got)
        assert got == [0, 1]  # as a serial loop: item 4's error is never the one raised


def _pass_results(tmp_path: Path, workers: int, monkeypatch: pytest.MonkeyPatch) -> list:
    monkeypatch.setattr(pass_workers, "PASS_WORKERS", workers)
    g, ups = open_states(tmp_path, 6)
    weights = np.array([0.1, 0.2, 0.3, 0.1, 0.2, 0.1])
    results = [
        stream_pass(g, ups, weights=weights, chosen=2),
        stream_pass(g, ups, distances=True, consensus=np.arange(1.0, 7.0)),
        stream_pass(g, ups, pairs=([0, 3], [1, 2, 4, 5]), weights=weights),
        stream_pass(g, ups, gram=True, distances=True),
    ]
    return results


def test_a_pass_is_the_same_to_the_bit_on_one_thread_or_several(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, updates = random_states(6, 11)
    save_states(tmp_path, base, updates)
    # blocks smaller than the tensors: several blocks per tensor, spans of small tensors
    monkeypatch.setattr(blocks, "AXPY_BLOCK", 16)
    monkeypatch.setattr(blocks, "STACK_BYTES", 16 * 4 * 6)
    serial = _pass_results(tmp_path, 1, monkeypatch)
    threaded = _pass_results(tmp_path, 3, monkeypatch)
    for one, many in zip(serial, threaded, strict=True):
        assert one.float_names == many.float_names
        if one.state is not None:
            assert list(one.state) == list(many.state)
            for name in one.state:
                np.testing.assert_array_equal(one.state[name], many.state[name])
        for field in ("squared", "pair_squared", "gram", "consensus_dots"):
            a, b = getattr(one, field), getattr(many, field)
            assert (a is None) == (b is None), field
            if a is not None:
                np.testing.assert_array_equal(a, b, err_msg=field)
        assert one.consensus_norm2 == many.consensus_norm2
    # and in memory (readers without positioned reads)
    monkeypatch.setattr(pass_workers, "PASS_WORKERS", 1)
    alone = stream_pass(readers(base)[0], readers(*updates), distances=True)
    monkeypatch.setattr(pass_workers, "PASS_WORKERS", 3)
    spread = stream_pass(readers(base)[0], readers(*updates), distances=True)
    np.testing.assert_array_equal(alone.squared, spread.squared)


def test_the_first_bad_tensor_in_file_order_is_named_with_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, updates = random_states(4, 3)
    names = [n for n, v in base.items() if v.dtype.kind == "f"]
    updates[2] = dict(updates[2])
    for name in names:  # every float tensor of update 2 is bad
        bad = updates[2][name].copy()
        bad.reshape(-1)[0] = np.nan
        updates[2][name] = bad
    save_states(tmp_path, base, updates)
    messages = []
    for workers in (1, 3):
        monkeypatch.setattr(pass_workers, "PASS_WORKERS", workers)
        g, ups = open_states(tmp_path, 4)
        with pytest.raises(Exception, match=r"updates\[2\]") as raised:
            stream_pass(g, ups, distances=True)
        messages.append(str(raised.value))
    assert messages[0] == messages[1]


def test_a_window_of_items_is_in_flight_not_the_whole_pass() -> None:
    """Results are held only for the items in flight (2 x workers ahead of the one yielded), so
    a pass over many tensors does not keep every tensor's results until its end."""
    started: list[int] = []

    def work(i: int) -> int:
        started.append(i)
        return i

    results = in_order(work, list(range(100)), workers=2)
    assert next(results) == 0
    time.sleep(0.05)  # let the threads run ahead as far as they may
    assert len(started) <= 2 * 2 + 1
    assert list(results) == list(range(1, 100))
