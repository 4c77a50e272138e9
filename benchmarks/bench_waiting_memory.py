"""Coordinator memory with N sites waiting: resident memory while they long-poll, per N.

For each N of ``--sites`` (default 100 and 1,000), a real coordinator (``CoordinatorProcess``,
SQLite in a temporary directory, default settings) gets a federation with N + 1 registered sites
(``bench_load.create_load_federation``); N of them join from ``--site-processes`` forked
processes (one thread per site) and then long-poll ``rounds/current`` (``wait_s`` 10) for
``--hold-s`` seconds. The last site never joins, so no round opens: the coordinator only holds
N waiting requests. Its VmRSS is sampled once a second; the figure is the median of the samples
of the last 10 s, when every site has joined and waits. Issue 24's target: at 1,000 waiting sites
at most 1.5 times the figure at 100.

    .venv/bin/python benchmarks/bench_waiting_memory.py --out runs/waiting_memory.json
"""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from _common import benchmark_parser, machine_info, write_result
from bench_load import SiteSpec, coordinator_pid, create_load_federation, memory_mib, tls_context

from client_sdk import AdminClient, FederationClient
from fedaudit_sim.coordinator_process import CoordinatorProcess


def waiting_sites(url: str, federation_id: str, specs: Sequence[SiteSpec], hold_s: float) -> None:
    """A forked process: its sites join, then long-poll until ``hold_s`` has passed."""

    def site(spec: SiteSpec) -> None:
        http = httpx.Client(base_url=url, verify=tls_context(), timeout=60)
        with FederationClient(url, spec.token, http_client=http) as client:
            client.join(
                federation_id, num_samples=sum(spec.class_counts), class_counts=spec.class_counts
            )
            end = time.monotonic() + hold_s
            while time.monotonic() < end:
                client.get_current_round(federation_id, wait_s=10)
        http.close()

    threads = [threading.Thread(target=site, args=(spec,)) for spec in specs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def measure(sites: int, processes: int, hold_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-waiting-") as tmp:
        server = CoordinatorProcess(Path(tmp) / "coordinator")
        server.start()
        try:
            pid = coordinator_pid(server)
            with AdminClient(server.url, server.admin_token) as admin:
                # one site more than join: the federation waits for it, no round opens
                federation_id, specs = create_load_federation(admin, sites + 1, 1, 0)
                context = multiprocessing.get_context("fork")
                workers = [
                    context.Process(
                        target=waiting_sites,
                        args=(server.url, str(federation_id), specs[i:sites:processes], hold_s),
                    )
                    for i in range(processes)
                ]
                before = memory_mib(pid).get("rss")
                for worker in workers:
                    worker.start()
                samples = []
                for _ in range(max(1, int(hold_s) - 2)):
                    time.sleep(1.0)
                    samples.append(memory_mib(pid).get("rss", 0.0))
                federation = admin.get_federation(federation_id)
                for worker in workers:
                    worker.join(timeout=hold_s + 60)
            peak = memory_mib(pid).get("peak")
        finally:
            server.stop()
    last = samples[-10:]
    return {
        "sites": sites,
        "joined_while_sampled": federation.joined_clients,
        "federation_status": federation.status,
        "rss_before_mib": before,
        "rss_waiting_mib": statistics.median(last),
        "rss_waiting_max_mib": max(last),
        "peak_rss_mib": peak,
        "worker_exit_codes": [worker.exitcode for worker in workers],
    }


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--sites", default="100,1000", help="comma-separated site counts")
    parser.add_argument("--site-processes", type=int, default=8)
    parser.add_argument("--hold-s", type=float, default=25.0)
    parser.add_argument("--quick", action="store_true", help="smoke run: 4 and 8 sites, 5 s")
    args = parser.parse_args(argv)
    counts = [4, 8] if args.quick else [int(n) for n in args.sites.split(",")]
    hold_s = 5.0 if args.quick else args.hold_s
    runs = [measure(n, args.site_processes, hold_s) for n in counts]
    for run in runs:
        print(
            f"{run['sites']:5d} waiting sites ({run['joined_while_sampled']} joined, federation "
            f"{run['federation_status']}): RSS {run['rss_before_mib']:.0f} MiB before, "
            f"{run['rss_waiting_mib']:.0f} MiB while they wait "
            f"(max {run['rss_waiting_max_mib']:.0f})"
        )
    ratio = runs[-1]["rss_waiting_mib"] / runs[0]["rss_waiting_mib"]
    print(f"RSS at {counts[-1]} waiting sites / at {counts[0]}: {ratio:.2f}")
    ok = all(
        run["joined_while_sampled"] == run["sites"]
        and run["federation_status"] == "waiting"
        and run["worker_exit_codes"] == [0] * len(run["worker_exit_codes"])
        for run in runs
    )
    write_result(
        args.out,
        {
            "benchmark": "waiting_memory",
            "machine": machine_info(),
            "parameters": {
                "sites": counts,
                "site_processes": args.site_processes,
                "hold_s": hold_s,
                "quick": args.quick,
            },
            "runs": runs,
            "rss_ratio_last_to_first": ratio,
            "ok": ok,
        },
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
