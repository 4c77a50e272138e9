"""uvicorn's httptools protocol with a cap on a request's head.

``fedaudit serve`` parses HTTP with httptools (faster than h11: docs/performance.md). uvicorn's
h11 backend refuses a request line and headers past 16 KiB; its httptools backend has no such cap,
so a client could make the coordinator hold megabytes of headers per connection before any route
or authentication runs (an 8 MiB header was accepted). :class:`BoundedHttpToolsProtocol` counts
the bytes received while a request's head is incomplete and, past :data:`MAX_HEAD_BYTES`, answers
``431 Request Header Fields Too Large`` (problem+json) and closes the connection. The count is
checked after each chunk the event loop hands over, so what is held stays below the cap plus one
read (64 KiB with asyncio and uvloop).

Import this module only where httptools is installed (:func:`service.cli.server.server_stack`).
"""

from __future__ import annotations

import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEAD_BYTES = 64 * 1024
"""The most bytes of a request line and headers a request may take (h11's cap is 16 KiB; a
fedaudit request's head is well under 2 KiB)."""

_PROBLEM = json.dumps(
    {
        "type": "/problems/request-head-too-large",
        "title": "Request Header Fields Too Large",
        "status": 431,
        "detail": f"the request line and headers exceed {MAX_HEAD_BYTES} bytes",
    }
).encode()


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """:class:`HttpToolsProtocol` that refuses a request head past :data:`MAX_HEAD_BYTES`."""

    _in_head = False
    _head_bytes = 0
    _refused = False

    def on_message_begin(self) -> None:
        """A request begins: its head is being received."""
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        """The head is complete: stop counting."""
        self._in_head = False
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        """Parse ``data``; refuse the request when its head has grown past the cap."""
        if self._refused:
            return
        super().data_received(data)
        if self._in_head:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._refuse()

    def _refuse(self) -> None:
        self._refused = True
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            b"content-type: application/problem+json\r\n"
            b"content-length: " + str(len(_PROBLEM)).encode("ascii") + b"\r\n"
            b"connection: close\r\n\r\n" + _PROBLEM
        )
        self.transport.close()
