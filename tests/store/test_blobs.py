"""Content-addressed blob stores: atomic writes, every backend (a directory, the database, an
S3-compatible server: moto's, over HTTP on loopback).

The behaviour every backend shares is tested on each (`backend`); the transaction-ownership
rules that the directory and the S3 stores share (TransactionOwnedBlobs) on both of those. The
S3 store's own checks are in test_s3_blobs.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from service.store.blobs import (
    DatabaseBlobStore,
    DirectoryBlobStore,
    TransactionOwnedBlobs,
    sha256_file,
    write_temp_file,
)
from service.store.s3blobs import S3BlobStore
from service.store.session import make_engine, make_sessionmaker

MakeStore = Callable[[str], Any]


@pytest.fixture
def sessions(database_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(database_url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture
def make_store(
    request: pytest.FixtureRequest, tmp_path: Path, sessions: sessionmaker[Session]
) -> MakeStore:
    """A new store of the backend named; "s3" gets a bucket of its own on the loopback server
    (and skips, saying why, where none can start)."""

    def make(backend: str) -> Any:
        if backend == "directory":
            return DirectoryBlobStore(tmp_path / "dir")
        if backend == "database":
            return DatabaseBlobStore(sessions, tmp_path / "cache")
        return S3BlobStore.connect(request.getfixturevalue("s3_location"), tmp_path / "s3-cache")

    return make


@pytest.fixture(params=["directory", "database", "s3"])
def store(request: pytest.FixtureRequest, make_store: MakeStore) -> Any:
    """Each backend in turn."""
    return make_store(request.param)


@pytest.fixture(params=["directory", "s3"])
def owned(request: pytest.FixtureRequest, make_store: MakeStore) -> TransactionOwnedBlobs:
    """Each backend that keeps blobs apart from their rows (TransactionOwnedBlobs)."""
    store: TransactionOwnedBlobs = make_store(request.param)
    return store


def stored(store: Any) -> set[str]:
    """The keys a store holds where it keeps them (files, the database store's cache, the
    bucket) and, for a store with a local cache, in the cache too."""
    keys = {key for key, _ in store.keys()} if hasattr(store, "keys") else set()
    cache = getattr(store, "cache", None)
    if cache is not None:
        keys |= {key for key, _ in cache.keys()}
    return keys


@pytest.mark.db
def test_put_is_content_addressed_and_idempotent(tmp_path: Path, store: Any) -> None:
    path, digest, size = write_temp_file(tmp_path / "tmp", b"hello model")
    assert size == 11
    assert store.put_file(path, digest) is True
    assert not path.exists()
    again, digest2, _ = write_temp_file(tmp_path / "tmp", b"hello model")
    assert digest2 == digest
    assert store.put_file(again, digest) is False
    local = store.local_path(digest)
    assert local.read_bytes() == b"hello model"
    assert sha256_file(local) == digest
    with store.open(digest) as handle:
        assert handle.read() == b"hello model"
    assert store.size(digest) == 11
    store.delete(digest)
    assert not store.exists(digest)
    assert stored(store) == set()
    with pytest.raises(FileNotFoundError, match=digest):
        store.local_path(digest)


def test_directory_store_rejects_bad_keys(tmp_path: Path) -> None:
    store = DirectoryBlobStore(tmp_path)
    with pytest.raises(ValueError, match="invalid blob key"):
        store.local_path("../../etc/passwd")


def test_no_partial_file_under_a_real_key(tmp_path: Path) -> None:
    """A failed write leaves no file behind (the temp file is removed, nothing renamed)."""

    def chunks():
        yield b"part"
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_temp_file(tmp_path, chunks())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.db
def test_a_blob_whose_transaction_rolls_back_is_removed(
    tmp_path: Path, store: Any, sessions: sessionmaker[Session]
) -> None:
    path, digest, _ = write_temp_file(tmp_path / "tmp", b"rolled back")

    def put_then_fail() -> None:
        with sessions.begin() as session:
            assert store.put_file(path, digest, session=session) is True
            assert digest in stored(store)
            raise RuntimeError("a failure after the put")

    with pytest.raises(RuntimeError, match="after the put"):
        put_then_fail()
    assert stored(store) == set()
    assert not store.exists(digest)
    # a session closed without commit (no exception in a `begin` block) also ends it
    path, digest, _ = write_temp_file(tmp_path / "tmp", b"abandoned")
    session = sessions()
    session.begin()
    store.put_file(path, digest, session=session)
    session.close()
    assert stored(store) == set()
    # committed: kept (for the database store, the row is the reference its cache needs)
    path, digest, _ = write_temp_file(tmp_path / "tmp", b"committed")
    with sessions.begin() as session:
        store.put_file(path, digest, session=session)
    assert store.exists(digest)


@pytest.mark.db
def test_a_store_that_fails_during_the_cleanup_does_not_hide_the_transactions_error(
    tmp_path: Path, owned: Any, sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cleanup after a rollback runs in the session's transaction-end hook: a store that does
    # not answer there (an S3 HEAD that fails) must neither replace the error that ended the
    # transaction nor leave the blobs counted as in flight (the sweep would skip them forever).
    first, key1, _ = write_temp_file(tmp_path / "tmp", b"first")
    second, key2, _ = write_temp_file(tmp_path / "tmp", b"second")

    def unreachable(key: str) -> bool:
        raise ConnectionError("the store does not answer")

    def put_two_then_fail() -> None:
        with sessions.begin() as session:
            owned.put_file(first, key1, session=session)
            owned.put_file(second, key2, session=session)
            monkeypatch.setattr(owned, "_stored", unreachable)
            raise LookupError("the round closed")

    with pytest.raises(LookupError, match="the round closed"):
        put_two_then_fail()
    assert dict(owned._in_flight) == {}


@pytest.mark.db
def test_a_rollback_keeps_a_blob_another_open_transaction_has_put(
    tmp_path: Path, owned: Any, sessions: sessionmaker[Session]
) -> None:
    """Two transactions put the same content; the first rolls back while the second is open:
    the blob stays for the second, and goes when the second rolls back too."""
    first, second = sessions(), sessions()
    first.begin()
    second.begin()
    path, digest, _ = write_temp_file(tmp_path / "tmp", b"same bytes")
    assert owned.put_file(path, digest, session=first) is True
    path, _, _ = write_temp_file(tmp_path / "tmp", b"same bytes")
    assert owned.put_file(path, digest, session=second) is False
    first.rollback()
    assert owned.exists(digest)
    second.rollback()
    assert not owned.exists(digest)
    assert stored(owned) == set()
    first.close()
    second.close()


def _staging_dir(store: Any) -> Path:
    """Where the store stages files (its own, or its local cache's)."""
    return Path(getattr(store, "cache", store).root) / ".tmp"


@pytest.mark.db
def test_sweep_removes_part_files_and_unreferenced_blobs_past_the_grace(
    tmp_path: Path, owned: Any, sessions: sessionmaker[Session]
) -> None:
    # an orphan (as a crash between the write and the commit leaves it) and a stale staged file
    path, orphan, _ = write_temp_file(tmp_path / "tmp", b"orphan")
    owned.put_file(path, orphan)
    stale = _staging_dir(owned) / "blob-x.part"
    stale.write_bytes(b"half")
    # a grace period that they are within keeps both
    report = owned.sweep(sessions, older_than=time.time() - 3600)
    assert not report
    assert owned.exists(orphan)
    assert stale.exists()
    report = owned.sweep(sessions, older_than=time.time() + 2)
    assert report.orphan_blobs == [orphan]
    assert report.part_files == [stale]
    assert not owned.exists(orphan)
    assert not stale.exists()
    assert stored(owned) == set()


@pytest.mark.db
def test_sweep_keeps_a_blob_an_open_transaction_is_putting(
    tmp_path: Path, owned: Any, sessions: sessionmaker[Session]
) -> None:
    with sessions.begin() as session:
        path, digest, _ = write_temp_file(tmp_path / "tmp", b"in flight")
        owned.put_file(path, digest, session=session)
        assert not owned.sweep(sessions, older_than=time.time() + 2)
        assert owned.exists(digest)
    # committed without a row that references it: garbage, swept
    assert owned.sweep(sessions, older_than=time.time() + 2).orphan_blobs == [digest]
    assert stored(owned) == set()


@pytest.mark.db
def test_discard_removes_an_unreferenced_blob(
    tmp_path: Path, store: Any, sessions: sessionmaker[Session]
) -> None:
    """A replaced initial model's blob goes."""
    path, digest, _ = write_temp_file(tmp_path / "tmp", b"replaced")
    with sessions.begin() as session:
        store.put_file(path, digest, session=session)
    assert store.discard(digest, sessions) is True
    assert not store.exists(digest)
    assert stored(store) == set()
    assert store.discard(digest, sessions) is False


@pytest.mark.db
def test_discard_keeps_a_blob_an_open_transaction_is_putting(
    tmp_path: Path, owned: Any, sessions: sessionmaker[Session]
) -> None:
    path, digest, _ = write_temp_file(tmp_path / "tmp", b"in flight")
    with sessions.begin() as session:
        owned.put_file(path, digest, session=session)
        assert owned.discard(digest, sessions) is False
        assert owned.exists(digest)


@pytest.mark.db
def test_drop_removes_blobs_when_the_transaction_commits_and_keeps_them_when_it_does_not(
    tmp_path: Path, store: Any, sessions: sessionmaker[Session]
) -> None:
    """Retention hands the blobs of pruned updates to `drop` in the transaction that marks the
    rows: nothing goes until it commits, and a failed one leaves every blob in place."""
    keys = []
    for content in (b"old update", b"older update"):
        path, digest, _ = write_temp_file(tmp_path / "tmp", content)
        with sessions.begin() as session:
            store.put_file(path, digest, session=session)
        store.local_path(digest)  # a cached copy, where the store has a cache
        keys.append(digest)

    def drop_then_fail() -> None:
        with sessions.begin() as session:
            store.drop(keys, session=session)
            raise RuntimeError("a failure after the drop")

    with pytest.raises(RuntimeError, match="after the drop"):
        drop_then_fail()
    assert all(store.exists(key) for key in keys)
    session = sessions()  # a session closed without a commit drops nothing either
    session.begin()
    store.drop(keys, session=session)
    session.close()
    assert stored(store) >= set(keys)

    with sessions.begin() as session:
        store.drop(keys[:1], session=session)
        assert store.local_path(keys[0]).read_bytes() == b"old update"  # until the commit
    assert not store.exists(keys[0])
    assert store.exists(keys[1])
    assert stored(store) == {keys[1]}


@pytest.mark.db
def test_drop_keeps_a_blob_a_row_needs_or_a_transaction_is_putting(
    tmp_path: Path, sessions: sessionmaker[Session]
) -> None:
    """Content-addressed: a pruned update's content may also be another row's (a global model
    identical to it); that row keeps it. So does an upload of the same content under way."""
    needed: set[str] = set()
    store = DirectoryBlobStore(tmp_path / "dir", references=lambda _, keys: needed & set(keys))
    path, shared, _ = write_temp_file(tmp_path / "tmp", b"shared content")
    store.put_file(path, shared)
    needed.add(shared)
    with sessions.begin() as session:
        store.drop([shared], session=session)
    assert store.exists(shared)
    needed.clear()
    with sessions.begin() as putting:
        again, _, _ = write_temp_file(tmp_path / "tmp", b"shared content")
        store.put_file(again, shared, session=putting)
        with sessions.begin() as session:
            store.drop([shared], session=session)
        assert store.exists(shared)
        needed.add(shared)  # the upload's row commits with it
    assert store.exists(shared)
