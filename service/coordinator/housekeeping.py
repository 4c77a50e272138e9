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
"""

from __future__ import annotations

import logging
import time

from service.coordinator.resources import Services
from service.store.blobs import SweepReport, sweep_part_files

log = logging.getLogger(__name__)


def sweep_leftovers(services: Services, *, grace_s: float | None = None) -> SweepReport:
    """Remove staged files and unreferenced blobs older than the grace period."""
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
