"""What lying sites can do to the evidence detector's verdict: a grid of reports, 8 seeds.

A simulated round: ten clean sites of 99 samples (three classes, 10 % errors, a fifth of them
confident), one noisy site (40 % errors, 70 % of them confident, a higher loss) and one liar
(``--liars N``: N colluding liars, each sending the same report) that reports whatever the grid
says: its per-class mean loss and spread, its error rate, the confident share of its errors,
and its size (99 or 399 samples, within a join's drift). Each report is judged on 8 rounds
(seeds 0-7) by the product's ``EvidenceDetector`` (defaults).

A report has an effect when, in some round, the audit abstains (``inconclusive``: the noisy
site goes unflagged), misses the noisy site, or flags one of the ten clean sites. The liars'
own flags are not counted: what they report about themselves is their business.

With ``--random N``: N reports drawn at random instead (seed 123), each class its own loss
(0-5, or 0-0.1), spread (0.005-3), error rate and confident share, judged on 4 rounds.

Usage (from the repository root; about a minute either way)::

    .venv/bin/python docs/eval/one_site_attacks.py [--liars 2] [--random 250]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from service.audit.evidence import EvidenceDetector  # noqa: E402

CLASSES = 3
LOSSES = (0.0, 0.02, 0.3, 1.0, 5.0)
SPREADS = (0.01, 0.6, 3.0)
ERROR_RATES = (0.0, 0.1, 0.5, 1.0)
CONFIDENT_SHARES = (0.0, 1.0)
SIZES = (99, 399)


Report = tuple[Any, Any, Any, Any, int]
"""loss, spread, error rate, confident share (each a number or one per class), size."""


def one_round(seed: int, report: Report, liars: int = 1) -> tuple[bool, bool, bool]:
    """(abstained, noisy site missed, a clean site flagged) for one round in which ``liars``
    sites send the same ``report`` (loss, spread, error rate, confident share, each a number or
    one per class; size)."""
    loss_value, spread, error_rate, confident_share, size = report
    rng = np.random.default_rng(seed)
    k = 11 + liars
    counts = np.full((k, CLASSES), 33)
    counts[11:] = size // CLASSES
    rates = np.array([0.1] * 10 + [0.4] + [0.1] * liars)
    errors = rng.binomial(counts, rates[:, None]).astype(np.float64)
    sure = np.where(rates[:, None] > 0.2, 0.7, 0.2)
    confident = rng.binomial(errors.astype(np.int64), sure).astype(np.float64)
    loss = 0.3 + 2.0 * (rates[:, None] - 0.1) + rng.normal(0.0, 0.03, size=(k, CLASSES))
    sd = np.full((k, CLASSES), 0.6)
    loss[11:], sd[11:] = loss_value, spread
    errors[11:] = np.round(error_rate * counts[11:])
    confident[11:] = np.round(confident_share * errors[11:])
    result = EvidenceDetector().fit(
        loss, counts, sd, per_class_errors=errors, per_class_confident_errors=confident
    )
    flags = np.array([bool(v is not None and v.flag) for v in result.verdicts])
    abstained = result.status != "ok"
    return abstained, not abstained and not flags[10], bool(flags[:10].any())


def random_reports(count: int) -> list[Report]:
    """``count`` reports drawn per class (module docstring)."""
    rng = np.random.default_rng(123)
    reports: list[Report] = []
    for _ in range(count):
        loss = rng.uniform(0, 5, CLASSES) if rng.random() < 0.5 else rng.uniform(0, 0.1, CLASSES)
        spread = np.exp(rng.uniform(np.log(0.005), np.log(3.0), CLASSES))
        errors = rng.uniform(0, 1, CLASSES) * (rng.random() < 0.7)
        reports.append((loss, spread, errors, rng.uniform(0, 1, CLASSES), int(rng.choice(SIZES))))
    return reports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--liars", type=int, default=1, help="colluding sites (same report)")
    parser.add_argument("--random", type=int, default=0, help="N random reports, not the grid")
    args = parser.parse_args()
    liars = args.liars
    if args.random:
        count = args.random
        hits = [
            r for r in random_reports(count) if any(any(one_round(s, r, liars)) for s in range(4))
        ]
        print(f"{len(hits)} of {count} random reports had an effect in some round")
        for hit in hits:
            print(hit)
        return
    grid: list[Report] = list(
        itertools.product(LOSSES, SPREADS, ERROR_RATES, CONFIDENT_SHARES, SIZES)
    )
    effective = 0
    print("| loss | spread | error rate | confident share | size | abstained | missed | false |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for report in grid:
        outcomes = np.array([one_round(seed, report, liars) for seed in range(8)])
        if outcomes.any():
            effective += 1
            a, m, f = outcomes.sum(axis=0)
            print(f"| {' | '.join(str(v) for v in report)} | {a}/8 | {m}/8 | {f}/8 |")
    print(f"\n{effective} of {len(grid)} reports had an effect in some round")


if __name__ == "__main__":
    main()
