"""The data directory's lease (service.coordinator.housekeeping.DataDirectoryLease): the
start-up sweep runs only where no other coordinator process serves the directory."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest

from service.coordinator.housekeeping import DataDirectoryLease

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("fcntl") is None, reason="flock is POSIX's"
)


def test_a_serving_process_keeps_another_from_sweeping(tmp_path: Path) -> None:
    # flock locks belong to an open file, so two leases in one process behave as two processes
    serving, starting = DataDirectoryLease(tmp_path), DataDirectoryLease(tmp_path)
    assert serving.sole()  # nobody else: it may sweep
    serving.share()  # then serves
    assert not starting.sole()  # a second start-up may not sweep
    serving.release()
    assert starting.sole()  # once the first has gone, it may
    starting.release()


def test_a_lock_file_that_cannot_be_opened_sweeps_as_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "coordinator.lock").mkdir()  # cannot be opened as a file (as another owner's)
    lease = DataDirectoryLease(tmp_path)
    with caplog.at_level(logging.WARNING, logger="service.coordinator.housekeeping"):
        assert lease.sole()
        lease.share()
    assert "cannot tell whether another coordinator process" in caplog.text
    lease.release()
