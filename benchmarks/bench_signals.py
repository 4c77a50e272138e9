"""How much do the round signals cost next to one local epoch?

Trains a small CNN on ~1000 random 28x28 inputs for one local epoch with the ``fedavg`` recipe
(batch 32, SGD) and times ``compute_signals`` with every optional signal a federation can ask for
(per-class loss with theta_G, train accuracy with theta_k, probe softmax, train loss). Prints the
ratio signals / epoch and writes the numbers as JSON to ``--out``.

    .venv/bin/python benchmarks/bench_signals.py --out runs/bench_signals.json
    .venv/bin/python benchmarks/bench_signals.py --device cuda --amp --out bench.json

One epoch and the signals are timed in alternation ``--repeats`` times after a warm-up pair
(CUDA is synchronised around every clock read); the reported ratio is the median of the paired
ratios, so a change of machine load during the run affects both sides alike. The data are
random: the cost of a pass does not depend on the values.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from client_sdk.local_state import LocalStateStore
from client_sdk.recipes import LocalData, RoundContext, TrainReport, get_recipe
from client_sdk.signals import OPTIONAL_SIGNALS, compute_signals

NUM_CLASSES = 10
INPUT_SHAPE = (1, 28, 28)


def small_cnn() -> nn.Module:
    """Two conv blocks and a two-layer head (~110k parameters)."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 64),
        nn.ReLU(),
        nn.Linear(64, NUM_CLASSES),
    )


def clock(fn: Callable[[], object], device: torch.device) -> float:
    """Wall time of one call of ``fn`` (CUDA synchronised before and after)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; return (and write) the result."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON result")
    parser.add_argument("--num-samples", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--probe-size", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--amp", action="store_true", help="mixed precision (CUDA only)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch default)")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    data = LocalData(
        torch.randn(args.num_samples, *INPUT_SHAPE, generator=gen),
        torch.randint(0, NUM_CLASSES, (args.num_samples,), generator=gen),
    ).to(device)
    torch.manual_seed(0)
    base = small_cnn().to(device)
    global_model = copy.deepcopy(base).eval()
    for p in global_model.parameters():
        p.requires_grad_(False)
    model = copy.deepcopy(base)

    def context() -> RoundContext:
        return RoundContext(
            round_index=0,
            total_rounds=1,
            num_classes=NUM_CLASSES,
            hyperparameters={"batch_size": args.batch_size, "lr": 0.01, "local_epochs": 1},
            role=None,
            label_correction=False,
            neighbors=[],
            self_weight=None,
            global_centroids=None,
            device=device,
            amp=args.amp,
            seed=0,
            state=LocalStateStore(None),
        )

    recipe = get_recipe("fedavg")
    report: list[TrainReport] = []

    def epoch() -> None:
        report[:] = [recipe.train(model, global_model, data, context())]

    def signals(required: set[str]) -> Callable[[], object]:
        return lambda: compute_signals(
            global_model=global_model,
            local_model=model,
            data=data,
            num_classes=NUM_CLASSES,
            required=required,
            train_report=report[0],
            probe_seed=1234,
            probe_size=args.probe_size,
            input_shape=INPUT_SHAPE,
            device=device,
        )

    required = set(OPTIONAL_SIGNALS) - {"centroids"}
    # Epoch and signals are timed in alternation, so a change of machine load during the run
    # hits both; the ratio is the median of the paired ratios. The first pair is a warm-up.
    epochs: list[float] = []
    alls: list[float] = []
    per: dict[str, list[float]] = {name: [] for name in sorted(required)}
    for i in range(args.repeats + 1):
        e = clock(epoch, device)
        a = clock(signals(required), device)
        singles = {name: clock(signals({name}), device) for name in per}
        if i == 0:
            continue
        epochs.append(e)
        alls.append(a)
        for name, seconds in singles.items():
            per[name].append(seconds)
    epoch_s = statistics.median(epochs)
    all_s = statistics.median(alls)
    ratio = statistics.median(a / e for a, e in zip(alls, epochs, strict=True))
    per_signal = {name: statistics.median(values) for name, values in per.items()}
    result: dict[str, Any] = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "amp": bool(args.amp and device.type == "cuda"),
        "num_samples": args.num_samples,
        "batch_size": args.batch_size,
        "probe_size": args.probe_size,
        "parameters": sum(p.numel() for p in base.parameters()),
        "epoch_seconds": epoch_s,
        "signals_seconds": all_s,
        "ratio": ratio,
        "ratios": [a / e for a, e in zip(alls, epochs, strict=True)],
        "per_signal_seconds": per_signal,
        "signals": sorted(required),
    }
    print(
        f"{device} ({result['device_name']}): one epoch {epoch_s * 1e3:.1f} ms, signals "
        f"{all_s * 1e3:.1f} ms -> ratio {result['ratio']:.3f}"
    )
    for name, seconds in per_signal.items():
        print(f"  {name:>15}: {seconds * 1e3:.1f} ms")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return result


if __name__ == "__main__":
    main()
