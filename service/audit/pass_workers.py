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

import itertools
import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

__all__ = ["PASS_WORKERS", "in_order"]

_In = TypeVar("_In")
_Out = TypeVar("_Out")


def _cores() -> int:
    """The cores this process may run on (its affinity where the platform says; else all)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


PASS_WORKERS = max(1, min(4, _cores()))
"""Threads of one pass: the cores the process may use, at most 4 (the pass is bound by memory
bandwidth beyond a few cores; on the 2-core machine of ``docs/performance.md`` two)."""


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
    waiting: deque[Future[_Out]] = deque()
    pending = iter(items)
    try:
        # a window of 2 x workers items in flight: results are released once yielded, and a
        # slow item holds back at most the window's
        for item in itertools.islice(pending, 2 * count):
            waiting.append(pool.submit(work, item))
        while waiting:
            done = waiting.popleft().result()
            for item in itertools.islice(pending, 1):
                waiting.append(pool.submit(work, item))
            yield done
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
