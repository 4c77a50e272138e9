"""Coordinate-wise median and trimmed mean over transposed blocks, on two threads.

Blocks of coordinates are copied from the K updates (read in parts from the coordinator's files,
:mod:`service.audit.block_source`) into a (coordinates x K) array whose rows
are sorted (numpy's vectorised sort of short rows beats a partition with two pivots there); a
tensor of at least ``MIN_PARALLEL`` coordinates is split between two threads (numpy releases the
GIL while sorting). The median of an even K is the float64 mean of the two middle values and the
trimmed mean a float64 sum of the kept values, as the float64 computation before these kernels.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

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

__all__ = ["MIN_PARALLEL", "SORT_BYTES", "coordinatewise"]

SORT_BYTES = 2 << 20
"""Bytes of a transposed (coordinates x K) block of the median / trimmed mean, per thread."""

MIN_PARALLEL = 1 << 15
"""Tensors with fewer coordinates than this are sorted on one thread."""


def _sorted_reduce(
    sources: Sequence[TensorSource], out: AnyArray, lo: int, hi: int, trim: int | None
) -> None:
    """Rows ``[lo, hi)`` of the (coordinates x K) transposed block, sorted per row, reduced."""
    k = len(sources)
    rows = max(1, SORT_BYTES // 4 // k)
    block = np.empty((min(rows, hi - lo), k), dtype=np.float32)
    stacked = np.empty(k * min(rows, hi - lo), dtype=np.float32)
    # float16 inputs are read into a buffer of their own, then converted.
    dtype = sources[0].dtype if sources else np.dtype(np.float32)
    raw = None if dtype == np.float32 else np.empty(min(rows, hi - lo), dtype=dtype)
    for start in range(lo, hi, rows):
        stop = min(start + rows, hi)
        x = block[: stop - start]
        # Contiguous row copies, then one transposing copy (faster than K strided columns).
        rows_k = stacked[: k * (stop - start)].reshape(k, stop - start)
        for j, source in enumerate(sources):
            source.copy_into(start, stop, rows_k[j], raw)
        np.copyto(x, rows_k.T)
        if not np.isfinite(x).all():
            _raise_non_finite(sources, "", start, stop)
        x.sort(axis=1)
        if trim is None:
            half = k // 2
            if k % 2:
                out[start:stop] = x[:, half]
            else:
                # float64 for the mean of the two middle values, as the float64 path did.
                out[start:stop] = (
                    x[:, half - 1].astype(np.float64) + x[:, half].astype(np.float64)
                ) * 0.5
        else:
            # float64 sum of the kept values (up to K of them, float32 inputs).
            out[start:stop] = x[:, trim : k - trim].sum(axis=1, dtype=np.float64) / (k - 2 * trim)


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
