"""Dependency aliases shared by the routes.

`SessionDep` is the request's read session (the only session the API layer makes): a route
reads through it and never writes, commits or rolls back; a route that writes calls a use case
in `service.coordinator`, which runs and commits its own transaction.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session

from service.config import Settings
from service.coordinator import admin_auth
from service.coordinator import clients as client_use_cases
from service.coordinator.resources import Services
from service.errors import AuthError, RateLimitedError
from service.store.tables import Client

logger = logging.getLogger(__name__)

bearer = HTTPBearer(auto_error=False, description="Admin token or a client token")


# The two below are coroutines, not plain functions: FastAPI runs a plain function dependency in
# its thread pool, and a hop there and back for an attribute read cost more than the read (every
# request asks for the services).
async def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


async def get_settings_dep(services: ServicesDep) -> Settings:
    return services.settings


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


def get_session(services: ServicesDep) -> Iterator[Session]:
    """One read session per request, closed (its transaction rolled back) when it ends."""
    with services.sessions() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def _token(credentials: HTTPAuthorizationCredentials | None) -> str | None:
    return credentials.credentials if credentials is not None else None


def client_address(request: Request) -> str:
    """The caller's address (behind a proxy, what uvicorn's trusted forwarded headers say)."""
    return request.client.host if request.client else "unknown"


def check_throttle(request: Request, services: Services, token: str | None) -> None:
    """Refuse (429) a token from an address that gave too many wrong ones lately."""
    if not token:
        return
    address = client_address(request)
    retry_after = services.auth_throttle.retry_after(address, services.clock())
    if retry_after is not None:
        raise RateLimitedError(
            f"too many wrong tokens from {address}: every token is refused for {retry_after} s",
            retry_after_s=retry_after,
        )


def note_wrong_token(request: Request, services: Services, token: str | None) -> None:
    if token:
        services.auth_throttle.failed(client_address(request), services.clock())


def is_admin(services: Services, token: str | None) -> bool:
    """Whether `token` is the admin token in force (a short unit of work of its own)."""
    return admin_auth.is_admin(services, token)


def require_admin(request: Request, services: ServicesDep, credentials: Credentials) -> str:
    token = _token(credentials)
    check_throttle(request, services, token)
    if not is_admin(services, token):
        note_wrong_token(request, services, token)
        raise AuthError("a valid admin bearer token is required")
    return "admin"


AdminDep = Annotated[str, Depends(require_admin)]


def current_client(request: Request, services: ServicesDep, credentials: Credentials) -> Client:
    """The client of the bearer token, looked up in a short unit of work of its own.

    The connection goes back to the pool before the handler runs, so a long-poll that waits or
    an upload that streams holds none; the returned row is detached (its columns are loaded),
    and a handler that changes the client re-reads it in its own session.
    """
    token = _token(credentials)
    check_throttle(request, services, token)
    try:
        return client_use_cases.authenticate(services, token)
    except AuthError as exc:
        note_wrong_token(request, services, token)
        _record_refusal(request, services, exc)
        raise


def _record_refusal(request: Request, services: Services, exc: AuthError) -> None:
    """A refused client request is part of the audit trail of the federation it named.

    Best effort: when no database connection is free the refusal is logged, not recorded, and
    the request is still answered 401 (a refusal must not wait for, or fail on, the database).
    """
    raw = request.path_params.get("federation_id")
    try:
        federation_id = uuid.UUID(str(raw)) if raw is not None else None
    except ValueError:
        federation_id = None
    if federation_id is None:
        return  # only refusals that name a federation are recorded
    try:
        client_use_cases.record_refusal(
            services,
            federation_id,
            method=request.method,
            path=request.url.path,
            reason=exc.detail,
        )
    except PoolTimeoutError:
        logger.warning(
            "refused %s %s (%s) not recorded: no database connection free",
            request.method,
            request.url.path,
            exc.detail,
        )


CurrentClient = Annotated[Client, Depends(current_client)]
