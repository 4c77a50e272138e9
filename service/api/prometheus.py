"""/metrics through prometheus_client: the database's counts, HTTP latency, the process.

Three sources go into one registry per app (:func:`make_registry`):

* :class:`DatabaseCollector`: the families read from the database at each scrape
  (``service.coordinator.ops.metrics_snapshot``), described as :class:`MetricFamily` values by
  the health routes, so that every replica over the same database answers the same for them;
* ``fedaudit_http_request_duration_seconds``, a histogram by method, route template (the path
  with its ``{parameters}``, never the raw path: bounded cardinality) and status, observed by
  :class:`RequestTimer` (an ASGI middleware). It counts this process's requests only: with
  several workers or replicas each answers for itself (prometheus_client's multiprocess mode is
  not set up);
* prometheus_client's process and platform collectors (``process_*``, ``python_info``).

The exposition is the text format 0.0.4 (``CONTENT_TYPE``), which every Prometheus reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Histogram, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

__all__ = [
    "CONTENT_TYPE",
    "DatabaseCollector",
    "MetricFamily",
    "RequestTimer",
    "by_label",
    "make_registry",
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


def make_registry(
    families: Callable[[], list[MetricFamily]],
) -> tuple[CollectorRegistry, Histogram]:
    """A registry with the database's families, the process and platform collectors and the
    HTTP histogram (returned too, for :class:`RequestTimer`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(families))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    histogram = Histogram(
        "fedaudit_http_request_duration_seconds",
        "Time to answer an HTTP request, by method, route template and status (this process).",
        ["method", "route", "status"],
        registry=registry,
        buckets=HTTP_BUCKETS,
    )
    return registry, histogram


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
