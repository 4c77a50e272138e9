"""Round close against Flower and the read bandwidth, on the same safetensors files.

For each configuration (K updates of a ResNet-18-shaped state, ``--width`` scaling the channels)
a global state and K updates are written as the safetensors files the coordinator stores. Then,
after one untimed warm-up round of every subject, ``--repeats`` rounds run every subject in
turn (A B C ... A B C, so a change of machine load hits them alike); each figure is reported as
seconds, the median, and the median over repeats of its ratio to a reference timed in the same
repeat:

* ``read_mmap`` / ``read_plain``: the physical reference, reading the same files once: a numpy
  float32 sum over fresh memory maps, and ``readinto`` a reused buffer. ``read`` is the faster
  of the two in each repeat; FedAvg's "fraction of read bandwidth" is read time / FedAvg time.
* ``fedavg``, ``median``, ``trimmed_mean``: ``service.audit.aggregate`` through the
  coordinator's ``SafetensorsReader``, exactly as a round close reads them.
* ``audit``: ``service.audit.run_audit`` with the FedNoRo configuration (DaAgg, 20 % of the
  sites noisy for the aggregation), the Fed-NCL and FedRN detectors and the neighbors, in process;
  by default a federation past its warm-up whose noisy sites the status already holds
  (``--audit-flags status``), or on the round's flags alone (``--audit-flags round``).
* ``flwr_*``: Flower (``flwr``, the optional ``bench`` extra) on the same files: each file loaded
  with ``safetensors.numpy.load_file`` into its list of per-layer arrays, then
  ``flwr.server.strategy.aggregate.aggregate`` / ``aggregate_median`` /
  ``aggregate_trimmed_avg``. ``flwr_fedavg_in_memory`` times ``aggregate`` alone on arrays
  loaded before the clock starts (what Flower costs when the updates are already in memory).

Memory: ``--memory`` runs FedAvg and the audit once each in a fresh Python process per K and
reports its peak RSS (``VmHWM``, mapped file pages included) over the size of one state, and
the same above a fresh process that only imported the modules (``baseline``).

    .venv/bin/python benchmarks/bench_aggregation.py --out runs/bench_aggregation.json
    .venv/bin/python benchmarks/bench_aggregation.py --quick --out runs/agg.json
"""

from __future__ import annotations

import gc
import mmap
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _common import (
    alternate,
    has_module,
    machine_info,
    make_state,
    mb,
    median,
    paired_ratio,
    perturbed,
    resnet18_shapes,
    state_nbytes,
    write_result,
)
from safetensors.numpy import load_file, save_file

from service.audit import (
    AggregationSettings,
    AuditConfig,
    ClientRoundData,
    StatusHistory,
    aggregate,
    run_audit,
)
from service.coordinator.tensors import SafetensorsReader

TRIM = 0.1


def parse_configs(text: str) -> list[tuple[int, int]]:
    """``"20x64,100x32"`` -> [(K, width), ...]."""
    configs = []
    for part in text.split(","):
        k, width = part.lower().split("x")
        configs.append((int(k), int(width)))
    return configs


def write_files(directory: Path, k: int, width: int) -> tuple[Path, list[Path], int]:
    shapes = resnet18_shapes(width)
    base = make_state(shapes, seed=0)
    noise = make_state(shapes, seed=1)
    global_path = directory / "global.safetensors"
    save_file(base, str(global_path))
    paths = []
    for i in range(k):
        # Noisy sites (the first 20 %) move further from the global model.
        factor = 0.05 if i < max(1, k // 5) else 0.01
        path = directory / f"update-{i:04d}.safetensors"
        save_file(perturbed(base, noise, factor * (1 + 0.01 * i), i + 1), str(path))
        paths.append(path)
    return global_path, paths, state_nbytes(base)


def read_mmap(paths: list[Path]) -> None:
    """The whole file of every update through a fresh memory map, summed as float32."""
    for path in paths:
        with path.open("rb") as handle:
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        view = np.frombuffer(mapped, dtype=np.uint8)
        with np.errstate(all="ignore"):  # the header's bytes read as floats may overflow
            view[: view.size // 4 * 4].view(np.float32).sum(dtype=np.float32)
        del view
        mapped.close()


def make_read_plain(paths: list[Path]) -> Callable[[], None]:
    buffer = bytearray(max(p.stat().st_size for p in paths))

    def read_plain() -> None:
        for path in paths:
            with path.open("rb", buffering=0) as handle:
                handle.readinto(buffer)

    return read_plain


def softmax_rows(values: Any) -> Any:
    clipped = np.clip(values, 1e-6, None)
    return clipped / clipped.sum(axis=1, keepdims=True)


def audit_inputs(global_path: Path, paths: list[Path], flags: str = "status") -> tuple[Any, ...]:
    """Client reports for ``run_audit``: the first 20 % have noisy per-class losses. With
    ``flags="status"`` (the coordinator's default) a federation past its warm-up: those sites
    noisy for three rounds, the others trusted, so the aggregation's noisy set is known before
    the detectors run (DaAgg's split of the first pass); ``"round"``: the round's flags alone."""
    rng = np.random.default_rng(0)
    k = len(paths)
    n_noisy = max(1, k // 5)
    probe = rng.dirichlet(np.ones(10), size=32)
    reports = []
    for i in range(k):
        noisy = i < n_noisy
        loss = rng.normal(2.0 if noisy else 0.5, 0.05, size=10)
        reports.append(
            {
                "client_id": f"site-{i:04d}",
                "num_samples": 500 + 10 * i,
                "class_counts": [50] * 10,
                "per_class_loss": loss.tolist(),
                "train_loss": float(loss.mean()),
                "train_accuracy": 0.5 if noisy else 0.9,
                "probe_softmax": softmax_rows(probe + rng.normal(0, 0.01, probe.shape)).tolist(),
            }
        )
    config = AuditConfig(
        primary_detector="fednoro",
        aggregation="daagg",
        detectors=("fednoro", "fedncl", "expertise"),
        aggregation_settings=AggregationSettings(flags=flags),
    )
    history = (
        [
            StatusHistory(status="noisy", flags=[True] * 3)
            if i < n_noisy
            else StatusHistory(status="trusted", flags=[False] * 3)
            for i in range(k)
        ]
        if flags == "status"
        else None
    )
    return reports, config, history


def run_audit_once(global_path: Path, paths: list[Path], inputs: tuple[Any, ...]) -> Any:
    reports, config, history = inputs
    clients = [
        ClientRoundData(state=SafetensorsReader(p), **r)
        for p, r in zip(paths, reports, strict=True)
    ]
    return run_audit(
        SafetensorsReader(global_path), clients, config, round_index=3, status_history=history
    )


def ours(rule: str, global_path: Path, paths: list[Path], n: Any) -> Callable[[], object]:
    params = {"trim_fraction": TRIM} if rule == "trimmed_mean" else None

    def call() -> object:
        return aggregate(
            rule,
            SafetensorsReader(global_path),
            [SafetensorsReader(p) for p in paths],
            n,
            params=params,
        )

    return call


def flower_subjects(paths: list[Path], n: Any, names: list[str]) -> dict[str, Callable[[], object]]:
    from flwr.server.strategy.aggregate import (
        aggregate as flwr_aggregate,
    )
    from flwr.server.strategy.aggregate import (
        aggregate_median,
        aggregate_trimmed_avg,
    )

    def load() -> list[tuple[list[Any], int]]:
        results = []
        for path, count in zip(paths, n, strict=True):
            tensors = load_file(str(path))
            results.append(([tensors[name] for name in names], int(count)))
        return results

    preloaded = load()
    return {
        "flwr_fedavg": lambda: flwr_aggregate(load()),
        "flwr_fedavg_in_memory": lambda: flwr_aggregate(preloaded),
        "flwr_median": lambda: aggregate_median(load()),
        "flwr_trimmed_mean": lambda: aggregate_trimmed_avg(load(), TRIM),
    }


RATIOS = (
    ("fedavg_over_read", "read", "fedavg"),
    ("fedavg_speedup_vs_flwr", "flwr_fedavg", "fedavg"),
    ("fedavg_speedup_vs_flwr_in_memory", "flwr_fedavg_in_memory", "fedavg"),
    ("median_speedup_vs_flwr", "flwr_median", "median"),
    ("trimmed_mean_speedup_vs_flwr", "flwr_trimmed_mean", "trimmed_mean"),
    ("audit_speedup_vs_flwr_fedavg", "flwr_fedavg", "audit"),
    ("audit_over_read", "read", "audit"),
)
"""(name, reference, subject): the median over repeats of reference time / subject time."""


def check_equal(global_path: Path, paths: list[Path], n: Any, names: list[str]) -> dict[str, float]:
    """Max |ours - Flower| per rule (same files): the timed work is the same work."""
    diffs: dict[str, float] = {}
    if not has_module("flwr"):
        return diffs
    from flwr.server.strategy.aggregate import aggregate as flwr_aggregate
    from flwr.server.strategy.aggregate import aggregate_median

    loaded = [
        ([load_file(str(p))[name] for name in names], int(c)) for p, c in zip(paths, n, strict=True)
    ]
    for rule, theirs in (("fedavg", flwr_aggregate(loaded)), ("median", aggregate_median(loaded))):
        state = ours(rule, global_path, paths, n)()
        diffs[rule] = max(
            float(np.max(np.abs(state.state[name] - t)))  # type: ignore[attr-defined]
            for name, t in zip(names, theirs, strict=True)
        )
    return diffs


def run_config(
    k: int, width: int, repeats: int, workdir: Path | None, audit_flags: str = "status"
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=workdir, prefix="bench-agg-") as tmp:
        global_path, paths, one_state = write_files(Path(tmp), k, width)
        names = [n for n in resnet18_shapes(width) if not n.endswith("num_batches_tracked")]
        n = np.array([500 + 10 * i for i in range(k)], dtype=np.float64)
        inputs = audit_inputs(global_path, paths, audit_flags)
        subjects: dict[str, Callable[[], object]] = {
            "read_mmap": lambda: read_mmap(paths),
            "read_plain": make_read_plain(paths),
            "fedavg": ours("fedavg", global_path, paths, n),
            "median": ours("median", global_path, paths, n),
            "trimmed_mean": ours("trimmed_mean", global_path, paths, n),
            "audit": lambda: run_audit_once(global_path, paths, inputs),
        }
        flwr_installed = has_module("flwr")
        if flwr_installed:
            subjects.update(flower_subjects(paths, n, names))
        equality = check_equal(global_path, paths, n, names)
        audit_rule = run_audit_once(global_path, paths, inputs).aggregation.rule
        gc.collect()
        times = alternate(subjects, repeats, warmup=1)
        file_bytes = sum(p.stat().st_size for p in paths)
    times["read"] = [
        min(a, b) for a, b in zip(times["read_mmap"], times["read_plain"], strict=True)
    ]
    ratios = {
        name: {
            "reference": ref,
            "subject": sub,
            "per_repeat": [r / s for r, s in zip(times[ref], times[sub], strict=True)],
            "median": paired_ratio(times[ref], times[sub]),
        }
        for name, ref, sub in RATIOS
        if ref in times and sub in times
    }
    return {
        "clients": k,
        "width": width,
        "state_bytes": one_state,
        "file_bytes_total": file_bytes,
        "repeats": repeats,
        "seconds": times,
        "median_seconds": {name: median(v) for name, v in times.items()},
        "read_gb_per_s": [file_bytes / t / 1e9 for t in times["read"]],
        "ratios": ratios,
        "flwr_installed": flwr_installed,
        "max_abs_diff_vs_flwr": equality,
        "audit_rule_applied": audit_rule,
        "audit_flags": audit_flags,
    }


MEMORY_CHILD = """
import sys
sys.path.insert(0, {bench!r})
from pathlib import Path
import numpy as np
import bench_aggregation as b
d = Path({directory!r}); k = {k}
paths = sorted(d.glob("update-*.safetensors")); g = d / "global.safetensors"
n = np.array([500 + 10 * i for i in range(k)], dtype=np.float64)
if {what!r} == "fedavg":
    b.ours("fedavg", g, paths, n)()
else:
    b.run_audit_once(g, paths, b.audit_inputs(g, paths, {flags!r}))
print(peak_rss())
"""

# ru_maxrss survives exec (a child forked from this large process would report our peak):
# VmHWM belongs to the new process's own memory map.
PEAK_RSS = """
def peak_rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")
"""


def memory(
    ks: list[int], width: int, workdir: Path | None, audit_flags: str = "status"
) -> dict[str, Any]:
    """Peak RSS of a fresh process running FedAvg, and the audit, once per K."""
    out: dict[str, Any] = {"width": width, "audit_flags": audit_flags, "runs": {}}
    for k in ks:
        with tempfile.TemporaryDirectory(dir=workdir, prefix="bench-mem-") as tmp:
            _, _, one_state = write_files(Path(tmp), k, width)
            out["state_bytes"] = one_state
            entry: dict[str, Any] = {}
            for what in ("baseline", "fedavg", "audit"):
                code = PEAK_RSS + (
                    "import numpy, service.audit, service.coordinator.tensors\nprint(peak_rss())"
                    if what == "baseline"
                    else MEMORY_CHILD.format(
                        bench=str(Path(__file__).parent),
                        directory=tmp,
                        k=k,
                        what=what,
                        flags=audit_flags,
                    )
                )
                done = subprocess.run(
                    [sys.executable, "-c", code], capture_output=True, text=True, check=True
                )
                rss = int(done.stdout.strip().splitlines()[-1])
                entry[what] = {"peak_rss_bytes": rss, "over_one_state": rss / one_state}
            for what in ("fedavg", "audit"):
                extra = entry[what]["peak_rss_bytes"] - entry["baseline"]["peak_rss_bytes"]
                entry[what]["above_import_baseline_over_one_state"] = extra / one_state
            out["runs"][str(k)] = entry
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON result")
    parser.add_argument(
        "--configs",
        default="20x64,100x32",
        help="comma-separated KxWIDTH (width 64 = ResNet-18's 44.8 MB; default 20x64,100x32)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats after a warm-up")
    parser.add_argument(
        "--memory",
        default="20,100",
        help="K values of the fresh-process peak-RSS runs ('' to skip; default 20,100)",
    )
    parser.add_argument("--memory-width", type=int, default=32, help="width of the memory runs")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary dir")
    parser.add_argument(
        "--audit-flags",
        choices=("status", "round"),
        default="status",
        help="the audit's noisy set: 'status' (the coordinator's default, a federation past its "
        "warm-up with the noisy sites known) or 'round' (this round's flags alone)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny states, 1 repeat")
    args = parser.parse_args(argv)
    if args.quick:
        args.configs, args.repeats, args.memory, args.memory_width = "4x4,6x4", 1, "3,6", 4
    configs = parse_configs(args.configs)
    result: dict[str, Any] = {
        "benchmark": "aggregation",
        "machine": machine_info(),
        "parameters": {
            "configs": [list(c) for c in configs],
            "repeats": args.repeats,
            "trim_fraction": TRIM,
            "memory_ks": args.memory,
            "memory_width": args.memory_width,
            "quick": args.quick,
            "audit_flags": args.audit_flags,
            "flwr": _flwr_version(),
        },
        "configs": [
            run_config(k, w, args.repeats, args.workdir, args.audit_flags) for k, w in configs
        ],
    }
    ks = [int(x) for x in args.memory.split(",") if x.strip()]
    if ks:
        result["memory"] = memory(ks, args.memory_width, args.workdir, args.audit_flags)
    for entry in result["configs"]:
        print(
            f"K={entry['clients']} width {entry['width']} "
            f"({mb(entry['state_bytes']):.1f} MB each), {entry['repeats']} repeats; "
            f"read {median(entry['read_gb_per_s']):.2f} GB/s"
        )
        for name, ratio in entry["ratios"].items():
            print(f"  {name:<34} {ratio['median']:7.2f}")
        if not entry["flwr_installed"]:
            print("  flwr not installed (pip install -e '.[bench]'): Flower comparison skipped")
    for k, run in result.get("memory", {}).get("runs", {}).items():
        print(
            f"memory K={k}: fedavg {run['fedavg']['over_one_state']:.2f}, "
            f"audit {run['audit']['over_one_state']:.2f} states peak RSS"
        )
    write_result(args.out, result)
    return result


def _flwr_version() -> str | None:
    if not has_module("flwr"):
        return None
    from importlib.metadata import version

    return version("flwr")


if __name__ == "__main__":
    main()
