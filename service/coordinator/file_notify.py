"""Change signals between coordinator processes on one SQLite database: a signal file.

Several `fedaudit serve` processes may share one SQLite database: the workers of
``fedaudit serve --workers N``, or two coordinators started on one data directory. A
`LocalNotifier` wakes only the waiters of its own process, so a site long-polling on one worker
learned of a round that another worker opened or closed at its 15-second re-check. The
`FileNotifier` is the SQLite counterpart of `PgNotifier` (`service.coordinator.pg_notify`):

- `notify` (after the commit, as every notifier's) wakes this process's waiters and appends one
  line, the federation id, to a signal file beside the database file (``<database>.signals``):
  a write of 37 bytes with ``O_APPEND`` lands whole at the end of the file whichever process
  writes (Linux and other POSIX systems on a local file system; not on NFS, where SQLite itself
  is not safe either). `publish` sends nothing: the line is written only once the change
  committed, so a rolled-back transaction signals nobody.
- A watcher thread in each process stats the file every `poll_s` (0.1 s by default) and, when it
  has grown, reads the new whole lines and wakes its own waiters of those federations (lines it
  wrote itself too: a spurious signal costs a waiter one short query).
- The file does not grow without bound: a writer that finds it past `max_bytes` (64 KiB, about
  1,700 signals) before its write renames it to ``<database>.signals.old`` and writes its line
  to a new one. A watcher that finds a new file (another inode), a shorter one, or none where it
  had one wakes every waiter of its process, since lines appended just before the switch may
  never reach it, and reads the new file from its start. A signal that is still lost (a writer
  that appended to the old file after a watcher had moved on) costs the site its re-check, as a
  missed PostgreSQL notification does.

The cost: one ``stat`` per process every `poll_s`, one open, write and close per change.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy.orm import Session

from service.coordinator.notify import LocalNotifier, NotifierState, Subscription

__all__ = ["FileNotifier", "signal_file_for"]

log = logging.getLogger(__name__)

POLL_S = 0.1
"""How often a watcher looks at the signal file (the bound on a cross-process wake-up's delay,
plus the waiter's own query)."""

MAX_BYTES = 64 * 1024
"""Past this size a writer starts a new signal file."""


def signal_file_for(database: str) -> Path:
    """The signal file beside a SQLite database file."""
    return Path(f"{database}.signals")


class FileNotifier:
    """`ChangeNotifier` for processes sharing one SQLite database (module docstring)."""

    def __init__(self, path: Path, *, poll_s: float = POLL_S, max_bytes: int = MAX_BYTES) -> None:
        self.path = Path(path)
        self.poll_s = poll_s
        self.max_bytes = max_bytes
        self._local = LocalNotifier()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._inode: int | None = None
        self._offset = 0
        self._partial = b""
        self._last_error: tuple[str, str] | None = None
        self._error_logged: str | None = None
        self._callbacks: list[Callable[[bool], None]] = []
        self._lock = threading.Lock()  # the watcher's position in the file

    # --- ChangeNotifier -----------------------------------------------------------------------

    def publish(self, session: Session, federation_id: uuid.UUID) -> None:
        """Nothing inside the transaction: the line is written after the commit (`notify`)."""

    def notify(self, federation_id: uuid.UUID) -> None:
        self._local.notify(federation_id)
        try:
            self._append(f"{federation_id}\n".encode())
        except OSError as exc:  # the change is committed; other processes re-check later
            self._failed(exc)

    @contextmanager
    def subscribe(self, federation_id: uuid.UUID) -> Iterator[Subscription]:
        with self._local.subscribe(federation_id) as subscription:
            yield subscription

    def subscribers(self, federation_id: uuid.UUID) -> int:
        return self._local.subscribers(federation_id)

    def start(self) -> None:
        """Start the watcher (from the file's current end: earlier signals are history)."""
        if self._thread is not None and self._thread.is_alive():
            return
        with self._lock:
            self._seek_end()
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._watch, name="fedaudit-signal-file", daemon=True
        )
        self._thread.start()
        for callback in list(self._callbacks):
            callback(True)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            if self._thread.is_alive():
                return  # still in a look at the file: start() will not run a second one
            self._thread = None
            for callback in list(self._callbacks):
                callback(False)

    def state(self) -> NotifierState:
        """``kind`` "file", ``listening`` while the watcher runs, its last error."""
        error = self._last_error
        return {
            "kind": "file",
            "listening": self._thread is not None and self._thread.is_alive(),
            "last_error": None if error is None else error[0],
            "last_error_at": None if error is None else error[1],
        }

    def watch(self, callback: Callable[[bool], None]) -> None:
        """``callback(listening)`` now, and ``True`` when the watcher starts."""
        self._callbacks.append(callback)
        callback(self._thread is not None and self._thread.is_alive())

    # --- the file -----------------------------------------------------------------------------

    def _append(self, line: bytes) -> None:
        try:
            if os.stat(self.path).st_size > self.max_bytes:
                os.replace(self.path, self.path.with_name(self.path.name + ".old"))
        except FileNotFoundError:
            pass  # no file yet, or another writer switched it first
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        self._error_logged = None

    def _seek_end(self) -> None:
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            self._inode, self._offset = None, 0
        else:
            self._inode, self._offset = info.st_ino, info.st_size
        self._partial = b""

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.check()
            except OSError as exc:
                self._failed(exc)

    def check(self) -> None:
        """One look at the file (the watcher's step; tests call it directly)."""
        with self._lock:
            try:
                handle = open(self.path, "rb")  # noqa: SIM115 (closed below)
            except FileNotFoundError:
                if self._inode is not None:  # renamed away and no new line yet: a switch
                    self._switched(None)
                return
            with handle:
                info = os.fstat(handle.fileno())
                if info.st_ino != self._inode or info.st_size < self._offset:
                    self._switched(info.st_ino)
                if info.st_size == self._offset:
                    return
                handle.seek(self._offset)
                data = handle.read(info.st_size - self._offset)
            self._relay(data)
        self._error_logged = None

    def _switched(self, inode: int | None) -> None:
        """A new file (or none), read from its start; where it replaced another, what was
        appended to the old one since the last look may be lost: every waiter re-checks."""
        had_one = self._inode is not None
        self._inode, self._offset, self._partial = inode, 0, b""
        if had_one:
            self._local.notify_all()

    def _relay(self, data: bytes) -> None:
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in set(lines):
            try:
                federation_id = uuid.UUID(line.decode("ascii"))
            except (UnicodeDecodeError, ValueError):
                continue  # not ours: ignored
            self._local.notify(federation_id)

    def _failed(self, exc: OSError) -> None:
        self._last_error = (type(exc).__name__, datetime.now(UTC).isoformat())
        if self._error_logged != type(exc).__name__:  # once per kind of failure, not every look
            self._error_logged = type(exc).__name__
            log.warning("change signal file %s: %s", self.path, exc)
