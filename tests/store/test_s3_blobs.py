"""The S3 blob store's own checks, against moto's S3 server over HTTP on loopback.

What every backend shares (content addressing, rollback removal, discard, the sweep) is tested
on this store too, in test_blobs.py. Here: what only a remote store can get wrong.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.coordinator.resources import blob_store
from service.errors import BlobStoreUnavailableError, MissingExtraError
from service.store.blobs import CorruptBlobError, write_temp_file
from service.store.s3blobs import S3BlobStore, S3Location
from service.store.session import make_engine, make_sessionmaker
from tests.s3 import bucket_names, raw_client, s3_settings

pytestmark = pytest.mark.db


@pytest.fixture
def sessions(database_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(database_url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture
def store(s3_location: S3Location, tmp_path: Path) -> S3BlobStore:
    return S3BlobStore.connect(s3_location, tmp_path / "cache")


def test_a_failed_transaction_leaves_no_object(
    store: S3BlobStore, s3_location: S3Location, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    path, key, _ = write_temp_file(tmp_path / "tmp", b"an update that will not commit")

    def put_then_fail() -> None:
        with sessions.begin() as session:
            store.put_file(path, key, session=session)
            assert bucket_names(s3_location) == {f"blobs/{key}"}
            raise RuntimeError("the row could not be written")

    with pytest.raises(RuntimeError, match="row could not"):
        put_then_fail()
    assert bucket_names(s3_location) == set()
    assert list(store.cache.keys()) == []
    assert list((store.cache.root / ".tmp").iterdir()) == []


def test_sweep_removes_an_orphan_and_leaves_other_objects_alone(
    store: S3BlobStore, s3_location: S3Location, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    """An object no row references (a crash between the PUT and the commit) goes; objects
    whose names are not blob keys, or outside the prefix, stay."""
    path, orphan, _ = write_temp_file(tmp_path / "tmp", b"orphan")
    store.put_file(path, orphan)  # no session: as a crash leaves it
    client = raw_client(s3_location)
    foreign = {"blobs/README.txt", f"elsewhere/{orphan}", f"blobs/sub/{orphan}"}
    for name in foreign:
        client.put_object(Bucket=s3_location.bucket, Key=name, Body=b"not fedaudit's")
    report = store.sweep(sessions, older_than=time.time() + 2)
    assert report.orphan_blobs == [orphan]
    assert bucket_names(s3_location) == foreign
    assert not store.cache.exists(orphan)


def test_putting_an_existing_object_again_renews_it_for_the_sweep(
    store: S3BlobStore, s3_location: S3Location, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    """A put of bytes already stored touches the object (S3 times are whole seconds), so a
    sweep with a grace period, on another replica, keeps it for the transaction that uses it."""
    path, key, _ = write_temp_file(tmp_path / "tmp", b"the same model")
    assert store.put_file(path, key) is True
    first = raw_client(s3_location).head_object(Bucket=store.bucket, Key=f"blobs/{key}")
    time.sleep(2.1)
    again, _, _ = write_temp_file(tmp_path / "tmp", b"the same model")
    assert store.put_file(again, key) is False
    # a sweep whose grace period the first write is past, the second within
    report = store.sweep(sessions, older_than=first["LastModified"].timestamp() + 1)
    assert not report
    assert store.exists(key)


def test_a_corrupted_object_is_refused_on_read(
    store: S3BlobStore, s3_location: S3Location, tmp_path: Path
) -> None:
    """An object overwritten behind the store's back: its content no longer hashes to its key,
    and nothing of it reaches the cache."""
    path, key, _ = write_temp_file(tmp_path / "tmp", b"the real model")
    store.put_file(path, key)
    raw_client(s3_location).put_object(
        Bucket=s3_location.bucket, Key=f"blobs/{key}", Body=b"tampered with"
    )
    reader = S3BlobStore.connect(s3_location, tmp_path / "another-cache")  # nothing cached
    with pytest.raises(CorruptBlobError, match=f"blob {key} in s3://.* is corrupt"):
        reader.local_path(key)
    assert list(reader.cache.keys()) == []
    assert list((reader.cache.root / ".tmp").iterdir()) == []


def test_put_refuses_a_file_that_is_not_its_key(
    store: S3BlobStore, s3_location: S3Location, tmp_path: Path
) -> None:
    path, key, _ = write_temp_file(tmp_path / "tmp", b"these bytes")
    path.write_bytes(b"other bytes")
    with pytest.raises(CorruptBlobError, match="its sha256 is"):
        store.put_file(path, key)
    assert bucket_names(s3_location) == set()


def test_a_missing_object_is_file_not_found(store: S3BlobStore) -> None:
    key = "0" * 64
    assert not store.exists(key)
    with pytest.raises(FileNotFoundError, match=key):
        store.local_path(key)
    with pytest.raises(FileNotFoundError, match=key):
        store.size(key)
    with pytest.raises(ValueError, match="invalid blob key"):
        store.exists("../" + key)


def test_start_up_refuses_a_missing_bucket_or_an_unreachable_server(
    s3_location: S3Location, tmp_path: Path
) -> None:
    missing = S3Location(**{**s3_location.__dict__, "bucket": "no-such-bucket-here"})
    with pytest.raises(BlobStoreUnavailableError, match="no-such-bucket-here.*does not exist"):
        S3BlobStore.connect(missing, tmp_path / "cache")
    closed = S3Location(**{**s3_location.__dict__, "endpoint_url": "http://127.0.0.1:9"})
    with pytest.raises(BlobStoreUnavailableError, match="not reachable"):
        S3BlobStore.connect(closed, tmp_path / "cache")


def test_start_up_without_boto3_names_the_extra(
    settings: Settings,
    s3_location: S3Location,
    sessions: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # an import of it fails
    with pytest.raises(MissingExtraError, match=r"pip install 'fedaudit\[s3\]'"):
        blob_store(s3_settings(settings, s3_location), sessions)


def test_the_settings_of_the_s3_backend(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="FEDAUDIT_S3_BUCKET must be set"):
        Settings(_env_file=None, data_dir=tmp_path, blob_backend="s3")
    with pytest.raises(ValidationError, match="at most 5 GiB"):
        Settings(
            _env_file=None,
            data_dir=tmp_path,
            blob_backend="s3",
            s3_bucket="b",
            max_upload_bytes=6 * 1024**3,
        )
    settings = Settings(_env_file=None, data_dir=tmp_path, blob_backend="s3", s3_bucket="b")
    assert settings.startup_sweep_grace_s == 3600  # the bucket is shared by the replicas
    assert settings.s3_prefix == "blobs/"
    explicit = Settings(
        _env_file=None,
        data_dir=tmp_path,
        blob_backend="s3",
        s3_bucket="b",
        startup_sweep_grace_s=0,
    )
    assert explicit.startup_sweep_grace_s == 0
    assert Settings(_env_file=None, data_dir=tmp_path).startup_sweep_grace_s == 0


def test_the_prefix_is_normalised() -> None:
    assert S3Location(bucket="b", prefix="/a/b").key_prefix == "a/b/"
    assert S3Location(bucket="b", prefix="").key_prefix == ""
    assert str(S3Location(bucket="b", endpoint_url="http://minio:9000")) == (
        "s3://b/blobs/ at http://minio:9000"
    )


def test_serve_refuses_to_start_and_says_why(
    tmp_path: Path, s3_location: S3Location, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fedaudit serve` with the s3 backend: a missing bucket, or boto3 missing, is one error
    line naming the cause, with no traceback and no credential in it."""
    from typer.testing import CliRunner

    from service.cli import app
    from service.config import get_settings

    runner = CliRunner()
    env = {
        "FEDAUDIT_DATA_DIR": str(tmp_path / "data"),
        "FEDAUDIT_ADMIN_TOKEN": "t" * 20,
        "FEDAUDIT_BLOB_BACKEND": "s3",
        "FEDAUDIT_S3_BUCKET": "not-created-yet",
        "FEDAUDIT_S3_ENDPOINT_URL": str(s3_location.endpoint_url),
        "FEDAUDIT_S3_REGION": str(s3_location.region),
        "FEDAUDIT_S3_ADDRESSING_STYLE": "path",
    }
    get_settings.cache_clear()
    try:
        assert runner.invoke(app, ["db", "upgrade"], env=env).exit_code == 0
        get_settings.cache_clear()
        refused = runner.invoke(app, ["serve", "--port", "0"], env=env)
        assert refused.exit_code == 1
        output = " ".join(refused.output.split())
        assert "not-created-yet" in output
        assert "does not exist (create it first)" in output
        assert "Traceback" not in output
        assert "fedaudit-test-secret" not in output
        get_settings.cache_clear()
        monkeypatch.setitem(sys.modules, "boto3", None)
        refused = runner.invoke(app, ["serve", "--port", "0"], env=env)
        assert refused.exit_code == 1
        assert "pip install 'fedaudit[s3]'" in " ".join(refused.output.split())
    finally:
        get_settings.cache_clear()


def test_debug_logs_leave_boto3_at_info() -> None:
    """boto3 logs request headers (the signed Authorization among them) at DEBUG: a
    coordinator run at DEBUG keeps boto3's loggers at INFO, and a quieter level as it is."""
    from service.logs import log_config

    loggers = log_config("DEBUG", "text")["loggers"]
    assert {loggers[name]["level"] for name in ("boto3", "botocore", "s3transfer")} == {"INFO"}
    assert log_config("WARNING", "json")["loggers"]["botocore"]["level"] == "WARNING"
