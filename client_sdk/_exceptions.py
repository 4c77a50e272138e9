"""Exceptions raised by the SDK.

    CoordinatorSDKError
    ├── APIConnectionError            the coordinator could not be reached (``cause`` says why)
    │   ├── APITimeoutError           ... or did not answer in time
    │   └── ProtocolMismatchError     something answers, but not as the URL says (TLS on one side
    │                                 only, an untrusted certificate, not HTTP): not retried
    ├── APIStatusError                the coordinator answered with an error status
    │   ├── BadRequestError           400
    │   ├── AuthenticationError       401
    │   ├── PermissionDeniedError     403
    │   ├── NotFoundError             404
    │   ├── ConflictError             409 (round closed, duplicate update, ...)
    │   ├── PayloadTooLargeError      413
    │   ├── UnprocessableEntityError  422 (update rejected, invalid model, ...)
    │   ├── RateLimitError            429
    │   └── InternalServerError       5xx
    ├── IntegrityError                downloaded bytes do not match their sha256
    ├── FederationFailedError         the federation stopped with an error
    └── SiteRoundError                this site could not do a round (reported to the coordinator)

Every `APIStatusError` carries `status_code`, the parsed RFC 9457 `problem` (when the body was
one) and the `response`.
"""

from __future__ import annotations

from typing import Any

import httpx

from client_sdk._responses import ProblemDetails


class CoordinatorSDKError(Exception):
    """Base of every SDK error."""


class APIConnectionError(CoordinatorSDKError):
    """The coordinator could not be reached; ``cause`` says why in a few words ("connection
    refused", "timed out", ...)."""

    def __init__(
        self, message: str, *, request: httpx.Request | None = None, cause: str | None = None
    ) -> None:
        super().__init__(message)
        self.request = request
        self.cause = cause or message


class APITimeoutError(APIConnectionError):
    pass


class ProtocolMismatchError(APIConnectionError):
    """Something answers at the coordinator's address, but not in the protocol its URL names:
    an ``https://`` URL to a coordinator serving plain http or an ``http://`` URL to one serving
    https (found by a TLS handshake when the server closed the connection without answering), a
    certificate the SDK does not trust, a server that does not speak HTTP. Trying again does not
    help, so the SDK does not retry it and a `Participant` stops; ``cause`` names what went wrong
    and ``hint`` what to check."""

    def __init__(
        self, message: str, *, request: httpx.Request | None = None, cause: str, hint: str
    ) -> None:
        super().__init__(message, request=request, cause=cause)
        self.hint = hint


class APIStatusError(CoordinatorSDKError):
    def __init__(
        self, message: str, *, response: httpx.Response, problem: ProblemDetails | None
    ) -> None:
        super().__init__(message)
        self.response = response
        self.status_code = response.status_code
        self.problem = problem

    @property
    def cause(self) -> str:
        """The answer in a few words (as `APIConnectionError.cause` says why there was none)."""
        return f"it answered {self.status_code}"

    @property
    def extensions(self) -> dict[str, Any]:
        """Problem extension members (e.g. ``errors``, ``open_round``)."""
        if self.problem is None:
            return {}
        return dict(self.problem.model_extra or {})


class BadRequestError(APIStatusError):
    pass


class AuthenticationError(APIStatusError):
    pass


class PermissionDeniedError(APIStatusError):
    pass


class NotFoundError(APIStatusError):
    pass


class ConflictError(APIStatusError):
    pass


class PayloadTooLargeError(APIStatusError):
    pass


class UnprocessableEntityError(APIStatusError):
    pass


class RateLimitError(APIStatusError):
    pass


class InternalServerError(APIStatusError):
    pass


class IntegrityError(CoordinatorSDKError):
    """Downloaded bytes do not match the sha256 the coordinator announced."""


class FederationFailedError(CoordinatorSDKError):
    """The federation stopped with an error; the coordinator says why."""


class SiteRoundError(CoordinatorSDKError):
    """This site failed a round: the global model did not load into its module, training or
    the signals failed. The coordinator was told (a ``site.error`` event) when ``reported``;
    the original exception is the ``__cause__``."""

    def __init__(
        self, message: str, *, round_index: int, stage: str, error_type: str, reported: bool
    ) -> None:
        super().__init__(message)
        self.round_index = round_index
        self.stage = stage
        self.error_type = error_type
        self.reported = reported


_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: UnprocessableEntityError,
    429: RateLimitError,
}


def status_error(response: httpx.Response) -> APIStatusError:
    """The typed exception for an error response, with its problem details parsed."""
    problem: ProblemDetails | None = None
    try:
        problem = ProblemDetails.model_validate(response.json())
    except Exception:
        problem = None
    cls = _BY_STATUS.get(response.status_code)
    if cls is None:
        cls = InternalServerError if response.status_code >= 500 else APIStatusError
    detail = problem.detail if problem is not None and problem.detail else response.text[:500]
    message = (
        f"{response.request.method} {response.request.url.path}: {response.status_code} {detail}"
    )
    return cls(message, response=response, problem=problem)


class SignalPolicyError(ValueError):
    """The federation's privacy policy leaves this site nothing to report (raised by
    ``client_sdk.privacy`` before anything is sent)."""
