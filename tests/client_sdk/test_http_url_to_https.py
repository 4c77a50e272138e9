"""An ``http://`` URL to a coordinator that serves https (issue 21): the server closes the
connection without answering, the SDK's TLS probe finds https there and raises
`ProtocolMismatchError` at once. A plain server that closes or resets connections, or one that
never answers the probe, stays an outage and is retried. Every server is real and on loopback:
`fedaudit serve --tls-cert/--tls-key` in its own process, small socket servers in a thread."""

from __future__ import annotations

import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import trustme

from client_sdk import (
    AdminClient,
    APIConnectionError,
    FederationClient,
    Participant,
    ProtocolMismatchError,
)
from client_sdk._transport_errors import _chain, describe
from fedaudit_sim.coordinator_process import free_port
from tests.client_sdk.test_connection_causes import TooManyWaits, stop_after, tcp_server
from tests.client_sdk.test_lost_answer import tiny_data, tiny_model
from tests.e2e.test_tls import ADMIN_TOKEN, TLSFiles, serve, wait_until_listening

pytestmark = pytest.mark.slow
TASK = "00000000-0000-0000-0000-000000000001"
HINT = "use an https:// URL (with ca_file= when its certificate comes from your own CA)"


def server_context() -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    trustme.CA().issue_cert("127.0.0.1").configure_cert(context)
    return context


@contextmanager
def tls_or_reset_server(context: ssl.SSLContext) -> Iterator[list[int]]:
    """A loopback server that completes a TLS handshake with whoever starts one and resets any
    other connection once its request came (a TLS server that answers plain http with a reset);
    yields [port, handshakes begun, resets]."""
    listener = socket.create_server(("127.0.0.1", 0))
    state = [listener.getsockname()[1], 0, 0]

    def serve_one(conn: socket.socket) -> None:
        with conn:
            if conn.recv(1, socket.MSG_PEEK) == b"\x16":  # a TLS handshake record
                state[1] += 1
                context.wrap_socket(conn, server_side=True).close()
                return
            conn.recv(65536)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            state[2] += 1

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                serve_one(conn)
            except OSError:
                pass  # the client went away first

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() on Linux
        listener.close()
        thread.join(timeout=5)


def failure_of(url: str) -> httpx.TransportError:
    """The transport error of a real GET to `url`."""
    with pytest.raises(httpx.TransportError) as raised:
        httpx.get(url, timeout=5)
    return raised.value


def test_an_http_url_to_the_https_coordinator_stops_the_site_at_once(tmp_path: Path) -> None:
    tls = TLSFiles(tmp_path)
    args = ("--tls-cert", str(tls.cert), "--tls-key", str(tls.key))
    with serve(tmp_path, *args) as (process, port):
        wait_until_listening(port, process)
        https_url, http_url = f"https://127.0.0.1:{port}", f"http://127.0.0.1:{port}"
        with AdminClient(https_url, ADMIN_TOKEN, ca_file=tls.ca_pem) as admin:
            federation = admin.create_federation(
                {
                    "name": "http-to-https",
                    "task": {"num_classes": 2, "input_shape": [4]},
                    "plan": {"rounds": 1, "min_clients": 1},
                    "config": {"method": "fedavg"},
                }
            )
            token = admin.add_client(federation.id, "site-a").token
        lines: list[str] = []
        waits: list[float] = []
        started = time.monotonic()
        # the client's own retries sleep for real: at least 7.75 s for its 5 retries
        with FederationClient(http_url, token, max_retries=5) as client:
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
        elapsed = time.monotonic() - started
    error = raised.value
    assert elapsed < 5.0
    assert waits == []
    assert lines == []  # nothing said to be "unreachable"
    assert error.cause == (
        f"the server at {http_url} closed the connection without answering: it speaks https"
    )
    assert error.hint == HINT
    assert str(error).endswith(f": {error.cause}. Check: {HINT}")


def test_a_reset_from_a_tls_server_is_a_mismatch_too() -> None:
    with tls_or_reset_server(server_context()) as server:
        url = f"http://127.0.0.1:{server[0]}/"
        exc = failure_of(url)
        failure = describe(exc, url)
        handshakes, resets = server[1], server[2]
    assert isinstance(exc, httpx.ReadError)
    assert any(isinstance(e, ConnectionResetError) for e in _chain(exc))
    assert (handshakes, resets) == (1, 1)
    assert failure.cause == (
        f"the server at http://127.0.0.1:{server[0]} closed the connection without answering: "
        "it speaks https"
    )
    assert failure.hint == HINT


def test_a_plain_server_that_closes_without_answering_is_retried() -> None:
    client_sleeps: list[float] = []
    with tcp_server(b"") as server:  # reads the request, closes without a byte
        url = f"http://127.0.0.1:{server[0]}"
        with (
            FederationClient(url, "token", max_retries=2, sleep=client_sleeps.append) as client,
            pytest.raises(APIConnectionError) as raised,
        ):
            client.get_task(TASK)
        connections = server[1]
    assert not isinstance(raised.value, ProtocolMismatchError)
    assert len(client_sleeps) == 2
    assert connections == 3 * 2  # each of the 3 tries, then its TLS probe
    assert raised.value.cause == f"{url} closed the connection without answering"


def test_a_plain_server_that_closes_is_an_outage_for_the_participant() -> None:
    lines: list[str] = []
    waits: list[float] = []
    with (
        tcp_server(b"") as server,
        FederationClient(f"http://127.0.0.1:{server[0]}", "token", max_retries=0) as client,
    ):
        participant = Participant(
            client,
            TASK,
            tiny_model(),
            tiny_data(),
            device="cpu",
            sleep=stop_after(2, waits),
            progress=lines.append,
        )
        with pytest.raises(TooManyWaits):
            participant.run()
    assert waits == [1.0, 2.0]
    assert all("closed the connection without answering" in line for line in lines)


def test_a_probe_that_gets_no_answer_gives_up_and_leaves_it_an_outage() -> None:
    silent = socket.create_server(("127.0.0.1", 0))  # the kernel accepts; nobody answers
    url = f"http://127.0.0.1:{silent.getsockname()[1]}/"
    exc = httpx.RemoteProtocolError("Server disconnected without sending a response.")
    with silent:
        started = time.monotonic()
        failure = describe(exc, url)
        elapsed = time.monotonic() - started
    assert 1.5 < elapsed < 5.0  # the probe's 2 s time-out, then no more
    assert failure.hint is None
    assert failure.cause.endswith("closed the connection without answering")


def test_a_refused_probe_and_an_https_url_are_not_probed_into_a_mismatch() -> None:
    exc = httpx.RemoteProtocolError("Server disconnected without sending a response.")
    assert describe(exc, f"http://127.0.0.1:{free_port()}/").hint is None  # nobody listens
    with tcp_server(b"", server_context()) as server:
        # an https:// URL whose server closed the connection: no probe, an outage
        failure = describe(exc, f"https://127.0.0.1:{server[0]}/")
        connections = server[1]
    assert connections == 0
    assert failure.hint is None
