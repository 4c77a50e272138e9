"""Noisy-client reports (JSON and CSV), client histories, pins, recomputations, diagnostics.

Reads go through the request's read session; a pin or an anchor is one use case of
`service.coordinator.overrides`, which commits it (a suspension too).
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from fastapi import APIRouter, Path, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse, Response

from service.api import convert
from service.api.deps import AdminDep, CurrentClient, ServicesDep, SessionDep
from service.api.problems import PROBLEM_400, PROBLEM_401, PROBLEM_404, PROBLEM_409, PROBLEM_410
from service.api.schemas.federations import ClientRead
from service.api.schemas.reports import (
    AnchorRequest,
    ClientDiagnostics,
    ClientHistory,
    NoisyClientReport,
    PinRequest,
    RecomputeRequest,
    RecomputeResult,
    SuspendRequest,
)
from service.coordinator import clients as client_use_cases
from service.coordinator import overrides, queries, report_csv, reports
from service.coordinator.resources import Services
from service.inputs import INT32_MAX

router = APIRouter(prefix="/federations/{federation_id}", tags=["reports"])


@router.get(
    "/report",
    summary="The noisy-client report (JSON, or CSV with format=csv)",
    response_model=NoisyClientReport,
    # `latest` is {} before the first audit: leave its fields out rather than send nulls
    response_model_exclude_unset=True,
    responses={
        200: {"content": {"text/csv": {}}},
        **PROBLEM_401,
        **PROBLEM_404,
    },
)
def get_report(
    federation_id: uuid.UUID,
    session: SessionDep,
    _: AdminDep,
    format: Literal["json", "csv"] = Query("json"),
) -> Any:
    federation = queries.federation_of(session, federation_id)
    report = reports.noisy_client_report(session, federation)
    if format == "csv":
        return PlainTextResponse(
            report_csv.report_csv(report),
            media_type="text/csv",
            headers={"Content-Disposition": f'attachment; filename="report-{federation_id}.csv"'},
        )
    return convert.noisy_client_report(report)


@router.get(
    "/clients/{client_id}/history",
    summary="What the audit said about one client, round by round",
    response_model=ClientHistory,
    responses={**PROBLEM_401, **PROBLEM_404},
)
def get_client_history(
    federation_id: uuid.UUID, client_id: uuid.UUID, session: SessionDep, _: AdminDep
) -> ClientHistory:
    federation = queries.federation_of(session, federation_id)
    client = queries.get_client(session, federation_id, client_id)
    return convert.client_history(reports.client_history(session, federation, client))


@router.put(
    "/clients/{client_id}/pin",
    summary="Pin a client's status by hand (with a reason)",
    responses={**PROBLEM_400, **PROBLEM_401, **PROBLEM_404},
)
def pin_client(
    federation_id: uuid.UUID,
    client_id: uuid.UUID,
    body: PinRequest,
    services: ServicesDep,
    actor: AdminDep,
) -> ClientRead:
    client = overrides.pin(
        services, federation_id, client_id, status=body.status, reason=body.reason, actor=actor
    )
    return convert.client_read(client)


@router.delete(
    "/clients/{client_id}/pin",
    summary="Remove a pin: the detectors decide again",
    responses={**PROBLEM_401, **PROBLEM_404},
)
def unpin_client(
    federation_id: uuid.UUID, client_id: uuid.UUID, services: ServicesDep, actor: AdminDep
) -> ClientRead:
    client = overrides.pin(
        services, federation_id, client_id, status=None, reason=None, actor=actor
    )
    return convert.client_read(client)


@router.put(
    "/clients/{client_id}/anchor",
    summary="Mark a site as a trust anchor (its labels are curated), with a reason",
    responses={**PROBLEM_401, **PROBLEM_404},
)
def anchor_client(
    federation_id: uuid.UUID,
    client_id: uuid.UUID,
    body: AnchorRequest,
    services: ServicesDep,
    actor: AdminDep,
) -> ClientRead:
    client = overrides.anchor(services, federation_id, client_id, reason=body.reason, actor=actor)
    return convert.client_read(client)


@router.delete(
    "/clients/{client_id}/anchor",
    summary="Remove a site's trust-anchor mark",
    responses={**PROBLEM_401, **PROBLEM_404},
)
def unanchor_client(
    federation_id: uuid.UUID, client_id: uuid.UUID, services: ServicesDep, actor: AdminDep
) -> ClientRead:
    client = overrides.anchor(services, federation_id, client_id, reason=None, actor=actor)
    return convert.client_read(client)


@router.put(
    "/clients/{client_id}/suspend",
    summary="Suspend a site: it is not selected for rounds until resumed (with a reason)",
    responses={**PROBLEM_401, **PROBLEM_404, **PROBLEM_409},
)
def suspend_client(
    federation_id: uuid.UUID,
    client_id: uuid.UUID,
    body: SuspendRequest,
    services: ServicesDep,
    actor: AdminDep,
) -> ClientRead:
    client = overrides.suspend(services, federation_id, client_id, reason=body.reason, actor=actor)
    return convert.client_read(client)


@router.delete(
    "/clients/{client_id}/suspend",
    summary="Resume a suspended site: it can be selected again from the next round",
    responses={**PROBLEM_401, **PROBLEM_404},
)
def resume_client(
    federation_id: uuid.UUID, client_id: uuid.UUID, services: ServicesDep, actor: AdminDep
) -> ClientRead:
    client = overrides.suspend(services, federation_id, client_id, reason=None, actor=actor)
    return convert.client_read(client)


def _recompute(
    services: Services, federation_id: uuid.UUID, index: int, body: RecomputeRequest
) -> RecomputeResult:
    recomputed = overrides.recompute(
        services,
        federation_id,
        index,
        audit_overrides=body.audit,
        exclude_clients=list(body.exclude_clients),
    )
    return convert.recompute_result(recomputed)


@router.post(
    "/rounds/{index}/recompute",
    summary="Re-run a past round's audit or a what-if aggregation (nothing is stored)",
    response_model=RecomputeResult,
    responses={**PROBLEM_400, **PROBLEM_401, **PROBLEM_404, **PROBLEM_410},
)
async def recompute_round(
    federation_id: uuid.UUID,
    body: RecomputeRequest,
    services: ServicesDep,
    _: AdminDep,
    index: int = Path(ge=0, le=INT32_MAX),
) -> RecomputeResult:
    return await run_in_threadpool(_recompute, services, federation_id, index, body)


@router.get(
    "/diagnostics",
    summary="A client's own diagnostics (its status and which of its classes look noisy)",
    response_model=ClientDiagnostics,
    responses={**PROBLEM_401, **PROBLEM_404},
)
def get_diagnostics(
    federation_id: uuid.UUID, session: SessionDep, client: CurrentClient
) -> ClientDiagnostics:
    client_use_cases.check_scope(client, federation_id)
    return convert.client_diagnostics(reports.client_diagnostics(session, client))


__all__ = ["router", "Response"]
