"""RFC 9457 problem details for every error the API returns.

FastAPI has no built-in ``application/problem+json`` (fastapi/fastapi#512), so the app installs
these handlers: domain errors (`service.errors`), request validation, Starlette HTTP errors, an
exhausted database connection pool (503 with Retry-After: the request did not get a connection
within ``FEDAUDIT_DB_POOL_TIMEOUT_S``), and a last-resort 500 that logs the traceback and says
nothing internal.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.errors import CoordinatorError, Problem

log = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"
POOL_BUSY_RETRY_AFTER_S = 2
"""Retry-After of a 503 for an exhausted connection pool (a brief overload, not an outage)."""


class ProblemDetails(BaseModel):
    """An RFC 9457 problem; extension members (``errors``, ``open_round`` ...) are allowed."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None


def problem_response(
    request: Request,
    *,
    status: int,
    title: str,
    slug: str,
    detail: str | None,
    headers: dict[str, str] | None = None,
    **extensions: Any,
) -> JSONResponse:
    body = ProblemDetails(
        type=f"/problems/{slug}",
        title=title,
        status=status,
        detail=detail,
        instance=request.url.path,
        **extensions,
    )
    return JSONResponse(
        body.model_dump(exclude_none=True),
        status_code=status,
        media_type=PROBLEM_JSON,
        headers=headers,
    )


def _slug(status: int) -> str:
    return {
        400: "bad-request",
        401: "unauthorized",
        403: "forbidden",
        404: "not-found",
        405: "method-not-allowed",
        409: "conflict",
        410: "gone",
        413: "payload-too-large",
        415: "unsupported-media-type",
        422: "validation-error",
        429: "rate-limited",
        503: "unavailable",
    }.get(status, "http-error" if status < 500 else "internal")


async def _coordinator_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, CoordinatorError)
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    if exc.status == 429 and "retry_after_s" in exc.extensions:
        headers = {"Retry-After": str(exc.extensions["retry_after_s"])}
    return problem_response(
        request,
        status=exc.status,
        title=exc.title,
        slug=exc.type_slug,
        detail=exc.detail,
        headers=headers,
        **exc.extensions,
    )


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors: list[Problem] = [
        {"loc": list(e.get("loc", [])), "msg": e.get("msg", ""), "type": e.get("type", "")}
        for e in exc.errors()
    ]
    first: Problem = errors[0] if errors else {"loc": [], "msg": "invalid request"}
    where = ".".join(str(p) for p in first["loc"])
    return problem_response(
        request,
        status=422,
        title="Request validation failed",
        slug="validation-error",
        detail=f"{where}: {first['msg']}" if where else str(first["msg"]),
        errors=errors,
    )


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return problem_response(
        request,
        status=exc.status_code,
        title=str(exc.detail) if exc.status_code < 500 else "Internal error",
        slug=_slug(exc.status_code),
        detail=str(exc.detail),
        headers=dict(exc.headers) if exc.headers else None,
    )


async def _pool_exhausted(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, PoolTimeoutError)
    log.warning(
        "%s %s: no database connection free in time (%s); answered 503",
        request.method,
        request.url.path,
        exc,
    )
    return problem_response(
        request,
        status=503,
        title="Service busy",
        slug="unavailable",
        detail=(
            "the coordinator has no database connection free right now; retry after "
            f"{POOL_BUSY_RETRY_AFTER_S} s"
        ),
        headers={"Retry-After": str(POOL_BUSY_RETRY_AFTER_S)},
    )


async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return problem_response(
        request,
        status=500,
        title="Internal error",
        slug="internal",
        detail="an unexpected error occurred; it has been logged",
    )


def install(app: FastAPI) -> None:
    app.add_exception_handler(CoordinatorError, _coordinator_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(PoolTimeoutError, _pool_exhausted)
    app.add_exception_handler(Exception, _unhandled)


def problem(status: int, description: str) -> dict[str, Any]:
    """An OpenAPI `responses` entry for a problem response."""
    return {
        "description": description,
        "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/ProblemDetails"}}},
    }


PROBLEM_400: dict[int | str, dict[str, Any]] = {400: problem(400, "Bad request")}
PROBLEM_401: dict[int | str, dict[str, Any]] = {
    401: problem(401, "Missing or invalid bearer token")
}
PROBLEM_403: dict[int | str, dict[str, Any]] = {403: problem(403, "Forbidden")}
PROBLEM_404: dict[int | str, dict[str, Any]] = {404: problem(404, "Not found")}
PROBLEM_409: dict[int | str, dict[str, Any]] = {
    409: problem(409, "Conflict with the current state")
}
PROBLEM_410: dict[int | str, dict[str, Any]] = {
    410: problem(410, "Removed for good: a model update pruned by retention (`reason` says when)")
}
PROBLEM_413: dict[int | str, dict[str, Any]] = {413: problem(413, "Payload too large")}
PROBLEM_422: dict[int | str, dict[str, Any]] = {422: problem(422, "Invalid input")}
PROBLEM_501_DP: dict[int | str, dict[str, Any]] = {
    501: problem(
        501,
        "The federation asks for the Gaussian mechanism, whose privacy accountant "
        "(dp-accounting, fedaudit[dp]) this coordinator lacks "
        "(/problems/dp-accounting-unavailable)",
    )
}
PROBLEM_503: dict[int | str, dict[str, Any]] = {
    503: {
        **problem(503, "Busy: no database connection free in time; retry after Retry-After"),
        "headers": {
            "Retry-After": {
                "description": "Seconds to wait before retrying",
                "schema": {"type": "integer"},
            }
        },
    }
}
PROBLEM_431: dict[int | str, dict[str, Any]] = {
    431: problem(
        431,
        "The request line and headers exceed 64 KiB (/problems/request-head-too-large; "
        "answered by the server before any route)",
    )
}
PROBLEM_429: dict[int | str, dict[str, Any]] = {
    429: {
        **problem(
            429,
            "Too many wrong tokens from this client address (any token is refused until the "
            "window ends); retry after Retry-After",
        ),
        "headers": {
            "Retry-After": {
                "description": "Seconds to wait before retrying",
                "schema": {"type": "integer"},
            }
        },
    }
}
PROBLEM_422_UPDATE: dict[int | str, dict[str, Any]] = {
    422: problem(
        422,
        "Invalid update (/problems/update-rejected), or num_samples / class_counts outside the "
        "drift the federation allows from the site's join (/problems/update-inconsistent), "
        "or counts or per-class signals finer than the federation's signal privacy policy "
        "(/problems/privacy-policy; nothing is stored)",
    )
}
