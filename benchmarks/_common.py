"""Shared pieces of the benchmarks: machine facts, clocks, same-run references, JSON output.

Every benchmark reports its figures as ratios against a reference measured in the same run
(EVALUATION.md, "Performance benchmarks"): the machines here are shared and noisy, so an absolute
number means little, while a ratio taken between alternating measurements cancels most of a
change of machine load. Nothing here is imported by the product.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

REPO = Path(__file__).resolve().parents[1]


def benchmark_parser(doc: str, *, model_state: bool = False) -> argparse.ArgumentParser:
    """The options the benchmarks share: ``--out``; with ``model_state`` also ``--width`` (of
    the ResNet-18 state) and ``--workdir``. The description is the script docstring's first
    paragraph."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON result")
    if model_state:
        parser.add_argument(
            "--width", type=int, default=64, help="ResNet-18 base width (64: the real 45 MB state)"
        )
        parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary dir")
    return parser


def machine_info() -> dict[str, Any]:
    """Facts about the machine and software a reader needs to judge the numbers."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gib: float | None = None
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        memory_gib = round(pages / 2**30, 1)
    except (ValueError, OSError):
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "memory_gib": memory_gib,
        "load_average_at_start": list(os.getloadavg()),
        "git_commit": commit or None,
    }


def has_module(name: str) -> bool:
    """True when ``name`` can be imported (checked without importing it)."""
    return importlib.util.find_spec(name) is not None


def clock(fn: Callable[[], object]) -> float:
    """Wall time of one call of ``fn`` (``time.perf_counter``)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def alternate(
    subjects: Mapping[str, Callable[[], object]], repeats: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Time every subject once per repeat, in turn, after ``warmup`` untimed rounds.

    Running the subjects in alternation (A B C A B C ...) instead of in blocks (A A A B B B)
    means a change of machine load during the run hits every subject alike, so the ratios taken
    per repeat stay meaningful.
    """
    times: dict[str, list[float]] = {name: [] for name in subjects}
    for i in range(warmup + repeats):
        for name, fn in subjects.items():
            seconds = clock(fn)
            if i >= warmup:
                times[name].append(seconds)
    return times


def bracketed(
    subjects: Mapping[str, Callable[[], object]],
    reference: Callable[[], object],
    repeats: int,
) -> tuple[dict[str, list[float]], dict[str, list[float]], list[float]]:
    """Time each subject between two runs of ``reference``: R S1 R S2 R ... R, per repeat.

    For subjects that run for many seconds a single reference slot per repeat is too far away
    in time to share the subject's machine load; here each subject's reference is the mean of
    the reference runs just before and just after it. Returns (subject seconds, their bracketing
    reference seconds, every reference run).
    """
    times: dict[str, list[float]] = {name: [] for name in subjects}
    brackets: dict[str, list[float]] = {name: [] for name in subjects}
    references: list[float] = []
    for _ in range(repeats):
        before = clock(reference)
        references.append(before)
        for name, fn in subjects.items():
            times[name].append(clock(fn))
            after = clock(reference)
            references.append(after)
            brackets[name].append((before + after) / 2)
            before = after
    return times, brackets, references


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> float:
    """Median over repeats of numerator[i] / denominator[i] (both taken in the same repeat)."""
    return statistics.median(a / b for a, b in zip(numerator, denominator, strict=True))


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


class CopyBandwidth:
    """The memory-copy reference: ``np.copyto`` of a large float64 array into another.

    The arrays are allocated and touched once at construction, so page faults of a first
    touch are not timed. Bandwidth is bytes copied per second (each byte is read once and
    written once), the number a streaming aggregation that reads its input once is bounded by.
    """

    def __init__(self, nbytes: int = 256 * 2**20) -> None:
        n = max(nbytes // 8, 1)
        self.source = np.ones(n)
        self.target = np.zeros(n)
        np.copyto(self.target, self.source)
        self.nbytes = int(self.source.nbytes)

    def __call__(self) -> None:
        np.copyto(self.target, self.source)

    def release(self) -> None:
        self.source = np.zeros(0)
        self.target = np.zeros(0)


def traced_peak(fn: Callable[[], object]) -> int:
    """Peak bytes allocated through Python's allocators (numpy arrays included) during ``fn``.

    Memory-mapped file pages (safetensors reads through a mapping) are not allocations and are
    not counted: they are page cache the kernel can drop, not memory the process holds. The
    tracer slows allocation down, so never time a call that runs under it.
    """
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return max(peak - base, 0)


def max_rss_bytes() -> int:
    """This process's peak resident set size so far (Linux reports KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def scaling_exponent(sizes: Sequence[float], seconds: Sequence[float]) -> float | None:
    """Least-squares slope of log(seconds) on log(size): t ~ size**slope."""
    points = [(math.log(s), math.log(t)) for s, t in zip(sizes, seconds, strict=True) if t > 0]
    if len(points) < 2:
        return None
    xs, ys = zip(*points, strict=True)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0.0:
        return None
    return float(sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx)


def resnet18_shapes(width: int = 64, num_classes: int = 10) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of a torchvision-style ResNet-18 state dict.

    ``width=64`` is ResNet-18 itself (11.18M parameters with a 10-class head, about 45 MB in
    float32 with the BatchNorm running statistics); a smaller width scales every channel count,
    keeping the same 122 tensors, for quick runs. ``*.num_batches_tracked`` are 0-d int64, as in
    torch, so the non-float path of every aggregation rule is exercised too.
    """
    shapes: dict[str, tuple[int, ...]] = {}

    def bn(prefix: str, channels: int) -> None:
        for part in ("weight", "bias", "running_mean", "running_var"):
            shapes[f"{prefix}.{part}"] = (channels,)
        shapes[f"{prefix}.num_batches_tracked"] = ()

    shapes["conv1.weight"] = (width, 3, 7, 7)
    bn("bn1", width)
    in_channels = width
    for stage, multiplier in enumerate((1, 2, 4, 8), start=1):
        channels = width * multiplier
        for block in range(2):
            prefix = f"layer{stage}.{block}"
            first_in = in_channels if block == 0 else channels
            shapes[f"{prefix}.conv1.weight"] = (channels, first_in, 3, 3)
            bn(f"{prefix}.bn1", channels)
            shapes[f"{prefix}.conv2.weight"] = (channels, channels, 3, 3)
            bn(f"{prefix}.bn2", channels)
            if block == 0 and first_in != channels:
                shapes[f"{prefix}.downsample.0.weight"] = (channels, first_in, 1, 1)
                bn(f"{prefix}.downsample.1", channels)
        in_channels = channels
    shapes["fc.weight"] = (num_classes, in_channels)
    shapes["fc.bias"] = (num_classes,)
    return shapes


def make_state(
    shapes: Mapping[str, tuple[int, ...]], seed: int, scale: float = 0.05
) -> dict[str, NDArray[Any]]:
    """A finite random state of the given shapes (float32; ``num_batches_tracked`` int64)."""
    rng = np.random.default_rng(seed)
    state: dict[str, NDArray[Any]] = {}
    for name, shape in shapes.items():
        if name.endswith("num_batches_tracked"):
            state[name] = np.array(seed, dtype=np.int64).reshape(shape)
        elif name.endswith("running_var"):
            state[name] = np.ones(shape, dtype=np.float32)
        else:
            state[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
    return state


def perturbed(
    base: Mapping[str, NDArray[Any]], noise: Mapping[str, NDArray[Any]], factor: float, step: int
) -> dict[str, NDArray[Any]]:
    """``base + factor * noise`` on float tensors, ``step`` in the int tensors: a distinct client
    update that costs one fused pass instead of a fresh random draw."""
    out: dict[str, NDArray[Any]] = {}
    f = np.float32(factor)
    for name, value in base.items():
        if value.dtype.kind == "f":
            out[name] = value + f * noise[name]
        else:
            out[name] = np.asarray(value + step, dtype=value.dtype)
    return out


def state_nbytes(state: Mapping[str, NDArray[Any]]) -> int:
    return int(sum(v.nbytes for v in state.values()))


def write_result(path: Path, result: Mapping[str, Any]) -> None:
    """Write the JSON result (parents created), sorted keys, one trailing newline."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, sort_keys=True, default=_jsonable) + "\n")


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def mb(nbytes: float) -> float:
    """Bytes to MB (10**6), the unit of every throughput printed here."""
    return nbytes / 1e6


def python() -> str:
    """The interpreter running the benchmark (children use the same one)."""
    return sys.executable
