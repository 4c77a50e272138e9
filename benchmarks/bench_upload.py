"""How fast does a 45 MB update go through the real service, next to a bare uvicorn endpoint?

Starts a real coordinator (``CoordinatorProcess``, SQLite, temporary directory) and a bare
Starlette app served by uvicorn in a second process (same uvicorn defaults as ``fedaudit serve``)
whose only route reads the request body chunk by chunk and discards it. A federation is created
with a ResNet-18-sized initial model (11.2M float32, 45 MB), so every update is valid: the same
tensor names, shapes and dtypes, finite values, well-formed signals.

Each repeat uploads, in alternation:

* through the service: ``FederationClient.submit_update`` (multipart metadata + state; the SDK
  hashes the state first, the server streams it to disk, hashes it, checks the manifest and the
  values, stores the blob and records the update), one site per upload, each a distinct state
  (blobs are content-addressed, so a repeated state would skip the store);
* to the sink: the same multipart body (same ``httpx`` call shape: ``files=``), discarded.

MB/s is the state's bytes (10**6) per second of the whole request, response included; the ratio
is service / sink, the median of the ratios taken per repeat. The client-side sha256 of the
state is timed on its own as well, to show how much of the gap is the SDK's hash.

    .venv/bin/python benchmarks/bench_upload.py --out runs/bench_upload.json
    .venv/bin/python benchmarks/bench_upload.py --quick --out runs/upload.json
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from _common import (
    benchmark_parser,
    has_module,
    machine_info,
    make_state,
    mb,
    median,
    paired_ratio,
    python,
    resnet18_shapes,
    state_nbytes,
    write_result,
)
from _coordinator import (
    FEDNCL_FEDAVG_CONFIG,
    Federation,
    create_federation,
    running_coordinator,
    state_bytes,
)
from numpy.typing import NDArray

from fedaudit_sim.coordinator_process import CoordinatorProcess

SINK_APP = textwrap.dedent(
    """
    import sys

    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route


    async def sink(request: Request) -> JSONResponse:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
        return JSONResponse({"bytes": size}, status_code=201)


    async def readyz(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})


    app = Starlette(routes=[Route("/sink", sink, methods=["POST"]), Route("/readyz", readyz)])
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
    """
)


class Sink(CoordinatorProcess):
    """The bare endpoint in a child process (uvicorn, as ``fedaudit serve`` runs it).

    Only ``start`` differs from the coordinator's: the readiness wait (``/readyz``), the log
    and ``stop`` are ``CoordinatorProcess``'s.
    """

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.data_dir / "sink.log"
        script = self.data_dir / "sink_app.py"
        script.write_text(SINK_APP)
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [python(), str(script), str(self.port)], stdout=log, stderr=subprocess.STDOUT
            )
        self._wait_ready(log_start)

    def _answers_to_our_token(self) -> bool:
        """The sink has no admin token: its ``/readyz`` answering is enough."""
        return True


def time_uploads(
    federation: Federation, sink: httpx.Client, base: dict[str, NDArray[Any]], uploads: int
) -> tuple[list[float], list[float], list[float]]:
    """Seconds of each upload to the sink, through the service, and of the client-side sha256."""
    sink_s: list[float] = []
    service_s: list[float] = []
    hash_s: list[float] = []
    for i in range(uploads):
        site = federation.sites[i]
        state = dict(base)
        bias = state["fc.bias"].copy()
        bias[0] = float(i + 1)  # a distinct state per upload
        state["fc.bias"] = bias
        payload = state_bytes(state)
        metadata = json.dumps(
            {
                "num_samples": site.num_samples,
                "sha256": "0" * 64,
                "signals": site.signals(),
                "metrics": {},
            }
        )

        started = time.perf_counter()
        response = sink.post(
            "/sink",
            files={
                "metadata": (None, metadata, "application/json"),
                "state": ("state.safetensors", payload, "application/octet-stream"),
            },
        )
        sink_s.append(time.perf_counter() - started)
        response.raise_for_status()
        if response.json()["bytes"] < len(payload):
            raise RuntimeError("the sink received fewer bytes than were sent")

        receipt, seconds = site.timed_submit(federation.id, 0, payload)
        service_s.append(seconds)
        if receipt.size_bytes != len(payload):
            raise RuntimeError("the service stored a different size")

        started = time.perf_counter()
        hashlib.sha256(payload).hexdigest()
        hash_s.append(time.perf_counter() - started)
        del payload
    return sink_s, service_s, hash_s


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; return (and write) the result."""
    parser = benchmark_parser(__doc__, model_state=True)
    parser.add_argument("--repeats", type=int, default=5, help="timed uploads to each endpoint")
    parser.add_argument("--quick", action="store_true", help="smoke run: width 8, 1 repeat")
    args = parser.parse_args(argv)
    if args.quick:
        args.width, args.repeats = 8, 1
    warmup = 1
    shapes = resnet18_shapes(args.width)
    base = make_state(shapes, seed=0)
    size = state_nbytes(base)

    with (
        tempfile.TemporaryDirectory(dir=args.workdir, prefix="bench-upload-") as tmp,
        running_coordinator(Path(tmp) / "coordinator") as (server, admin),
        Sink(Path(tmp) / "sink") as sink,
        httpx.Client(base_url=sink.url, timeout=120.0) as bare,
        # One site per upload and one more that never uploads, so round 0 stays open and no
        # round close runs during the measurement.
        create_federation(
            server,
            admin,
            state_bytes(base),
            clients=warmup + args.repeats + 1,
            rounds=1,
            config=FEDNCL_FEDAVG_CONFIG,
        ) as federation,
    ):
        sink_s, service_s, hash_s = (
            times[warmup:] for times in time_uploads(federation, bare, base, warmup + args.repeats)
        )

    service_mbps = [mb(size) / t for t in service_s]
    sink_mbps = [mb(size) / t for t in sink_s]
    result: dict[str, Any] = {
        "benchmark": "upload",
        "machine": machine_info(),
        "parameters": {
            "width": args.width,
            "state_bytes": size,
            "repeats": args.repeats,
            "warmup": warmup,
            "uvicorn": uvicorn.__version__,
            "uvicorn_http": "httptools" if has_module("httptools") else "h11",
            "uvicorn_loop": "uvloop" if has_module("uvloop") else "asyncio",
            "database": "sqlite",
            "quick": args.quick,
        },
        "service": {"seconds": service_s, "mb_per_s": service_mbps},
        "sink": {"seconds": sink_s, "mb_per_s": sink_mbps},
        "client_sha256": {"seconds": hash_s, "mb_per_s": [mb(size) / t for t in hash_s]},
        "median_service_mb_per_s": median(service_mbps),
        "median_sink_mb_per_s": median(sink_mbps),
        "service_over_sink": paired_ratio(service_mbps, sink_mbps),
        "client_sha256_share_of_service_time": paired_ratio(hash_s, service_s),
        "notes": [
            "MB/s = state bytes / seconds of the whole request (response included)",
            "both endpoints are uvicorn in a child process on 127.0.0.1 with the same defaults",
        ],
    }
    print(
        f"upload of a {mb(size):.1f} MB update: service {result['median_service_mb_per_s']:.0f} "
        f"MB/s, bare uvicorn sink {result['median_sink_mb_per_s']:.0f} MB/s -> service/sink "
        f"{result['service_over_sink']:.3f} (client sha256: "
        f"{result['client_sha256_share_of_service_time']:.1%} of the service upload time)"
    )
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
