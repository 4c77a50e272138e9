"""What a failed connection to the coordinator means: a cause in a few words, and whether trying
again can help.

Connection refused, a time-out, a reset or a host name that does not resolve can pass (the
coordinator restarts, the network comes back): the SDK retries them. A TLS handshake that fails
(an ``https://`` URL to a coordinator serving plain http, a certificate the SDK does not trust)
or an answer that is not HTTP at all stays the same however often it is tried: the SDK raises
`ProtocolMismatchError` at once, with what to check.

The reverse mismatch, an ``http://`` URL to a coordinator serving https, looks like an outage:
the server closes (or resets) the connection without answering. When that happens to an
``http://`` URL, `describe` checks once whether the host and port speak TLS: a TCP connect and
a TLS handshake (certificate not verified, a 2 s time-out per step), closed as soon as it
completes, nothing else sent. A completed handshake makes it a mismatch; a probe that fails in
any way (refused, timed out, not TLS) leaves it an outage, retried as before.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass

import httpx

# OpenSSL's reasons when the other side of a TLS handshake does not speak TLS (an http server
# answered the ClientHello); OpenSSL 3.2 says "record layer failure" where 3.0 says "wrong
# version number".
_NOT_TLS = frozenset(
    {"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "UNKNOWN_PROTOCOL"}
)
# h11's words for an answer that is not an HTTP response at all (a TLS alert is "illegal
# request line": its first byte is a control character).
_NOT_HTTP = ("illegal status line", "illegal request line", "illegal header line", "no response")
# How long the TLS probe of an http:// URL's host waits for the connect and each handshake step.
_PROBE_TIMEOUT_S = 2.0
_PLAIN_HINT = (
    "a coordinator started without --tls-cert/--tls-key serves plain http: use an http:// URL "
    "(e.g. on loopback), or give the coordinator a certificate and keep https://"
)


@dataclass(frozen=True)
class TransportFailure:
    """``cause``: what went wrong, in a few words; ``hint``: what to check, set only when
    trying again cannot help."""

    cause: str
    hint: str | None = None


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from (httpx -> httpcore -> ssl/OSError)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not e for e in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _tls_failure(error: ssl.SSLError, origin: str) -> TransportFailure | None:
    if isinstance(error, ssl.SSLCertVerificationError):
        return TransportFailure(
            f"the TLS certificate of {origin} was not accepted "
            f"({error.verify_message or error.reason})",
            "a coordinator with its own CA needs ca_file= (the CA's PEM file); the URL's host "
            "must be a name the certificate was issued for",
        )
    if isinstance(error, ssl.SSLEOFError | ssl.SSLZeroReturnError):
        return None  # the connection was cut during the handshake: it may pass
    reason = str(error.reason or error)
    if reason in _NOT_TLS:
        return TransportFailure(
            f"the TLS handshake with {origin} failed ({reason.lower().replace('_', ' ')}): "
            "the server there does not speak https",
            _PLAIN_HINT,
        )
    return TransportFailure(
        f"the TLS handshake with {origin} failed ({reason.lower().replace('_', ' ')})",
        "check the URL's scheme (http:// or https://), ca_file= and, when the coordinator "
        "asks for client certificates, client_cert=",
    )


def describe(exc: httpx.TransportError, url: httpx.URL | str) -> TransportFailure:
    """Why the request to ``url`` failed, and whether it is worth trying again. An ``http://``
    URL whose server closed the connection without answering is probed for TLS
    (`_speaks_tls`): this one case may open a connection, of at most a few seconds."""
    url = httpx.URL(url)
    origin = f"{url.scheme}://{url.netloc.decode('ascii', 'replace')}"
    chain = _chain(exc)
    for error in chain:
        if isinstance(error, ssl.SSLError):
            tls = _tls_failure(error, origin)
            if tls is not None:
                return tls
    if isinstance(exc, httpx.UnsupportedProtocol):
        return TransportFailure(
            f"the URL {str(url)!r} does not start with http:// or https://",
            "give the coordinator's URL with its scheme, e.g. http://127.0.0.1:8000",
        )
    message = str(exc)
    if isinstance(exc, httpx.RemoteProtocolError) and message.startswith(_NOT_HTTP):
        return TransportFailure(
            f"the server at {origin} does not answer in HTTP ({message})",
            "check the URL's host and port; a coordinator serving https needs an https:// URL",
        )
    if url.scheme == "http" and _closed_unanswered(exc, chain) and _speaks_tls(url):
        return TransportFailure(
            f"the server at {origin} closed the connection without answering: it speaks https",
            "use an https:// URL (with ca_file= when its certificate comes from your own CA)",
        )
    return TransportFailure(_transient_cause(exc, chain, url, origin))


def _closed_unanswered(exc: httpx.TransportError, chain: list[BaseException]) -> bool:
    """The server closed the connection with no answer, or reset it once the request was sent
    (not while connecting): what a TLS server does with a plain-http request."""
    if isinstance(exc, httpx.RemoteProtocolError):
        return "without sending a response" in str(exc)
    return not isinstance(exc, httpx.ConnectError) and any(
        isinstance(e, ConnectionResetError) for e in chain
    )


def _speaks_tls(url: httpx.URL, timeout: float = _PROBE_TIMEOUT_S) -> bool:
    """Whether a TLS handshake with ``url``'s host and port completes (certificate not verified,
    SNI = the host); the connection is closed right after it, nothing else is sent."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        host = url.raw_host.decode("ascii")  # IDNA-encoded; an IPv6 address without brackets
        with (
            socket.create_connection((host, url.port or 80), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return True
    except (OSError, ValueError):  # refused, timed out, not TLS (ssl.SSLError is an OSError)
        return False


def _transient_cause(
    exc: httpx.TransportError, chain: list[BaseException], url: httpx.URL, origin: str
) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"{origin} did not answer in time"
    if any(isinstance(e, ConnectionRefusedError) for e in chain):
        return f"connection refused by {origin}"
    if any(isinstance(e, socket.gaierror) for e in chain):
        return f"the host name {url.host!r} could not be resolved"
    if any(isinstance(e, ConnectionResetError) for e in chain):
        return f"{origin} reset the connection"
    if isinstance(exc, httpx.RemoteProtocolError) and "without sending a response" in str(exc):
        return f"{origin} closed the connection without answering"
    return str(exc) or type(exc).__name__
