"""Content-addressed blob storage for model states (safetensors files).

A blob's key is the sha256 of its bytes. Writes are atomic: the bytes go to a temporary file in
the store's own directory, are fsynced, then renamed into place, so a crash never leaves a
half-written blob under a real key. Three backends: a directory (default), the database, and an
S3-compatible object store (service.store.s3blobs); the last two serve several replicas without
a shared file system, their readers through a local cached copy checked against its sha256.

Nothing is left behind. A blob put with the caller's ``session`` belongs to that transaction:
when the transaction ends without a commit (any exception, a failed commit, a session closed
mid-way) the file is removed again, unless another transaction of this process has put the same
key and not ended yet, or a committed row references it (TransactionOwnedBlobs holds these rules
for the directory and the S3 stores; the database store's rows roll back with the transaction).
A crash between the rename and the commit can still leave a file without a row;
:meth:`DirectoryBlobStore.sweep` (run at start-up) removes those, and the staged ``.part`` files
a crash leaves.

Removal follows the rows the same way. A caller that changes rows so that they no longer need
some blobs (retention marks model updates pruned) hands the keys to :meth:`BlobStore.drop` with
its session: the directory and S3 stores remove them once the transaction commits, and keep them
if it does not; the database store deletes their rows in the transaction itself. A crash after
the commit leaves blobs that no row needs, which the sweep removes.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from sqlalchemy import delete, event, select
from sqlalchemy.orm import Session, SessionTransaction, sessionmaker

from service.store.tables import Blob, ModelUpdate, ModelVersion

log = logging.getLogger(__name__)

CHUNK = 1024 * 1024
QUERY_BATCH = 500
_SESSION_KEY = "fedaudit.blobs_put"
"""``session.info`` entry: the (store, key) pairs put in the session's current transaction."""
_DROP_KEY = "fedaudit.blobs_dropped"
"""``session.info`` entry: the (store, key) pairs to remove when the transaction commits."""

References = Callable[[Session, Collection[str]], set[str]]
"""Which of these keys a committed row still needs."""


def referenced_by_rows(session: Session, keys: Collection[str]) -> set[str]:
    """The keys that a model update (not pruned) or a model version points at."""
    found: set[str] = set()
    wanted = list(keys)
    for start in range(0, len(wanted), QUERY_BATCH):
        batch = wanted[start : start + QUERY_BATCH]
        found.update(
            session.scalars(
                select(ModelUpdate.blob_key).where(
                    ModelUpdate.blob_key.in_(batch), ModelUpdate.pruned_at.is_(None)
                )
            )
        )
        found.update(
            session.scalars(select(ModelVersion.blob_key).where(ModelVersion.blob_key.in_(batch)))
        )
    return found


def stored_in_database(session: Session, keys: Collection[str]) -> set[str]:
    """The keys that have a row in the ``blob`` table (what a cache entry copies)."""
    found: set[str] = set()
    wanted = list(keys)
    for start in range(0, len(wanted), QUERY_BATCH):
        batch = wanted[start : start + QUERY_BATCH]
        found.update(session.scalars(select(Blob.key).where(Blob.key.in_(batch))))
    return found


class CorruptBlobError(OSError):
    """A stored blob whose content does not hash to its key: refused, never served."""


def check_key(key: str) -> str:
    """`key` if it is a sha256 hex digest (64 lower-case hex characters); else ValueError."""
    if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
        raise ValueError(f"invalid blob key {key!r}")
    return key


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_temp_file(directory: Path, chunks: Iterator[bytes] | bytes) -> tuple[Path, str, int]:
    """Write bytes to a new fsynced temporary file in `directory`; return (path, sha256, size)."""
    directory.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    fd, name = tempfile.mkstemp(dir=directory, prefix="blob-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as handle:
            for chunk in [chunks] if isinstance(chunks, bytes) else chunks:
                handle.write(chunk)
                digest.update(chunk)
                size += len(chunk)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name), digest.hexdigest(), size


def fill_cache(
    cache: DirectoryBlobStore, key: str, chunks: Iterator[bytes] | bytes, *, source: str
) -> Path:
    """Write a blob read from `source` into the local `cache` (a temporary file, then a rename)
    and return the cached file; CorruptBlobError, and nothing cached, unless it hashes to `key`."""
    staged, digest, _ = write_temp_file(cache.root / ".tmp", chunks)
    if digest != key:
        staged.unlink()
        raise CorruptBlobError(
            f"blob {key} in {source} is corrupt: its content's sha256 is {digest}; refused"
        )
    cache.put_file(staged, key)
    return cache.local_path(key)


class BlobStore(Protocol):
    """Where model states live. Keys are sha256 hex digests of the content."""

    writes_rows: bool
    """The store writes its blobs as rows through the caller's session (the database store):
    a put then takes the session's connection and must follow the caller's locks."""

    def put_file(self, path: Path, key: str, *, session: Session | None = None) -> bool:
        """Move the fsynced file at `path` into the store under `key`; True if it was new.

        `session`: the caller's open transaction. The blob belongs to it: a database-backed
        store writes its row there (so SQLite's single writer is not asked for a second, nested
        write transaction), and a blob whose transaction ends without a commit is removed
        again unless a committed row or another open transaction of this process needs it.
        """
        ...

    def exists(self, key: str) -> bool: ...

    def size(self, key: str) -> int: ...

    def local_path(self, key: str) -> Path:
        """A local file holding the blob (for safetensors' one-tensor-at-a-time reads)."""
        ...

    def open(self, key: str) -> BinaryIO: ...

    def delete(self, key: str) -> None: ...

    def discard(self, key: str, sessions: sessionmaker[Session]) -> bool:
        """Remove the blob `key` unless a committed row or an open transaction of this process
        still needs it (a replaced model's blob); True if it was removed."""
        ...

    def drop(self, keys: Collection[str], *, session: Session) -> None:
        """Remove the blobs `keys` with the caller's transaction, whose flushed rows no longer
        need them (pruned updates): gone once it commits, kept if it does not. A key that a row
        still needs, or that a transaction of this process is putting, is kept."""
        ...

    def sweep(self, sessions: sessionmaker[Session], *, older_than: float) -> SweepReport:
        """Remove what a crash or a failed transaction left, last written before `older_than`."""
        ...


@dataclass
class SweepReport:
    """What a sweep removed."""

    part_files: list[Path] = field(default_factory=list)
    orphan_blobs: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.part_files or self.orphan_blobs)


def sweep_part_files(directory: Path, *, older_than: float) -> list[Path]:
    """Remove the ``*.part`` files in `directory` last written before `older_than` (epoch s)."""
    removed: list[Path] = []
    if not directory.is_dir():
        return removed
    for path in directory.glob("*.part"):
        try:
            if path.is_file() and path.stat().st_mtime < older_than:
                path.unlink()
                removed.append(path)
        except FileNotFoundError:
            continue  # gone meanwhile
    return removed


class TransactionOwnedBlobs:
    """The rules that tie a blob to the transaction that put it, shared by the stores that keep
    blobs apart from their rows (a directory, an S3 bucket).

    A backend provides `_stored`, `_remove` and `_written_before`, registers each put with
    `_claim` (holding ``_lock``) before the blob becomes visible, and lists its sweep's
    candidates for `_remove_orphans`. `references`: which keys committed rows need (default:
    model updates and model versions); a blob that no row needs is garbage.
    """

    writes_rows = False
    """A put touches no database connection (a file, an object)."""

    def __init__(self, references: References) -> None:
        self.references = references
        self._lock = threading.Lock()
        self._in_flight: Counter[str] = Counter()
        """Keys put by transactions of this process that have not ended yet."""

    def _stored(self, key: str) -> bool:
        raise NotImplementedError

    def _remove(self, key: str) -> None:
        raise NotImplementedError

    def _written_before(self, key: str, older_than: float) -> bool:
        """The blob is there and was last written (or put again) before `older_than`."""
        raise NotImplementedError

    def _claim(self, key: str, session: Session | None) -> None:
        """Tie `key` to the session's transaction (the caller holds ``_lock``)."""
        if session is not None:
            self._in_flight[key] += 1
            session.info.setdefault(_SESSION_KEY, []).append((self, key))

    def _transaction_ended(self, key: str, bind: Any, *, committed: bool) -> None:
        """A transaction that put `key` ended; without a commit, remove what no one needs."""
        with self._lock:
            self._in_flight[key] -= 1
            if self._in_flight[key] > 0:
                return  # another transaction of this process still counts on the blob
            del self._in_flight[key]
            if committed:
                return
            # Runs inside the session's transaction-end hook: an error here (a store that does
            # not answer) must not replace the exception that ended the transaction, nor stop
            # the other blobs of the transaction from being released. The sweep removes what is
            # left.
            try:
                if not self._stored(key):
                    return
                with Session(bind=bind) as session:
                    needed = key in self.references(session, [key])
                if not needed:
                    self._remove(key)
                    log.info("blob %s removed: the transaction that stored it did not commit", key)
            except Exception:
                log.warning(
                    "could not remove blob %s after a rollback; the start-up sweep will if no "
                    "row needs it",
                    key,
                    exc_info=True,
                )

    def discard(self, key: str, sessions: sessionmaker[Session]) -> bool:
        with self._lock:
            if self._in_flight[key] > 0:
                return False
            with sessions() as session:
                if key in self.references(session, [key]):
                    return False
            removed = self._stored(key)
            self._remove(key)
            self._in_flight = +self._in_flight  # drop the zero count the lookup added
            return removed

    def drop(self, keys: Collection[str], *, session: Session) -> None:
        session.info.setdefault(_DROP_KEY, []).extend((self, check_key(key)) for key in keys)

    def _drop_committed(self, key: str, bind: Any) -> None:
        """The transaction that dropped `key` committed: remove it unless something needs it.
        Runs in the commit hook: an error is logged (the sweep removes what is left), never
        raised over a commit that happened."""
        with self._lock:
            try:
                if self._in_flight[key] > 0:
                    return  # put again by a transaction still under way
                with Session(bind=bind) as session:
                    if key in self.references(session, [key]):
                        return
                self._remove(key)
            except Exception:
                log.warning(
                    "could not remove the pruned blob %s; the start-up sweep will",
                    key,
                    exc_info=True,
                )
            finally:
                self._in_flight = +self._in_flight  # drop the zero count the lookup added

    def _remove_orphans(
        self, sessions: sessionmaker[Session], candidates: Collection[str], *, older_than: float
    ) -> list[str]:
        """Remove those of `candidates` (last written before `older_than`) that no committed
        row needs and no transaction of this process is putting; the keys removed."""
        if not candidates:
            return []
        with sessions() as session:
            needed = self.references(session, list(candidates))
        removed: list[str] = []
        with self._lock:
            for key in candidates:
                if key in needed or self._in_flight[key] > 0:
                    continue
                if not self._written_before(key, older_than):
                    continue  # put again since the query (a put touches it), or gone
                self._remove(key)
                removed.append(key)
            self._in_flight = +self._in_flight  # drop the zero counts the lookups added
        return removed


class DirectoryBlobStore(TransactionOwnedBlobs):
    """Blobs as files ``<root>/<key[:2]>/<key>``.

    `references`: which keys committed rows need (default: model updates and model versions);
    a blob that no row needs is garbage, removed when the transaction that put it rolls back
    and by :meth:`sweep`.
    """

    def __init__(self, root: Path, *, references: References = referenced_by_rows) -> None:
        super().__init__(references)
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / ".tmp").mkdir(exist_ok=True)

    def _path(self, key: str) -> Path:
        check_key(key)
        return self.root / key[:2] / key

    def put_file(self, path: Path, key: str, *, session: Session | None = None) -> bool:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() and path.stat().st_dev != self.root.stat().st_dev:
            # A rename across file systems is not atomic: copy next to the target first.
            staged, _, _ = write_temp_file(self.root / ".tmp", path.read_bytes())
            path.unlink()
            path = staged
        with self._lock:
            self._claim(key, session)
            if target.exists():
                path.unlink(missing_ok=True)
                os.utime(target)  # in use again: not "old" for a sweep with a grace period
                return False
            os.replace(path, target)
            _fsync_dir(target.parent)
            return True

    def _stored(self, key: str) -> bool:
        return self._path(key).exists()

    def _remove(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def _written_before(self, key: str, older_than: float) -> bool:
        try:
            return self._path(key).stat().st_mtime < older_than
        except FileNotFoundError:
            return False

    def exists(self, key: str) -> bool:
        return self._path(key).exists()

    def size(self, key: str) -> int:
        return self._path(key).stat().st_size

    def local_path(self, key: str) -> Path:
        path = self._path(key)
        if not path.exists():
            raise FileNotFoundError(f"blob {key} is missing from {self.root}")
        return path

    def open(self, key: str) -> BinaryIO:
        return self.local_path(key).open("rb")

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def keys(self) -> Iterator[tuple[str, Path]]:
        """Every stored blob's key and file."""
        for directory in sorted(self.root.iterdir()):
            if len(directory.name) != 2 or not directory.is_dir():
                continue
            for path in sorted(directory.iterdir()):
                name = path.name
                if len(name) == 64 and name.startswith(directory.name) and path.is_file():
                    yield name, path

    def sweep(self, sessions: sessionmaker[Session], *, older_than: float) -> SweepReport:
        """Remove staged ``.part`` files and blobs that no committed row needs, both last
        written before `older_than` (epoch seconds); blobs that a transaction of this process
        is still putting are kept."""
        report = SweepReport(part_files=sweep_part_files(self.root / ".tmp", older_than=older_than))
        candidates = [key for key, _ in self.keys() if self._written_before(key, older_than)]
        report.orphan_blobs = self._remove_orphans(sessions, candidates, older_than=older_than)
        return report


@event.listens_for(Session, "after_commit")
def _blobs_committed(session: Session) -> None:
    for store, key in session.info.pop(_SESSION_KEY, ()):
        store._transaction_ended(key, session.get_bind(), committed=True)
    for store, key in session.info.pop(_DROP_KEY, ()):
        store._drop_committed(key, session.get_bind())


@event.listens_for(Session, "after_transaction_end")
def _blobs_transaction_ended(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is not None:
        return  # a nested transaction: the outermost one decides
    session.info.pop(_DROP_KEY, None)  # not committed (a commit took them): the blobs stay
    if _SESSION_KEY not in session.info:
        return  # nothing put
    for store, key in session.info.pop(_SESSION_KEY):
        store._transaction_ended(key, session.get_bind(), committed=False)


class DatabaseBlobStore:
    """Blobs as rows of the ``blob`` table; reads go through a local cache directory."""

    writes_rows = True
    """A put reads and inserts the blob's row through the caller's session."""

    def __init__(self, sessions: sessionmaker[Session], cache_dir: Path) -> None:
        self.sessions = sessions
        self.cache = DirectoryBlobStore(cache_dir, references=stored_in_database)

    def put_file(self, path: Path, key: str, *, session: Session | None = None) -> bool:
        if session is not None:
            created = self._insert(session, path, key)
            if created:  # the cached copy goes if the row rolls back
                self.cache.put_file(path, key, session=session)
            return created
        with self.sessions.begin() as own:
            created = self._insert(own, path, key)
        if created:
            self.cache.put_file(path, key)
        return created

    @staticmethod
    def _insert(session: Session, path: Path, key: str) -> bool:
        if session.get(Blob, key) is not None:
            path.unlink(missing_ok=True)
            return False
        data = path.read_bytes()
        session.add(Blob(key=key, size_bytes=len(data), data=data))
        session.flush()
        return True

    def exists(self, key: str) -> bool:
        with self.sessions() as session:
            return session.scalar(select(Blob.key).where(Blob.key == key)) is not None

    def size(self, key: str) -> int:
        with self.sessions() as session:
            size = session.scalar(select(Blob.size_bytes).where(Blob.key == key))
        if size is None:
            raise FileNotFoundError(f"blob {key} is missing from the database")
        return size

    def local_path(self, key: str) -> Path:
        if self.cache.exists(key):
            return self.cache.local_path(key)
        with self.sessions() as session:
            data = session.scalar(select(Blob.data).where(Blob.key == key))
        if data is None:
            raise FileNotFoundError(f"blob {key} is missing from the database")
        return fill_cache(self.cache, key, data, source="the database")

    def open(self, key: str) -> BinaryIO:
        return self.local_path(key).open("rb")

    def delete(self, key: str) -> None:
        with self.sessions.begin() as session:
            session.execute(delete(Blob).where(Blob.key == key))
        self.cache.delete(key)

    def discard(self, key: str, sessions: sessionmaker[Session]) -> bool:
        with self.sessions.begin() as session:
            if key in referenced_by_rows(session, [key]):
                return False
            removed = session.scalar(select(Blob.key).where(Blob.key == key)) is not None
            session.execute(delete(Blob).where(Blob.key == key))
        self.cache.delete(key)
        return removed

    def drop(self, keys: Collection[str], *, session: Session) -> None:
        """Delete the blob rows of `keys` that no row needs in the caller's transaction; their
        cached copies go once it commits. (A replica that finds the row before this commit and
        puts the same content meanwhile does not write it again: content that an old, pruned
        update and a new update share exactly is not expected.)"""
        wanted = list(keys)
        needed = referenced_by_rows(session, wanted)
        gone = [key for key in wanted if key not in needed]
        for start in range(0, len(gone), QUERY_BATCH):
            session.execute(delete(Blob).where(Blob.key.in_(gone[start : start + QUERY_BATCH])))
        self.cache.drop(gone, session=session)

    def sweep(self, sessions: sessionmaker[Session], *, older_than: float) -> SweepReport:
        """The cache's leftovers: staged files, and copies of blobs without a row. (A blob row
        commits with the rows that reference it, and goes in the transaction that stops them
        referencing it, so none is left without them.)"""
        return self.cache.sweep(sessions, older_than=older_than)


@contextmanager
def staged_copy(source: BinaryIO, directory: Path) -> Iterator[tuple[Path, str, int]]:
    """Copy a stream into an fsynced temporary file; removed afterwards unless moved."""
    directory.mkdir(parents=True, exist_ok=True)
    path, digest, size = write_temp_file(directory, iter(lambda: source.read(CHUNK), b""))
    try:
        yield path, digest, size
    finally:
        path.unlink(missing_ok=True)


def copy_stream(source: BinaryIO, target: BinaryIO) -> None:
    shutil.copyfileobj(source, target, CHUNK)
