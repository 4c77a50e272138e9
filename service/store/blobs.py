"""Content-addressed blob storage for model states (safetensors files).

A blob's key is the sha256 of its bytes. Writes are atomic: the bytes go to a temporary file in
the store's own directory, are fsynced, then renamed into place, so a crash never leaves a
half-written blob under a real key. Two backends: a directory (default) and the database (for
several replicas without a shared file system; readers get a local cached copy).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Protocol

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from service.store.models import Blob

CHUNK = 1024 * 1024


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


class BlobStore(Protocol):
    """Where model states live. Keys are sha256 hex digests of the content."""

    def put_file(self, path: Path, key: str, *, session: Session | None = None) -> bool:
        """Move the fsynced file at `path` into the store under `key`; True if it was new.

        `session`: the caller's open transaction, which a database-backed store joins (so the
        blob commits or rolls back with the rows that reference it, and SQLite's single writer
        is not asked for a second, nested write transaction). Ignored by the directory store.
        """
        ...

    def exists(self, key: str) -> bool: ...

    def size(self, key: str) -> int: ...

    def local_path(self, key: str) -> Path:
        """A local file holding the blob (for safetensors' one-tensor-at-a-time reads)."""
        ...

    def open(self, key: str) -> BinaryIO: ...

    def delete(self, key: str) -> None: ...


class DirectoryBlobStore:
    """Blobs as files ``<root>/<key[:2]>/<key>``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / ".tmp").mkdir(exist_ok=True)

    def _path(self, key: str) -> Path:
        if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
            raise ValueError(f"invalid blob key {key!r}")
        return self.root / key[:2] / key

    def put_file(self, path: Path, key: str, *, session: Session | None = None) -> bool:
        target = self._path(key)
        if target.exists():
            path.unlink(missing_ok=True)
            return False
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.stat().st_dev != self.root.stat().st_dev:
            # A rename across file systems is not atomic: copy next to the target first.
            staged, _, _ = write_temp_file(self.root / ".tmp", path.read_bytes())
            path.unlink()
            path = staged
        os.replace(path, target)
        _fsync_dir(target.parent)
        return True

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


class DatabaseBlobStore:
    """Blobs as rows of the ``blob`` table; reads go through a local cache directory."""

    def __init__(self, sessions: sessionmaker[Session], cache_dir: Path) -> None:
        self.sessions = sessions
        self.cache = DirectoryBlobStore(cache_dir)

    def put_file(self, path: Path, key: str, *, session: Session | None = None) -> bool:
        if session is not None:
            created = self._insert(session, path, key)
        else:
            with self.sessions.begin() as own:
                created = self._insert(own, path, key)
        if created:
            self.cache.put_file(path, key)  # a cache entry outliving a rollback is harmless
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
        staged, digest, _ = write_temp_file(self.cache.root / ".tmp", data)
        if digest != key:
            staged.unlink()
            raise OSError(f"blob {key} in the database is corrupt (sha256 {digest})")
        self.cache.put_file(staged, key)
        return self.cache.local_path(key)

    def open(self, key: str) -> BinaryIO:
        return self.local_path(key).open("rb")

    def delete(self, key: str) -> None:
        with self.sessions.begin() as session:
            session.execute(delete(Blob).where(Blob.key == key))
        self.cache.delete(key)


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
