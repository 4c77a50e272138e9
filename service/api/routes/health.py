"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from service.api.deps import ServicesDep
from service.api.problems import problem
from service.coordinator import ops

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is alive")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="Database reachable and migrations at head",
    responses={503: problem(503, "Not ready")},
)
def readyz(services: ServicesDep) -> dict[str, str]:
    ops.readiness(services)
    return {"status": "ready"}


@router.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics")
def metrics(services: ServicesDep) -> str:
    return ops.prometheus_metrics(services)
