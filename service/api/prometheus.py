"""/metrics through prometheus_client: the database's counts, HTTP latency, the process.

Three sources go into each scrape (:func:`make_registry`):

* :class:`DatabaseCollector`: the families read from the database at each scrape
  (``service.coordinator.monitoring.metrics_snapshot``), described as :class:`MetricFamily`
  values by the health routes, so that every replica over the same database answers the same
  for them;
* ``fedaudit_http_request_duration_seconds``, a histogram by method, route template (the path
  with its ``{parameters}``, never the raw path: bounded cardinality) and status, observed by
  :class:`RequestTimer` (an ASGI middleware);
* prometheus_client's platform collector (``python_info``) and, in one process, its process
  collector (``process_*``).

With ``PROMETHEUS_MULTIPROC_DIR`` set (``fedaudit serve --workers N`` sets it for its workers),
prometheus_client keeps the histogram's values in files there, one per process, and a scrape
sums every worker's with a ``MultiProcessCollector`` on a fresh registry: the histogram counts
the requests of all workers, whichever answers the scrape. The database's families are not
metrics of a process: they go into that registry directly, read once per scrape. prometheus_client
has no process metrics in that mode (they would describe the worker that answered), so
``process_*`` are left out. Process-side gauges need an explicit ``multiprocess_mode``
(:func:`listener_gauge`, the change listener's state: ``livemin``), and :func:`process_exited`
removes a stopping worker's live gauges.

The exposition is the text format 0.0.4 (``CONTENT_TYPE``), which every Prometheus reads.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    multiprocess,
    values,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

__all__ = [
    "CONTENT_TYPE",
    "DatabaseCollector",
    "MetricFamily",
    "RequestTimer",
    "by_label",
    "listener_gauge",
    "make_registry",
    "multiprocess_dir",
    "process_exited",
    "render",
    "route_template",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # what generate_latest writes
HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class MetricFamily:
    """One database-derived family: name, help text, type and samples (labels, value). A
    counter's name ends in ``_total``, as it is exposed."""

    name: str
    help: str
    type: Literal["counter", "gauge"]
    samples: list[tuple[Mapping[str, str], float]] = field(default_factory=list)


def by_label(label: str, counts: Mapping[str, int]) -> list[tuple[Mapping[str, str], float]]:
    """Samples of one labelled family, sorted by label value."""
    return [({label: key}, float(n)) for key, n in sorted(counts.items())]


def _to_prometheus(family: MetricFamily) -> Metric:
    names = sorted({k for labels, _ in family.samples for k in labels})
    if family.type == "counter":
        if not family.name.endswith("_total"):
            raise ValueError(f"counter {family.name}: the name must end in _total")
        metric: Metric = CounterMetricFamily(
            family.name.removesuffix("_total"), family.help, labels=names
        )
    else:
        metric = GaugeMetricFamily(family.name, family.help, labels=names)
    for labels, value in family.samples:
        metric.add_metric([labels.get(n, "") for n in names], value)  # type: ignore[attr-defined]
    return metric


class DatabaseCollector(Collector):
    """Yields ``families()`` (read from the database) at each scrape."""

    def __init__(self, families: Callable[[], list[MetricFamily]]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        for family in self._families():
            yield _to_prometheus(family)


def multiprocess_dir() -> str | None:
    """``PROMETHEUS_MULTIPROC_DIR`` when prometheus_client's multiprocess mode is on in this
    process: the variable is set and was when prometheus_client was imported (it chooses
    between values in memory and in files then); None otherwise."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not path or values.ValueClass is values.MutexValue:
        return None
    return path


def make_registry(
    families: Callable[[], list[MetricFamily]],
    *,
    multiprocess_path: str | None = None,
) -> tuple[Callable[[], CollectorRegistry], Histogram]:
    """What a scrape renders (a function that gives the registry), and the HTTP histogram for
    :class:`RequestTimer`.

    In one process (``multiprocess_path`` None), one registry with the database's families,
    the process and platform collectors and the histogram. In multiprocess mode, a fresh
    registry per scrape with the database's families, the platform collector and a
    ``MultiProcessCollector`` over ``multiprocess_path``; the histogram is in no registry, its
    values go to the files that collector reads (every worker's)."""
    database = DatabaseCollector(families)
    if multiprocess_path is None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(database)
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        histogram = _request_histogram("(this process)", registry)
        return lambda: registry, histogram
    platform = PlatformCollector(registry=None)

    def scrape() -> CollectorRegistry:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(database)
        registry.register(platform)
        multiprocess.MultiProcessCollector(registry, path=multiprocess_path)  # type: ignore[no-untyped-call]
        return registry

    return scrape, _request_histogram("(all worker processes)", None)


def _request_histogram(whose: str, registry: CollectorRegistry | None) -> Histogram:
    return Histogram(
        "fedaudit_http_request_duration_seconds",
        f"Time to answer an HTTP request, by method, route template and status {whose}.",
        ["method", "route", "status"],
        registry=registry,
        buckets=HTTP_BUCKETS,
    )


def listener_gauge(registry: CollectorRegistry | None) -> Gauge:
    """``fedaudit_change_listener_up``: 1 while the process's PostgreSQL change listener
    listens, 0 while it reconnects. In ``registry`` in one process; in multiprocess mode
    (``registry`` None) in the workers' files, where a scrape shows the minimum over the live
    workers (``livemin``: 0 when any of them does not listen)."""
    return Gauge(
        "fedaudit_change_listener_up",
        "1 while this coordinator's PostgreSQL LISTEN connection is up (other replicas' round "
        "changes wake its waiting sites at once), 0 while it reconnects; with several worker "
        "processes, the minimum over them.",
        registry=registry,
        multiprocess_mode="livemin",
    )


def process_exited(multiprocess_path: str | None) -> None:
    """Multiprocess bookkeeping as this worker stops: its live gauges' files are removed (a
    no-op in one process)."""
    if multiprocess_path is not None:
        multiprocess.mark_process_dead(os.getpid(), multiprocess_path)  # type: ignore[no-untyped-call]


def render(registry: CollectorRegistry) -> bytes:
    """The registry in the text format 0.0.4."""
    return generate_latest(registry)


class RequestTimer:
    """ASGI middleware: observes each HTTP request's duration in ``histogram`` with the route
    template the router matched (``unmatched`` when none did) and the response status."""

    def __init__(self, app: Any, histogram: Histogram) -> None:
        self.app = app
        self.histogram = histogram

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [500]

        async def send_status(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            template = route_template(scope)
            self.histogram.labels(scope["method"], template, str(status[0])).observe(
                time.perf_counter() - started
            )


def route_template(scope: Mapping[str, Any]) -> str:
    """The matched route's path with its ``{parameters}``, the prefix it was included under
    in front (a route included under a prefix knows only its own part): ``unmatched`` when no
    route matched."""
    route = scope.get("route")
    own = getattr(route, "path", None)
    regex = getattr(route, "path_regex", None)
    if not own or regex is None:
        return "unmatched"
    path = str(scope.get("path", ""))
    for i, char in enumerate(path):
        if char == "/" and regex.fullmatch(path[i:]):
            return path[:i] + str(own)
    return str(own)
