"""A wrong URL or a TLS mismatch is named and not retried; an outage is retried and its cause
named. Every server here is real and on loopback: the coordinator in its own process (plain
http, as the quickstart serves it), a TLS server whose certificate the SDK does not trust, a TCP
server that answers in something other than HTTP, a port nobody listens on."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trustme

from client_sdk import (
    AdminClient,
    APIConnectionError,
    FederationClient,
    Participant,
    ProtocolMismatchError,
)
from fedaudit_sim.coordinator_process import CoordinatorProcess, free_port
from tests.client_sdk.test_lost_answer import tiny_data, tiny_model

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


class TooManyWaits(Exception):
    """Raised by the test's sleep: the participant kept waiting where it should have stopped."""


def stop_after(waits: int, seen: list[float]) -> Callable[[float], None]:
    def sleep(seconds: float) -> None:
        seen.append(seconds)
        if len(seen) >= waits:
            raise TooManyWaits(seen)

    return sleep


@contextmanager
def tcp_server(answer: bytes, context: ssl.SSLContext | None = None) -> Iterator[list[int]]:
    """A loopback TCP server: each connection (TLS-wrapped when `context` is given) reads what
    comes and writes `answer`; yields [port, connections accepted]."""
    listener = socket.create_server(("127.0.0.1", 0))
    state = [listener.getsockname()[1], 0]

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            state[1] += 1
            with conn:
                try:
                    stream = context.wrap_socket(conn, server_side=True) if context else conn
                    stream.recv(65536)
                    stream.sendall(answer)
                    stream.close()
                except (OSError, ssl.SSLError):
                    pass  # the client gave up on the handshake

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() on Linux
        listener.close()
        thread.join(timeout=5)


def test_https_to_the_plain_http_coordinator_stops_the_site_at_once(tmp_path: Path) -> None:
    with (
        CoordinatorProcess(tmp_path / "coord") as server,
        AdminClient(server.url, server.admin_token) as admin,
    ):
        federation = admin.create_federation(
            {
                "name": "tls-mismatch",
                "task": {"num_classes": 2, "input_shape": [4]},
                "plan": {"rounds": 1, "min_clients": 1},
                "config": {"method": "fedavg"},
            }
        )
        token = admin.add_client(federation.id, "site-a").token
        https_url = f"https://127.0.0.1:{server.port}"  # README's old snippet, on loopback
        lines: list[str] = []
        waits: list[float] = []
        with FederationClient(https_url, token, sleep=stop_after(1, [])) as client:
            participant = Participant(
                client,
                federation.id,
                tiny_model(),
                tiny_data(),
                device="cpu",
                sleep=stop_after(3, waits),
                progress=lines.append,
            )
            with pytest.raises(ProtocolMismatchError) as raised:
                participant.run()
    error = raised.value
    assert waits == []  # no outage waited out, no retry of the client's own
    assert "wrong version number" in error.cause or "record layer failure" in error.cause
    assert f"https://127.0.0.1:{server.port}" in error.cause
    assert "http://" in error.hint
    assert "Check: " in str(error)
    assert lines == []  # nothing said to be "unreachable"


def test_a_certificate_the_sdk_does_not_trust_is_named_and_not_retried() -> None:
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    client_sleeps: list[float] = []
    with tcp_server(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}", context) as server:
        url = f"https://127.0.0.1:{server[0]}"
        with (
            FederationClient(url, "token", max_retries=5, sleep=client_sleeps.append) as client,
            pytest.raises(ProtocolMismatchError) as raised,
        ):
            client.get_task("00000000-0000-0000-0000-000000000001")
        connections = server[1]
    assert connections == 1
    assert client_sleeps == []
    assert raised.value.cause.startswith(f"the TLS certificate of {url} was not accepted")
    assert "unable to get local issuer certificate" in raised.value.cause
    assert "ca_file=" in raised.value.hint
    assert isinstance(raised.value, APIConnectionError)  # what callers caught before


def test_a_server_that_does_not_speak_http_is_named_and_not_retried() -> None:
    client_sleeps: list[float] = []
    with tcp_server(b"SSH-2.0-OpenSSH_9.2\r\n\r\n") as server:
        url = f"http://127.0.0.1:{server[0]}"
        with (
            FederationClient(url, "token", max_retries=5, sleep=client_sleeps.append) as client,
            pytest.raises(ProtocolMismatchError) as raised,
        ):
            client.get_task("00000000-0000-0000-0000-000000000001")
        connections = server[1]
    assert connections == 1
    assert client_sleeps == []
    assert raised.value.cause == (
        f"the server at {url} does not answer in HTTP (illegal status line: "
        "bytearray(b'SSH-2.0-OpenSSH_9.2'))"
    )


def test_a_url_without_scheme_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(ValueError, match="must start with http:// or https://"):
        FederationClient("coordinator:8000", "token")


def test_an_outage_is_retried_and_its_cause_named() -> None:
    port = free_port()  # nobody listens there
    lines: list[str] = []
    waits: list[float] = []
    client_sleeps: list[float] = []
    with FederationClient(
        f"http://127.0.0.1:{port}", "token", max_retries=2, sleep=client_sleeps.append
    ) as client:
        participant = Participant(
            client,
            "00000000-0000-0000-0000-000000000001",
            tiny_model(),
            tiny_data(),
            device="cpu",
            sleep=stop_after(3, waits),
            progress=lines.append,
        )
        with pytest.raises(TooManyWaits):
            participant.run()
    assert waits == [1.0, 2.0, 4.0]
    assert len(client_sleeps) == 3 * 2  # the client's own two retries before each wait
    cause = f"connection refused by http://127.0.0.1:{port}"
    assert [line.split(" for ")[0] for line in lines] == ["coordinator unreachable"] * 3
    assert [line.split("; ")[1] for line in lines] == [
        "trying again in 1 s",
        "trying again in 2 s",
        "trying again in 4 s",
    ]
    assert all(f"({cause})" in line for line in lines)


SITE_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    from torch import nn
    from client_sdk import FederationClient, Participant
    from client_sdk.recipes import LocalData

    def stop(seconds):
        raise SystemExit(3)

    client = FederationClient(sys.argv[1], "token", max_retries=0)
    data = LocalData(inputs=torch.zeros(4, 2), labels=torch.tensor([0, 1, 0, 1]))
    Participant(
        client, "00000000-0000-0000-0000-000000000001", nn.Linear(2, 2), data, device="cpu",
        sleep=stop, progress=sys.argv[2] == "on",
    ).run()
    """
)


@pytest.mark.parametrize("progress", ["on", "off"])
def test_a_warning_is_printed_once_without_logging_configured(progress: str) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-c", SITE_SCRIPT, url, progress],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 3, done.stderr
    said = f"coordinator unreachable for 0 s (connection refused by {url}); trying again in 1 s"
    assert done.stderr.count(said) == 1, done.stderr
    assert done.stderr.count("unreachable") == 1, done.stderr
    assert done.stderr.startswith("fedaudit site: " if progress == "on" else said), done.stderr
