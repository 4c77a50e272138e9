"""How long does the coordinator take from the last upload of a round to the next round open?

Starts a real coordinator (``CoordinatorProcess``: ``fedaudit db upgrade`` + ``fedaudit serve``
on SQLite in a temporary directory), creates a federation through ``AdminClient`` with a
ResNet-18-sized initial model (11.2M float32, 45 MB, built with numpy: ResNet-18's tensor names
and shapes), registers K sites, and each site uploads a distinct, well-formed update with
``FederationClient.submit_update``. Two configurations (``--config``):

* ``fedncl-fedavg`` (the default): FedAvg with the Fed-NCL detector only (its only signal is the
  train loss); the round close reads every update once (Fed-NCL's divergence and FedAvg in one
  pass), writes the new model and opens the next round;
* ``fednoro-daagg``: the full audit of issue 18's target, FedNoRo's detector as the primary,
  Fed-NCL and FedRN's expertise with the neighbors (the sites send per-class losses, a train
  accuracy and the probe softmax; the first 20 % report losses far above the others'), DaAgg,
  no warm-up. The medians count the closes from round 2, when the noisy sites' status is noisy
  (flagged in rounds 0 and 1), as in a federation past its warm-up.

Measured per round close:

* ``coordinator_seconds``, recorded by the server around the close (``AdminClient.get_round``);
* wall clock from the last upload's response to ``get_current_round`` answering with the next
  round, asked every ``--poll-ms`` (25 ms, ``wait_s=0``) so the figure is when the round became
  visible (includes the background worker's pick-up). A ``Participant`` long-polls instead; the
  server wakes a waiting long poll when the round opens (an in-process signal sent when the
  close commits), so a site learns of the round about as soon as this;
* the I/O floor: reading the K stored update files once (raw ``readinto``, page cache), measured
  right after that close, so each ratio compares two measurements taken seconds apart;
* Flower's FedAvg on the last round's stored files after the last close (with ``flwr``
  installed, the ``bench`` extra; one warm-up, then ``--floor-repeats`` times): each file loaded
  with ``safetensors.numpy.load_file``, then Flower's ``aggregate``; the ratio is its median
  over the median ``coordinator_seconds`` (why after the last close and not after each:
  ``flower_fedavg_seconds``);
* for a breakdown (``fedncl-fedavg`` only: the full audit's close depends on the sites' status
  history, which the re-run does not have), the audit and aggregation alone
  (``service.audit.run_audit`` with the federation's stored audit configuration) re-run in the
  benchmark's process on the same stored files, with numpy's default BLAS threads and again
  with one: the rest of ``coordinator_seconds`` is writing the new model and the database work.

The uploads of K = 100 full-size updates are 4.5 GB per round: ``--max-upload-gb`` (default 2.5)
caps the bytes uploaded per K; above it the state is scaled down (fewer channels, same 122
tensors) and the result says so. ``--max-upload-gb 10`` runs K = 100 at full size.

    .venv/bin/python benchmarks/bench_round_overhead.py --out runs/bench_round_overhead.json
    .venv/bin/python benchmarks/bench_round_overhead.py --config fednoro-daagg --clients 100 \
        --rounds 4 --max-upload-gb 20 --out runs/round_fednoro.json
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
    has_module,
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
    CONFIGS,
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


def flower_fedavg_seconds(paths: list[Path], sites: list[Any], repeats: int) -> list[float]:
    """Flower's FedAvg on the stored files of the last round, as ``bench_aggregation`` times it:
    each file loaded with ``safetensors.numpy.load_file`` into its per-layer arrays, then
    ``flwr.server.strategy.aggregate.aggregate`` with the sites' sample counts; one untimed
    warm-up, then ``repeats`` times (empty without Flower).

    After the last close, not after each: Flower holds the K updates and their weighted copies
    (9 GB at K = 100 x 44.8 MB). Timed after each close in this process, the closes after it took
    2-3x longer (measured; our explanation: the process keeps that heap, and the next round's
    updates leave the page cache); timed in a fresh child process it took 5-6 s against 0.9 s
    warm (measured; page faults, we think), which a running Flower server would not pay."""
    if not has_module("flwr"):
        return []
    from flwr.server.strategy.aggregate import aggregate as flwr_aggregate
    from safetensors.numpy import load_file

    def once() -> float:
        started = time.perf_counter()
        results = []
        for path, site in zip(paths, sites, strict=True):
            tensors = load_file(str(path))
            results.append(([tensors[name] for name in sorted(tensors)], site.num_samples))
        flwr_aggregate(results)
        return time.perf_counter() - started

    once()
    return [once() for _ in range(repeats)]


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


STEADY_FROM = {"fedncl-fedavg": 0, "fednoro-daagg": 2}
"""The first round whose close the medians count: FedNoRo's noisy sites are flagged in rounds 0
and 1 and hold the status noisy from round 2 on (2 flags in 3 rounds), as in a federation past
its warm-up; the earlier closes are reported too."""


def run_k(
    server: CoordinatorProcess,
    admin: AdminClient,
    clients: int,
    width: int,
    rounds: int,
    floor_repeats: int,
    poll_s: float,
    config_name: str = "fedncl-fedavg",
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
        config=CONFIGS[config_name],
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
            # in process only where it repeats the close (no status history to pass)
            audit_seconds, audit_one_thread = (
                time_audit(server, admin, federation, r, paths)
                if config_name == "fedncl-fedavg"
                else (None, None)
            )
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
                    "audit_share_of_coordinator": (
                        None if audit_seconds is None else audit_seconds / info.coordinator_seconds
                    ),
                    "audit_in_process_one_blas_thread_seconds": audit_one_thread,
                    "upload_seconds_median": median(upload_seconds),
                    "upload_mb_per_s_median": mb(one_state) / median(upload_seconds),
                    "aggregation_rule": info.aggregation_rule,
                }
            )
        # Flower on the last round's files (still stored: retention keeps each site's latest).
        flower = flower_fedavg_seconds(paths, federation.sites, floor_repeats)
    finally:
        federation.close()
    steady = [c for c in closes if c["round"] >= STEADY_FROM[config_name]] or closes

    def mid(key: str) -> float | None:
        values = [c[key] for c in steady if c[key] is not None]
        return median(values) if values else None

    return {
        "clients": clients,
        "width": width,
        "config": config_name,
        "state_bytes": one_state,
        "round_bytes": clients * one_state,
        "closes": closes,
        "medians_from_round": steady[0]["round"],
        "median_coordinator_seconds": mid("coordinator_seconds"),
        "median_wall_seconds": mid("wall_seconds_last_upload_to_next_round"),
        "median_io_floor_seconds": mid("io_floor_seconds"),
        "coordinator_over_io_floor": mid("coordinator_over_io_floor"),
        "wall_over_io_floor": mid("wall_over_io_floor"),
        "flwr_fedavg_seconds": flower,
        "median_flwr_fedavg_seconds": median(flower) if flower else None,
        "coordinator_speedup_vs_flwr_fedavg": (
            median(flower) / mid_coordinator
            if flower and (mid_coordinator := mid("coordinator_seconds"))
            else None
        ),
        "median_audit_in_process_seconds": mid("audit_in_process_seconds"),
        "median_audit_one_blas_thread_seconds": mid("audit_in_process_one_blas_thread_seconds"),
    }


def summary_line(k: int, entry: dict[str, Any]) -> str:
    """One line per K: the medians, with what was not measured left out."""

    def seconds(key: str, digits: int = 2) -> str:
        value = entry[key]
        return "n/a" if value is None else f"{value:.{digits}f} s"

    flower = entry["coordinator_speedup_vs_flwr_fedavg"]
    return (
        f"K={k} ({entry['config']}, medians from round {entry['medians_from_round']}): "
        f"{mb(entry['state_bytes']):.1f} MB per update"
        f"{' (scaled down)' if 'scaled_down' in entry else ''}; "
        f"coordinator {seconds('median_coordinator_seconds')}, wall "
        f"{seconds('median_wall_seconds')}; Flower's FedAvg on the same files "
        f"{seconds('median_flwr_fedavg_seconds')}"
        f"{'' if flower is None else f' (coordinator {flower:.2f}x faster)'}; in process "
        f"{seconds('median_audit_in_process_seconds')} (one BLAS thread "
        f"{seconds('median_audit_one_blas_thread_seconds')}); read-all-once floor "
        f"{seconds('median_io_floor_seconds', 3)} -> coordinator/floor "
        f"{entry['coordinator_over_io_floor']:.1f}, wall/floor {entry['wall_over_io_floor']:.1f}"
    )


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
    parser.add_argument(
        "--config",
        choices=sorted(CONFIGS),
        default="fedncl-fedavg",
        help="fedncl-fedavg: FedAvg with the Fed-NCL detector (the train loss only); "
        "fednoro-daagg: the full audit (FedNoRo primary, Fed-NCL, FedRN expertise and "
        "neighbors, DaAgg, no warm-up; medians from round 2, when the noisy sites' status is "
        "noisy)",
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
                server,
                admin,
                k,
                width,
                args.rounds,
                args.floor_repeats,
                args.poll_ms / 1e3,
                args.config,
            )
            if width != args.width:
                entry["scaled_down"] = (
                    f"K={k} x {args.rounds} round(s) x {mb(full_state):.1f} MB exceeds "
                    f"--max-upload-gb {args.max_upload_gb}: width {width} "
                    f"({mb(entry['state_bytes']):.1f} MB per update) instead of "
                    f"{args.width}"
                )
            per_k[str(k)] = entry
            print(summary_line(k, entry))

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
            "config": args.config,
            "federation_config": CONFIGS[args.config],
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
