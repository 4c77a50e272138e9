"""/metrics under ``fedaudit serve --workers 2``: every scrape counts every worker's requests,
and the database's families once (prometheus_client's multiprocess mode; issue 21, point 5)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from fedaudit_sim.coordinator_process import CoordinatorProcess
from tests.api.test_metrics import parse_exposition

pytestmark = pytest.mark.slow

REQUESTS = 20
SCRAPES = 8
COUNT = "fedaudit_http_request_duration_seconds_count"


def _count(metrics: dict[str, dict], route: str) -> float:
    """Requests to ``route`` answered 200, summed over the series (one per method)."""
    return sum(
        v
        for labels, v in metrics[COUNT]["samples"].items()
        if dict(labels)["route"] == route and dict(labels)["status"] == "200"
    )


def _get(url: str) -> httpx.Response:
    # a client of its own: a new connection each time, which either worker may accept
    with httpx.Client(timeout=30) as client:
        return client.get(url)


def test_every_scrape_counts_the_requests_of_both_workers(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"  # where serve's private directory for the metric files goes
    tmp.mkdir()
    with CoordinatorProcess(
        tmp_path / "coord", workers=2, extra_env={"TMPDIR": str(tmp)}
    ) as server:
        with ThreadPoolExecutor(max_workers=4) as pool:
            answers = list(pool.map(_get, [f"{server.url}/healthz"] * REQUESTS))
        assert [r.status_code for r in answers] == [200] * REQUESTS
        # a request is counted just after its answer is sent: let the last ones be
        time.sleep(0.5)
        scrapes = [_get(f"{server.url}/metrics") for _ in range(SCRAPES)]
        assert server.running
        during = {d.name: sorted(f.name for f in d.iterdir()) for d in tmp.iterdir()}
    assert [r.status_code for r in scrapes] == [200] * SCRAPES
    for seen, scrape in enumerate(scrapes):
        metrics = parse_exposition(scrape.text)  # a duplicate sample fails here
        # each scrape sees all 20, whichever worker answered it, and the scrapes before it (the
        # one just before may not be counted yet: it is counted once it is answered)
        assert _count(metrics, "/healthz") == REQUESTS, seen
        assert seen - 1 <= _count(metrics, "/metrics") <= seen, seen
        # the database's families, read at the scrape: once, not once per worker
        assert sum(metrics["fedaudit_build_info"]["samples"].values()) == 1
        assert "python_info" in metrics
        # prometheus_client has no process metrics in multiprocess mode
        assert not any(name.startswith("process_") for name in metrics)
    # the workers' files (histogram_<pid>.db) were in one fresh directory of serve's
    ((name, files),) = during.items()
    assert name.startswith("fedaudit-metrics-")
    assert files, server.log_tail()
    assert all(f.startswith("histogram_") for f in files), files
    assert list(tmp.iterdir()) == []  # the metric files' directory is removed at exit
