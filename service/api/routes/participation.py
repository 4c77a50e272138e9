"""Client endpoints: join, the current round (long-poll), submit an update.

Each route calls use cases of `service.coordinator` (`clients`, `rounds`, `updates`) that open
and commit their own short transactions: the long-poll holds no connection while it waits, and
an upload none while its body streams to disk.
"""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Header, Path, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool

from service.api.deps import CurrentClient, ServicesDep, SessionDep
from service.api.problems import (
    PROBLEM_400,
    PROBLEM_401,
    PROBLEM_403,
    PROBLEM_404,
    PROBLEM_409,
    PROBLEM_413,
    PROBLEM_422,
    PROBLEM_422_UPDATE,
)
from service.api.schemas.federations import SiteTask
from service.api.schemas.rounds import (
    CurrentRound,
    Instructions,
    JoinRead,
    JoinRequest,
    RoundRef,
    SiteErrorRead,
    SiteErrorReport,
    UpdateRead,
)
from service.api.uploads import receive_update
from service.coordinator import clients as client_use_cases
from service.coordinator import rounds, updates
from service.coordinator.queries import federation_of
from service.coordinator.resources import Services
from service.coordinator.signal_policy import policy_of
from service.errors import CoordinatorError
from service.inputs import INT32_MAX

router = APIRouter(prefix="/federations/{federation_id}", tags=["participation"])

MAX_WAIT_S = 30.0
SAFETY_RECHECK_S = 15.0
"""A waiting long-poll re-reads the database after each change signal for its federation
(`Services.notifier`) and, in case a signal was lost, at most this long after the last read."""


@router.get(
    "/task",
    summary="The federation's task (classes, input shape, signal privacy policy)",
    responses={**PROBLEM_401, **PROBLEM_404},
)
def get_task(federation_id: uuid.UUID, session: SessionDep, client: CurrentClient) -> SiteTask:
    client_use_cases.check_scope(client, federation_id)
    federation = federation_of(session, federation_id)
    return SiteTask.model_construct(
        num_classes=federation.num_classes,
        input_shape=federation.input_shape,
        class_names=federation.class_names,
        privacy=policy_of(federation.config),
    )


@router.post(
    "/join",
    summary="Join the federation",
    responses={
        200: {
            "links": {
                "GetCurrentRound": {
                    "operationId": "participation-get_current_round",
                    "parameters": {"federation_id": "$response.body#/federation_id"},
                    "description": "Ask what to do now",
                }
            }
        },
        **PROBLEM_400,
        **PROBLEM_401,
        **PROBLEM_404,
        **PROBLEM_422_UPDATE,
    },
)
def join(
    federation_id: uuid.UUID,
    body: JoinRequest,
    services: ServicesDep,
    client: CurrentClient,
) -> JoinRead:
    client_use_cases.check_scope(client, federation_id)
    client, federation = client_use_cases.join_federation(
        services,
        client,
        federation_id,
        num_samples=body.num_samples,
        class_counts=body.class_counts,
    )
    return JoinRead(
        client_id=client.id,
        federation_id=federation.id,
        name=client.name,
        federation_status=federation.status,
        num_classes=federation.num_classes,
        input_shape=federation.input_shape,
        privacy=policy_of(federation.config),
    )


def _current(services: Services, client_id: uuid.UUID) -> CurrentRound:
    state = rounds.current_for(services, client_id)
    if isinstance(state, rounds.Finished):
        return CurrentRound(status="finished", final_model_id=state.final_model_id)
    if isinstance(state, rounds.Wait):
        return CurrentRound(
            status="wait",
            retry_after_s=state.retry_after_s,
            reason=state.reason,
            sites_selected=state.sites_selected,
            sites_submitted=state.sites_submitted,
        )
    return CurrentRound(
        status="train",
        round=RoundRef(
            id=state.round.id, index=state.round.index, deadline_at=state.round.deadline_at
        ),
        instructions=Instructions.model_validate(state.instructions),
    )


# OpenAPI links: the workflow a site follows, from one answer to the next request.
CURRENT_ROUND_LINKS = {
    "SubmitUpdate": {
        "operationId": "participation-submit_update",
        "parameters": {
            "federation_id": "$request.path.federation_id",
            "round_index": "$response.body#/round/index",
        },
        "description": "Submit the update of the round to train",
    },
    "DownloadGlobalModel": {
        "operationId": "models-download_model",
        "parameters": {"model_id": "$response.body#/instructions/global_model_id"},
        "description": "Download the global model to start from",
    },
}


@router.get(
    "/rounds/current",
    summary="What to do now: train (with instructions), wait, or finished",
    responses={200: {"links": CURRENT_ROUND_LINKS}, **PROBLEM_401, **PROBLEM_404, **PROBLEM_409},
)
async def get_current_round(
    federation_id: uuid.UUID,
    response: Response,
    services: ServicesDep,
    client: CurrentClient,
    wait_s: float = Query(0.0, ge=0.0, le=MAX_WAIT_S, description="Long-poll up to this long"),
) -> CurrentRound:
    client_use_cases.check_scope(client, federation_id)
    deadline = time.monotonic() + wait_s
    # Subscribed before the first read, so a round that opens in between still wakes us. While
    # waiting, the request holds no database connection: each read is its own short session.
    with services.notifier.subscribe(federation_id) as changes:
        current = await run_in_threadpool(_current, services, client.id)
        while current.status == "wait":
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await changes.wait(min(remaining, SAFETY_RECHECK_S))
            current = await run_in_threadpool(_current, services, client.id)
    if current.status == "wait":
        response.headers["Retry-After"] = str(max(1, round(current.retry_after_s or 1)))
    return current


@router.post(
    "/rounds/{round_index}/updates",
    status_code=status.HTTP_201_CREATED,
    summary="Submit an update (multipart: metadata JSON + safetensors state)",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "required": ["metadata", "state"],
                        "properties": {
                            "metadata": {"$ref": "#/components/schemas/UpdateMetadata"},
                            "state": {"type": "string", "format": "binary"},
                        },
                    },
                    "encoding": {
                        "metadata": {"contentType": "application/json"},
                        "state": {"contentType": "application/octet-stream"},
                    },
                }
            },
        }
    },
    responses={
        200: {"description": "A retried identical upload: the stored result", "model": UpdateRead},
        **PROBLEM_400,
        **PROBLEM_401,
        **PROBLEM_403,
        **PROBLEM_404,
        **PROBLEM_409,
        **PROBLEM_413,
        **PROBLEM_422_UPDATE,
    },
)
async def submit_update(
    federation_id: uuid.UUID,
    request: Request,
    response: Response,
    services: ServicesDep,
    client: CurrentClient,
    round_index: int = Path(ge=0, le=INT32_MAX),
    idempotency_key: str = Header(
        ...,
        alias="Idempotency-Key",
        min_length=1,
        max_length=200,
        pattern=r"^[\x21-\x7e]+$",
        description="1-200 visible ASCII characters; a retry with the same key and the same "
        "update gets the stored result",
    ),
) -> UpdateRead:
    try:
        client_use_cases.check_scope(client, federation_id)
        metadata, staged = await receive_update(
            request, services.settings.tmp_dir, services.settings.max_upload_bytes
        )
    except CoordinatorError as exc:
        await run_in_threadpool(
            updates.record_rejection, services, client, federation_id, round_index, exc
        )
        raise
    result = await run_in_threadpool(
        lambda: updates.submit_update(
            services,
            client,
            federation_id=federation_id,
            round_index=round_index,
            metadata_raw=metadata,
            staged=staged,
            idempotency_key=idempotency_key,
        )
    )
    if not result.created:
        response.status_code = status.HTTP_200_OK
    update = result.update
    return UpdateRead(
        id=update.id,
        round_id=update.round_id,
        round_index=update.round_index,
        client_id=update.client_id,
        sha256=update.sha256,
        size_bytes=update.size_bytes,
        num_samples=update.num_samples,
        received_at=update.received_at,
        replayed=not result.created,
    )


@router.post(
    "/rounds/{round_index}/error",
    status_code=status.HTTP_202_ACCEPTED,
    summary="Report that this site failed a round (loading the model, training, ...)",
    responses={**PROBLEM_400, **PROBLEM_401, **PROBLEM_404, **PROBLEM_422},
)
def report_error(
    federation_id: uuid.UUID,
    body: SiteErrorReport,
    services: ServicesDep,
    client: CurrentClient,
    round_index: int = Path(ge=0, le=INT32_MAX),
) -> SiteErrorRead:
    """Recorded as a ``site.error`` event (at most a few per site and round), shown in the
    event list, the report, the dashboard and ``fedaudit_site_errors_total``. The round goes on:
    the site may fix its side and ask for the round again."""
    client_use_cases.check_scope(client, federation_id)
    event = client_use_cases.record_site_error(
        services,
        client,
        federation_id,
        round_index,
        stage=body.stage,
        error_type=body.error_type,
        message=body.message,
    )
    return SiteErrorRead(recorded=event is not None, event_id=event.id if event else None)
