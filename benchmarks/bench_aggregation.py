"""How fast does the coordinator aggregate K client updates stored as safetensors files?

Writes a global state and K client updates with ResNet-18's tensor shapes (``--width 64``: 11.2M
float32, 45 MB each) to a work directory, then times ``service.audit.aggregate`` for each rule,
reading every state through the coordinator's streaming reader
``service.coordinator.tensors.SafetensorsReader`` exactly as a round close does. Throughput is
update bytes aggregated per second (K x the size of one update / seconds; DaAgg reads every update
twice and is still charged once). Two references are measured in the same process, in
alternation with the rules:

* the machine's memory-copy bandwidth (``np.copyto`` of a 256 MiB array), and
* the floor: a plain numpy weighted sum, in float64, of the same K states already in memory
  (one flat float32 vector per client), which is what FedAvg costs with no file, no per-tensor
  loop and no validation.

A "read only" pass (every tensor of every update read through the reader, no arithmetic) shows how
much of a rule's time is reading. Peak memory of one call of each rule is measured separately with
``tracemalloc`` (allocations only; the files are memory-mapped page cache, which the process does
not hold) and compared with the size of one state: a rule that held all K states would peak near
K times that.

When Flower (``flwr``) is installed, its ``aggregate`` (FedAvg) runs on identical in-memory arrays
too; otherwise the result says it was skipped. The files are read from the page cache (they were
just written), as they are on a coordinator that has just received them.

    .venv/bin/python benchmarks/bench_aggregation.py --out runs/bench_aggregation.json
    .venv/bin/python benchmarks/bench_aggregation.py --quick --out runs/agg.json
"""

from __future__ import annotations

import gc
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _common import (
    CopyBandwidth,
    alternate,
    benchmark_parser,
    has_module,
    machine_info,
    make_state,
    max_rss_bytes,
    mb,
    median,
    paired_ratio,
    perturbed,
    resnet18_shapes,
    state_nbytes,
    traced_peak,
    write_result,
)
from numpy.typing import NDArray
from safetensors.numpy import save_file

from service.audit import aggregate
from service.coordinator.tensors import SafetensorsReader

RULES = ("fedavg", "daagg", "fedncl_layerwise", "trimmed_mean", "median")


def write_states(
    directory: Path, shapes: dict[str, tuple[int, ...]], clients: int
) -> tuple[Path, list[Path], list[NDArray[np.float32]], int]:
    """Global state and K distinct updates on disk; also each update's floats as one vector."""
    base = make_state(shapes, seed=0)
    noise = make_state(shapes, seed=1)
    global_path = directory / "global.safetensors"
    save_file(base, str(global_path))
    paths: list[Path] = []
    flats: list[NDArray[np.float32]] = []
    for k in range(clients):
        update = perturbed(base, noise, 0.01 * (k + 1), k + 1)
        path = directory / f"update-{k:04d}.safetensors"
        save_file(update, str(path))
        paths.append(path)
        flats.append(
            np.concatenate([v.reshape(-1) for v in update.values() if v.dtype.kind == "f"])
        )
    return global_path, paths, flats, state_nbytes(base)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; return (and write) the result."""
    parser = benchmark_parser(__doc__, model_state=True)
    parser.add_argument("--clients", type=int, default=10, help="K updates (default 10)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats after a warm-up")
    parser.add_argument("--rules", default=",".join(RULES), help="comma-separated rules")
    parser.add_argument("--noisy-fraction", type=float, default=0.2)
    parser.add_argument("--copy-mib", type=int, default=256, help="memory-copy reference size")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 3 clients, width 8, 1 repeat, no warm-up"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.width, args.repeats, args.copy_mib = 3, 8, 1, 16
    rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    k = args.clients
    shapes = resnet18_shapes(args.width)

    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="bench-agg-") as tmp:
        directory = Path(tmp)
        global_path, paths, flats, one_state = write_states(directory, shapes, k)
        largest_tensor = max(int(np.prod(s, dtype=np.int64)) * 4 for s in shapes.values())
        total = k * one_state
        num_samples = np.array([100 + 10 * i for i in range(k)], dtype=np.float64)
        weights = num_samples / num_samples.sum()
        noisy = np.zeros(k, dtype=bool)
        noisy[: max(1, round(args.noisy_fraction * k)) if k > 1 else 0] = True

        def run_rule(rule: str) -> Callable[[], object]:
            def call() -> object:
                global_reader = SafetensorsReader(global_path)
                readers = [SafetensorsReader(p) for p in paths]
                return aggregate(rule, global_reader, readers, num_samples, noisy=noisy)

            return call

        def read_only() -> None:
            readers = [SafetensorsReader(p) for p in paths]
            for name in readers[0].keys():
                for reader in readers:
                    reader.get(name)

        floor_out = np.zeros(flats[0].size, dtype=np.float64)

        def floor() -> None:
            floor_out.fill(0.0)
            for w, x in zip(weights, flats, strict=True):
                # np.float64 * float32 -> float64: the product's arithmetic, without its loops.
                np.add(floor_out, w * x, out=floor_out)
            floor_out.astype(np.float32)

        copy = CopyBandwidth(args.copy_mib * 2**20)
        subjects: dict[str, Callable[[], object]] = {"copy": copy, "floor": floor}
        subjects["read_only"] = read_only
        for rule in rules:
            subjects[rule] = run_rule(rule)

        flwr_note: dict[str, Any]
        if has_module("flwr"):
            from flwr.server.strategy.aggregate import aggregate as flwr_aggregate

            # One flat tensor per client: the very numbers the floor sums.
            results = [([x], int(n)) for x, n in zip(flats, num_samples, strict=True)]
            subjects["flwr_fedavg"] = lambda: flwr_aggregate(results)
            flwr_note = {"installed": True}
        else:
            flwr_note = {"installed": False, "note": "flwr not installed: comparison skipped"}

        # Sanity: the product's FedAvg equals the floor's weighted sum (so the timed work is
        # the real work).
        check = aggregate(
            "fedavg",
            SafetensorsReader(global_path),
            [SafetensorsReader(p) for p in paths],
            num_samples,
        )
        floor()
        product_flat = np.concatenate(
            [check.state[n].reshape(-1) for n in shapes if not n.endswith("num_batches_tracked")]
        )
        max_abs_diff = float(np.max(np.abs(product_flat - floor_out.astype(np.float32))))
        del check, product_flat

        # The memory pass (untimed, one call each) doubles as the warm-up of the timed ones.
        gc.collect()
        peaks: dict[str, int] = {"read_only": traced_peak(read_only)}
        for rule in rules:
            peaks[rule] = traced_peak(run_rule(rule))
            gc.collect()
        floor()
        times = alternate(subjects, args.repeats, warmup=0)
        copy.release()

    copy_gbps = [copy.nbytes / t / 1e9 for t in times["copy"]]
    per_subject: dict[str, Any] = {}
    for name, values in times.items():
        if name == "copy":
            continue
        throughput = [total / t / 1e9 for t in values]
        entry: dict[str, Any] = {
            "seconds": values,
            "median_seconds": median(values),
            "gb_per_s": throughput,
            "median_gb_per_s": median(throughput),
            "ratio_to_copy_bandwidth": paired_ratio(throughput, copy_gbps),
            "ratio_to_floor": paired_ratio(times["floor"], values),
        }
        if name in peaks:
            entry["peak_traced_bytes"] = peaks[name]
            entry["peak_over_one_state"] = peaks[name] / one_state
            entry["peak_over_all_k_states"] = peaks[name] / total
        per_subject[name] = entry

    result: dict[str, Any] = {
        "benchmark": "aggregation",
        "machine": machine_info(),
        "parameters": {
            "clients": k,
            "width": args.width,
            "tensors": len(shapes),
            "state_bytes": one_state,
            "largest_tensor_bytes": largest_tensor,
            "update_bytes_total": total,
            "repeats": args.repeats,
            "rules": rules,
            "noisy_clients": int(noisy.sum()),
            "copy_bytes": copy.nbytes,
            "quick": args.quick,
        },
        "copy_bandwidth": {"seconds": times["copy"], "gb_per_s": copy_gbps},
        "median_copy_gb_per_s": median(copy_gbps),
        "subjects": per_subject,
        "flwr": flwr_note,
        "fedavg_vs_floor_max_abs_diff": max_abs_diff,
        "process_max_rss_bytes": max_rss_bytes(),
        "notes": [
            "throughput = K x one update's bytes / seconds (DaAgg reads every update twice)",
            "files are read from the page cache; peak memory is tracemalloc (allocations only)",
        ],
    }
    print(
        f"aggregation of K={k} updates of {mb(one_state):.1f} MB ({len(shapes)} tensors); "
        f"memory copy {result['median_copy_gb_per_s']:.2f} GB/s"
    )
    print(f"  {'subject':<17} {'GB/s':>7} {'/copy':>7} {'floor/t':>8} {'peak/state':>10}")
    for name, entry in per_subject.items():
        peak = entry.get("peak_over_one_state")
        print(
            f"  {name:<17} {entry['median_gb_per_s']:7.3f} {entry['ratio_to_copy_bandwidth']:7.3f}"
            f" {entry['ratio_to_floor']:8.3f} {'' if peak is None else f'{peak:10.2f}'}"
        )
    if not flwr_note["installed"]:
        print(f"  {flwr_note['note']}")
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
