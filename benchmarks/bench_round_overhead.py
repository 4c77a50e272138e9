"""How long does the coordinator take from the last upload of a round to the next round open?

Starts a real coordinator (``CoordinatorProcess``: ``fedaudit db upgrade`` + ``fedaudit serve``
on SQLite in a temporary directory), creates a federation through ``AdminClient`` with a
ResNet-18-sized initial model (11.2M float32, 45 MB, built with numpy: ResNet-18's tensor names
and shapes), registers K sites, and each site uploads a distinct, well-formed update with
``FederationClient.submit_update``. The federation uses FedAvg with the Fed-NCL detector only
(its only signal is the train loss), so the round close reads every update twice (Fed-NCL's
divergence, then FedAvg), writes the new model and opens the next round.

Measured per round close:

* ``coordinator_seconds``, recorded by the server around the close (``AdminClient.get_round``);
* wall clock from the last upload's response to ``get_current_round`` answering with the next
  round, asked every ``--poll-ms`` (25 ms, ``wait_s=0``) so the figure is when the round became
  visible (includes the background worker's pick-up). A ``Participant`` long-polls instead; the
  server wakes a waiting long poll when the round opens (an in-process signal sent when the
  close commits), so a site learns of the round about as soon as this;
* the I/O floor: reading the K stored update files once (raw ``readinto``, page cache), measured
  right after that close, so each ratio compares two measurements taken seconds apart;
* for a breakdown, the audit and aggregation alone (``service.audit.run_audit`` with the
  federation's stored audit configuration) re-run in the benchmark's process on the same stored
  files, with numpy's default BLAS threads and again with one: the rest of
  ``coordinator_seconds`` is writing the new model and the database work.

The uploads of K = 100 full-size updates are 4.5 GB per round: ``--max-upload-gb`` (default 2.5)
caps the bytes uploaded per K; above it the state is scaled down (fewer channels, same 122
tensors) and the result says so. ``--max-upload-gb 10`` runs K = 100 at full size.

    .venv/bin/python benchmarks/bench_round_overhead.py --out runs/bench_round_overhead.json
    .venv/bin/python benchmarks/bench_round_overhead.py --quick --out runs/round.json
"""

from __future__ import annotations

import hashlib
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import (
    benchmark_parser,
    machine_info,
    make_state,
    mb,
    median,
    perturbed,
    resnet18_shapes,
    state_nbytes,
    write_result,
)
from _coordinator import (
    FEDNCL_FEDAVG_CONFIG,
    Federation,
    blob_path,
    create_federation,
    running_coordinator,
    state_bytes,
)
from threadpoolctl import threadpool_limits

from client_sdk import AdminClient
from fedaudit_sim.coordinator_process import CoordinatorProcess
from service.audit import AuditConfig, ClientRoundData, run_audit
from service.coordinator.tensors import SafetensorsReader


def read_all(paths: list[Path], buffer: bytearray) -> int:
    """Read every file once into ``buffer`` (no allocation per read); return bytes read."""
    view = memoryview(buffer)
    total = 0
    for path in paths:
        with path.open("rb", buffering=0) as handle:
            while True:
                n = handle.readinto(view)
                if not n:
                    break
                total += n
    return total


def time_audit(
    server: CoordinatorProcess,
    admin: AdminClient,
    federation: Federation,
    round_index: int,
    update_paths: list[Path],
) -> tuple[float, float]:
    """Seconds of ``run_audit`` (detection + FedAvg) on the round's stored files, in process:
    with numpy's default BLAS threads (as the coordinator runs it), then with one BLAS thread.

    Fed-NCL's divergence takes ``np.dot`` of long vectors, which OpenBLAS spreads over its
    threads; on a shared 2-core machine those threads wait on each other whenever a neighbour
    holds a core, which the second figure shows.
    """
    info = admin.get_round(federation.id, round_index)
    global_sha = hashlib.sha256(admin.download_model(info.model_in_id)).hexdigest()
    stored = admin.get_federation(federation.id).config
    audit = dict(stored["audit"])
    if round_index < int(stored["warmup_rounds"]):
        audit["aggregation"] = "fedavg"  # what the coordinator does during the warm-up
    config = AuditConfig.from_json(audit)

    def once() -> float:
        started = time.perf_counter()
        data = [
            ClientRoundData(
                client_id=site.name,
                num_samples=site.num_samples,
                class_counts=np.asarray(site.class_counts),
                train_loss=site.train_loss,
                state=SafetensorsReader(path),
            )
            for site, path in zip(federation.sites, update_paths, strict=True)
        ]
        global_reader = SafetensorsReader(blob_path(server.data_dir, global_sha))
        run_audit(global_reader, data, config, round_index=round_index)
        return time.perf_counter() - started

    default_threads = once()
    with threadpool_limits(limits=1):
        one_thread = once()
    return default_threads, one_thread


def width_for_budget(width: int, clients: int, rounds: int, budget_bytes: float) -> int:
    """The largest ResNet-18 width <= ``width`` whose uploads fit the budget."""
    w = width
    while w > 1:
        per_state = state_nbytes_for(w)
        if clients * rounds * per_state <= budget_bytes:
            return w
        w -= 1
    return 1


def state_nbytes_for(width: int) -> int:
    shapes = resnet18_shapes(width)
    total = 0
    for name, shape in shapes.items():
        itemsize = 8 if name.endswith("num_batches_tracked") else 4
        total += math.prod(shape) * itemsize
    return total


def run_k(
    server: CoordinatorProcess,
    admin: AdminClient,
    clients: int,
    width: int,
    rounds: int,
    floor_repeats: int,
    poll_s: float,
) -> dict[str, Any]:
    """One federation with K clients; ``rounds`` round closes measured."""
    shapes = resnet18_shapes(width)
    base = make_state(shapes, seed=0)
    noise = make_state(shapes, seed=1)
    one_state = state_nbytes(base)
    # rounds + 1 planned: the last measured close must open a next round, not finish.
    federation = create_federation(
        server,
        admin,
        state_bytes(base),
        clients=clients,
        rounds=rounds + 1,
        config=FEDNCL_FEDAVG_CONFIG,
    )
    buffer = bytearray(8 * 2**20)
    closes: list[dict[str, Any]] = []
    try:
        for r in range(rounds):
            upload_seconds: list[float] = []
            digests: list[str] = []
            for k, site in enumerate(federation.sites):
                # Distinct bytes per site and round (blobs are content-addressed).
                payload = state_bytes(perturbed(base, noise, 1e-3 * (k + 1) + 1e-4 * r, k + r))
                receipt, seconds = site.timed_submit(federation.id, r, payload)
                upload_seconds.append(seconds)
                digests.append(receipt.sha256)
                del payload
            last_upload_done = time.perf_counter()
            poller = federation.sites[0].client
            polls = 0
            while True:
                current = poller.get_current_round(federation.id, wait_s=0.0)
                polls += 1
                if current.status == "train" and current.round and current.round.index == r + 1:
                    break
                if current.status == "finished":
                    raise RuntimeError("the federation finished before the next round opened")
                if time.perf_counter() - last_upload_done > 600:
                    raise RuntimeError(f"round {r + 1} did not open within 600 s")
                time.sleep(poll_s)
            wall = time.perf_counter() - last_upload_done
            info = admin.get_round(federation.id, r)
            if info.state != "closed" or info.coordinator_seconds is None:
                raise RuntimeError(f"round {r} is {info.state} with no coordinator_seconds")
            paths = [blob_path(server.data_dir, d) for d in digests]
            floors = []
            for _ in range(floor_repeats):
                started = time.perf_counter()
                read = read_all(paths, buffer)
                floors.append(time.perf_counter() - started)
            floor = median(floors)
            audit_seconds, audit_one_thread = time_audit(server, admin, federation, r, paths)
            closes.append(
                {
                    "round": r,
                    "coordinator_seconds": info.coordinator_seconds,
                    "wall_seconds_last_upload_to_next_round": wall,
                    "polls": polls,
                    "io_floor_seconds": floor,
                    "io_floor_runs": floors,
                    "io_floor_bytes": read,
                    "coordinator_over_io_floor": info.coordinator_seconds / floor,
                    "wall_over_io_floor": wall / floor,
                    "audit_in_process_seconds": audit_seconds,
                    "audit_share_of_coordinator": audit_seconds / info.coordinator_seconds,
                    "audit_in_process_one_blas_thread_seconds": audit_one_thread,
                    "upload_seconds_median": median(upload_seconds),
                    "upload_mb_per_s_median": mb(one_state) / median(upload_seconds),
                    "aggregation_rule": info.aggregation_rule,
                }
            )
    finally:
        federation.close()
    return {
        "clients": clients,
        "width": width,
        "state_bytes": one_state,
        "round_bytes": clients * one_state,
        "closes": closes,
        "median_coordinator_seconds": median([c["coordinator_seconds"] for c in closes]),
        "median_wall_seconds": median(
            [c["wall_seconds_last_upload_to_next_round"] for c in closes]
        ),
        "median_io_floor_seconds": median([c["io_floor_seconds"] for c in closes]),
        "coordinator_over_io_floor": median([c["coordinator_over_io_floor"] for c in closes]),
        "wall_over_io_floor": median([c["wall_over_io_floor"] for c in closes]),
        "median_audit_in_process_seconds": median([c["audit_in_process_seconds"] for c in closes]),
        "median_audit_one_blas_thread_seconds": median(
            [c["audit_in_process_one_blas_thread_seconds"] for c in closes]
        ),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; return (and write) the result."""
    parser = benchmark_parser(__doc__, model_state=True)
    parser.add_argument("--clients", default="10,100", help="comma-separated K values")
    parser.add_argument("--rounds", type=int, default=2, help="round closes measured per K")
    parser.add_argument(
        "--max-upload-gb",
        type=float,
        default=2.5,
        help="cap on bytes uploaded per K (all rounds); above it the state is scaled down",
    )
    parser.add_argument("--floor-repeats", type=int, default=3)
    parser.add_argument(
        "--poll-ms", type=float, default=25.0, help="get_current_round interval after the upload"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: K = 3, width 4, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.width, args.rounds, args.floor_repeats = "3", 4, 1, 1
    sizes = [int(s) for s in args.clients.split(",") if s.strip()]
    full_state = state_nbytes_for(args.width)

    per_k: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(dir=args.workdir, prefix="bench-round-") as tmp,
        running_coordinator(Path(tmp) / "coordinator") as (server, admin),
    ):
        for k in sizes:
            width = width_for_budget(args.width, k, args.rounds, args.max_upload_gb * 1e9)
            entry = run_k(
                server, admin, k, width, args.rounds, args.floor_repeats, args.poll_ms / 1e3
            )
            if width != args.width:
                entry["scaled_down"] = (
                    f"K={k} x {args.rounds} round(s) x {mb(full_state):.1f} MB exceeds "
                    f"--max-upload-gb {args.max_upload_gb}: width {width} "
                    f"({mb(entry['state_bytes']):.1f} MB per update) instead of "
                    f"{args.width}"
                )
            per_k[str(k)] = entry
            print(
                f"K={k}: {mb(entry['state_bytes']):.1f} MB per update"
                f"{' (scaled down)' if 'scaled_down' in entry else ''}; "
                f"coordinator {entry['median_coordinator_seconds']:.2f} s, wall "
                f"{entry['median_wall_seconds']:.2f} s (audit+FedAvg alone "
                f"{entry['median_audit_in_process_seconds']:.2f} s, one BLAS thread "
                f"{entry['median_audit_one_blas_thread_seconds']:.2f} s), read-all-once "
                f"floor "
                f"{entry['median_io_floor_seconds']:.3f} s -> coordinator/floor "
                f"{entry['coordinator_over_io_floor']:.1f}, wall/floor "
                f"{entry['wall_over_io_floor']:.1f}"
            )

    result: dict[str, Any] = {
        "benchmark": "round_overhead",
        "machine": machine_info(),
        "parameters": {
            "clients": sizes,
            "width": args.width,
            "full_state_bytes": full_state,
            "rounds": args.rounds,
            "max_upload_gb": args.max_upload_gb,
            "floor_repeats": args.floor_repeats,
            "poll_ms": args.poll_ms,
            "config": FEDNCL_FEDAVG_CONFIG,
            "database": "sqlite",
            "quick": args.quick,
        },
        "per_clients": per_k,
        "notes": [
            "coordinator_seconds: measured by the server around the round close",
            "wall: last upload response -> get_current_round (polled, wait_s=0) shows the next "
            "round",
            "I/O floor: the K stored update files read once (readinto, page cache)",
            "audit_in_process: run_audit re-run by the benchmark on the same files",
        ],
    }
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
