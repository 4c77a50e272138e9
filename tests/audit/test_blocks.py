"""The blocked pass (service.audit.blocks) equals plain float64 computations.

Two kinds of checks: small literal inputs whose results are worked out by hand, and random states
(float32, float16 and float64 tensors, an int counter) compared with a float64 reference written
here the way the tensor-by-tensor code before the blocked pass computed it, at block sizes from
one entry to whole tensors. The tolerances are the ones the module docstring states: float32
blocks with float64 totals agree with float64 to about 1e-6 relative (weighted sums: a few
float32 roundings of the result).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from service.audit import (
    DictStateReader,
    InvalidInputError,
    InvalidParameterError,
    aggregate,
    aggregate_daagg,
    aggregate_fedavg,
    aggregate_fedncl_layerwise,
    blocks,
    fedncl_divergences,
    round_pass,
    sorted_blocks,
)
from service.audit.aggregators.fedavg import planned_fedavg_weights
from service.audit.block_source import FileStateReader, small_runs, span_sources
from service.coordinator.tensors import SafetensorsFormatError, SafetensorsReader

# --------------------------------------------------------------------------------------------
# Literal inputs
# --------------------------------------------------------------------------------------------

GLOBAL: dict[str, np.ndarray] = {
    "w": np.array([0.0, 0.0, 0.0], dtype=np.float32),
    "n": np.array(7, dtype=np.int64),
}
A: dict[str, np.ndarray] = {
    "w": np.array([1.0, 2.0, 2.0], dtype=np.float32),
    "n": np.array(1, dtype=np.int64),
}
B: dict[str, np.ndarray] = {
    "w": np.array([1.0, 2.0, 5.0], dtype=np.float32),
    "n": np.array(2, dtype=np.int64),
}
C: dict[str, np.ndarray] = {
    "w": np.array([4.0, 6.0, 2.0], dtype=np.float32),
    "n": np.array(3, dtype=np.int64),
}


def readers(*states: dict[str, np.ndarray]) -> list[DictStateReader]:
    return [DictStateReader(s) for s in states]


@pytest.mark.parametrize("block", [1, 2, 1 << 20])
def test_literal_fedavg_divergence_and_pairs(monkeypatch, block: int) -> None:
    monkeypatch.setattr(blocks, "AXPY_BLOCK", block)
    monkeypatch.setattr(blocks, "STACK_BYTES", block * 4 * 3)
    g = DictStateReader(GLOBAL)
    # weights 1/4, 1/4, 1/2: (0.25*1 + 0.25*1 + 0.5*4, ...) = (2.5, 4.0, 2.75)
    result = aggregate_fedavg(g, readers(A, B, C), [1, 1, 2], max_client_weight_factor=None)
    np.testing.assert_array_equal(result.state["w"], np.array([2.5, 4.0, 2.75], np.float32))
    assert int(result.state["n"]) == 3  # the int tensor of the largest weight (C)
    # ||A||^2 = 9, ||B||^2 = 30, ||C||^2 = 56
    assert fedncl_divergences(g, readers(A, B, C)).tolist() == [9.0, 30.0, 56.0]
    # noisy A against clean B, C: ||A - B||^2 = 9, ||A - C||^2 = 9 + 16 + 0 = 25
    both = blocks.stream_pass(g, readers(A, B, C), pairs=([0], [1, 2]), distances=True)
    assert both.pair_squared is not None
    assert both.pair_squared.tolist() == [[[9.0, 25.0]]]
    # DaAgg: d(A) = min(3, 5) = 3 = max d, D(A) = 1; w ∝ n * exp(-D)
    daagg = aggregate_daagg(g, readers(A, B, C), [1, 1, 1], [True, False, False])
    raw = np.array([math.exp(-1.0), 1.0, 1.0])
    np.testing.assert_allclose(daagg.weights, raw / raw.sum(), rtol=1e-12)
    assert daagg.details["distances"] == [3.0, 0.0, 0.0]


def test_literal_layerwise_weights() -> None:
    g = DictStateReader(GLOBAL)
    # one float tensor: d = 1 + ||theta_k||^2 = 10, 31, 57; clean (no penalty), equal n
    result = aggregate_fedncl_layerwise(
        g, readers(A, B, C), [1, 1, 1], [False, False, False], max_client_weight_factor=None
    )
    raw = np.array([1 / 10, 1 / 31, 1 / 57])
    np.testing.assert_allclose(result.layer_weights["w"], raw / raw.sum(), rtol=1e-12)
    expected = (raw / raw.sum()) @ np.stack([A["w"], B["w"], C["w"]]).astype(np.float64)
    np.testing.assert_allclose(result.state["w"], expected, rtol=1e-6)


def test_literal_median_and_trimmed_mean() -> None:
    g = DictStateReader(GLOBAL)
    states = readers(A, B, C, {"w": np.array([9.0, -1.0, 0.5], np.float32), "n": np.array(0)})
    # per coordinate, sorted: (1, 1, 4, 9) (-1, 2, 2, 6) (0.5, 2, 2, 5)
    median = aggregate("median", g, states, [1, 1, 1, 1]).state["w"]
    assert median.tolist() == [2.5, 2.0, 2.0]
    trimmed = aggregate(
        "trimmed_mean", g, states, [1, 1, 1, 1], params={"trim_fraction": 0.25}
    ).state["w"]
    assert trimmed.tolist() == [2.5, 2.0, 2.0]  # the mean of the middle two, K = 4


# --------------------------------------------------------------------------------------------
# Random states against the float64 reference
# --------------------------------------------------------------------------------------------

SHAPES = {
    "conv": ((6, 3, 3, 3), np.float32),
    "bias": ((6,), np.float32),
    "half": ((40,), np.float16),
    "double": ((5, 7), np.float64),
    "steps": ((), np.int64),
}


def random_states(k: int, seed: int) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
    rng = np.random.default_rng(seed)
    base = {
        name: (rng.normal(size=shape).astype(dtype) if dtype != np.int64 else np.array(5))
        for name, (shape, dtype) in SHAPES.items()
    }
    updates = []
    for i in range(k):
        spread = 0.3 if i < 2 else 0.05
        updates.append(
            {
                name: (
                    (value + rng.normal(scale=spread, size=value.shape)).astype(value.dtype)
                    if value.dtype.kind == "f"
                    else np.array(int(value) + i)
                )
                for name, value in base.items()
            }
        )
    return base, updates


def ref_weighted(updates, weights, chosen) -> dict[str, np.ndarray]:
    out = {}
    for name, value in updates[0].items():
        if value.dtype.kind != "f":
            out[name] = updates[chosen][name]
            continue
        acc = sum(w * u[name].astype(np.float64) for w, u in zip(weights, updates, strict=True))
        out[name] = np.asarray(acc).astype(value.dtype)
    return out


def ref_squared(base, updates) -> np.ndarray:
    """Per float tensor and client, ||theta_k - theta_G||^2 in float64 (tensors x clients)."""
    rows = []
    for name, value in base.items():
        if value.dtype.kind == "f":
            g = value.astype(np.float64).reshape(-1)
            rows.append(
                [float(np.sum((u[name].astype(np.float64).reshape(-1) - g) ** 2)) for u in updates]
            )
    return np.array(rows)


def save_states(directory: Path, base: dict[str, np.ndarray], updates: list) -> None:
    """The global state and the updates as the safetensors files a coordinator stores
    (``g.safetensors``, ``u0.safetensors``, ...)."""
    save_file(base, str(directory / "g.safetensors"))
    for i, update in enumerate(updates):
        save_file(update, str(directory / f"u{i}.safetensors"))


def open_states(directory: Path, k: int) -> tuple[SafetensorsReader, list[SafetensorsReader]]:
    """Readers of the files :func:`save_states` wrote."""
    g = SafetensorsReader(directory / "g.safetensors")
    return g, [SafetensorsReader(directory / f"u{i}.safetensors") for i in range(k)]


def assert_states_close(actual, expected, weights_rtol: float = 0.0) -> None:
    """Equal up to a few roundings of the dtype; ``weights_rtol`` adds the relative difference
    of weights computed from distances in another summation order."""
    for name, value in expected.items():
        got = actual[name]
        assert got.dtype == value.dtype, name
        assert got.shape == value.shape, name
        if value.dtype.kind != "f":
            np.testing.assert_array_equal(got, value)
            continue
        # float32 blocks: a few roundings of values of size ~1 (float16: its own eps 1e-3).
        eps = float(np.finfo(value.dtype).eps)
        tol = 8 * eps + 2 * weights_rtol
        np.testing.assert_allclose(got, value, rtol=tol, atol=tol, err_msg=name)


@pytest.fixture(params=[1, 5, 1 << 20], ids=["block1", "block5", "whole"])
def block(request, monkeypatch) -> int:
    size: int = request.param
    monkeypatch.setattr(blocks, "AXPY_BLOCK", size)
    monkeypatch.setattr(blocks, "STACK_BYTES", size * 4 * 7)
    monkeypatch.setattr(sorted_blocks, "SORT_BYTES", size * 4 * 7)
    monkeypatch.setattr(sorted_blocks, "NETWORK_WIDTH", size)
    monkeypatch.setattr(sorted_blocks, "MIN_PARALLEL", 8)
    return size


@pytest.mark.parametrize("seed", [0, 1])
def test_random_fedavg_and_reliability_equal_float64(block: int, seed: int) -> None:
    base, updates = random_states(7, seed)
    n = np.arange(1.0, 8.0)
    result = aggregate("fedavg", DictStateReader(base), readers(*updates), n)
    assert_states_close(
        result.state, ref_weighted(updates, result.weights, int(np.argmax(result.weights)))
    )
    p = np.linspace(0.0, 0.9, 7)
    rel = aggregate(
        "reliability_weighted", DictStateReader(base), readers(*updates), n, noisy_probability=p
    )
    assert_states_close(rel.state, ref_weighted(updates, rel.weights, int(np.argmax(rel.weights))))


@pytest.mark.parametrize("variant", ["paper", "reference"])
def test_random_divergences_equal_float64(block: int, variant: str) -> None:
    base, updates = random_states(7, 3)
    squared = ref_squared(base, updates)
    expected = squared.sum(axis=0) if variant == "paper" else (np.sqrt(squared) + 1.0).sum(axis=0)
    got = fedncl_divergences(DictStateReader(base), readers(*updates), variant)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


@pytest.mark.parametrize("variant", ["paper", "reference"])
def test_random_daagg_equals_float64(block: int, variant: str) -> None:
    base, updates = random_states(7, 4)
    noisy = np.array([True, True, False, False, False, True, False])
    n = np.arange(1.0, 8.0)
    result = aggregate_daagg(DictStateReader(base), readers(*updates), n, noisy, variant=variant)
    floats = [name for name, v in base.items() if v.dtype.kind == "f"]
    distances = np.zeros(7)
    for i in np.flatnonzero(noisy):
        per_clean = []
        for j in np.flatnonzero(~noisy):
            per_tensor = [
                float(np.sum((updates[i][f].astype(np.float64) - updates[j][f]) ** 2))
                for f in floats
            ]
            per_clean.append(
                math.sqrt(sum(per_tensor))
                if variant == "paper"
                else sum(map(math.sqrt, per_tensor))
            )
        distances[i] = min(per_clean)
    np.testing.assert_allclose(result.details["distances"], distances, rtol=1e-6)
    raw = n * np.exp(-distances / distances.max())
    np.testing.assert_allclose(result.weights, raw / raw.sum(), rtol=1e-6)
    assert_states_close(
        result.state, ref_weighted(updates, result.weights, int(np.argmax(result.weights)))
    )


def test_random_layerwise_equals_float64(block: int) -> None:
    base, updates = random_states(7, 5)
    noisy = np.array([True, False, False, False, False, False, True])
    n = np.arange(1.0, 8.0)
    result = aggregate_fedncl_layerwise(
        DictStateReader(base),
        readers(*updates),
        n,
        noisy,
        round_index=9,
        max_client_weight_factor=None,
    )
    penalty = np.where(noisy, min(max(50.0 * 10 / 60, 1.0), 50.0), 1.0)
    squared = ref_squared(base, updates)
    floats = [name for name, v in base.items() if v.dtype.kind == "f"]
    expected_state = {}
    for name, row in zip(floats, squared, strict=True):
        raw = n / penalty / (1.0 + row)
        weights = raw / raw.sum()
        np.testing.assert_allclose(result.layer_weights[name], weights, rtol=1e-6)
        expected_state[name] = ref_weighted([{name: u[name]} for u in updates], weights, 0)[name]
    expected_state["steps"] = updates[int(np.argmax(n / penalty))]["steps"]
    assert_states_close(result.state, expected_state)


@pytest.mark.parametrize("network", [True, False], ids=["network", "sort"])
@pytest.mark.parametrize("k", [6, 7])
def test_random_median_and_trimmed_mean_equal_float64(
    block: int, k: int, network: bool, monkeypatch
) -> None:
    # the comparator network (up to NETWORK_MAX_K clients) and the per-coordinate sort above it
    monkeypatch.setattr(sorted_blocks, "NETWORK_MAX_K", 128 if network else 2)
    base, updates = random_states(k, 6)
    n = np.ones(k)
    median = aggregate("median", DictStateReader(base), readers(*updates), n).state
    trimmed = aggregate(
        "trimmed_mean", DictStateReader(base), readers(*updates), n, params={"trim_fraction": 0.2}
    ).state
    trim = math.floor(0.2 * k)
    for name, value in base.items():
        stack = np.stack([u[name].astype(np.float64) for u in updates])
        if value.dtype.kind != "f":
            assert median[name] == updates[0][name]
            continue
        np.testing.assert_array_equal(median[name], np.median(stack, axis=0).astype(value.dtype))
        expected = np.sort(stack, axis=0)[trim : k - trim].mean(axis=0).astype(value.dtype)
        eps = float(np.finfo(value.dtype).eps)
        np.testing.assert_allclose(trimmed[name], expected, rtol=2 * eps, atol=2 * eps)


# --------------------------------------------------------------------------------------------
# Memory-mapped readers, validation
# --------------------------------------------------------------------------------------------


def test_file_readers_give_the_same_results_and_map_nothing(tmp_path: Path, monkeypatch) -> None:
    base, updates = random_states(5, 7)
    save_states(tmp_path, base, updates)
    # blocks smaller than the tensors, so that every tensor is read in several parts
    monkeypatch.setattr(blocks, "AXPY_BLOCK", 16)
    monkeypatch.setattr(blocks, "STACK_BYTES", 16 * 4 * 5)
    monkeypatch.setattr(sorted_blocks, "SORT_BYTES", 8 * 4 * 5)

    def from_files() -> tuple[SafetensorsReader, list[SafetensorsReader]]:
        return open_states(tmp_path, 5)

    g, ups = from_files()
    assert isinstance(ups[0], FileStateReader)
    for name in base:
        np.testing.assert_array_equal(ups[0].get(name), updates[0][name])
    noisy = [True, False, False, True, False]
    for rule in ("fedavg", "daagg", "fedncl_layerwise", "median", "trimmed_mean"):
        g, ups = from_files()
        from_disk = aggregate(rule, g, ups, [1, 2, 3, 4, 5], noisy=noisy)
        in_memory = aggregate(
            rule, DictStateReader(base), readers(*updates), [1, 2, 3, 4, 5], noisy=noisy
        )
        for name in base:
            np.testing.assert_array_equal(
                from_disk.state[name], in_memory.state[name], err_msg=rule
            )
        # nothing of the update files is mapped into the process (positioned reads only)
        maps = Path("/proc/self/maps")
        if maps.exists():
            assert str(tmp_path) not in maps.read_text(), rule


def test_file_reader_reads_ranges_and_refuses_bad_requests(tmp_path: Path) -> None:
    values = np.arange(10, dtype=np.float32)
    save_file({"a": np.array([7], dtype=np.int64), "w": values}, str(tmp_path / "s.safetensors"))
    reader = SafetensorsReader(tmp_path / "s.safetensors")
    out = np.empty(3, dtype=np.float32)
    reader.read_into("w", 4, out)
    assert out.tolist() == [4.0, 5.0, 6.0]
    assert reader.get("a").tolist() == [7]
    assert reader.layout("w") == (np.dtype(np.float32), (10,))
    with pytest.raises(ValueError, match=r"entries \[8, 11\) of 10"):
        reader.read_into("w", 8, out)
    with pytest.raises(ValueError, match="C-contiguous"):
        reader.read_into("w", 0, np.empty(3, dtype=np.float64))
    with pytest.raises(KeyError, match="no tensor 'x'"):
        reader.get("x")
    reader.close()
    # a file cut short after it was checked: a clear error, not garbage or a hang
    path = tmp_path / "s.safetensors"
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(SafetensorsFormatError, match="ends inside tensor 'w'"):
        reader.read_into("w", 7, out)


@pytest.mark.parametrize("rule", ["fedavg", "daagg", "median"])
def test_non_finite_update_is_named(rule: str) -> None:
    base, updates = random_states(4, 8)
    updates[2]["conv"] = updates[2]["conv"].copy()
    updates[2]["conv"][1, 0, 0, 0] = np.nan
    with pytest.raises(InvalidInputError, match=r"updates\[2\]: tensor 'conv' contains NaN"):
        aggregate(
            rule,
            DictStateReader(base),
            readers(*updates),
            [1, 1, 1, 1],
            noisy=[True, False, False, False],
        )


def test_non_finite_update_with_zero_weight_is_refused() -> None:
    base, updates = random_states(3, 9)
    updates[0]["bias"] = np.full(6, np.inf, dtype=np.float32)
    with pytest.raises(InvalidInputError, match=r"updates\[0\]: tensor 'bias' contains NaN"):
        aggregate(
            "reliability_weighted",
            DictStateReader(base),
            readers(*updates),
            [1, 1, 1],
            noisy_probability=[1.0, 0.0, 0.0],
        )


# --------------------------------------------------------------------------------------------
# The round's shared pass
# --------------------------------------------------------------------------------------------


class CountingReader(DictStateReader):
    """Counts how many times each tensor is handed out (one per pass over the state)."""

    def __init__(self, tensors: dict[str, np.ndarray]) -> None:
        super().__init__(tensors)
        self.reads = 0

    def get(self, name: str) -> np.ndarray:
        if name == "conv":
            self.reads += 1
        return super().get(name)


@pytest.mark.parametrize(("rule", "passes"), [("fedavg", 1), ("daagg", 2), ("fedncl_layerwise", 2)])
def test_shared_pass_serves_divergence_and_aggregation(rule: str, passes: int) -> None:
    base, updates = random_states(7, 10)
    n = np.arange(1.0, 8.0)
    noisy = [True, False, False, True, False, False, False]
    g = DictStateReader(base)
    plain = aggregate(rule, g, readers(*updates), n, noisy=noisy)
    plain_divergence = fedncl_divergences(g, readers(*updates))

    counted = [CountingReader(u) for u in updates]
    shared = round_pass.RoundPass(
        g,
        counted,
        gram=rule == "daagg",
        weights=planned_fedavg_weights(n, 4.0) if rule == "fedavg" else None,
        chosen=int(np.argmax(n)),
    )
    divergence = fedncl_divergences(g, counted, shared=shared)
    result = aggregate(rule, g, counted, n, noisy=noisy, shared=shared)
    assert shared.passes == passes
    assert all(c.reads == passes for c in counted)  # each update read once per pass
    np.testing.assert_allclose(divergence, plain_divergence, rtol=1e-6)
    np.testing.assert_allclose(result.weights, plain.weights, rtol=1e-6)
    if rule == "daagg":
        np.testing.assert_allclose(
            result.details["distances"], plain.details["distances"], rtol=1e-6
        )
    assert_states_close(result.state, plain.state, weights_rtol=1e-6)


def test_shared_pass_refuses_other_states() -> None:
    base, updates = random_states(3, 11)
    shared = round_pass.RoundPass(DictStateReader(base), readers(*updates))
    with pytest.raises(InvalidParameterError, match="shared"):
        aggregate("fedavg", DictStateReader(base), readers(*updates), [1, 1, 1], shared=shared)


def _write_in_order(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """A safetensors file whose data follow the dict's order (safetensors' own writer sorts)."""
    codes = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int64): "I64"}
    header, position, chunks = {}, 0, []
    for name, value in tensors.items():
        data = np.ascontiguousarray(value).tobytes()
        header[name] = {
            "dtype": codes[value.dtype],
            "shape": list(value.shape),
            "data_offsets": [position, position + len(data)],
        }
        position += len(data)
        chunks.append(data)
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(chunks))


def small_model(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "a.bias": rng.normal(size=3).astype(np.float32),
        "b.bias": rng.normal(size=5).astype(np.float32),
        "c.half": rng.normal(size=4).astype(np.float16),
        "d.bias": rng.normal(size=2).astype(np.float32),
        "e.weight": rng.normal(size=(6, 7)).astype(np.float32),
        "f.steps": np.array([3], dtype=np.int64),
        "g.bias": rng.normal(size=6).astype(np.float32),
    }


def test_small_tensors_read_as_one_span_give_the_same_state(tmp_path: Path, monkeypatch) -> None:
    # runs of small float tensors (under AXPY_BLOCK entries) are read as one span per client;
    # one client's file holds them in another order, so its runs cannot be spans there
    monkeypatch.setattr(blocks, "AXPY_BLOCK", 16)
    rng = np.random.default_rng(3)
    base = small_model(rng)
    clients = [{k: (v + 1 + i).astype(v.dtype) for k, v in base.items()} for i in range(3)]
    _write_in_order(tmp_path / "g.safetensors", base)
    for i, client in enumerate(clients):
        order = list(client) if i != 1 else list(reversed(client))
        _write_in_order(tmp_path / f"u{i}.safetensors", {k: client[k] for k in order})
    first = SafetensorsReader(tmp_path / "u0.safetensors")
    names = sorted(first.keys(), key=first.offset)
    # 3 + 5 entries, then the float16 tensor alone (another dtype), then 2, the large one
    # (42 entries) alone, the int64 alone, then 6
    assert small_runs(first, names, 16) == [
        ["a.bias", "b.bias"],
        ["c.half"],
        ["d.bias"],
        ["e.weight"],
        ["f.steps"],
        ["g.bias"],
    ]
    ups = [SafetensorsReader(tmp_path / f"u{i}.safetensors") for i in range(3)]
    assert span_sources(ups, ["a.bias", "b.bias"]) is None  # client 1: another order
    assert span_sources([ups[0], ups[2]], ["a.bias", "b.bias"]) is not None
    weights = [1.0, 2.0, 5.0]
    for subset in ([0, 2], [0, 1, 2]):
        from_disk = aggregate(
            "fedavg",
            SafetensorsReader(tmp_path / "g.safetensors"),
            [ups[i] for i in subset],
            [weights[i] for i in subset],
        )
        in_memory = aggregate(
            "fedavg",
            DictStateReader(base),
            readers(*[clients[i] for i in subset]),
            [weights[i] for i in subset],
        )
        for name in base:
            np.testing.assert_array_equal(from_disk.state[name], in_memory.state[name])
            assert from_disk.state[name].dtype == base[name].dtype


def test_a_non_finite_value_in_a_span_is_named(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(blocks, "AXPY_BLOCK", 16)
    rng = np.random.default_rng(4)
    base = small_model(rng)
    bad = {k: v.copy() for k, v in base.items()}
    bad["b.bias"][2] = np.inf
    _write_in_order(tmp_path / "g.safetensors", base)
    _write_in_order(tmp_path / "u0.safetensors", base)
    _write_in_order(tmp_path / "u1.safetensors", bad)
    with pytest.raises(InvalidInputError, match=r"updates\[1\]: tensor 'b.bias' contains NaN"):
        aggregate(
            "fedavg",
            SafetensorsReader(tmp_path / "g.safetensors"),
            [SafetensorsReader(tmp_path / f"u{i}.safetensors") for i in range(2)],
            [1.0, 1.0],
        )


@pytest.mark.parametrize("k", range(1, 13))
def test_the_ranking_network_sorts_every_zero_one_input(k: int) -> None:
    # the 0-1 principle (Knuth, TAOCP vol. 3, 5.3.4): a comparator network that sorts every
    # 0/1 input sorts every input; all 2^k inputs at once, one per column
    columns = ((np.arange(2**k)[None, :] >> np.arange(k)[:, None]) & 1).astype(np.float32)
    network = sorted_blocks.ranking_network(k, tuple(range(k)))
    rows = [columns[i].copy() for i in range(k)]
    sorted_blocks._ranked(rows, np.empty(2**k, dtype=np.float32), network)
    np.testing.assert_array_equal(np.stack(rows), np.sort(columns, axis=0))


@pytest.mark.parametrize("k", [2, 5, 20, 33, 64, 100])
def test_the_pruned_network_puts_the_wanted_ranks_in_place(k: int) -> None:
    rng = np.random.default_rng(k)
    # ties included: values from a small set
    values = rng.integers(0, 5, size=(k, 300)).astype(np.float32)
    expected = np.sort(values, axis=0)
    for wanted in (((k - 1) // 2, k // 2), tuple(range(k // 5, k - k // 5))):
        network = sorted_blocks.ranking_network(k, wanted)
        assert len(network) <= len(sorted_blocks.ranking_network(k, tuple(range(k))))
        rows = [values[i].copy() for i in range(k)]
        sorted_blocks._ranked(rows, np.empty(300, dtype=np.float32), network)
        for rank in wanted:
            np.testing.assert_array_equal(rows[rank], expected[rank])


@pytest.mark.parametrize("rule", ["fedavg", "daagg", "median", "trimmed_mean", "fedncl_layerwise"])
def test_an_empty_tensor_is_aggregated_as_empty(rule: str, tmp_path: Path) -> None:
    # a tensor with a 0 in its shape (the coordinator's header check accepts it)
    base = {"w": np.zeros((3, 0), dtype=np.float32), "b": np.ones(2, dtype=np.float32)}
    ups = [
        {"w": np.zeros((3, 0), dtype=np.float32), "b": np.full(2, i, np.float32)} for i in range(3)
    ]
    save_states(tmp_path, base, ups)
    for g, readers_ in ((DictStateReader(base), readers(*ups)), open_states(tmp_path, 3)):
        state = aggregate(rule, g, readers_, [1, 1, 1], noisy=[True, False, False]).state
        assert state["w"].shape == (3, 0)
        assert state["b"].shape == (2,)


@pytest.mark.parametrize("rule", ["fedavg", "daagg", "median"])
def test_an_update_cut_short_after_its_check_is_named(rule: str, tmp_path: Path) -> None:
    base, updates = random_states(3, 9)
    save_file(base, str(tmp_path / "g.safetensors"))
    for i, u in enumerate(updates):
        save_file(u, str(tmp_path / f"u{i}.safetensors"))
    ups = [SafetensorsReader(tmp_path / f"u{i}.safetensors") for i in range(3)]  # headers read
    cut = tmp_path / "u1.safetensors"
    cut.write_bytes(cut.read_bytes()[:-12])  # the last tensor's last entries are gone
    with pytest.raises(InvalidInputError, match=r"updates\[1\]: the file ends inside tensor '"):
        aggregate(
            rule,
            SafetensorsReader(tmp_path / "g.safetensors"),
            ups,
            [1, 1, 1],
            noisy=[True, False, False],
        )


def test_a_source_outlives_the_name_of_its_reader(tmp_path: Path) -> None:
    # the source keeps its reader: the reader's file stays open (a collected reader would close
    # it, and the next file opened could take its number)
    import gc

    from service.audit.block_source import file_readers, tensor_sources

    save_file({"w": np.full(4, 1.0, np.float32)}, str(tmp_path / "a.safetensors"))
    save_file({"w": np.full(4, 2.0, np.float32)}, str(tmp_path / "b.safetensors"))
    readers_ = [SafetensorsReader(tmp_path / "a.safetensors")]
    (source,) = tensor_sources(readers_, file_readers(readers_), "w")
    del readers_
    gc.collect()
    other = SafetensorsReader(tmp_path / "b.safetensors")
    assert other.get("w").tolist() == [2.0] * 4
    assert source.whole().tolist() == [1.0] * 4


@pytest.mark.parametrize(
    ("n", "chosen_noisy", "full_pass"),
    [
        (np.arange(1.0, 9.0), False, False),  # the largest weight a clean client's
        (np.array([20.0, 1, 2, 3, 4, 5, 6, 7]), True, False),  # a noisy client's (n 20)
        (np.array([1.0, 1, 1, 1, 1, 1, 1, 60]), False, True),  # the cap binds a clean client
    ],
)
def test_daagg_reads_only_the_noisy_clients_a_second_time(
    block: int, n: np.ndarray, chosen_noisy: bool, full_pass: bool
) -> None:
    """DaAgg's distances pass also sums the clean clients' states weighted by n; the weighted
    pass then reads the noisy clients only, unless the cap changed the clean clients' weights
    (then every client, as before). The state equals the float64 sum either way."""
    base, updates = random_states(8, 21)
    base.pop("half")  # a float16 model always takes the pass over every client
    updates = [{k: v for k, v in u.items() if k != "half"} for u in updates]
    noisy = np.array([True, True, False, False, False, True, False, False])
    counted = [CountingReader(u) for u in updates]
    result = aggregate_daagg(DictStateReader(base), counted, n, noisy)
    assert result.weight_cap is not None
    assert bool(result.weight_cap["capped"]) is full_pass
    chosen = int(np.argmax(result.weights))
    assert bool(noisy[chosen]) is chosen_noisy
    second = [c.reads - 1 for c in counted]
    assert second == [1] * 8 if full_pass else second == [int(f) for f in noisy]
    assert_states_close(result.state, ref_weighted(updates, result.weights, chosen))
    assert result.state["steps"] == updates[chosen]["steps"]


class _ChangedAfterFirstRead(DictStateReader):
    """Finite on the first read, NaN afterwards (a stored update that changed between passes)."""

    def __init__(self, tensors: dict[str, np.ndarray]) -> None:
        super().__init__(tensors)
        self.reads = 0

    def get(self, name: str) -> np.ndarray:
        self.reads += 1
        value = super().get(name)
        if self.reads > 1:
            value = value.copy()
            value.reshape(-1)[0] = np.nan
        return value


def test_daagg_names_the_noisy_client_whose_second_read_fails() -> None:
    """The pass over the noisy clients only finds client 3's NaN; the error names client 3 (the
    pass over every client, which it then makes), not its place among the noisy."""
    rng = np.random.default_rng(0)
    g = {"w": rng.normal(size=8).astype(np.float32)}
    ups = [
        {"w": (g["w"] + rng.normal(scale=0.3 if i == 3 else 0.01, size=8)).astype(np.float32)}
        for i in range(5)
    ]
    states: list[DictStateReader] = [DictStateReader(u) for u in ups]
    states[3] = _ChangedAfterFirstRead(ups[3])
    with pytest.raises(InvalidInputError, match=r"updates\[3\]: tensor 'w' contains NaN"):
        aggregate_daagg(DictStateReader(g), states, np.ones(5), [False, False, False, True, False])


def test_daagg_on_a_float16_model_with_large_sums_warns_of_nothing() -> None:
    """A float16 model takes the pass over every client and builds no clean sum (a sum of
    float16 values weighted by sample counts overflowed the type, with a warning, which the
    suite turns into an error)."""
    g: dict[str, np.ndarray] = {
        "w": np.full(4, 60.0, dtype=np.float16),
        "b": np.zeros(2, dtype=np.float32),
    }
    ups: list[dict[str, np.ndarray]] = [
        {"w": np.full(4, 60.0 + i, dtype=np.float16), "b": np.full(2, float(i), np.float32)}
        for i in range(5)
    ]
    n = np.full(5, 500.0)
    result = aggregate_daagg(
        DictStateReader(g), readers(*ups), n, [True, False, False, False, False]
    )
    assert result.rule == "daagg"
    assert_states_close(
        result.state, ref_weighted(ups, result.weights, int(np.argmax(result.weights)))
    )
