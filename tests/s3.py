"""An S3-compatible server for the s3 blob backend's tests: moto's, over HTTP on loopback.

`s3_server` (session) starts moto's ``ThreadedMotoServer`` on 127.0.0.1 and a free port; each
test that asks for `s3_location` gets a bucket of its own there and credentials of its own in
the environment (never the machine's AWS configuration). Without moto or boto3, or when the
server cannot start, those tests are skipped and say why; ``FEDAUDIT_REQUIRE_S3=1`` (CI) makes
that a failure.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from service.config import Settings
from service.store.s3blobs import S3Location, make_client

REQUIRE_ENV = "FEDAUDIT_REQUIRE_S3"
REGION = "us-east-1"


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """The endpoint URL of moto's S3 server on loopback, for the whole session."""
    try:
        import boto3  # noqa: F401
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        _unavailable(f"the S3 tests need boto3 and moto[server] (the dev extra): {exc}")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    try:
        server.start()
        host, port = server.get_host_and_port()
    except Exception as exc:
        _unavailable(f"moto's S3 server could not start on 127.0.0.1: {exc!r}")
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_location(s3_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> S3Location:
    """A new, empty bucket on the loopback server, with throw-away credentials."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "fedaudit-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fedaudit-test-secret")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    location = S3Location(
        bucket=f"fedaudit-{uuid.uuid4().hex[:16]}",
        prefix="blobs/",
        endpoint_url=s3_server,
        region=REGION,
        addressing_style="path",
    )
    raw_client(location).create_bucket(Bucket=location.bucket)
    return location


def raw_client(location: S3Location) -> Any:
    """A client that goes behind the store's back (to list, overwrite or plant objects)."""
    return make_client(location)


def bucket_names(location: S3Location) -> set[str]:
    """Every object name in the bucket, under the prefix or not."""
    pages = raw_client(location).get_paginator("list_objects_v2").paginate(Bucket=location.bucket)
    return {item["Key"] for page in pages for item in page.get("Contents", ())}


def s3_settings(settings: Settings, location: S3Location) -> Settings:
    """`settings` with the s3 blob backend on `location`."""
    return settings.model_copy(
        update={
            "blob_backend": "s3",
            "s3_bucket": location.bucket,
            "s3_prefix": location.prefix,
            "s3_endpoint_url": location.endpoint_url,
            "s3_region": location.region,
            "s3_addressing_style": location.addressing_style,
        }
    )
