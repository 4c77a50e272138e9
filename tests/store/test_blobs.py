"""Content-addressed blob stores: atomic writes, both backends."""

from __future__ import annotations

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
