"""HTTP clients of the coordinator: `FederationClient` (a site); `AdminClient` (the operator)
lives in `client_sdk._admin` and shares the transport (`_Base`).

Both wrap an `httpx.Client` that is either given (and then left open) or owned (and closed by
`close()` / the context manager). Connection errors, 429 and 5xx are retried with exponential
backoff that honours ``Retry-After``; other errors raise the typed exceptions of
`client_sdk._exceptions` with the problem details attached.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import ssl
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, Self

import httpx

from client_sdk._exceptions import (
    APIConnectionError,
    APITimeoutError,
    ConflictError,
    FederationFailedError,
    IntegrityError,
    ProtocolMismatchError,
    status_error,
)
from client_sdk._responses import (
    CurrentRound,
    Diagnostics,
    JoinInfo,
    SiteTask,
    UpdateReceipt,
)
from client_sdk._transport_errors import describe

log = logging.getLogger("client_sdk")

API = "/api/v1"
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


def _tls_context(
    ca_file: str | os.PathLike[str] | None,
    client_cert: tuple[str | os.PathLike[str], str | os.PathLike[str]] | None,
) -> ssl.SSLContext | bool:
    """The TLS verification for an https coordinator: the system's trust store (True), or a
    context that trusts ``ca_file`` (a coordinator with its own CA) and presents ``client_cert``
    (certificate, key) when the coordinator requires mutual TLS."""
    if ca_file is None and client_cert is None:
        return True
    context = ssl.create_default_context(cafile=None if ca_file is None else os.fspath(ca_file))
    if client_cert is not None:
        certificate, key = client_cert
        context.load_cert_chain(os.fspath(certificate), os.fspath(key))
    return context


class _Base:
    def __init__(
        self,
        base_url: str | None = None,
        api_token: str | None = None,
        *,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        max_retries: int = 5,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        http_client: httpx.Client | None = None,
        token_env: str = "FEDAUDIT_TOKEN",
        sleep: Callable[[float], None] = time.sleep,
        ca_file: str | os.PathLike[str] | None = None,
        client_cert: tuple[str | os.PathLike[str], str | os.PathLike[str]] | None = None,
    ) -> None:
        base_url = base_url or os.environ.get("FEDAUDIT_URL")
        token = api_token or os.environ.get(token_env)
        if http_client is None and not base_url:
            raise ValueError("base_url is required (or set FEDAUDIT_URL)")
        if not token:
            raise ValueError(f"api_token is required (or set {token_env})")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if base_url and httpx.URL(base_url).scheme not in ("http", "https"):
            raise ValueError(f"base_url {base_url!r} must start with http:// or https://")
        if http_client is not None and (ca_file is not None or client_cert is not None):
            raise ValueError("ca_file and client_cert configure the SDK's own http client only")
        self._owns_client = http_client is None
        self._http = http_client or httpx.Client(
            base_url=base_url or "", timeout=timeout, verify=_tls_context(ca_file, client_cert)
        )
        self._headers = {"Authorization": f"Bearer {token}"}
        self.max_retries = max_retries
        self._backoff_base_s = backoff_base_s
        self._backoff_max_s = backoff_max_s
        self._sleep = sleep

    def close(self) -> None:
        if self._owns_client:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _delay(self, attempt: int, response: httpx.Response | None) -> float:
        if response is not None:
            retry_after = response.headers.get("retry-after")
            if retry_after is not None:
                try:
                    return min(max(float(retry_after), 0.0), self._backoff_max_s)
                except ValueError:
                    pass
        base: float = min(self._backoff_base_s * 2**attempt, self._backoff_max_s)
        return base * (0.5 + random.random() / 2)

    def _request(
        self,
        method: str,
        path: str,
        *,
        retry_status: bool = True,
        expected: tuple[int, ...] = (200, 201),
        **kwargs: Any,
    ) -> httpx.Response:
        """Send with retries; `retry_status=False` retries only what was surely never sent."""
        headers = {**self._headers, **kwargs.pop("headers", {})}
        attempt = 0
        while True:
            response: httpx.Response | None = None
            try:
                _rewind(kwargs)
                response = self._http.request(method, path, headers=headers, **kwargs)
            except httpx.TransportError as exc:
                self._raise_unless_retried(exc, method, path, attempt, retry_status)
            else:
                if response.status_code in expected:
                    return response
                if not (
                    retry_status
                    and response.status_code in RETRY_STATUSES
                    and attempt < self.max_retries
                ):
                    raise status_error(response)
            delay = self._delay(attempt, response)
            why = "no answer" if response is None else f"answer {response.status_code}"
            log.info(
                "retrying %s %s in %.2fs (%s; attempt %d of %d)",
                method,
                path,
                delay,
                why,
                attempt + 1,
                self.max_retries,
            )
            self._sleep(delay)
            attempt += 1

    def _raise_unless_retried(
        self, exc: httpx.TransportError, method: str, path: str, attempt: int, retry_status: bool
    ) -> None:
        """Raise the typed error for a failed send unless it is worth trying again: never for
        a TLS or protocol mismatch (`ProtocolMismatchError`), after ``max_retries`` for a
        connection refused or timed out, at once for a request that may have arrived when
        ``retry_status`` is False."""
        try:
            url = exc.request.url
        except RuntimeError:  # an exception raised without its request
            url = self._http.base_url.join(path)
        failure = describe(exc, url)
        tries = f"{attempt + 1} tr{'y' if attempt == 0 else 'ies'}"
        if failure.hint is not None:
            raise ProtocolMismatchError(
                f"{method} {url}: {failure.cause}. Check: {failure.hint}",
                request=_request_of(exc),
                cause=failure.cause,
                hint=failure.hint,
            ) from exc
        never_sent = isinstance(exc, httpx.ConnectError)
        if attempt >= self.max_retries or not (retry_status or never_sent):
            cls = APITimeoutError if isinstance(exc, httpx.TimeoutException) else APIConnectionError
            raise cls(
                f"{method} {url}: {failure.cause} ({tries}; {exc or type(exc).__name__})",
                request=_request_of(exc),
                cause=failure.cause,
            ) from exc


def _request_of(exc: httpx.TransportError) -> httpx.Request | None:
    try:
        return exc.request
    except RuntimeError:
        return None


def _rewind(kwargs: Mapping[str, Any]) -> None:
    """Seek file parts back to the start before a retry."""
    files = kwargs.get("files") or {}
    for value in files.values():
        if isinstance(value, tuple) and len(value) >= 2 and hasattr(value[1], "seek"):
            value[1].seek(0)


def join_path(federation_id: uuid.UUID | str) -> str:
    """Where a site's join goes (``POST``)."""
    return f"{API}/federations/{federation_id}/join"


def join_body(num_samples: int, class_counts: Sequence[int | None]) -> dict[str, Any]:
    """The JSON body of a join, exactly as :meth:`FederationClient.join` sends it."""
    return {"num_samples": num_samples, "class_counts": list(class_counts)}


def update_path(federation_id: uuid.UUID | str, round_index: int) -> str:
    """Where a round's update goes (``POST``, multipart: ``metadata`` and ``state``)."""
    return f"{API}/federations/{federation_id}/rounds/{round_index}/updates"


def _sha256_of(state: bytes | IO[bytes]) -> str:
    if isinstance(state, bytes):
        return hashlib.sha256(state).hexdigest()
    position = state.tell()
    hasher = hashlib.sha256()
    for chunk in iter(lambda: state.read(1024 * 1024), b""):
        hasher.update(chunk)
    state.seek(position)
    return hasher.hexdigest()


def update_metadata(
    state: bytes | IO[bytes],
    *,
    num_samples: int,
    signals: Mapping[str, Any],
    metrics: Mapping[str, float | None] | None = None,
) -> dict[str, Any]:
    """The ``metadata`` part of an update, exactly as :meth:`FederationClient.submit_update`
    sends it (as JSON): ``num_samples``, the state's ``sha256``, ``signals`` and ``metrics``.
    ``Participant.preview`` shows the same dict."""
    return {
        "num_samples": num_samples,
        "sha256": _sha256_of(state),
        "signals": dict(signals),
        "metrics": dict(metrics or {}),
    }


class FederationClient(_Base):
    """What a site (a hospital) does: join, ask what to do, download models, submit updates."""

    def __init__(self, base_url: str | None = None, api_token: str | None = None, **kwargs: Any):
        super().__init__(base_url, api_token, **kwargs)

    def get_task(self, federation_id: uuid.UUID | str) -> SiteTask:
        """The federation's task: number of classes, input shape, class names, and the
        signal privacy policy the site's join and updates must obey."""
        response = self._request("GET", f"{API}/federations/{federation_id}/task")
        return SiteTask.model_validate(response.json())

    def join(
        self,
        federation_id: uuid.UUID | str,
        *,
        num_samples: int,
        class_counts: Sequence[int | None],
    ) -> JoinInfo:
        response = self._request(
            "POST", join_path(federation_id), json=join_body(num_samples, class_counts)
        )
        return JoinInfo.model_validate(response.json())

    def get_diagnostics(self, federation_id: uuid.UUID | str) -> Diagnostics:
        """This site's own verdict: its status, flagged rounds, noisy classes and advice."""
        response = self._request("GET", f"{API}/federations/{federation_id}/diagnostics")
        return Diagnostics.model_validate(response.json())

    def get_current_round(
        self, federation_id: uuid.UUID | str, *, wait_s: float = 0.0
    ) -> CurrentRound:
        """The open round and this client's instructions, or wait, or finished.

        `wait_s` long-polls: the coordinator answers as soon as there is something to do.
        """
        try:
            response = self._request(
                "GET",
                f"{API}/federations/{federation_id}/rounds/current",
                params={"wait_s": wait_s},
                timeout=httpx.Timeout(wait_s + 60.0, connect=10.0),
            )
        except ConflictError as exc:
            if exc.problem is not None and exc.problem.type == "/problems/federation-state":
                raise FederationFailedError(exc.problem.detail or str(exc)) from exc
            raise
        return CurrentRound.model_validate(response.json())

    def download_model(
        self,
        model_id: uuid.UUID | str,
        *,
        expected_sha256: str | None = None,
        if_none_match: str | None = None,
    ) -> bytes | None:
        """The model's safetensors bytes, checked against their sha256; None on 304."""
        headers = {"If-None-Match": f'"{if_none_match}"'} if if_none_match else {}
        response = self._request(
            "GET", f"{API}/models/{model_id}", headers=headers, expected=(200, 304)
        )
        if response.status_code == 304:
            return None
        data = response.content
        digest = hashlib.sha256(data).hexdigest()
        announced = response.headers.get("x-content-sha256") or response.headers.get(
            "etag", ""
        ).strip('"')
        for label, want in (("expected", expected_sha256), ("announced", announced)):
            if want and want != digest:
                raise IntegrityError(
                    f"model {model_id}: sha256 {digest} does not match the {label} {want}"
                )
        return data

    def submit_update(
        self,
        federation_id: uuid.UUID | str,
        round_index: int,
        *,
        state: bytes | IO[bytes],
        num_samples: int,
        signals: Mapping[str, Any],
        metrics: Mapping[str, float | None] | None = None,
        idempotency_key: str | None = None,
    ) -> UpdateReceipt:
        """Upload theta_k and the signals; retried uploads with the same key are safe."""
        metadata = update_metadata(state, num_samples=num_samples, signals=signals, metrics=metrics)
        digest = metadata["sha256"]
        key = idempotency_key or f"{round_index}-{digest}"
        response = self._request(
            "POST",
            update_path(federation_id, round_index),
            headers={"Idempotency-Key": key},
            files={
                "metadata": (None, json.dumps(metadata), "application/json"),
                "state": ("state.safetensors", state, "application/octet-stream"),
            },
        )
        return UpdateReceipt.model_validate(response.json())

    def report_error(
        self,
        federation_id: uuid.UUID | str,
        round_index: int,
        *,
        stage: str,
        error_type: str,
        message: str,
    ) -> bool:
        """Tell the coordinator this site failed a round (a ``site.error`` event); True when
        recorded. The message loses its control characters (but tab and line breaks) and is
        cut to the coordinator's limit."""
        response = self._request(
            "POST",
            f"{API}/federations/{federation_id}/rounds/{round_index}/error",
            json={
                "stage": stage,
                "error_type": _printable(error_type, line=True)[:200] or "Exception",
                "message": _printable(message)[:MAX_ERROR_CHARS] or error_type or "(no message)",
            },
            retry_status=False,
            expected=(202,),
        )
        return bool(response.json().get("recorded"))


MAX_ERROR_CHARS = 2000
"""The longest error message the coordinator records."""
_CONTROL = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
_LINE_CONTROL = re.compile("[\t\n\r]")


def _printable(text: str, *, line: bool = False) -> str:
    """`text` without the characters the coordinator refuses in free text (names: one line)."""
    cleaned = _CONTROL.sub("?", text)
    if line:
        cleaned = _LINE_CONTROL.sub(" ", cleaned)
    return cleaned.strip()
