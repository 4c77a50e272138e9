"""A robustness sweep: many small random scenarios through ``fedaudit simulate``.

Each draw picks a data set, a client count (2-40), a partition, a noise protocol and flip, two
methods for ``--compare`` and sometimes an aggregation override, and runs 2-4 rounds of one local
epoch (``--no-keep-coordinator-data``), so the sweep looks for crashes and unclear errors rather
than accuracy. It prints one line per scenario: the exit status, the wall time, the flags, and
for a non-zero status the last lines of the output. Exit status 2 (a refused configuration) is an
expected answer when the drawn aggregation does not fit the method; 1 is a failed run.

Usage (from the repository root; outputs under ``--out``)::

    .venv/bin/python docs/eval/sweep.py --seed 1 --count 25 --out runs/sweep
"""

from __future__ import annotations

import argparse
import random
import shlex
import subprocess
import time
from pathlib import Path

DATASETS = ["digits", "breast_cancer", "wine", "breastmnist", "pneumoniamnist", "mnist"]
PARTITIONS = [
    ("iid", []),
    ("shards", ["num_shards_per_client=2"]),
    ("shards", ["num_shards_per_client=1"]),
    ("dirichlet", ["beta=0.1"]),
    ("dirichlet", ["beta=1.0"]),
    ("bernoulli_dirichlet", ["p=0.5", "alpha=1.0"]),
    ("lognormal_quantity", []),
]
NOISES = [
    ("none", []),
    ("linear", ["lo=0.0", "hi=0.9"]),
    ("rho_tau", ["rho=0.5", "tau=0.3"]),
    ("rho_range", ["rho=0.3", "lo=0.5", "hi=0.9"]),
    ("bernoulli", ["p=0.5"]),
    ("truncated_gaussian", []),
    ("uniform_all", ["eps=0.3"]),
    ("rho_tau", ["rho=1.0", "tau=1.0"]),
]
FLIPS = ["symmetric", "symmetric_any", "pairflip", "instance"]
METHODS = ["fedavg", "fednoro", "fedrn", "fedncl", "rofl", "flr", "fedprox"]
AGGREGATIONS = [None, None, None, "median", "trimmed_mean", "reliability_weighted", "daagg"]


def draw(rng: random.Random, out: Path) -> list[str]:
    """The ``fedaudit simulate`` arguments of one random scenario."""
    partition, partition_params = rng.choice(PARTITIONS)
    noise, noise_params = rng.choice(NOISES)
    args = [
        "--no-progress",
        "--no-keep-coordinator-data",
        "--dataset", rng.choice(DATASETS),
        "--clients", str(rng.choice([2, 3, 4, 5, 7, 12, 40])),
        "--partition", partition,
        "--noise", noise,
        "--rounds", str(rng.choice([2, 3, 4])),
        "--local-epochs", "1",
        "--compare", ",".join(rng.sample(METHODS, 2)),
        "--seed", str(rng.randrange(100)),
        "--out", str(out),
    ]  # fmt: skip
    for value in partition_params:
        args += ["--partition-param", value]
    for value in noise_params:
        args += ["--noise-param", value]
    if noise != "none":
        args += ["--flip", rng.choice(FLIPS)]
    aggregation = rng.choice(AGGREGATIONS)
    if aggregation is not None:
        args += ["--aggregation", aggregation]
    return args


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("runs/sweep"))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per scenario")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    for i in range(args.count):
        command = [".venv/bin/fedaudit", "simulate", *draw(rng, args.out / f"{args.seed}_{i}")]
        started = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
            status, output = str(done.returncode), done.stdout + done.stderr
        except subprocess.TimeoutExpired:
            status, output = "timeout", ""
        seconds = time.perf_counter() - started
        print(f"[{i}] exit {status}, {seconds:.0f} s: {shlex.join(command[2:])}")
        if status != "0":
            print("    " + " | ".join(output.strip().splitlines()[-4:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
