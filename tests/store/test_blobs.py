"""Content-addressed blob stores: atomic writes, both backends."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from service.store.blobs import DatabaseBlobStore, DirectoryBlobStore, sha256_file, write_temp_file
from service.store.session import make_engine, make_sessionmaker


@pytest.mark.db
def test_put_is_content_addressed_and_idempotent(tmp_path: Path, database_url: str) -> None:
    engine = make_engine(database_url)
    sessions = make_sessionmaker(engine)
    stores = [DirectoryBlobStore(tmp_path / "dir"), DatabaseBlobStore(sessions, tmp_path / "cache")]
    for store in stores:
        path, digest, size = write_temp_file(tmp_path / "tmp", b"hello model")
        assert size == 11
        assert store.put_file(path, digest) is True  # type: ignore[attr-defined]
        assert not path.exists()
        again, digest2, _ = write_temp_file(tmp_path / "tmp", b"hello model")
        assert digest2 == digest
        assert store.put_file(again, digest) is False  # type: ignore[attr-defined]
        local = store.local_path(digest)  # type: ignore[attr-defined]
        assert local.read_bytes() == b"hello model"
        assert sha256_file(local) == digest
        assert store.size(digest) == 11  # type: ignore[attr-defined]
        store.delete(digest)  # type: ignore[attr-defined]
        assert not store.exists(digest)  # type: ignore[attr-defined]
    engine.dispose()


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


def _stores(tmp_path: Path, sessions) -> list[tuple[str, object]]:
    return [
        ("directory", DirectoryBlobStore(tmp_path / "dir")),
        ("database", DatabaseBlobStore(sessions, tmp_path / "cache")),
    ]


def _on_disk(store) -> set[str]:
    directory = getattr(store, "cache", store)
    return {key for key, _ in directory.keys()}


@pytest.mark.db
def test_a_blob_whose_transaction_rolls_back_is_removed(tmp_path: Path, database_url: str) -> None:
    engine = make_engine(database_url)
    sessions = make_sessionmaker(engine)
    for _, store in _stores(tmp_path, sessions):
        path, digest, _ = write_temp_file(tmp_path / "tmp", b"rolled back")

        def put_then_fail(store: object = store, path: Path = path, digest: str = digest) -> None:
            with sessions.begin() as session:
                assert store.put_file(path, digest, session=session) is True  # type: ignore[attr-defined]
                assert digest in _on_disk(store)
                raise RuntimeError("a failure after the put")

        with pytest.raises(RuntimeError, match="after the put"):
            put_then_fail()
        assert _on_disk(store) == set()
        assert not store.exists(digest)  # type: ignore[attr-defined]
        # a session closed without commit (no exception in a `begin` block) also ends it
        path, digest, _ = write_temp_file(tmp_path / "tmp", b"abandoned")
        session = sessions()
        session.begin()
        store.put_file(path, digest, session=session)  # type: ignore[attr-defined]
        session.close()
        assert _on_disk(store) == set()
        # committed: kept (for the database store, the row is the reference its cache needs)
        path, digest, _ = write_temp_file(tmp_path / "tmp", b"committed")
        with sessions.begin() as session:
            store.put_file(path, digest, session=session)  # type: ignore[attr-defined]
        assert store.exists(digest)  # type: ignore[attr-defined]
    engine.dispose()


@pytest.mark.db
def test_a_rollback_keeps_a_blob_another_open_transaction_has_put(
    tmp_path: Path, database_url: str
) -> None:
    """Two transactions put the same content; the first rolls back while the second is open:
    the file stays for the second, and goes when the second rolls back too."""
    engine = make_engine(database_url)
    sessions = make_sessionmaker(engine)
    store = DirectoryBlobStore(tmp_path / "dir")
    first, second = sessions(), sessions()
    first.begin()
    second.begin()
    path, digest, _ = write_temp_file(tmp_path / "tmp", b"same bytes")
    assert store.put_file(path, digest, session=first) is True
    path, _, _ = write_temp_file(tmp_path / "tmp", b"same bytes")
    assert store.put_file(path, digest, session=second) is False
    first.rollback()
    assert store.exists(digest)
    second.rollback()
    assert not store.exists(digest)
    first.close()
    second.close()
    engine.dispose()


@pytest.mark.db
def test_sweep_removes_part_files_and_unreferenced_blobs_past_the_grace(
    tmp_path: Path, database_url: str
) -> None:
    engine = make_engine(database_url)
    sessions = make_sessionmaker(engine)
    store = DirectoryBlobStore(tmp_path / "dir")
    # an orphan (as a crash between rename and commit leaves it) and a stale staged file
    path, orphan, _ = write_temp_file(tmp_path / "tmp", b"orphan")
    store.put_file(path, orphan)
    stale = store.root / ".tmp" / "blob-x.part"
    stale.write_bytes(b"half")
    # a grace period that they are within keeps both
    report = store.sweep(sessions, older_than=time.time() - 3600)
    assert not report
    assert store.exists(orphan)
    assert stale.exists()
    report = store.sweep(sessions, older_than=time.time() + 1)
    assert report.orphan_blobs == [orphan]
    assert report.part_files == [stale]
    assert not store.exists(orphan)
    assert not stale.exists()
    engine.dispose()


@pytest.mark.db
def test_sweep_keeps_a_blob_an_open_transaction_is_putting(
    tmp_path: Path, database_url: str
) -> None:
    engine = make_engine(database_url)
    sessions = make_sessionmaker(engine)
    store = DirectoryBlobStore(tmp_path / "dir")
    with sessions.begin() as session:
        path, digest, _ = write_temp_file(tmp_path / "tmp", b"in flight")
        store.put_file(path, digest, session=session)
        assert not store.sweep(sessions, older_than=time.time() + 1)
        assert store.exists(digest)
    # committed without a row that references it: garbage, swept
    assert store.sweep(sessions, older_than=time.time() + 1).orphan_blobs == [digest]
    engine.dispose()


@pytest.mark.db
def test_discard_removes_an_unreferenced_blob_but_not_one_being_put(
    tmp_path: Path, database_url: str
) -> None:
    """A replaced initial model's blob goes; a transaction putting the same bytes keeps it."""
    engine = make_engine(database_url)
    sessions = make_sessionmaker(engine)
    for name, store in _stores(tmp_path, sessions):
        path, digest, _ = write_temp_file(tmp_path / "tmp", b"replaced " + name.encode())
        with sessions.begin() as session:
            store.put_file(path, digest, session=session)  # type: ignore[attr-defined]
        assert store.discard(digest, sessions) is True  # type: ignore[attr-defined]
        assert not store.exists(digest)  # type: ignore[attr-defined]
        assert store.discard(digest, sessions) is False  # type: ignore[attr-defined]
    directory = DirectoryBlobStore(tmp_path / "dir2")
    path, digest, _ = write_temp_file(tmp_path / "tmp", b"in flight")
    with sessions.begin() as session:
        directory.put_file(path, digest, session=session)
        assert directory.discard(digest, sessions) is False
        assert directory.exists(digest)
    engine.dispose()
