"""Blobs in an S3-compatible object store (AWS S3, MinIO, Ceph RGW, ...), through boto3.

boto3 comes with the optional extra ``fedaudit[s3]``; without it, `S3BlobStore.connect` raises
MissingExtraError naming that install. A blob is the object ``<prefix><key>`` of the bucket, its
key the sha256 of its content. The guarantees are the directory store's (service.store.blobs):

- sha256 checked: `put_file` hashes the file and refuses one whose digest is not its key, and
  sends the digest as the object's SHA-256 checksum, which the server checks against the body
  it receives; `local_path` hashes what it downloads and refuses (CorruptBlobError) an object
  whose content does not match its key.
- Atomic visibility: an object is written by one PUT of the whole file, and S3 shows an object
  only once its PUT is complete; no multipart upload, so nothing partial exists under any name.
  One PUT holds at most 5 GiB (`SINGLE_PUT_LIMIT`), the largest upload this backend accepts.
- Nothing orphaned: the transaction-ownership rules of TransactionOwnedBlobs (a blob put with
  a session is removed again when its transaction ends without a commit, unless a committed row
  or another open transaction of this process needs it; `discard`), and `sweep` removes the
  objects under the prefix that no row references and that were last written before its
  `older_than`. Putting an object that is already there renews its Last-Modified (a server-side
  copy onto itself), so that a sweep with a grace period, on another replica, keeps it.

Reads go through a local cache directory, as with the database store: `local_path` downloads
the object into a temporary file, checks its sha256 and renames it into place.

Credentials come from boto3's own chain (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``,
``AWS_PROFILE``, a web identity or an instance role): never a fedaudit setting, never logged.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, Literal

from sqlalchemy.orm import Session, sessionmaker

from service.errors import BlobStoreUnavailableError, MissingExtraError
from service.store.blobs import (
    CHUNK,
    CorruptBlobError,
    DirectoryBlobStore,
    References,
    SweepReport,
    TransactionOwnedBlobs,
    check_key,
    fill_cache,
    referenced_by_rows,
    sha256_file,
)

log = logging.getLogger(__name__)

SINGLE_PUT_LIMIT = 5 * 1024**3
"""The largest object one S3 PUT may write (5 GiB)."""
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 60.0
MAX_ATTEMPTS = 3
MAX_POOL_CONNECTIONS = 50
"""HTTP connections the client keeps (boto3's default, 10, is fewer than the requests the
server's thread pool may run at once: more would wait for one, and urllib3 would warn)."""
CONTENT_TYPE = "application/octet-stream"
AddressingStyle = Literal["auto", "path", "virtual"]


@dataclass(frozen=True)
class S3Location:
    """Where the blobs live: a bucket, a prefix in it, and the server (AWS S3 when
    `endpoint_url` is None)."""

    bucket: str
    prefix: str = "blobs/"
    endpoint_url: str | None = None
    region: str | None = None
    addressing_style: AddressingStyle = "auto"

    @property
    def key_prefix(self) -> str:
        """The prefix as object names start with it: no leading ``/``, one trailing ``/``."""
        prefix = self.prefix.strip("/")
        return f"{prefix}/" if prefix else ""

    def __str__(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"s3://{self.bucket}/{self.key_prefix}{where}"


def make_client(location: S3Location) -> Any:
    """A boto3 S3 client for `location` (thread-safe: one per process), with short connection
    time-outs and few retries."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:
        raise MissingExtraError(
            "the s3 blob backend needs boto3, which is not installed: pip install 'fedaudit[s3]'"
        ) from exc
    config = Config(
        s3={"addressing_style": location.addressing_style},
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        retries={"max_attempts": MAX_ATTEMPTS, "mode": "standard"},
        max_pool_connections=MAX_POOL_CONNECTIONS,
    )
    return boto3.session.Session().client(
        "s3",
        endpoint_url=location.endpoint_url,
        region_name=location.region,
        config=config,
    )


def _missing(exc: BaseException) -> bool:
    """An S3 error that says the object is not there (a missing bucket is not that)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return False
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in {"404", "NoSuchKey", "NotFound"} or (status == 404 and code != "NoSuchBucket")


def _is_key(name: str) -> bool:
    try:
        check_key(name)
    except ValueError:
        return False
    return True


def check_bucket(client: Any, location: S3Location) -> None:
    """BlobStoreUnavailableError unless the bucket answers (it exists, the credentials may
    read it)."""
    try:
        client.head_bucket(Bucket=location.bucket)
    except Exception as exc:
        if _missing(exc):
            reason = "the bucket does not exist (create it first)"
        else:
            reason = str(exc) or type(exc).__name__
        raise BlobStoreUnavailableError(
            f"the blob store {location} is not reachable: {reason}"
        ) from exc


class S3BlobStore(TransactionOwnedBlobs):
    """Blobs as objects ``<prefix><key>`` of an S3 bucket; reads through a local cache.

    `references`: which keys committed rows need (default: model updates and model versions).
    Use a bucket, or at least a prefix, of this federation network's own: the sweep removes
    every object under the prefix whose name is a sha256 that no row references.
    """

    def __init__(
        self,
        client: Any,
        location: S3Location,
        cache_dir: Path,
        *,
        references: References = referenced_by_rows,
    ) -> None:
        super().__init__(references)
        self.client = client
        self.location = location
        self.bucket = location.bucket
        self.prefix = location.key_prefix
        self.cache = DirectoryBlobStore(cache_dir, references=references)

    @classmethod
    def connect(cls, location: S3Location, cache_dir: Path) -> S3BlobStore:
        """The store at `location`, once its bucket has answered (a start-up check)."""
        client = make_client(location)
        check_bucket(client, location)
        log.info("model blobs in %s (local cache %s)", location, cache_dir)
        return cls(client, location, cache_dir)

    def _name(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _head(self, key: str) -> dict[str, Any] | None:
        try:
            head: dict[str, Any] = self.client.head_object(Bucket=self.bucket, Key=self._name(key))
        except Exception as exc:
            if _missing(exc):
                return None
            raise
        return head

    def _touch(self, key: str) -> bool:
        """Renew the object's Last-Modified (a copy onto itself); False if it is not there."""
        name = self._name(key)
        try:
            self.client.copy_object(
                Bucket=self.bucket,
                Key=name,
                CopySource={"Bucket": self.bucket, "Key": name},
                MetadataDirective="REPLACE",
                ContentType=CONTENT_TYPE,
                Metadata={"sha256": key},
            )
        except Exception as exc:
            if _missing(exc):
                return False
            raise
        return True

    def put_file(self, path: Path, key: str, *, session: Session | None = None) -> bool:
        name = self._name(key)
        digest = sha256_file(path)
        if digest != key:
            raise CorruptBlobError(
                f"refusing to store a file as blob {key}: its sha256 is {digest}"
            )
        size = path.stat().st_size
        if size > SINGLE_PUT_LIMIT:
            raise ValueError(f"blob {key} has {size} bytes; one S3 PUT holds at most 5 GiB")
        with self._lock:
            self._claim(key, session)
        # From here on, until the transaction ends, nothing in this process removes the object.
        created = not self._touch(key)
        if created:
            with path.open("rb") as body:
                self.client.put_object(
                    Bucket=self.bucket,
                    Key=name,
                    Body=body,
                    ContentLength=size,
                    ContentType=CONTENT_TYPE,
                    Metadata={"sha256": key},
                    ChecksumSHA256=base64.b64encode(bytes.fromhex(key)).decode("ascii"),
                )
        self.cache.put_file(path, key)  # the coordinator reads what it has just stored
        return created

    def _stored(self, key: str) -> bool:
        return self._head(key) is not None

    def _remove(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._name(key))
        self.cache.delete(key)

    def _written_before(self, key: str, older_than: float) -> bool:
        head = self._head(key)
        if head is None:
            return False
        modified: datetime = head["LastModified"]
        return modified.timestamp() < older_than

    def exists(self, key: str) -> bool:
        return self._stored(key)

    def size(self, key: str) -> int:
        head = self._head(key)
        if head is None:
            raise FileNotFoundError(f"blob {key} is missing from {self.location}")
        return int(head["ContentLength"])

    def local_path(self, key: str) -> Path:
        if self.cache.exists(key):
            return self.cache.local_path(key)
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._name(key))
        except Exception as exc:
            if _missing(exc):
                raise FileNotFoundError(f"blob {key} is missing from {self.location}") from None
            raise
        body = response["Body"]
        try:
            chunks: Iterator[bytes] = iter(lambda: body.read(CHUNK), b"")
            return fill_cache(self.cache, key, chunks, source=str(self.location))
        finally:
            body.close()

    def open(self, key: str) -> BinaryIO:
        return self.local_path(key).open("rb")

    def delete(self, key: str) -> None:
        self._remove(key)

    def keys(self) -> Iterator[tuple[str, float]]:
        """Every stored blob's key and last-written time (epoch seconds); other objects under
        the prefix are left alone."""
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix
        )
        for page in pages:
            for item in page.get("Contents", ()):
                key = str(item["Key"])[len(self.prefix) :]
                if _is_key(key):
                    yield key, item["LastModified"].timestamp()

    def sweep(self, sessions: sessionmaker[Session], *, older_than: float) -> SweepReport:
        """Remove the objects that no committed row needs, last written before `older_than`
        (epoch seconds, this machine's clock against the server's), and the cache's staged
        files and copies of blobs no row needs; objects a transaction of this process is
        still putting are kept."""
        candidates = [key for key, written in self.keys() if written < older_than]
        orphans = self._remove_orphans(sessions, candidates, older_than=older_than)
        cache = self.cache.sweep(sessions, older_than=older_than)
        return SweepReport(part_files=cache.part_files, orphan_blobs=orphans)
