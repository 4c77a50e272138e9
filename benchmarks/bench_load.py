"""Load: N concurrent simulated sites (separate processes) against a real coordinator on loopback.

Starts a real coordinator (``CoordinatorProcess``: ``fedaudit db upgrade`` + ``fedaudit serve``,
one uvicorn process on a loopback port; SQLite in a temporary directory, or ``--postgres-url``),
creates a federation for N sites and R rounds through ``AdminClient`` (FedAvg with the Fed-NCL
detector, ``min_clients`` = N so every round waits for every site, a one-hour round deadline) with
a tiny model (about 3,600 float32 parameters, 15 KB), registers the N sites, then forks the site
processes (``--sites-per-process`` sites per process, one thread each; default 1: one process per
site) and releases them together.

A site does what ``client_sdk.Participant`` does, without torch: ``FederationClient.join`` with
its class counts, then ``get_current_round`` until the federation finishes; when told to train it
downloads the global model (``download_model``, sha256 checked), adds a small seeded perturbation
(no training: the coordinator's work is what is measured) and uploads it with the signals the
federation requires (``submit_update``, idempotency key = the round id, as ``Participant``). With
``--poll-wait-s 0`` (the default) a site polls without long-polling and sleeps the server's
``retry_after_s`` hint between polls (``Participant(poll_wait_s=0)``), so the poll latency is the
route's service time under load; ``--poll-wait-s 10`` long-polls like the default ``Participant``
(then a poll's latency includes the time it waited for a round to open).

Every HTTP attempt (the SDK's retries of 429/5xx/connection errors included) is recorded by the
site's transport: route (join, poll, download, upload), status code (or the transport error),
latency to the last byte of the response. At the end the benchmark checks, from the admin API and
from the database: the federation finished, every round closed, exactly N updates stored per
round from N distinct sites, the same set as the receipts the sites got; and counts 5xx answers
and the ERROR lines of the coordinator's log. It exits non-zero when any check fails. It also
reports the coordinator's resident memory (before the sites start, sampled while they run, and
its peak, /proc VmHWM), and, per site and round, the time from the round's opening to the end of
the site's first poll answered ``train`` for it.

    .venv/bin/python benchmarks/bench_load.py --out runs/bench_load.json
    .venv/bin/python benchmarks/bench_load.py --postgres-url postgresql://HOST/DB --out runs/pg.json
    .venv/bin/python benchmarks/bench_load.py --quick --out runs/load_quick.json
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import re
import resource
import secrets
import shlex
import ssl
import statistics
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from _common import benchmark_parser, machine_info, write_result
from _coordinator import FEDNCL_FEDAVG_CONFIG, NUM_CLASSES, state_bytes
from safetensors.numpy import load
from sqlalchemy import create_engine, distinct, func, select

from client_sdk import AdminClient, FederationClient
from client_sdk._client import DEFAULT_TIMEOUT
from fedaudit_sim.coordinator_process import CoordinatorProcess

SHAPES: dict[str, tuple[int, ...]] = {
    "conv.weight": (8, 3, 5, 5),
    "conv.bias": (8,),
    "fc.weight": (NUM_CLASSES, 300),
    "fc.bias": (NUM_CLASSES,),
}
"""The tiny model: 3,618 float32 parameters (14.5 KB of tensors)."""

ROUTES = ("join", "poll", "download", "upload", "other")
LATENCY_ROUTES = ("join", "poll", "download", "upload")


def route_of(method: str, path: str) -> str:
    if method == "POST" and path.endswith("/join"):
        return "join"
    if method == "GET" and path.endswith("/rounds/current"):
        return "poll"
    if method == "GET" and "/models/" in path:
        return "download"
    if method == "POST" and re.search(r"/rounds/\d+/updates$", path):
        return "upload"
    return "other"


# --- the site side (runs in the forked processes) -----------------------------------------------


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context per site process, shared by its sites' clients. httpx builds one per
    client otherwise (about 16 ms of CPU each, loading the CA bundle), so a thousand sites
    released together spent some 30 s of CPU on it, on the cores the coordinator runs on, though
    they talk plain HTTP on loopback."""
    return ssl.create_default_context()


class RecordingTransport(httpx.BaseTransport):
    """An ``httpx.HTTPTransport`` that records every attempt: (route, status, seconds, start,
    poll answer, round index of a ``train`` answer). Status is the HTTP code, or the name of the
    transport error. The response body is read here, so the latency is to its last byte."""

    def __init__(self, records: list[list[Any]], t0: float) -> None:
        self._inner = httpx.HTTPTransport(verify=tls_context())
        self._records = records
        self._t0 = t0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        route = route_of(request.method, request.url.path)
        started = time.perf_counter()
        try:
            response = self._inner.handle_request(request)
            try:
                raw = b"".join(response.iter_raw())
            finally:
                response.close()
        except Exception as exc:
            self._records.append(
                [
                    route,
                    type(exc).__name__,
                    time.perf_counter() - started,
                    started - self._t0,
                    None,
                    None,
                ]
            )
            raise
        seconds = time.perf_counter() - started
        answer = train_round = None
        if route == "poll" and response.status_code == 200:
            try:
                body = json.loads(raw)
                answer = body["status"]
                if answer == "train":
                    train_round = int(body["round"]["index"])
            except (ValueError, KeyError, TypeError):
                answer = "unparsed"
        self._records.append(
            [route, response.status_code, seconds, started - self._t0, answer, train_round]
        )
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=httpx.ByteStream(raw),
            extensions=response.extensions,
            request=request,
        )

    def close(self) -> None:
        self._inner.close()


@dataclass(frozen=True)
class SiteSpec:
    index: int
    name: str
    token: str
    class_counts: list[int]
    train_loss: float


def run_site(
    url: str,
    federation_id: str,
    spec: SiteSpec,
    poll_wait_s: float,
    deadline: float,
    out_dir: Path,
    t0: float,
) -> None:
    """One site, start to finish; writes ``out_dir/<name>.json`` (also when it fails)."""
    records: list[list[Any]] = []
    receipts: list[dict[str, Any]] = []
    error: str | None = None
    rng = np.random.default_rng(spec.index)
    http = httpx.Client(
        base_url=url,
        timeout=DEFAULT_TIMEOUT,
        transport=RecordingTransport(records, t0),
        verify=tls_context(),
    )
    client = FederationClient(url, spec.token, http_client=http)
    try:
        client.join(
            federation_id, num_samples=sum(spec.class_counts), class_counts=spec.class_counts
        )
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError("the run's deadline passed before the federation finished")
            current = client.get_current_round(federation_id, wait_s=poll_wait_s)
            if current.status == "finished":
                break
            if current.status == "wait":
                if poll_wait_s == 0:
                    time.sleep(min(current.retry_after_s or 1.0, 5.0))
                continue
            instructions = current.instructions
            assert instructions is not None
            assert current.round is not None
            data = client.download_model(
                instructions.global_model_id, expected_sha256=instructions.global_model_sha256
            )
            assert data is not None
            state = {
                name: value + np.float32(1e-3) * rng.standard_normal(value.shape, np.float32)
                for name, value in load(data).items()
            }
            signals: dict[str, Any] = {"class_counts": spec.class_counts}
            for name in instructions.signals:
                if name == "train_loss":
                    signals[name] = spec.train_loss
                elif name != "class_counts":
                    raise RuntimeError(f"the federation requires signal {name!r}: not simulated")
            receipt = client.submit_update(
                federation_id,
                instructions.round_index,
                state=state_bytes(state),
                num_samples=sum(spec.class_counts),
                signals=signals,
                idempotency_key=str(current.round.id),
            )
            receipts.append(
                {
                    "round": receipt.round_index,
                    "client_id": str(receipt.client_id),
                    "update_id": str(receipt.id),
                    "replayed": receipt.replayed,
                }
            )
    except Exception:
        error = traceback.format_exc()
    finally:
        client.close()
        http.close()
    (out_dir / f"{spec.name}.json").write_text(
        json.dumps({"site": spec.name, "records": records, "receipts": receipts, "error": error})
    )


# --- the driver ---------------------------------------------------------------------------------


def quantiles(values: Sequence[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "max": None}
    ordered = sorted(values)

    def q(p: float) -> float:
        # nearest rank: the smallest value with at least p of the samples at or below it
        k = max(0, min(len(ordered) - 1, int(np.ceil(p * len(ordered))) - 1))
        return ordered[k]

    return {
        "n": len(ordered),
        "mean": statistics.fmean(ordered),
        "p50": q(0.50),
        "p95": q(0.95),
        "p99": q(0.99),
        "max": ordered[-1],
    }


@contextmanager
def s3_store(endpoint_url: str | None) -> Iterator[dict[str, str]]:
    """The coordinators' environment for an S3 bucket of this run's own: at ``endpoint_url``
    (credentials from the environment), or on moto's server started here on loopback (the dev
    extra's ``moto[server]``, throw-away credentials)."""
    import boto3

    env: dict[str, str] = {}
    server = None
    if endpoint_url is None:
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        endpoint_url = f"http://{host}:{port}"
        env |= {"AWS_ACCESS_KEY_ID": "bench-load", "AWS_SECRET_ACCESS_KEY": "bench-load-secret"}
    bucket = f"fedaudit-load-{secrets.token_hex(6)}"
    env |= {
        "FEDAUDIT_S3_BUCKET": bucket,
        "FEDAUDIT_S3_ENDPOINT_URL": endpoint_url,
        "FEDAUDIT_S3_REGION": "us-east-1",
        "FEDAUDIT_S3_ADDRESSING_STYLE": "path",
    }
    credentials = {
        "aws_access_key_id": env.get("AWS_ACCESS_KEY_ID"),
        "aws_secret_access_key": env.get("AWS_SECRET_ACCESS_KEY"),
    }
    client = boto3.client("s3", endpoint_url=endpoint_url, region_name="us-east-1", **credentials)
    client.create_bucket(Bucket=bucket)
    try:
        yield env
    finally:
        if server is not None:
            server.stop()


@contextmanager
def coordinators(
    data_dir: Path,
    database_url: str | None,
    replicas: int,
    blob_backend: str,
    workers: int = 1,
    blob_env: Mapping[str, str] | None = None,
) -> Iterator[list[CoordinatorProcess]]:
    """``replicas`` coordinator processes on one database (one admin token), each with its own
    data directory and log; the blobs where ``blob_backend`` says (``database``: no shared disk
    between the replicas; ``s3``: the object store ``blob_env`` describes)."""
    token = secrets.token_urlsafe(24)
    env = {
        # INFO would write one access line per request; WARNING keeps errors (and tracebacks).
        "FEDAUDIT_LOG_LEVEL": "WARNING",
        "FEDAUDIT_BLOB_BACKEND": blob_backend,
        **(blob_env or {}),
    }
    with ExitStack() as stack:
        servers = []
        for i in range(replicas):
            server = CoordinatorProcess(
                data_dir / f"replica{i}" if replicas > 1 else data_dir,
                database_url=database_url,
                admin_token=token,
                extra_env=env,
                workers=workers,
            )
            server.start()
            stack.callback(server.stop)
            servers.append(server)
        yield servers


def create_load_federation(
    admin: AdminClient, sites: int, rounds: int, seed: int
) -> tuple[uuid.UUID, list[SiteSpec]]:
    federation = admin.create_federation(
        {
            "name": f"load-{uuid.uuid4().hex[:8]}",
            "task": {"num_classes": NUM_CLASSES, "input_shape": [3, 32, 32]},
            "plan": {"rounds": rounds, "min_clients": sites, "round_deadline_s": 3600},
            "config": dict(FEDNCL_FEDAVG_CONFIG),
            "seed": seed,
        }
    )
    rng = np.random.default_rng(seed)
    initial = {
        name: rng.standard_normal(shape, np.float32) * np.float32(0.05)
        for name, shape in SHAPES.items()
    }
    admin.upload_initial_model(federation.id, state_bytes(initial))
    specs = []
    for k in range(sites):
        name = f"site-{k:04d}"
        created = admin.add_client(federation.id, name)
        specs.append(
            SiteSpec(
                index=k,
                name=name,
                token=created.token,
                class_counts=[int(c) for c in rng.integers(10, 60, size=NUM_CLASSES)],
                train_loss=float(rng.uniform(0.2, 1.5)),
            )
        )
    return federation.id, specs


def monitor(
    admin: AdminClient,
    federation_id: uuid.UUID,
    processes: Sequence[multiprocessing.process.BaseProcess],
    out_dir: Path,
    sites: int,
    deadline: float,
    stall_s: float,
    started: float,
) -> list[str]:
    """Print progress until every site process exited; return problems.

    The site processes are killed at ``deadline``, or when nothing moved (no round opened or
    closed, no update stored, no site done) for ``stall_s`` seconds: the problem then says
    where the federation stood."""
    seen: dict[int, str] = {}
    last_done = -1
    problems: list[str] = []
    progress: tuple[Any, ...] = ()
    last_move = time.monotonic()
    while any(p.is_alive() for p in processes):
        now = time.monotonic()
        stalled = now - last_move > stall_s
        if now > deadline or stalled:
            try:
                f = admin.get_federation(federation_id)
                where = (
                    f"federation {f.status}, {f.joined_clients}/{f.clients} sites joined, "
                    f"{f.rounds_started} round(s) opened, rounds: {seen or 'none'}"
                )
            except Exception as exc:
                where = f"(federation not readable: {exc!r})"
            reason = f"no progress for {stall_s:.0f} s" if stalled else "the --timeout-s deadline"
            problems.append(f"stopped after {reason}: {where}; site processes killed")
            print(f"[{now - started:6.1f} s] STOPPED: {problems[-1]}", flush=True)
            for p in processes:
                if p.is_alive():
                    p.kill()
            break
        time.sleep(2.0)
        elapsed = time.monotonic() - started
        submitted: list[int] = []
        try:
            for info in admin.list_rounds(federation_id):
                submitted.append(len(info.submitted_clients))
                if seen.get(info.index) != info.state:
                    seen[info.index] = info.state
                    print(
                        f"[{elapsed:6.1f} s] round {info.index} {info.state}"
                        f" ({len(info.submitted_clients)}/{len(info.selected_clients)} updates)",
                        flush=True,
                    )
        except Exception as exc:  # progress only: the final checks decide
            print(f"[{elapsed:6.1f} s] progress query failed: {exc!r}", flush=True)
        done = len(list(out_dir.glob("*.json")))
        if done != last_done:
            last_done = done
            print(f"[{elapsed:6.1f} s] sites done: {done}/{sites}", flush=True)
        now_progress = (tuple(sorted(seen.items())), tuple(submitted), done)
        if now_progress != progress:
            progress = now_progress
            last_move = time.monotonic()
    for p in processes:
        p.join(timeout=30)
        if p.exitcode not in (0, None):
            problems.append(f"site process {p.name} exited with {p.exitcode}")
    return problems


def stored_updates(database_url: str, federation_id: uuid.UUID) -> list[dict[str, Any]]:
    """Per round of the federation: rows in model_update and distinct sites (other federations
    in the same database, an earlier run's, are left out)."""
    from service.store.tables import ModelUpdate, Round

    engine = create_engine(database_url)
    query = (
        select(
            Round.index,
            Round.state,
            func.count(ModelUpdate.id),
            func.count(distinct(ModelUpdate.client_id)),
        )
        .outerjoin(ModelUpdate, ModelUpdate.round_id == Round.id)
        .where(Round.federation_id == federation_id)
        .group_by(Round.index, Round.state)
        .order_by(Round.index)
    )
    try:
        with engine.connect() as conn:
            rows = conn.execute(query).all()
    finally:
        engine.dispose()
    return [
        {"round": int(i), "state": str(s), "rows": int(n), "distinct_sites": int(d)}
        for i, s, n, d in rows
    ]


def process_cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a running process so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    # fields[0] is the state (field 3); utime and stime are fields 14 and 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def coordinator_pid(server: CoordinatorProcess) -> int | None:
    """The pid of the ``fedaudit serve`` child (one process: uvicorn runs in it)."""
    process = getattr(server, "_process", None)
    return None if process is None else int(process.pid)


def coordinator_pids(servers: list[CoordinatorProcess]) -> list[int]:
    """Every process of the coordinators: each ``fedaudit serve`` and, with ``--workers N``, its
    worker processes (children found through /proc; Linux)."""
    roots = [pid for pid in (coordinator_pid(s) for s in servers) if pid is not None]
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(parents.get(pid, []))
    return sorted(found)


def children_cpu_seconds() -> float:
    """User + system CPU seconds of this process's exited and joined children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def memory_mib(pid: int | None) -> dict[str, float]:
    """Resident memory of a running process now (VmRSS) and at its peak so far (VmHWM), in MiB
    (Linux /proc; empty elsewhere)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found["rss" if key == "VmRSS" else "peak"] = int(value.split()[0]) / 1024
    return found


class MemorySampler(threading.Thread):
    """Samples the coordinators' summed VmRSS every ``interval_s`` while the sites run; `stop`
    gives the largest sample and the median one (most of a long-poll run, the sites wait)."""

    def __init__(self, pids: Sequence[int | None], interval_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self._pids = list(pids)
        self._interval_s = interval_s
        self._stop_event = threading.Event()
        self.samples: list[float] = []

    def run(self) -> None:
        while not self._stop_event.wait(self._interval_s):
            self.samples.append(sum(memory_mib(pid).get("rss", 0.0) for pid in self._pids))

    def stop(self) -> dict[str, float | None]:
        self._stop_event.set()
        self.join(timeout=5)
        ordered = sorted(self.samples)
        return {
            "samples": len(ordered),
            "max_rss_mib": ordered[-1] if ordered else None,
            "median_rss_mib": ordered[len(ordered) // 2] if ordered else None,
        }


def train_after_open(
    site_results: Sequence[Mapping[str, Any]], opened_at: Mapping[int, float], t0_wall: float
) -> list[float]:
    """Per site and round: seconds from the round's opening (the coordinator's ``opened_at``) to
    the end of the site's first poll answered ``train`` for it (the time a site learns of the
    round; with short polls it includes the sleep between polls)."""
    first: dict[tuple[str, int], float] = {}
    for site in site_results:
        for route, status, seconds, start, answer, *rest in site["records"]:
            index = rest[0] if rest else None
            if route != "poll" or status != 200 or answer != "train" or index is None:
                continue
            end = start + seconds
            key = (site["site"], int(index))
            first[key] = min(end, first.get(key, end))
    return [t0_wall + end - opened_at[i] for (_, i), end in first.items() if i in opened_at]


def log_errors(log_path: Path) -> dict[str, Any]:
    text_ = log_path.read_text(errors="replace") if log_path.exists() else ""
    lines = text_.splitlines()
    errors = [line for line in lines if "ERROR" in line or "Traceback" in line]
    first_traceback = None
    if "Traceback" in text_:
        start = text_.index("Traceback")
        first_traceback = "\n".join(text_[start:].splitlines()[:60])
    return {
        "error_lines": len(errors),
        "first_error_lines": errors[:10],
        "database_is_locked": text_.count("database is locked"),
        "first_traceback": first_traceback,
    }


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--sites", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--sites-per-process",
        type=int,
        default=1,
        help="sites per forked process, one thread each (1: one process per site)",
    )
    parser.add_argument(
        "--poll-wait-s",
        type=float,
        default=0.0,
        help="wait_s of get_current_round (0: short polls that sleep the server's hint)",
    )
    parser.add_argument("--postgres-url", default=None, help="default: SQLite in a temp dir")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="uvicorn worker processes of each coordinator (fedaudit serve --workers N; on "
        "SQLite they wake each other's waiting sites through the database's signal file)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="coordinator processes on the one PostgreSQL database (needs --postgres-url); the "
        "site processes are dealt to them in turn",
    )
    parser.add_argument(
        "--blob-backend",
        choices=("directory", "database", "s3"),
        default=None,
        help="where the coordinators keep the models (default: files in a directory for one "
        "replica, the database for several, which share no disk; s3: an S3-compatible store, "
        "moto's server on loopback unless --s3-endpoint-url)",
    )
    parser.add_argument(
        "--s3-endpoint-url",
        default=None,
        help="with --blob-backend s3: an S3-compatible endpoint (credentials from the "
        "environment); default: moto's server started on loopback by the benchmark",
    )
    parser.add_argument("--timeout-s", type=float, default=1200.0, help="for the whole run")
    parser.add_argument(
        "--stall-s",
        type=float,
        default=180.0,
        help="stop when no round opened or closed, no update was stored and no site finished "
        "for this long",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smoke run: 4 sites, 2 rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.sites, args.rounds = 4, 2
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.sites < 1 or args.rounds < 1 or args.sites_per_process < 1 or args.replicas < 1:
        parser.error("--sites, --rounds, --sites-per-process and --replicas must be at least 1")
    if args.replicas > 1 and not args.postgres_url:
        parser.error("--replicas above 1 needs --postgres-url (replicas share a PostgreSQL)")
    if args.replicas > 1 and args.blob_backend == "directory":
        parser.error("--blob-backend directory: replicas on separate machines share no disk")
    blob_backend = args.blob_backend or ("database" if args.replicas > 1 else "directory")
    given = sys.argv[1:] if argv is None else list(argv)
    command = " ".join(shlex.quote(a) for a in ["bench_load.py", *given])
    machine = machine_info()
    groups = [
        list(range(i, min(i + args.sites_per_process, args.sites)))
        for i in range(0, args.sites, args.sites_per_process)
    ]
    print(
        f"load: {args.sites} sites x {args.rounds} rounds, {len(groups)} site processes "
        f"({args.sites_per_process} site(s) per process), "
        f"{'PostgreSQL' if args.postgres_url else 'SQLite'}, {args.replicas} coordinator "
        f"process(es) of {args.workers} worker(s), blobs: {blob_backend}, "
        f"poll wait_s={args.poll_wait_s}; "
        f"{machine['cpu_count']} cores, {machine['memory_gib']} GiB",
        flush=True,
    )

    problems: list[str] = []
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="bench-load-") as tmp:
        data_dir = Path(tmp) / "coordinator"
        out_dir = Path(tmp) / "sites"
        out_dir.mkdir()
        blobs = ExitStack()
        blob_env = (
            blobs.enter_context(s3_store(args.s3_endpoint_url)) if blob_backend == "s3" else None
        )
        with (
            blobs,
            coordinators(
                data_dir, args.postgres_url, args.replicas, blob_backend, args.workers, blob_env
            ) as servers,
        ):
            server = servers[0]  # the admin's replica
            database_url = args.postgres_url or f"sqlite:///{(data_dir / 'fedaudit.db').resolve()}"
            with AdminClient(server.url, server.admin_token) as admin:
                setup_started = time.perf_counter()
                federation_id, specs = create_load_federation(
                    admin, args.sites, args.rounds, args.seed
                )
                setup_s = time.perf_counter() - setup_started
                print(
                    f"federation {federation_id} created, {args.sites} sites registered "
                    f"({setup_s:.1f} s); forking site processes",
                    flush=True,
                )
                context = multiprocessing.get_context("fork")
                barrier = context.Barrier(len(groups) + 1)
                processes = []
                fork_started = time.perf_counter()
                # The release time, set just before the barrier opens (shared memory: a fork
                # copies ordinary values at fork time).
                shared_t0 = context.Value("d", 0.0, lock=False)
                for number, group in enumerate(groups):
                    p = context.Process(
                        target=site_process,
                        args=(
                            servers[number % len(servers)].url,
                            str(federation_id),
                            [specs[i] for i in group],
                            args.poll_wait_s,
                            args.timeout_s,
                            out_dir,
                            barrier,
                            shared_t0,
                        ),
                        name=f"sites-{group[0]:04d}",
                    )
                    p.start()
                    processes.append(p)
                fork_s = time.perf_counter() - fork_started
                pids = coordinator_pids(servers)
                coordinator_cpu_before = sum(process_cpu_seconds(pid) for pid in pids)
                memory_before = sum(memory_mib(pid).get("rss", 0.0) for pid in pids)
                sampler = MemorySampler(pids)
                sampler.start()
                children_before = children_cpu_seconds()
                shared_t0.value = time.time()
                barrier.wait(timeout=600)
                started = time.monotonic()
                print(
                    f"{len(processes)} site processes forked ({fork_s:.1f} s) and released",
                    flush=True,
                )
                problems += monitor(
                    admin,
                    federation_id,
                    processes,
                    out_dir,
                    args.sites,
                    started + args.timeout_s + 60,
                    args.stall_s,
                    started,
                )
                wall_s = time.monotonic() - started
                coordinator_cpu_s = (
                    sum(process_cpu_seconds(pid) for pid in pids) - coordinator_cpu_before
                )
                sites_cpu_s = children_cpu_seconds() - children_before
                memory = {
                    "before_release_rss_mib": memory_before,
                    **sampler.stop(),
                    "peak_rss_mib": sum(memory_mib(pid).get("peak", 0.0) for pid in pids),
                }
                t0_wall = float(shared_t0.value)
                print(f"all site processes exited after {wall_s:.1f} s; checking", flush=True)
                federation = admin.get_federation(federation_id)
                rounds_info = admin.list_rounds(federation_id)
            logs = [log_errors(one.log_path) for one in servers]
            log = {
                "error_lines": sum(one["error_lines"] for one in logs),
                "first_error_lines": [line for one in logs for line in one["first_error_lines"]][
                    :10
                ],
                "database_is_locked": sum(one["database_is_locked"] for one in logs),
                "first_traceback": next(
                    (one["first_traceback"] for one in logs if one["first_traceback"]), None
                ),
            }
        stored = stored_updates(database_url, uuid.UUID(str(federation_id)))
        site_results = [json.loads(p.read_text()) for p in sorted(out_dir.glob("*.json"))]

    # --- figures and checks ---
    records = [r for s in site_results for r in s["records"]]
    by_route: dict[str, Counter[str]] = defaultdict(Counter)
    latencies: dict[str, list[float]] = defaultdict(list)
    poll_answers: dict[str, list[float]] = defaultdict(list)
    for route, status, seconds, _start, answer, *_ in records:
        by_route[route][str(status)] += 1
        if isinstance(status, int) and status < 400:
            latencies[route].append(seconds)
            if route == "poll" and answer is not None:
                poll_answers[answer].append(seconds)
    five_xx = sum(
        n for counts in by_route.values() for status, n in counts.items() if status.startswith("5")
    )
    transport_errors = sum(
        n for counts in by_route.values() for status, n in counts.items() if not status.isdigit()
    )
    site_errors = {s["site"]: s["error"] for s in site_results if s["error"]}
    missing_sites = args.sites - len(site_results)

    receipts: dict[int, list[str]] = defaultdict(list)
    replayed = 0
    for s in site_results:
        for receipt in s["receipts"]:
            receipts[receipt["round"]].append(receipt["client_id"])
            replayed += bool(receipt["replayed"])
    rounds_closed = sum(1 for r in rounds_info if r.state == "closed")
    per_round = []
    for r in sorted(rounds_info, key=lambda info: info.index):
        db = next((row for row in stored if row["round"] == r.index), None)
        got = receipts.get(r.index, [])
        per_round.append(
            {
                "round": r.index,
                "state": r.state,
                "selected": len(r.selected_clients),
                "submitted_api": len(r.submitted_clients),
                "submitted_api_distinct": len(set(r.submitted_clients)),
                "stored_rows_db": db["rows"] if db else 0,
                "stored_distinct_sites_db": db["distinct_sites"] if db else 0,
                "receipts": len(got),
                "receipts_distinct": len(set(got)),
                "receipts_match_api": set(got) == {str(c) for c in r.submitted_clients},
                "coordinator_seconds": r.coordinator_seconds,
                "opened_at": r.opened_at.isoformat(),
                "closed_at": r.closed_at.isoformat() if r.closed_at else None,
            }
        )
    expected = args.sites
    if federation.status != "finished":
        problems.append(f"federation is {federation.status}, not finished")
    if len(rounds_info) != args.rounds or rounds_closed != args.rounds:
        problems.append(f"{rounds_closed} of {args.rounds} rounds closed ({len(rounds_info)} seen)")
    for row in per_round:
        counts = (
            row["submitted_api"],
            row["submitted_api_distinct"],
            row["stored_rows_db"],
            row["stored_distinct_sites_db"],
            row["receipts"],
            row["receipts_distinct"],
        )
        if any(c != expected for c in counts) or not row["receipts_match_api"]:
            problems.append(
                f"round {row['round']}: expected {expected} updates from {expected} sites; "
                f"API {counts[0]} ({counts[1]} distinct), database {counts[2]} rows "
                f"({counts[3]} distinct), receipts {counts[4]} ({counts[5]} distinct), "
                f"receipts match the API: {row['receipts_match_api']}"
            )
    if five_xx:
        problems.append(f"{five_xx} answers with a 5xx status")
    if transport_errors:
        problems.append(f"{transport_errors} requests failed in transport (no HTTP answer)")
    if site_errors:
        problems.append(f"{len(site_errors)} site(s) failed")
    if missing_sites:
        problems.append(f"{missing_sites} site(s) wrote no result")

    result: dict[str, Any] = {
        "benchmark": "load",
        "command": command,
        "machine": machine,
        "parameters": {
            "sites": args.sites,
            "rounds": args.rounds,
            "sites_per_process": args.sites_per_process,
            "site_processes": len(groups),
            "poll_wait_s": args.poll_wait_s,
            "database": "postgresql" if args.postgres_url else "sqlite",
            "replicas": args.replicas,
            "workers": args.workers,
            "blob_backend": blob_backend,
            "model_parameters": int(sum(int(np.prod(s)) for s in SHAPES.values())),
            "config": FEDNCL_FEDAVG_CONFIG,
            "coordinator": "uvicorn processes (fedaudit serve, one per replica), default settings",
            "quick": args.quick,
        },
        "setup_seconds": setup_s,
        "fork_seconds": fork_s,
        "wall_seconds": wall_s,
        "cpu_seconds": {
            "coordinator": coordinator_cpu_s,
            "site_processes": sites_cpu_s,
            "available": wall_s * (machine["cpu_count"] or 1),
        },
        "requests": len(records),
        "status_by_route": {route: dict(by_route[route]) for route in ROUTES if route in by_route},
        "latency_seconds": {route: quantiles(latencies[route]) for route in LATENCY_ROUTES},
        "poll_latency_by_answer": {k: quantiles(v) for k, v in sorted(poll_answers.items())},
        "train_after_open_seconds": quantiles(
            train_after_open(
                site_results, {r.index: r.opened_at.timestamp() for r in rounds_info}, t0_wall
            )
        ),
        "coordinator_memory": memory,
        "five_xx": five_xx,
        "transport_errors": transport_errors,
        "federation_status": federation.status,
        "rounds_closed": rounds_closed,
        "rounds_expected": args.rounds,
        "updates_expected_per_round": expected,
        "uploads_replayed": replayed,
        "per_round": per_round,
        "coordinator_log": log,
        "site_errors": dict(list(site_errors.items())[:5]),
        "site_errors_count": len(site_errors),
        "problems": problems,
        "ok": not problems,
    }
    write_result(args.out, result)
    print_summary(result)
    return 0 if not problems else 1


def site_process(
    url: str,
    federation_id: str,
    specs: Sequence[SiteSpec],
    poll_wait_s: float,
    timeout_s: float,
    out_dir: Path,
    barrier: Any,
    shared_t0: Any,
) -> None:
    """A forked process: wait for the others, then run its sites (one thread each).

    ``shared_t0`` is the wall time of the release, set by the driver just before it opens the
    barrier; each process turns it into its own ``perf_counter`` origin."""
    tls_context()  # made before the release, not by the first site that needs it
    barrier.wait(timeout=600)
    t0 = time.perf_counter() - (time.time() - float(shared_t0.value))
    deadline = time.monotonic() + timeout_s
    if len(specs) == 1:
        run_site(url, federation_id, specs[0], poll_wait_s, deadline, out_dir, t0)
        return
    threads = [
        threading.Thread(
            target=run_site,
            args=(url, federation_id, spec, poll_wait_s, deadline, out_dir, t0),
            name=spec.name,
        )
        for spec in specs
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def print_summary(result: Mapping[str, Any]) -> None:
    p = result["parameters"]
    print(
        f"\n{p['sites']} sites x {p['rounds']} rounds on {p['database']} "
        f"({p['site_processes']} site processes): wall {result['wall_seconds']:.1f} s, "
        f"{result['requests']} requests; CPU seconds: coordinator "
        f"{result['cpu_seconds']['coordinator']:.0f}, site processes "
        f"{result['cpu_seconds']['site_processes']:.0f}, of "
        f"{result['cpu_seconds']['available']:.0f} available"
    )
    for route, counts in result["status_by_route"].items():
        print(f"  {route:9s} " + ", ".join(f"{s}: {n}" for s, n in sorted(counts.items())))
    for route, q in result["latency_seconds"].items():
        if q["n"]:
            print(
                f"  {route:9s} latency p50 {q['p50'] * 1e3:7.1f} ms  p95 {q['p95'] * 1e3:7.1f} ms"
                f"  p99 {q['p99'] * 1e3:7.1f} ms  max {q['max'] * 1e3:7.1f} ms  (n={q['n']})"
            )
    after = result["train_after_open_seconds"]
    if after["n"]:
        print(
            f"  a site told to train, after its round opened: p50 {after['p50']:.2f} s, "
            f"p99 {after['p99']:.2f} s, max {after['max']:.2f} s (n={after['n']})"
        )
    memory = result["coordinator_memory"]
    if memory.get("peak_rss_mib"):
        print(
            f"  coordinator RSS: {memory['before_release_rss_mib']:.0f} MiB before the sites "
            f"started, median {memory['median_rss_mib']:.0f} MiB while they ran, peak "
            f"{memory['peak_rss_mib']:.0f} MiB"
        )
    print(
        f"  rounds closed {result['rounds_closed']}/{result['rounds_expected']}; updates per "
        "round (API/db rows/receipts): "
        + ", ".join(
            f"r{r['round']} {r['submitted_api']}/{r['stored_rows_db']}/{r['receipts']}"
            for r in result["per_round"]
        )
        + f" of {result['updates_expected_per_round']}; 5xx {result['five_xx']}; coordinator "
        f"log ERROR lines {result['coordinator_log']['error_lines']}"
    )
    if result["problems"]:
        print("FAILED:\n  " + "\n  ".join(result["problems"]))
        if result["coordinator_log"]["first_traceback"]:
            print(
                "first traceback in the coordinator log:\n"
                + result["coordinator_log"]["first_traceback"]
            )
        for site, error in result["site_errors"].items():
            print(f"{site}:\n{error}")
    else:
        print("OK: no 5xx, no lost or duplicated update, every round closed")


if __name__ == "__main__":
    sys.exit(main())
