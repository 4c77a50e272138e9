"""Change signals through a file between processes sharing one SQLite database
(service.coordinator.file_notify). Two notifiers on one path stand for two processes."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from service.coordinator.file_notify import FileNotifier, signal_file_for

pytestmark = pytest.mark.anyio


def test_the_signal_file_sits_beside_the_database() -> None:
    assert signal_file_for("/data/fedaudit.db") == Path("/data/fedaudit.db.signals")


async def test_a_change_noted_by_one_process_wakes_the_other_s_waiter(tmp_path: Path) -> None:
    path = tmp_path / "db.signals"
    writer, reader = FileNotifier(path), FileNotifier(path)
    fid, other = uuid.uuid4(), uuid.uuid4()
    reader.check()  # nothing written yet: nothing to do
    with reader.subscribe(fid) as waiting, reader.subscribe(other) as elsewhere:
        writer.notify(fid)
        assert path.read_bytes() == f"{fid}\n".encode()
        reader.check()
        assert await waiting.wait(1.0) is True
        assert await elsewhere.wait(0.05) is False  # another federation: not woken
        reader.check()  # nothing new since
        assert await waiting.wait(0.05) is False


async def test_the_writer_s_own_waiters_are_woken_at_once(tmp_path: Path) -> None:
    notifier = FileNotifier(tmp_path / "db.signals")
    fid = uuid.uuid4()
    with notifier.subscribe(fid) as waiting:
        assert notifier.subscribers(fid) == 1
        notifier.notify(fid)
        assert await waiting.wait(0.5) is True
    assert notifier.subscribers(fid) == 0


async def test_a_partial_line_waits_for_its_end_and_garbage_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "db.signals"
    reader = FileNotifier(path)
    fid = uuid.uuid4()
    with reader.subscribe(fid) as waiting:
        path.write_bytes(b"not a federation\n" + str(fid)[:10].encode())
        reader.check()
        assert await waiting.wait(0.05) is False
        with path.open("ab") as handle:
            handle.write(str(fid)[10:].encode() + b"\n")
        reader.check()
        assert await waiting.wait(1.0) is True


async def test_a_new_file_wakes_every_waiter_and_is_read_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "db.signals"
    writer = FileNotifier(path, max_bytes=100)  # 37 bytes a line: the fourth starts a new file
    reader = FileNotifier(path)
    first, second, bystander = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    writer.notify(first)
    reader.check()
    with reader.subscribe(second) as waiting, reader.subscribe(bystander) as other:
        writer.notify(first)
        writer.notify(first)
        assert path.stat().st_size == 111
        writer.notify(second)  # past 100 bytes before this write: renamed away first
        assert (tmp_path / "db.signals.old").stat().st_size == 111
        assert path.read_bytes() == f"{second}\n".encode()  # the line that switched it
        reader.check()
        assert await other.wait(1.0) is True  # lines may have been lost: everyone re-checks
        assert await waiting.wait(1.0) is True


async def test_a_file_renamed_away_with_no_new_line_yet_is_a_switch(tmp_path: Path) -> None:
    path = tmp_path / "db.signals"
    writer, reader = FileNotifier(path), FileNotifier(path)
    fid = uuid.uuid4()
    writer.notify(fid)
    reader.check()
    with reader.subscribe(fid) as waiting:
        path.rename(tmp_path / "db.signals.old")  # as a writer does before its line
        reader.check()
        assert await waiting.wait(1.0) is True
        reader.check()  # still no file: nothing more
        assert await waiting.wait(0.05) is False
        writer.notify(fid)  # the new file, read from its start
        reader.check()
        assert await waiting.wait(1.0) is True


async def test_the_watcher_thread_relays_without_being_asked(tmp_path: Path) -> None:
    path = tmp_path / "db.signals"
    writer, reader = FileNotifier(path), FileNotifier(path, poll_s=0.02)
    seen: list[bool] = []
    reader.watch(seen.append)
    writer.notify(uuid.uuid4())  # before the start: history, not a signal
    reader.start()
    try:
        assert reader.state()["kind"] == "file"
        assert reader.state()["listening"] is True
        assert seen == [False, True]
        fid = uuid.uuid4()
        with reader.subscribe(fid) as waiting:
            assert await waiting.wait(0.1) is False  # the line written before the start
            started = time.monotonic()
            writer.notify(fid)
            assert await waiting.wait(2.0) is True
            assert time.monotonic() - started < 1.0
    finally:
        reader.close()
    assert reader.state()["listening"] is False
    assert seen == [False, True, False]


def test_a_file_that_cannot_be_written_is_reported_not_raised(tmp_path: Path) -> None:
    path = tmp_path / "db.signals"
    path.mkdir()  # a directory where the file should be: no process can append to it
    notifier = FileNotifier(path)
    notifier.notify(uuid.uuid4())  # the change is committed: never an exception here
    state = notifier.state()
    assert state["last_error"] == "IsADirectoryError"
    assert state["last_error_at"] is not None
