"""Admin endpoints: federations, the initial model, clients, rounds, events.

A route that writes calls one use case (`service.coordinator.federations`, `rounds`), which
runs and commits its own transaction; the route then reads what it answers through the
request's read session.
"""

from __future__ import annotations

import uuid
from typing import Literal

from fastapi import APIRouter, Path, Query, Request, status
from fastapi.concurrency import run_in_threadpool

from service.api import convert
from service.api.deps import AdminDep, ServicesDep, SessionDep
from service.api.problems import (
    PROBLEM_400,
    PROBLEM_401,
    PROBLEM_404,
    PROBLEM_409,
    PROBLEM_413,
    PROBLEM_422,
    PROBLEM_501_DP,
)
from service.api.schemas.federations import (
    ClientCreate,
    ClientCreated,
    ClientRead,
    EventPage,
    FederationCreate,
    FederationPage,
    FederationRead,
    FederationStop,
    ModelRead,
    PruneReport,
    PruneRequest,
)
from service.api.schemas.rounds import RoundClose, RoundDetail, RoundPage
from service.api.uploads import receive_raw
from service.coordinator import federations as use_cases
from service.coordinator import queries, retention, rounds
from service.coordinator.resources import Services
from service.coordinator.updates import StagedUpload
from service.inputs import INT32_MAX, INT64_MAX
from service.store.event_kinds import EVENT_KIND_NAMES

router = APIRouter(prefix="/federations", tags=["federations"])

EventKind = Literal[EVENT_KIND_NAMES]  # type: ignore[valid-type]
"""The kinds of event a filter may name (``service.store.event_kinds``): another is refused."""


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    summary="Create a federation",
    responses={**PROBLEM_400, **PROBLEM_401, **PROBLEM_409, **PROBLEM_422, **PROBLEM_501_DP},
)
def create_federation(
    body: FederationCreate, session: SessionDep, services: ServicesDep, actor: AdminDep
) -> FederationRead:
    federation = use_cases.register_federation(
        services,
        name=body.name,
        num_classes=body.task.num_classes,
        input_shape=body.task.input_shape,
        class_names=body.task.class_names,
        rounds=body.plan.rounds,
        min_clients=body.plan.min_clients,
        max_clients=body.plan.max_clients,
        round_deadline_s=body.plan.round_deadline_s,
        config=body.config,
        seed=body.seed,
        actor=actor,
    )
    return convert.federation_read(session, federation)


@router.get("", summary="List federations", responses={**PROBLEM_401})
def list_federations(
    session: SessionDep,
    _: AdminDep,
    offset: int = Query(0, ge=0, le=INT64_MAX),
    limit: int = Query(100, ge=1, le=1000),
) -> FederationPage:
    items, total = queries.list_federations(session, offset=offset, limit=limit)
    summaries = use_cases.federation_summaries(session, items)
    return FederationPage(
        items=[convert.federation_read(session, f, summaries[f.id]) for f in items], total=total
    )


@router.get(
    "/{federation_id}", summary="Get a federation", responses={**PROBLEM_401, **PROBLEM_404}
)
def get_federation(federation_id: uuid.UUID, session: SessionDep, _: AdminDep) -> FederationRead:
    return convert.federation_read(session, queries.federation_of(session, federation_id))


def _store_initial_model(
    services: Services, federation_id: uuid.UUID, staged: StagedUpload, actor: str
) -> ModelRead:
    version = use_cases.store_initial_model(
        services,
        federation_id,
        staged=staged.path,
        sha256=staged.sha256,
        size=staged.size,
        actor=actor,
    )
    return convert.model_read(version)


@router.put(
    "/{federation_id}/model",
    status_code=status.HTTP_201_CREATED,
    summary="Upload the initial global model (safetensors body)",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
    responses={
        **PROBLEM_400,
        **PROBLEM_401,
        **PROBLEM_404,
        **PROBLEM_409,
        **PROBLEM_413,
        **PROBLEM_422,
    },
)
async def upload_initial_model(
    federation_id: uuid.UUID, request: Request, services: ServicesDep, actor: AdminDep
) -> ModelRead:
    staged = await receive_raw(
        request, services.settings.tmp_dir, services.settings.max_upload_bytes
    )
    return await run_in_threadpool(_store_initial_model, services, federation_id, staged, actor)


@router.get(
    "/{federation_id}/models",
    summary="List the global model versions",
    responses={**PROBLEM_401, **PROBLEM_404},
)
def list_models(federation_id: uuid.UUID, session: SessionDep, _: AdminDep) -> list[ModelRead]:
    queries.federation_of(session, federation_id)
    return [convert.model_read(m) for m in queries.list_models(session, federation_id)]


@router.post(
    "/{federation_id}/start",
    summary="Open round 0 now with the clients that have joined",
    responses={**PROBLEM_401, **PROBLEM_404, **PROBLEM_409},
)
def start_federation(
    federation_id: uuid.UUID, session: SessionDep, services: ServicesDep, _: AdminDep
) -> FederationRead:
    federation = rounds.start_now(services, federation_id)
    return convert.federation_read(session, federation)


@router.post(
    "/{federation_id}/stop",
    summary="Stop the federation for good (its open round fails; sites are told why)",
    responses={**PROBLEM_401, **PROBLEM_404, **PROBLEM_409, **PROBLEM_422},
)
def stop_federation(
    federation_id: uuid.UUID,
    body: FederationStop,
    session: SessionDep,
    services: ServicesDep,
    actor: AdminDep,
) -> FederationRead:
    federation = use_cases.stop(services, federation_id, reason=body.reason, actor=actor)
    return convert.federation_read(session, federation)


@router.post(
    "/{federation_id}/prune",
    summary="Prune the model updates of old rounds (retention); global models are kept",
    response_model=PruneReport,
    responses={**PROBLEM_400, **PROBLEM_401, **PROBLEM_404, **PROBLEM_422},
)
def prune_federation(
    federation_id: uuid.UUID, body: PruneRequest, services: ServicesDep, actor: AdminDep
) -> retention.RetentionReport:
    """Removes the blobs, and the probe softmax and centroids, of the model updates of the
    finished rounds older than the last `keep_rounds`, except each site's latest update and the
    neighbour models an open round hands out. Rows, audit results, reports and every global
    model stay; a pruned update's download and a what-if of its round answer 410. Recorded as a
    `federation.pruned` event."""
    return retention.prune(
        services,
        federation_id,
        keep_rounds=body.keep_rounds,
        dry_run=body.dry_run,
        actor=actor,
    )


@router.post(
    "/{federation_id}/clients",
    status_code=status.HTTP_201_CREATED,
    summary="Add a client; its token is returned once",
    responses={**PROBLEM_401, **PROBLEM_404, **PROBLEM_409, **PROBLEM_422},
)
def add_client(
    federation_id: uuid.UUID, body: ClientCreate, services: ServicesDep, actor: AdminDep
) -> ClientCreated:
    client, token = use_cases.register_client(services, federation_id, name=body.name, actor=actor)
    return ClientCreated(**convert.client_read(client).model_dump(), token=token)


@router.get(
    "/{federation_id}/clients", summary="List clients", responses={**PROBLEM_401, **PROBLEM_404}
)
def list_clients(federation_id: uuid.UUID, session: SessionDep, _: AdminDep) -> list[ClientRead]:
    queries.federation_of(session, federation_id)
    return [convert.client_read(c) for c in queries.list_clients(session, federation_id)]


@router.get(
    "/{federation_id}/rounds", summary="List rounds", responses={**PROBLEM_401, **PROBLEM_404}
)
def list_rounds(
    federation_id: uuid.UUID,
    session: SessionDep,
    _: AdminDep,
    offset: int = Query(0, ge=0, le=INT64_MAX),
    limit: int = Query(1000, ge=1, le=10000),
) -> RoundPage:
    queries.federation_of(session, federation_id)
    items, total = queries.list_rounds(session, federation_id, offset=offset, limit=limit)
    return RoundPage(items=[convert.round_read(session, r) for r in items], total=total)


@router.get(
    "/{federation_id}/rounds/{index}",
    summary="Get a round with its audit",
    responses={**PROBLEM_401, **PROBLEM_404},
)
def get_round(
    federation_id: uuid.UUID,
    session: SessionDep,
    _: AdminDep,
    index: int = Path(ge=0, le=INT32_MAX),
) -> RoundDetail:
    queries.federation_of(session, federation_id)
    rnd = rounds.get_round(session, federation_id, index)
    base = convert.round_read(session, rnd)
    return RoundDetail(**base.model_dump(), audit=queries.audit_of_round(session, rnd.id))


@router.post(
    "/{federation_id}/rounds/{index}/close",
    summary="Close an open round now with the updates it has (as its deadline would)",
    responses={**PROBLEM_401, **PROBLEM_404, **PROBLEM_409, **PROBLEM_422},
)
def close_round(
    federation_id: uuid.UUID,
    body: RoundClose,
    session: SessionDep,
    services: ServicesDep,
    actor: AdminDep,
    index: int = Path(ge=0, le=INT32_MAX),
) -> RoundDetail:
    """The round is audited and aggregated with the updates received (at least the plan's
    `min_clients`); selected sites that have not sent are left out, and the next round opens.
    409 when the round is not open or has too few updates."""
    use_cases.close_round_now(services, federation_id, index, reason=body.reason, actor=actor)
    rnd = rounds.get_round(session, federation_id, index)
    base = convert.round_read(session, rnd)
    return RoundDetail(**base.model_dump(), audit=queries.audit_of_round(session, rnd.id))


@router.get(
    "/{federation_id}/events", summary="The audit trail", responses={**PROBLEM_401, **PROBLEM_404}
)
def list_events(
    federation_id: uuid.UUID,
    session: SessionDep,
    _: AdminDep,
    kind: EventKind | None = Query(None, description="Only events of this kind"),
    client_id: uuid.UUID | None = None,
    after_id: int = Query(0, ge=0, le=INT64_MAX),
    limit: int = Query(1000, ge=1, le=10000),
) -> EventPage:
    queries.federation_of(session, federation_id)
    events = queries.list_events(
        session, federation_id, kind=kind, client_id=client_id, after_id=after_id, limit=limit
    )
    return EventPage(items=[convert.event_read(e) for e in events])
