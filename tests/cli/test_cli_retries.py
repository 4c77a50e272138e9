"""The CLI says when it waits before retrying a request, instead of sitting silent."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from service.cli import app


class _Busy(BaseHTTPRequestHandler):
    """Answers every request 429 with ``Retry-After: 0`` (a coordinator slowing a client)."""

    def do_GET(self) -> None:
        body = b'{"type": "about:blank", "title": "Too Many Requests", "status": 429}'
        self.send_response(429)
        self.send_header("Content-Type", "application/problem+json")
        self.send_header("Retry-After", "0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
        return


@pytest.fixture
def busy_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Busy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_each_wait_before_a_retry_is_announced(busy_url: str) -> None:
    result = CliRunner().invoke(app, ["federation", "list", "--url", busy_url, "--token", "t"])
    text = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    assert "waiting: retrying GET /api/v1/federations" in text
    assert "(answer 429; attempt 1 of 2)" in text
    assert "(answer 429; attempt 2 of 2)" in text
    assert "error: 429" in text
