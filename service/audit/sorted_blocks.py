"""Coordinate-wise median and trimmed mean by comparator networks over blocks, on two threads.

Blocks of coordinates are read from the K updates (in parts from the coordinator's files,
:mod:`service.audit.block_source`) into a K x b stack, and a comparator network (Batcher's
odd-even merge sort, pruned to the ranks the rule needs) runs across the block's columns, each
comparator two vectorised min/max operations (above ``NETWORK_MAX_K`` clients each coordinate's
values are sorted instead); a tensor of at least ``MIN_PARALLEL`` coordinates is split between
two threads (numpy releases the GIL in those operations). The median of an even K is the
float64 mean of the two middle values and the trimmed mean a float64 sum of the kept values, as
the float64 computation before these kernels.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np

from service.audit._typing import AnyArray
from service.audit._validation import InvalidInputError
from service.audit.block_source import TensorSource, file_readers, tensor_sources
from service.audit.blocks import _check_meta, _raise_non_finite
from service.audit.state import (
    StateReader,
    check_state_names,
    is_float_tensor,
    read_global_tensor,
    read_tensor,
)

__all__ = ["MIN_PARALLEL", "NETWORK_MAX_K", "SORT_BYTES", "coordinatewise", "ranking_network"]

SORT_BYTES = 2 << 20
"""Bytes of a transposed (coordinates x K) block of the median / trimmed mean, per thread."""

MIN_PARALLEL = 1 << 15
"""Tensors with fewer coordinates than this are sorted on one thread."""

NETWORK_MAX_K = 128
"""Up to this many clients a comparator network ranks the values (measured: 4x a sort at K = 20,
1.7x at K = 100, no gain at K = 200, where it needs about 8,000 comparators)."""

NETWORK_WIDTH = 1 << 14
"""Coordinates per block of the network at least (each comparator is a Python call: narrower
blocks pay more calls per coordinate; 16,384 was the fastest of 4,096, 16,384 and 65,536)."""


@lru_cache(maxsize=64)
def ranking_network(k: int, wanted: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """Comparators (a, b), a < b, that put the values of ranks ``wanted`` on wires ``wanted``:
    Batcher's odd-even merge sort for the next power of two (Knuth, TAOCP vol. 3, 5.3.4,
    Algorithm M), comparators that touch a wire >= k dropped (those wires would hold +inf and
    never move), then pruned to the comparators whose outputs reach a wanted wire."""
    size = 1
    while size < k:
        size *= 2
    pairs: list[tuple[int, int]] = []
    p = 1
    while p < size:
        step = p
        while step >= 1:
            for j in range(step % p, size - step, 2 * step):
                for i in range(min(step, size - j - step)):
                    a, b = i + j, i + j + step
                    if a // (2 * p) == b // (2 * p) and b < k:
                        pairs.append((a, b))
            step //= 2
        p *= 2
    needed, kept = set(wanted), []
    for a, b in reversed(pairs):
        if a in needed or b in needed:
            kept.append((a, b))
            needed.update((a, b))
    return tuple(reversed(kept))


def _ranked(rows: list[AnyArray], spare: AnyArray, network: Sequence[tuple[int, int]]) -> None:
    """Apply ``network`` to the rows (one coordinate per column): every comparator is two
    vectorised operations over the block, the rows swapped by reference, not copied."""
    for a, b in network:
        np.minimum(rows[a], rows[b], out=spare)
        np.maximum(rows[a], rows[b], out=rows[b])
        rows[a], spare = spare, rows[a]


def _blocks(
    sources: Sequence[TensorSource], lo: int, hi: int, width: int
) -> Iterator[tuple[int, int, AnyArray]]:
    """Coordinates ``[lo, hi)`` in blocks: ``(start, stop, stack)``, the K x (stop - start) stack
    of the clients' values (one client per row, float32, checked finite), valid until the next
    block."""
    k = len(sources)
    if hi <= lo:  # an empty tensor (a 0 in its shape): nothing to read
        return
    width = min(width, hi - lo)
    stacked = np.empty((k, width), dtype=np.float32)
    # float16 inputs are read into a buffer of their own, then converted.
    dtype = sources[0].dtype if sources else np.dtype(np.float32)
    raw = None if dtype == np.float32 else np.empty(width, dtype=dtype)
    for start in range(lo, hi, width):
        stop = min(start + width, hi)
        stack = stacked[:, : stop - start]
        for j, source in enumerate(sources):
            source.copy_into(start, stop, stack[j], raw)
        if not np.isfinite(stack).all():
            _raise_non_finite(sources, "", start, stop)
        yield start, stop, stack


def _reduce(ranked: Sequence[AnyArray], out: AnyArray, trim: int | None) -> None:
    """The rule from the values ranked per coordinate (``ranked[r]``: rank r's values): the
    median (of an even K the float64 mean of the two middle values) or the trimmed mean (a
    float64 sum of the kept values), as the float64 computation before these kernels."""
    k = len(ranked)
    if trim is None:
        if k % 2:
            out[:] = ranked[k // 2]
        else:
            out[:] = (ranked[k // 2 - 1].astype(np.float64) + ranked[k // 2]) * 0.5
        return
    out[:] = 0.0
    for values in ranked[trim : k - trim]:
        out += values
    out /= k - 2 * trim


def _sorted_reduce(
    sources: Sequence[TensorSource], out: AnyArray, lo: int, hi: int, trim: int | None
) -> None:
    """Coordinates ``[lo, hi)`` of the rule, block by block. Up to ``NETWORK_MAX_K`` clients the
    ranks the rule needs are put in place by a comparator network run across the block's
    columns (no transposition, no per-coordinate sort: about 4x faster than sorting each
    coordinate's K values at K = 20, 1.7x at K = 100); above, where a network needs too many
    comparators, each coordinate's K values are sorted (a transposed block, rows sorted)."""
    k = len(sources)
    if k > NETWORK_MAX_K:
        for start, stop, stack in _blocks(sources, lo, hi, max(1, SORT_BYTES // 4 // k)):
            values = np.ascontiguousarray(stack.T)  # one transposing copy,
            values.sort(axis=1)  # then each coordinate's K values sorted
            _reduce(list(values.T), out[start:stop], trim)
        return
    wanted = ((k - 1) // 2, k // 2) if trim is None else tuple(range(trim, k - trim))
    network = ranking_network(k, wanted)
    width = max(NETWORK_WIDTH, SORT_BYTES // 4 // k)
    spare_row = np.empty(min(width, hi - lo), dtype=np.float32)
    for start, stop, stack in _blocks(sources, lo, hi, width):
        rows = list(stack)
        _ranked(rows, spare_row[: stop - start], network)
        _reduce(rows, out[start:stop], trim)


def coordinatewise(
    global_state: StateReader,
    updates: Sequence[StateReader],
    trim: int | None,
    pool: ThreadPoolExecutor | None = None,
) -> dict[str, AnyArray]:
    """Trimmed mean (``trim`` values cut per side) or median (``trim`` None), per coordinate.

    Float tensors are transposed in blocks of coordinates and each block's rows are sorted;
    tensors of at least ``MIN_PARALLEL`` coordinates are split between two threads. Non-float
    tensors are copied from client 0 (uniform weights: the lowest index wins the tie). Float64
    tensors are sorted in float64 (the float32 block would round them).
    """
    names = check_state_names(global_state, updates)
    from_file = file_readers(updates)
    state: dict[str, AnyArray] = {}
    own_pool = pool is None
    executor = ThreadPoolExecutor(max_workers=2) if pool is None else pool
    try:
        for name in names:
            reference = read_global_tensor(global_state, name)
            if not is_float_tensor(reference) or reference.dtype == np.float64:
                tensors = [
                    read_tensor(u, name, reference, f"updates[{j}]") for j, u in enumerate(updates)
                ]
                state[name] = _exact_coordinatewise(reference, tensors, trim)
                continue
            sources = tensor_sources(updates, from_file, name)
            for j, source in enumerate(sources):
                _check_meta(source, reference, name, f"updates[{j}]")
            out = np.empty(reference.size, dtype=np.float64)
            try:
                _run_split(executor, sources, out, trim)
            except InvalidInputError as exc:
                raise InvalidInputError(str(exc).replace("tensor ''", f"tensor {name!r}")) from None
            state[name] = out.reshape(reference.shape).astype(reference.dtype)
    finally:
        if own_pool:
            executor.shutdown()
    return state


def _run_split(
    executor: ThreadPoolExecutor, flats: list[TensorSource], out: AnyArray, trim: int | None
) -> None:
    size = int(out.size)
    if size < MIN_PARALLEL:
        _sorted_reduce(flats, out, 0, size, trim)
        return
    middle = size // 2
    futures = [
        executor.submit(_sorted_reduce, flats, out, 0, middle, trim),
        executor.submit(_sorted_reduce, flats, out, middle, size, trim),
    ]
    for future in futures:
        future.result()


def _exact_coordinatewise(
    reference: AnyArray, tensors: Sequence[AnyArray], trim: int | None
) -> AnyArray:
    """Non-float tensors: client 0's copy; float64 tensors: the float64 computation."""
    if not is_float_tensor(reference):
        return np.array(tensors[0], copy=True)
    stack = np.stack([t.reshape(-1) for t in tensors])
    if trim is None:
        combined = np.median(stack, axis=0)
    else:
        stack.sort(axis=0)
        combined = stack[trim : stack.shape[0] - trim].mean(axis=0)
    result: AnyArray = combined.reshape(reference.shape).astype(reference.dtype)
    return result
