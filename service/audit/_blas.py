"""One BLAS thread for the audit's small matrix products.

The audit's products are small (a block of parameters, a chunk of targets): on a busy 2-core
machine BLAS threads waiting for a core made them several times slower than one thread
(measured for the round's pass and the neighbor search). The limit is process-wide while it
holds, as threadpoolctl's limits are.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from threadpoolctl import ThreadpoolController

_CONTROLLER: list[ThreadpoolController] = []


def _blas_controller() -> ThreadpoolController:
    """One controller per process: building it scans the loaded libraries (milliseconds, which
    a small round would pay on every pass); limiting through it costs microseconds."""
    if not _CONTROLLER:
        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0]


def one_blas_thread() -> AbstractContextManager[Any]:
    """A context in which BLAS runs on one thread."""
    limit: AbstractContextManager[Any] = _blas_controller().limit(limits=1, user_api="blas")
    return limit
