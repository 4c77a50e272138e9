"""What a crash or a failed request can leave on disk, removed at start-up.

A request that fails after its blob was stored removes the blob itself (the blob store ties a
blob to the transaction that put it). A crash cannot clean up: an upload cut off leaves its
staged ``upload-*.part`` file in ``tmp/``, a round close cut off its ``state-*.part`` file, and a
crash between a blob's rename and its row's commit leaves a blob that no row references. The
sweep removes those, at start-up, before the first request.

Only files last written more than ``startup_sweep_grace_s`` ago are removed. The default, 0,
removes every one: a coordinator process owns its data directory, and at start-up none of its
own uploads is under way. Processes that share a data directory (``fedaudit serve --workers N``
sweeps once in the parent before it starts the workers; replicas on a shared file system do not)
should set a grace period longer than any upload can stall, so that one replica's start-up
cannot remove another's upload in progress.

**Who sweeps.** A coordinator process holds a shared lock on ``coordinator.lock`` in its data
directory while it serves (:class:`DataDirectoryLease`); the sweep runs only where it can take
that lock exclusively, that is where no other coordinator process is serving the directory. A
second ``fedaudit serve`` started on a live data directory by mistake (on another port, or on the
same one, where it fails to bind after its start-up) therefore leaves the running one's uploads
alone and says so, instead of removing them as a crash's leftovers. The lock is ``flock``'s
(POSIX): where the platform has none the sweep runs as before, and on a network file system
it holds only where the file system honours ``flock``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import IO

from service.coordinator.resources import Services
from service.store.blobs import SweepReport, sweep_part_files

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

LOCK_NAME = "coordinator.lock"
"""The file in the data directory that serving processes hold a shared lock on."""


class DataDirectoryLease:
    """A coordinator process's claim on its data directory (module docstring, "Who sweeps")."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_NAME
        self._file: IO[bytes] | None = None
        self._unusable = False

    def _open(self) -> IO[bytes] | None:
        if fcntl is None or self._unusable:
            return None
        if self._file is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.path.open("ab")
            except OSError as exc:  # e.g. a lock file another user created: sweep as before
                self._unusable = True
                log.warning(
                    "cannot open %s (%s): the start-up sweep cannot tell whether another "
                    "coordinator process serves this data directory",
                    self.path,
                    exc,
                )
                return None
        return self._file

    def sole(self) -> bool:
        """Whether no other process serves the directory: the exclusive lock, taken and kept
        until :meth:`share` or :meth:`release` (True where the platform has no ``flock``)."""
        handle = self._open()
        if handle is None or fcntl is None:
            return True
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def share(self) -> None:
        """Hold the shared lock while serving (waits while another process sweeps)."""
        handle = self._open()
        if handle is None or fcntl is None:
            return
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another coordinator process's start-up sweep of %s", self.path)
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH)

    def release(self) -> None:
        """Give the lock up (closing the file releases it)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def sweep_leftovers(
    services: Services, *, grace_s: float | None = None, lease: DataDirectoryLease | None = None
) -> SweepReport:
    """Remove staged files and unreferenced blobs older than the grace period; with ``lease``,
    only where no other coordinator process serves the data directory (module docstring)."""
    if lease is not None and not lease.sole():
        log.warning(
            "start-up sweep skipped: another coordinator process is serving %s (its uploads "
            "in progress are not a crash's leftovers)",
            services.settings.data_dir,
        )
        return SweepReport()
    grace = services.settings.startup_sweep_grace_s if grace_s is None else grace_s
    older_than = time.time() - grace
    report = services.blobs.sweep(services.sessions, older_than=older_than)
    report.part_files.extend(sweep_part_files(services.settings.tmp_dir, older_than=older_than))
    if report:
        log.warning(
            "start-up sweep removed %d staged file(s) and %d blob(s) no row references "
            "(left by a crash or a failed write)",
            len(report.part_files),
            len(report.orphan_blobs),
        )
    return report
