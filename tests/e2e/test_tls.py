"""`fedaudit serve` speaks https itself, and mutual TLS when given a client CA (no proxy).

A throw-away CA (trustme) signs a certificate for 127.0.0.1; the real server runs in its own
process on a loopback port; the SDK trusts the CA with ``ca_file`` and presents a client
certificate with ``client_cert``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import trustme

from client_sdk import AdminClient, APIConnectionError

pytestmark = [pytest.mark.slow]

ADMIN_TOKEN = "tls-test-admin-token-0123456789"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TLSFiles:
    def __init__(self, root: Path) -> None:
        self.ca = trustme.CA()
        server = self.ca.issue_cert("127.0.0.1")
        client_ca = trustme.CA()  # a separate CA signs the sites' certificates
        site = client_ca.issue_cert("hospital-a.example")
        stranger = trustme.CA().issue_cert("stranger.example")
        self.ca_pem = root / "ca.pem"
        self.cert = root / "server.pem"
        self.key = root / "server.key"
        self.client_ca = root / "client-ca.pem"
        self.site_cert, self.site_key = root / "site.pem", root / "site.key"
        self.stranger_cert, self.stranger_key = root / "stranger.pem", root / "stranger.key"
        self.ca.cert_pem.write_to_path(str(self.ca_pem))
        server.private_key_pem.write_to_path(str(self.key))
        self.cert.write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems))
        client_ca.cert_pem.write_to_path(str(self.client_ca))
        site.private_key_pem.write_to_path(str(self.site_key))
        self.site_cert.write_bytes(b"".join(blob.bytes() for blob in site.cert_chain_pems))
        stranger.private_key_pem.write_to_path(str(self.stranger_key))
        self.stranger_cert.write_bytes(b"".join(b.bytes() for b in stranger.cert_chain_pems))


@pytest.fixture
def tls(tmp_path: Path) -> TLSFiles:
    return TLSFiles(tmp_path)


@contextmanager
def serve(tmp_path: Path, *args: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    env = {
        **os.environ,
        "FEDAUDIT_DATA_DIR": str(tmp_path / "data"),
        "FEDAUDIT_ADMIN_TOKEN": ADMIN_TOKEN,
        "FEDAUDIT_LOG_LEVEL": "WARNING",
    }
    env.pop("FEDAUDIT_DATABASE_URL", None)
    cli = [sys.executable, "-m", "service.cli"]
    subprocess.run([*cli, "db", "upgrade"], env=env, check=True, capture_output=True)
    port = free_port()
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen(
        [*cli, "serve", "--port", str(port), *args], env=env, stdout=log, stderr=log
    )
    try:
        yield process, port
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()  # a graceful shutdown waits for open connections
            process.wait(timeout=15)
        log.close()


def wait_until_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, "the server exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError("the server did not start listening")


def test_https_with_a_certificate_the_sdk_trusts(tmp_path: Path, tls: TLSFiles) -> None:
    with serve(tmp_path, "--tls-cert", str(tls.cert), "--tls-key", str(tls.key)) as (process, port):
        wait_until_listening(port, process)
        url = f"https://127.0.0.1:{port}"
        with AdminClient(url, ADMIN_TOKEN, ca_file=tls.ca_pem, max_retries=0) as admin:
            assert admin.list_federations() == []
        # without the coordinator's CA the SDK refuses the certificate
        with (
            AdminClient(url, ADMIN_TOKEN, max_retries=0) as untrusting,
            pytest.raises(APIConnectionError),
        ):
            untrusting.list_federations()
        # plain http to the https port gets no answer
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)


def test_mutual_tls_requires_a_client_certificate_from_the_ca(
    tmp_path: Path, tls: TLSFiles
) -> None:
    args = ("--tls-cert", str(tls.cert), "--tls-key", str(tls.key))
    with serve(tmp_path, *args, "--tls-client-ca", str(tls.client_ca)) as (process, port):
        wait_until_listening(port, process)
        url = f"https://127.0.0.1:{port}"
        with AdminClient(
            url,
            ADMIN_TOKEN,
            ca_file=tls.ca_pem,
            client_cert=(tls.site_cert, tls.site_key),
            max_retries=0,
        ) as site:
            assert site.list_federations() == []
        for cert in (None, (tls.stranger_cert, tls.stranger_key)):
            with (
                AdminClient(
                    url, ADMIN_TOKEN, ca_file=tls.ca_pem, client_cert=cert, max_retries=0
                ) as refused,
                pytest.raises(APIConnectionError),
            ):
                refused.list_federations()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--tls-cert", "{cert}"), "--tls-cert and --tls-key go together"),
        (("--tls-client-ca", "{ca}"), "--tls-client-ca needs --tls-cert and --tls-key"),
        (("--tls-cert", "{cert}", "--tls-key", "{missing}"), "no such file"),
        (("--tls-cert", "{key}", "--tls-key", "{key}"), "cannot load"),
    ],
)
def test_an_incomplete_tls_configuration_stops_serve_with_the_reason(
    tmp_path: Path, tls: TLSFiles, args: tuple[str, ...], message: str
) -> None:
    paths = {
        "cert": str(tls.cert),
        "key": str(tls.key),
        "ca": str(tls.client_ca),
        "missing": str(tmp_path / "nope.key"),
    }
    env = {**os.environ, "FEDAUDIT_DATA_DIR": str(tmp_path / "data")}
    result = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve", *(a.format(**paths) for a in args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert message in " ".join(result.stderr.split()), result.stderr
