"""Dependency aliases shared by the routes (the only API module touching sessions)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from service.config import Settings
from service.coordinator import clients as client_use_cases
from service.coordinator.services import Services
from service.errors import AuthError
from service.store.models import Client

bearer = HTTPBearer(auto_error=False, description="Admin token or a client token")


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def get_settings_dep(services: ServicesDep) -> Settings:
    return services.settings


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


def get_session(services: ServicesDep) -> Iterator[Session]:
    """One session per request; handlers that write commit explicitly before answering."""
    with services.sessions() as session:
        try:
            yield session
        except BaseException:
            session.rollback()
            raise


SessionDep = Annotated[Session, Depends(get_session)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def _token(credentials: HTTPAuthorizationCredentials | None) -> str | None:
    return credentials.credentials if credentials is not None else None


def require_admin(services: ServicesDep, credentials: Credentials) -> str:
    client_use_cases.authenticate_admin(_token(credentials), services.settings.admin_secret())
    return "admin"


AdminDep = Annotated[str, Depends(require_admin)]


def current_client(request: Request, services: ServicesDep, credentials: Credentials) -> Client:
    """The client of the bearer token, looked up in a short unit of work of its own.

    The connection goes back to the pool before the handler runs, so a long-poll that waits or
    an upload that streams holds none; the returned row is detached (its columns are loaded),
    and a handler that changes the client re-reads it in its own session.
    """
    token = _token(credentials)
    try:
        with services.sessions() as session:
            return client_use_cases.authenticate_client(session, token)
    except AuthError as exc:
        _record_refusal(request, services, exc)
        raise


def _record_refusal(request: Request, services: Services, exc: AuthError) -> None:
    """A refused client request is part of the audit trail of the federation it named."""
    raw = request.path_params.get("federation_id")
    try:
        federation_id = uuid.UUID(str(raw)) if raw is not None else None
    except ValueError:
        federation_id = None
    with services.sessions.begin() as session:
        client_use_cases.record_auth_failure(
            session,
            federation_id,
            method=request.method,
            path=request.url.path,
            reason=exc.detail,
            budget=services.auth_events,
            now=services.clock(),
        )


CurrentClient = Annotated[Client, Depends(current_client)]
