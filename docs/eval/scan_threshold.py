"""The 1 % threshold of a scan over split sizes, for the separation guard (``docs/algorithms.md``).

FedNoRo's calibrated guard compares Ashman's D of the mixture's group of size n with the 99th
percentile of D for the top-n split of one normal sample (``null_separation_threshold``). A guard
that let the statistic choose the group as well as its size would test the *best* split over all
sizes, whose null threshold is higher. This draws ``--draws`` samples of ``--clients`` N(0, 1)
values, computes D of the top-n split for every n, turns each into its p-value under the same
draws, and prints, per n, the D that the smallest p-value must beat for a 1 % test overall, next
to the fixed-size 99th percentile.

Usage (from the repository root)::

    .venv/bin/python docs/eval/scan_threshold.py --clients 10
"""

from __future__ import annotations

import argparse

import numpy as np


def top_split_d(values: np.ndarray) -> np.ndarray:
    """D (population spreads) of the top-n split of each row, for n = 1 .. K - 1."""
    ordered = np.sort(values, axis=1)[:, ::-1]
    columns = []
    for n in range(1, ordered.shape[1]):
        top, rest = ordered[:, :n], ordered[:, n:]
        gap = top.mean(axis=1) - rest.mean(axis=1)
        columns.append(np.sqrt(2.0) * gap / np.sqrt(top.var(axis=1) + rest.var(axis=1)))
    return np.stack(columns, axis=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--draws", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    null = top_split_d(np.random.default_rng(args.seed).standard_normal((args.draws, args.clients)))
    ordered = np.sort(null, axis=0)
    sizes = range(null.shape[1])
    p_values = np.stack(
        [1.0 - np.searchsorted(ordered[:, j], null[:, j]) / args.draws for j in sizes], axis=1
    )
    level = float(np.quantile(p_values.min(axis=1), 0.01))
    print(f"{args.clients} clients: the smallest p-value must be below {level:.5f}")
    print("| group size | scan threshold (1 %) | fixed-size threshold (99th percentile) |")
    print("| --- | --- | --- |")
    for j in range(null.shape[1]):
        scan = np.quantile(null[:, j], 1.0 - level)
        fixed = np.quantile(null[:, j], 0.99)
        print(f"| {j + 1} | {scan:.2f} | {fixed:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
