"""Credentials: rotate the admin token, end dashboard sessions, rotate and revoke site tokens.

Each route calls one use case of `service.coordinator.admin_auth`, which commits.
"""

from __future__ import annotations

import uuid

from fastapi import APIRouter, status

from service.api import convert
from service.api.deps import AdminDep, ServicesDep
from service.api.problems import PROBLEM_401, PROBLEM_404, PROBLEM_422
from service.api.schemas.credentials import AdminTokenRotated, RevokeRequest, SessionsEnded
from service.api.schemas.federations import ClientCreated, ClientRead
from service.coordinator import admin_auth

router = APIRouter(tags=["credentials"])


@router.post(
    "/admin/token",
    status_code=status.HTTP_201_CREATED,
    summary="Rotate the admin token (returned once; the old one and all sessions end)",
    responses={**PROBLEM_401},
)
def rotate_admin_token(services: ServicesDep, actor: AdminDep) -> AdminTokenRotated:
    token = admin_auth.new_admin_token(services, actor=actor)
    return AdminTokenRotated(token=token)


@router.delete(
    "/admin/sessions",
    summary="End every dashboard session (log out everywhere)",
    responses={**PROBLEM_401},
)
def end_admin_sessions(services: ServicesDep, _: AdminDep) -> SessionsEnded:
    ended = admin_auth.log_out_everywhere(services)
    return SessionsEnded(ended=ended)


@router.post(
    "/federations/{federation_id}/clients/{client_id}/token",
    status_code=status.HTTP_201_CREATED,
    summary="Rotate a site's token (returned once; the old one stops working)",
    responses={**PROBLEM_401, **PROBLEM_404},
)
def rotate_client_token(
    federation_id: uuid.UUID,
    client_id: uuid.UUID,
    services: ServicesDep,
    actor: AdminDep,
) -> ClientCreated:
    client, token = admin_auth.new_client_token(services, federation_id, client_id, actor=actor)
    return ClientCreated(**convert.client_read(client).model_dump(), token=token)


@router.post(
    "/federations/{federation_id}/clients/{client_id}/token/revoke",
    summary="Revoke a site's token (until it is rotated)",
    responses={**PROBLEM_401, **PROBLEM_404, **PROBLEM_422},
)
def revoke_client_token(
    federation_id: uuid.UUID,
    client_id: uuid.UUID,
    body: RevokeRequest,
    services: ServicesDep,
    actor: AdminDep,
) -> ClientRead:
    client = admin_auth.revoke_site_token(
        services, federation_id, client_id, actor=actor, reason=body.reason
    )
    return convert.client_read(client)
