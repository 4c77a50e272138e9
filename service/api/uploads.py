"""Streaming request bodies to disk: never held whole in memory, hashed on the way, size-capped.

An update is ``multipart/form-data`` with a ``metadata`` part (JSON, kept in memory up to a small
cap) and a ``state`` part (safetensors, streamed to a temporary file). The initial model is a raw
``application/octet-stream`` body. Past the configured limit the request fails with 413 as soon
as the limit is crossed (or at once when Content-Length already says so).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from python_multipart.multipart import MultipartParser, parse_options_header

from service.coordinator.finite_scan import FiniteScan
from service.coordinator.updates import StagedUpload
from service.errors import BadRequestError, PayloadTooLargeError

MAX_METADATA_BYTES = 16 * 1024 * 1024
FLUSH_BYTES = 1024 * 1024  # disk writes and hashing leave the event loop in 1 MiB batches


class _TempWriter:
    """A temporary file fed from the event loop; the disk work runs in the thread pool.

    One batch is written (and hashed) in the thread pool while the event loop receives and
    parses the next: :meth:`flush` waits for the previous batch's write before it starts the
    next one, so the batches reach the file and the hash in order, and at most two batches
    (``2 * FLUSH_BYTES``) are held in memory. A batch is the received pieces themselves (views
    of the request's chunks, which are immutable): the event loop copies nothing.
    """

    def __init__(self, directory: Path, *, scan: bool = False) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._scan = FiniteScan() if scan else None
        fd, name = tempfile.mkstemp(dir=directory, prefix="upload-", suffix=".part")
        self.path = Path(name)
        self._file = os.fdopen(fd, "wb")
        self._digest = hashlib.sha256()
        self._pending: list[bytes | memoryview] = []
        self._pending_bytes = 0
        self._writing: asyncio.Future[Any] | None = None
        self.size = 0

    @classmethod
    async def open(cls, directory: Path, *, scan: bool = False) -> _TempWriter:
        """Create the file in the thread pool: mkdir and mkstemp touch the disk. ``scan``: look
        for non-finite floats on the way (:class:`FiniteScan`), a safetensors state."""
        return await run_in_threadpool(functools.partial(cls, directory, scan=scan))

    def add(self, data: bytes | memoryview) -> None:
        """Queue bytes (no copy, on the event loop: ``data`` must not change); `flush` writes
        them."""
        self._pending.append(data)
        self._pending_bytes += len(data)
        self.size += len(data)

    @property
    def should_flush(self) -> bool:
        return self._pending_bytes >= FLUSH_BYTES

    def _write(self, pieces: list[bytes | memoryview]) -> None:
        for piece in pieces:
            self._file.write(piece)
            self._digest.update(piece)
            if self._scan is not None:
                self._scan.feed(piece)

    async def flush(self) -> None:
        """Start writing the queued bytes, once the previous batch is written."""
        if self._pending:
            pieces, self._pending, self._pending_bytes = self._pending, [], 0
            await self._written()
            self._writing = asyncio.ensure_future(run_in_threadpool(self._write, pieces))

    async def _written(self) -> None:
        """Wait for the batch in flight. The write itself is shielded: a cancelled wait (the
        request's task cancelled) leaves it in flight and recorded, so :meth:`discard` removes
        the file only once it ends instead of closing it under the worker thread."""
        writing = self._writing
        if writing is not None:
            await asyncio.shield(writing)
            self._writing = None

    async def close(self) -> StagedUpload:
        await self.flush()
        await self._written()
        # finish (fsync, close) is tracked like a write, for the same reason
        finishing: asyncio.Future[StagedUpload] = asyncio.ensure_future(
            run_in_threadpool(self.finish)
        )
        self._writing = finishing
        staged = await asyncio.shield(finishing)
        self._writing = None
        return staged

    def finish(self) -> StagedUpload:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return StagedUpload(
            path=self.path,
            sha256=self._digest.hexdigest(),
            size=self.size,
            non_finite=None if self._scan is None else self._scan.result(),
        )

    def discard(self) -> None:
        """Remove the file; where a batch is still being written, once that write ends (its
        outcome no longer matters)."""
        writing, self._writing = self._writing, None
        if writing is not None and not writing.done():
            writing.add_done_callback(self._discard_after)
            return
        if writing is not None:
            self._discard_after(writing)
        else:
            self._remove()

    def _discard_after(self, writing: asyncio.Future[Any]) -> None:
        if not writing.cancelled():
            writing.exception()  # retrieved: a failed write of a discarded upload is no news
        self._remove()

    def _remove(self) -> None:
        if not self._file.closed:
            self._file.close()
        self.path.unlink(missing_ok=True)


def _check_declared_length(request: Request, limit: int) -> None:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(
            f"the request body is {int(declared)} bytes; the limit is {limit}", limit=limit
        )


async def receive_raw(request: Request, directory: Path, limit: int) -> StagedUpload:
    """Stream a raw body into a temporary file."""
    _check_declared_length(request, limit)
    writer = await _TempWriter.open(directory)
    try:
        async for chunk in request.stream():
            if writer.size + len(chunk) > limit:
                raise PayloadTooLargeError(
                    f"the request body exceeds the limit of {limit} bytes", limit=limit
                )
            writer.add(chunk)
            if writer.should_flush:
                await writer.flush()
        if writer.size == 0:
            raise BadRequestError("the request body is empty")
        return await writer.close()
    except BaseException:
        writer.discard()
        raise


class _Parts:
    """The multipart parser's callbacks: the metadata part kept in memory (at most
    ``MAX_METADATA_BYTES``), the state part streamed to ``writer``; any other part, or a part
    sent twice, is refused."""

    def __init__(self, writer: _TempWriter) -> None:
        self.writer = writer
        self.metadata = bytearray()
        self.seen: set[str] = set()
        self.name: str | None = None
        self.headers: dict[bytes, bytes] = {}
        self.header_field = b""
        self.header_value = b""

    def callbacks(self) -> Any:
        """The callbacks by the names ``multipart.MultipartParser`` calls them."""
        return {
            "on_part_begin": self.on_part_begin,
            "on_header_field": self.on_header_field,
            "on_header_value": self.on_header_value,
            "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished,
            "on_part_data": self.on_part_data,
        }

    def on_part_begin(self) -> None:
        self.headers = {}
        self.name = None

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self.header_field += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self.header_value += data[start:end]

    def on_header_end(self) -> None:
        self.headers[self.header_field.lower()] = self.header_value
        self.header_field = b""
        self.header_value = b""

    def on_headers_finished(self) -> None:
        _, disp = parse_options_header(self.headers.get(b"content-disposition", b""))
        name = disp.get(b"name", b"").decode("utf-8", "replace")
        if name not in ("metadata", "state"):
            raise BadRequestError(f"unexpected multipart part {name!r}")
        if name in self.seen:
            raise BadRequestError(f"the part {name!r} appears twice")
        self.seen.add(name)
        self.name = name

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        # A view of the request's chunk, not a copy, where it is immutable (bytes: uvicorn's and
        # the ASGI spec's); a buffer that may change after this call is copied.
        chunk = memoryview(data)[start:end] if isinstance(data, bytes) else bytes(data[start:end])
        if self.name == "metadata":
            if len(self.metadata) + len(chunk) > MAX_METADATA_BYTES:
                raise PayloadTooLargeError(
                    f"the metadata part exceeds {MAX_METADATA_BYTES} bytes",
                    limit=MAX_METADATA_BYTES,
                )
            self.metadata.extend(chunk)
        elif self.name == "state":
            self.writer.add(chunk)


async def receive_update(
    request: Request, directory: Path, limit: int
) -> tuple[bytes, StagedUpload]:
    """Parse a multipart update: returns the metadata bytes and the staged state file."""
    content_type, params = parse_options_header(request.headers.get("content-type", ""))
    if content_type != b"multipart/form-data" or b"boundary" not in params:
        raise BadRequestError(
            "an update must be multipart/form-data with the parts 'metadata' and 'state'"
        )
    _check_declared_length(request, limit)
    writer = await _TempWriter.open(directory, scan=True)
    parts = _Parts(writer)
    total = 0
    try:
        # inside the try: a boundary the parser refuses (over 256 bytes) is a 400 and no file
        parser = MultipartParser(params[b"boundary"], parts.callbacks())
        async for chunk in request.stream():
            total += len(chunk)
            if total > limit:
                raise PayloadTooLargeError(
                    f"the request body exceeds the limit of {limit} bytes", limit=limit
                )
            parser.write(chunk)
            if writer.should_flush:
                await writer.flush()
        parser.finalize()
        missing = {"metadata", "state"} - parts.seen
        if missing:
            raise BadRequestError(f"the multipart body lacks the part(s) {sorted(missing)}")
        if writer.size == 0:
            raise BadRequestError("the 'state' part is empty")
        return bytes(parts.metadata), await writer.close()
    except (BadRequestError, PayloadTooLargeError):
        writer.discard()
        raise
    except OSError:  # a failed write (ENOSPC, EIO) is the server's, not the client's 400
        writer.discard()
        raise
    except Exception as exc:  # the parser's own errors: a malformed body
        writer.discard()
        raise BadRequestError(f"malformed multipart body: {exc}") from None
    except BaseException:
        writer.discard()
        raise
