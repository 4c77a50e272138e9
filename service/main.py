"""Application factory: the only module that wires the layers together."""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.routing import APIRoute
from sqlalchemy import Engine

from service import __version__
from service.api import problems, prometheus
from service.api.problems import ProblemDetails
from service.api.routes import (
    admin,
    credentials,
    federations,
    health,
    models,
    participation,
    reports,
)
from service.audit import one_blas_thread_in_this_process
from service.config import Settings, get_settings
from service.coordinator.housekeeping import DataDirectoryLease, sweep_leftovers
from service.coordinator.reaper import DeadlineReaper
from service.coordinator.resources import Services
from service.coordinator.update_metadata import UpdateMetadata
from service.store.event_log import log_committed_events
from service.store.migrate import check_at_head
from service.store.session import make_engine, make_sessionmaker

log = logging.getLogger(__name__)

API_PREFIX = "/api/v1"
DATABASE_FREE_PATHS = frozenset({"/healthz"})
"""Paths that never take a database connection (the others can answer 503 when none is free)."""


def _operation_id(route: APIRoute) -> str:
    tag = route.tags[0] if route.tags else "default"
    return f"{tag}-{route.name}"


def _with_problem_responses(schema: dict[str, Any]) -> dict[str, Any]:
    """FastAPI's schema with the models only referenced (problem details, the update's
    metadata) and the answers this app really gives: problem details for 422 (not
    FastAPI's HTTPValidationError), 429 where a token is taken, 400 for an unreadable body, 503
    where the database is read. Changes ``schema`` in place and returns it."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    # Models the routes name by reference only: problem details, and the update's metadata
    # (a JSON part of a multipart body the upload route streams and parses itself).
    for model in (ProblemDetails, UpdateMetadata):
        part = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(part.pop("$defs", {}))
        components[model.__name__] = part
    # FastAPI documents request validation errors as HTTPValidationError JSON; this app
    # answers them (like every error) with problem details.
    problem = {"schema": {"$ref": "#/components/schemas/ProblemDetails"}}
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            response = operation.get("responses", {}).get("422")
            if response is not None:
                response["content"] = {"application/problem+json": problem}
    # Every route that takes a token can refuse it for a throttled address.
    throttled = problems.PROBLEM_429[429]
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            if "401" in operation.get("responses", {}):
                operation["responses"].setdefault("429", copy.deepcopy(throttled))
    # A body that cannot be decoded (not UTF-8, not JSON, nested too deep for the
    # parser) is answered 400 before the body's schema is checked.
    unreadable = problems.PROBLEM_400[400]
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            if "requestBody" in operation:
                operation["responses"].setdefault("400", copy.deepcopy(unreadable))
    # Any request whose head is too large is refused before routing (service.http_protocol).
    too_large = problems.PROBLEM_431[431]
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            operation.setdefault("responses", {}).setdefault("431", copy.deepcopy(too_large))
    # Every route that reads the database can find the connection pool exhausted.
    busy = problems.PROBLEM_503[503]
    for path, operations in schema.get("paths", {}).items():
        if path in DATABASE_FREE_PATHS:
            continue
        for operation in operations.values():
            operation.setdefault("responses", {}).setdefault("503", copy.deepcopy(busy))
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    return schema


def _migrated_engine(settings: Settings) -> Engine:
    """The database engine with its pool settings; with ``check_migrations``, refused (and
    disposed) unless the schema is at the latest revision."""
    engine = make_engine(
        settings.resolved_database_url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        pool_timeout_s=settings.db_pool_timeout_s,
    )
    if settings.check_migrations:
        try:
            check_at_head(engine)
        except Exception:
            engine.dispose()
            raise
    return engine


def _services(settings: Settings) -> Services:
    """The process's resources over a database at head; a store that does not answer (an S3
    bucket) is refused with nothing left open."""
    engine = _migrated_engine(settings)
    try:
        return Services.create(settings, make_sessionmaker(engine))
    except Exception:
        engine.dispose()
        raise


def _install_metrics(app: FastAPI, services: Services, metrics_files: str | None) -> None:
    """``/metrics``'s registry (``app.state.metrics_registry``, called at each scrape), the HTTP
    histogram's middleware and, on PostgreSQL, the change listener's gauge."""
    scrape, request_seconds = prometheus.make_registry(
        functools.partial(health.database_families, services), multiprocess_path=metrics_files
    )
    app.state.metrics_registry = scrape
    if services.notifier.state()["kind"] == "postgres":
        # the listener's thread sets it as it connects and loses its connection
        listening = prometheus.listener_gauge(None if metrics_files else scrape())
        services.notifier.watch(listening.set)
    app.add_middleware(prometheus.RequestTimer, histogram=request_seconds)


def create_app(settings: Settings | None = None, *, run_reaper: bool = True) -> FastAPI:
    """Build the app; the database must already be migrated to head (`fedaudit db upgrade`)."""
    settings = settings or get_settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    # The audit's products run on one BLAS thread (service/audit/_blas.py), set here, on the
    # thread that builds the app, for the worker threads that close rounds.
    one_blas_thread_in_this_process()
    log_committed_events()
    services = _services(settings)
    metrics_files = prometheus.multiprocess_dir()  # set by `fedaudit serve --workers N`

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        lease = DataDirectoryLease(settings.data_dir)
        if settings.startup_sweep:
            sweep_leftovers(services, lease=lease)
        lease.share()  # while this process serves, another's start-up does not sweep
        services.notifier.start()  # on PostgreSQL: other replicas' signals wake our long-polls
        reaper = DeadlineReaper(services) if run_reaper else None
        if reaper is not None:
            reaper.start()
        try:
            yield
        finally:
            if reaper is not None:
                reaper.stop()
            services.close()
            lease.release()
            prometheus.process_exited(metrics_files)

    app = FastAPI(
        title="fedaudit coordinator",
        version=__version__,
        description=(
            "Runs federated-learning rounds and audits label quality while the federation runs: "
            "noisy-client detection, reliability, neighbor sets and robust aggregation."
        ),
        lifespan=lifespan,
        generate_unique_id_function=_operation_id,
        # The pages load Swagger UI and ReDoc from a CDN: off in production unless asked for.
        docs_url="/docs" if settings.api_docs_enabled else None,
        redoc_url="/redoc" if settings.api_docs_enabled else None,
    )
    app.state.services = services
    _install_metrics(app, services, metrics_files)
    problems.install(app)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
        )
    app.include_router(health.router)
    app.include_router(admin.router)
    app.include_router(admin.icon_router)
    # participation first: its /rounds/current must win over the admin /rounds/{index}
    for router in (
        participation.router,
        federations.router,
        reports.router,
        models.router,
        credentials.router,
    ):
        app.include_router(router, prefix=API_PREFIX)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            app.openapi_schema = _with_problem_responses(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
