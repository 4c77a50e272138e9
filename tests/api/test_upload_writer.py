"""The upload's temporary file (``service.api.uploads._TempWriter``): one batch written in the
thread pool while the next is received, in order; a discarded upload leaves no file, also when
a batch is still being written."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from pathlib import Path

import pytest

from service.api import uploads
from service.api.uploads import FLUSH_BYTES, _TempWriter

pytestmark = pytest.mark.anyio


def _chunks(total: int, size: int) -> list[bytes]:
    """``total`` bytes in chunks of ``size``, each chunk's bytes differing from its neighbours'
    (a batch written twice or out of order changes the file)."""
    return [
        bytes([i % 251]) * min(size, total - start) for i, start in enumerate(range(0, total, size))
    ]


async def test_batches_reach_the_file_and_the_hash_in_order(tmp_path: Path) -> None:
    writer = await _TempWriter.open(tmp_path)
    chunks = _chunks(3 * FLUSH_BYTES + 12_345, 65_536)
    flushes = 0
    for chunk in chunks:
        writer.add(chunk)
        if writer.should_flush:
            await writer.flush()
            flushes += 1
    staged = await writer.close()
    body = b"".join(chunks)
    assert flushes == 3
    assert staged.size == len(body) == 3 * 1024 * 1024 + 12_345
    assert staged.path.read_bytes() == body
    assert staged.sha256 == hashlib.sha256(body).hexdigest()


async def test_a_discard_while_a_batch_is_written_removes_the_file_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started, release = threading.Event(), threading.Event()
    write = _TempWriter._write

    def held(self: _TempWriter, pieces: list[bytes | memoryview]) -> None:
        started.set()
        release.wait(10)
        write(self, pieces)

    monkeypatch.setattr(uploads._TempWriter, "_write", held)
    writer = await _TempWriter.open(tmp_path)
    writer.add(b"x" * FLUSH_BYTES)
    await writer.flush()
    assert await asyncio.to_thread(started.wait, 10)
    writer.discard()
    assert writer.path.exists()  # the write in flight still holds it
    release.set()
    for _ in range(200):
        if not writer.path.exists():
            break
        await asyncio.sleep(0.01)
    assert not writer.path.exists()
    assert list(tmp_path.iterdir()) == []


async def test_a_failed_write_fails_the_close_and_the_discard_cleans_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: _TempWriter, pieces: list[bytes | memoryview]) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(uploads._TempWriter, "_write", broken)
    writer = await _TempWriter.open(tmp_path)
    writer.add(b"y" * FLUSH_BYTES)
    await writer.flush()
    with pytest.raises(OSError, match="No space left"):
        await writer.close()
    writer.discard()
    assert list(tmp_path.iterdir()) == []


async def test_a_cancelled_upload_does_not_close_the_file_under_a_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started, release = threading.Event(), threading.Event()
    write = _TempWriter._write
    outcomes: list[str] = []

    def held(self: _TempWriter, data: list[bytes | memoryview]) -> None:
        started.set()
        release.wait(10)
        try:
            write(self, data)
            outcomes.append("written")
        except ValueError as exc:
            outcomes.append(str(exc))
            raise

    monkeypatch.setattr(uploads._TempWriter, "_write", held)
    writer = await _TempWriter.open(tmp_path)

    async def upload() -> None:
        try:
            writer.add(b"a" * FLUSH_BYTES)
            await writer.flush()
            writer.add(b"b" * FLUSH_BYTES)
            await writer.flush()  # waits for the first batch: cancelled here
        except BaseException:
            writer.discard()
            raise

    task = asyncio.ensure_future(upload())
    assert await asyncio.to_thread(started.wait, 10)
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert writer.path.exists()  # the write in flight still holds it
    release.set()
    for _ in range(200):
        if not writer.path.exists():
            break
        await asyncio.sleep(0.01)
    assert outcomes == ["written"]
    assert list(tmp_path.iterdir()) == []
