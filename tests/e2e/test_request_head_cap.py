"""The httptools protocol ``fedaudit serve`` runs refuses a request head past its cap (431,
problem+json, connection closed), as uvicorn's h11 backend does at 16 KiB; a normal request and
a head just under the cap are served. A real uvicorn server on loopback, raw sockets."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from service.http_protocol import MAX_HEAD_BYTES, BoundedHttpToolsProtocol
from tests.e2e.test_tls import free_port


async def hello(request: Request) -> JSONResponse:
    return JSONResponse({"header_bytes": len(request.headers.get("x-pad", ""))})


@pytest.fixture
def port() -> Iterator[int]:
    chosen = free_port()
    config = uvicorn.Config(
        Starlette(routes=[Route("/", hello)]),
        host="127.0.0.1",
        port=chosen,
        log_level="warning",
        http=BoundedHttpToolsProtocol,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "uvicorn exited during start-up"
        assert time.monotonic() < deadline, "uvicorn did not start in 30 s"
        time.sleep(0.02)
    yield chosen
    server.should_exit = True
    thread.join(timeout=30)


def _exchange(port: int, pieces: list[bytes]) -> bytes:
    """Send ``pieces`` one after the other; what the server answered until it closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            for piece in pieces:
                sock.sendall(piece)
                time.sleep(0.001)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed while the head was still coming: its answer is read below
        answer = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            answer += chunk
            if b"\r\n\r\n" in answer and b"connection: close" not in answer.lower():
                head, _, body = answer.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                if len(body) >= length:
                    break
    return answer


def _request(pad: int) -> bytes:
    return (
        b"GET / HTTP/1.1\r\nhost: test\r\nx-pad: " + b"a" * pad + b"\r\nconnection: close\r\n\r\n"
    )


def test_a_normal_request_and_a_head_under_the_cap_are_served(port: int) -> None:
    answer = _exchange(port, [_request(10)])
    assert answer.startswith(b"HTTP/1.1 200 ")
    big = _request(MAX_HEAD_BYTES - 200)
    answer = _exchange(port, [big[i : i + 8192] for i in range(0, len(big), 8192)])
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert json.loads(answer.partition(b"\r\n\r\n")[2]) == {"header_bytes": MAX_HEAD_BYTES - 200}


@pytest.mark.parametrize("piece", [8192, 65536])
def test_a_head_past_the_cap_is_refused_with_431(port: int, piece: int) -> None:
    huge = _request(4 * MAX_HEAD_BYTES)
    answer = _exchange(port, [huge[i : i + piece] for i in range(0, len(huge), piece)])
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 Request Header Fields Too Large")
    assert b"content-type: application/problem+json" in head
    problem = json.loads(body)
    assert problem["status"] == 431
    assert problem["type"] == "/problems/request-head-too-large"
