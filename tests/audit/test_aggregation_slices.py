"""The blocked rules work block by block; the answer does not depend on the block size."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.audit import (
    DictStateReader,
    aggregate_daagg,
    aggregate_median,
    aggregate_trimmed_mean,
    blocks,
    sorted_blocks,
)


@pytest.fixture
def states() -> tuple[DictStateReader, list[DictStateReader], list[np.ndarray]]:
    rng = np.random.default_rng(5)
    values = [rng.normal(size=(23,)).astype(np.float32) for _ in range(5)]
    updates = [
        DictStateReader({"w": v, "steps": np.asarray(k, dtype=np.int64)})
        for k, v in enumerate(values)
    ]
    global_state = DictStateReader(
        {"w": np.zeros(23, dtype=np.float32), "steps": np.asarray(0, dtype=np.int64)}
    )
    return global_state, updates, values


@pytest.mark.parametrize("entries", [1, 7, 1 << 22])
def test_median_and_trimmed_mean_per_block_equal_numpy(states, monkeypatch, entries: int) -> None:
    global_state, updates, values = states
    # entries coordinates of the K = 5 clients per transposed block (float32: 4 bytes each)
    monkeypatch.setattr(sorted_blocks, "SORT_BYTES", entries * 4 * 5)
    monkeypatch.setattr(
        sorted_blocks, "MIN_PARALLEL", 8
    )  # the 23 coordinates split between threads
    stack = np.stack([v.astype(np.float64) for v in values])
    median = aggregate_median(global_state, updates)
    np.testing.assert_array_equal(median.state["w"], np.median(stack, axis=0).astype(np.float32))
    # trim_fraction 0.2 of K = 5 -> floor(1.0) = 1 value cut per side, mean of the middle 3
    trimmed = aggregate_trimmed_mean(global_state, updates, trim_fraction=0.2)
    expected = np.sort(stack, axis=0)[1:4].mean(axis=0).astype(np.float32)
    np.testing.assert_array_equal(trimmed.state["w"], expected)
    assert int(median.state["steps"]) == 0  # integer tensors copied, never averaged


@pytest.mark.parametrize("entries", [1, 3, 1 << 22])
def test_daagg_distances_per_block(states, monkeypatch, entries: int) -> None:
    global_state, updates, values = states
    monkeypatch.setattr(blocks, "STACK_BYTES", entries * 4 * 5)
    noisy = np.array([True, False, False, False, True])
    result = aggregate_daagg(global_state, updates, [1, 1, 1, 1, 1], noisy)
    # d(i) = min over clean j of ||v_i - v_j||, D = d / max d, w ∝ exp(-D) (equal n)
    d = [
        min(float(np.linalg.norm(values[i].astype(np.float64) - values[j])) for j in (1, 2, 3))
        for i in (0, 4)
    ]
    raw = np.array([math.exp(-d[0] / max(d)), 1, 1, 1, math.exp(-d[1] / max(d))])
    # float32 blocks, float64 totals: the distances (norms ~4.5, K = 5, 23 entries) agree with
    # the float64 ones to ~1e-6 relative, the weights exp(-D) to the same order.
    np.testing.assert_allclose(result.weights, raw / raw.sum(), rtol=1e-6)
    distances = result.details["distances"]
    np.testing.assert_allclose([distances[0], distances[4]], d, rtol=1e-6)
