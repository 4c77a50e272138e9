"""One BLAS thread for the audit's small matrix products.

The audit's products are small (a block of parameters, a chunk of targets): on a busy 2-core
machine BLAS threads waiting for a core made them several times slower than one thread
(measured for the round's pass and the neighbor search). The limit is process-wide while it
holds, as threadpoolctl's limits are (other threads' numpy work runs on one BLAS thread too).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from threadpoolctl import ThreadpoolController

_CONTROLLER: list[ThreadpoolController] = []


def _blas_controller() -> ThreadpoolController:
    """One controller per process: building it scans the loaded libraries (milliseconds, which
    a small round would pay on every pass); limiting through it costs microseconds."""
    if not _CONTROLLER:
        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0]


_LOCK = threading.Lock()
_HELD: list[Any] = []  # the active limiter, while any context holds it
_DEPTH = [0]


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """A context in which BLAS runs on one thread. Contexts may overlap (two threads auditing at
    once): the first to enter sets the limit, the last to leave restores the original one, so
    overlapping contexts never leave the process at one thread."""
    with _LOCK:
        if _DEPTH[0] == 0:
            limiter = _blas_controller().limit(limits=1, user_api="blas")
            _HELD.append(limiter)
        _DEPTH[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                _HELD.pop().restore_original_limits()


_PROCESS: list[Any] = []  # the process-wide limiter, once set


def one_blas_thread_in_this_process() -> None:
    """Run BLAS on one thread in the whole process from now on (idempotent). The coordinator
    calls it at start, on its main thread: its BLAS work is the audit's small products, and with
    the OpenBLAS numpy and scipy ship (0.3.30) a limit set from a worker thread does not take
    once the main thread has set one (measured), so :func:`one_blas_thread` in the worker
    threads that close rounds would not hold on its own."""
    with _LOCK:
        if not _PROCESS:
            _PROCESS.append(_blas_controller().limit(limits=1, user_api="blas"))
