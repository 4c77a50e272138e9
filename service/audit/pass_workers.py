"""The threads a blocked pass spreads its tensors over (:func:`in_order`).

A pass over the round's updates (:func:`service.audit.blocks.stream_pass`) is a loop over
tensors whose work is independent: each reads its K clients' blocks (``os.preadv``, which
releases the GIL while the kernel copies) and reduces them with numpy and BLAS (which release
it too). On a 2-core machine two threads, each on its own tensors, read and reduce at once;
the Python between the calls is what they share. Each tensor is computed exactly as a serial
pass would, and the results are applied in the serial order (totals over tensors included),
so the pass's results do not depend on the number of threads.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

__all__ = ["PASS_WORKERS", "in_order"]

_In = TypeVar("_In")
_Out = TypeVar("_Out")

PASS_WORKERS = max(1, min(4, os.cpu_count() or 1))
"""Threads of one pass: the machine's cores, at most 4 (the pass is bound by memory bandwidth
beyond a few cores; on the 2-core machine of ``docs/performance.md`` two)."""


def in_order(
    work: Callable[[_In], _Out], items: Sequence[_In], workers: int | None = None
) -> Iterator[_Out]:
    """``work(item)`` for every item, yielded in the items' order, computed by up to
    ``workers`` threads (default :data:`PASS_WORKERS`; one: in this thread, one item at a
    time). An item's exception is raised where its result would have been yielded, after the
    results before it, as in a serial loop; the items not yet started are then cancelled."""
    count = PASS_WORKERS if workers is None else workers
    if count <= 1 or len(items) <= 1:
        for item in items:
            yield work(item)
        return
    pool = ThreadPoolExecutor(max_workers=count, thread_name_prefix="fedaudit-pass")
    try:
        futures: list[Future[_Out]] = [pool.submit(work, item) for item in items]
        for future in futures:
            yield future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
