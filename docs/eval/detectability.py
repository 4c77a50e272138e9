"""How findable is each noisy site at all? An oracle bound beside the evidence detector's answer.

For every noisy site of a kept simulation (the last round of each run): its samples n, its wrong
labels w (the simulator's realised rate times n), and the *oracle tail*: the binomial probability
that a clean site of n samples makes at least ``w + (n - w) p0`` errors, p0 being the pooled error
rate of the clean sites under the round's global model. That is the p-value a count test would
give if the model contradicted every wrong label and knew the clean rate exactly, with no spread
between sites: no per-round test of the counts does better. Beside it, the share of rounds after
the warm-up the `evidence` detector flagged the site, and its p-value at the last round. A site
whose oracle tail is above Benjamini-Hochberg's threshold (0.01 x rank / K) cannot be flagged by a
per-round test at the product's false-alarm rate, whatever the detector.

Usage (from the repository root; runs kept with their coordinator data)::

    .venv/bin/python docs/eval/detectability.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
from scipy.stats import binom

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from evidence_whatif import load  # noqa: E402

from service.audit.evidence import EvidenceDetector  # noqa: E402


def realised_rates(path: Path) -> dict[tuple[str, str, str], float]:
    """(configuration label, seed, client) -> the simulator's realised noise rate."""
    rates: dict[tuple[str, str, str], float] = {}
    with (path / "clients.csv").open() as handle:
        for row in csv.DictReader(handle):
            if row["round"] == "0":
                key = (row["label"], row["seed"], row["client"])
                rates[key] = float(row["true_noise_rate"] or 0.0)
    return rates


def main(paths: list[str]) -> None:
    for path in map(Path, paths):
        rates = realised_rates(path)
        for run in load(path):
            label, seed = run["name"].split("/")[-1].rsplit("_seed", 1)
            truth = np.asarray(run["truth"], dtype=bool)
            flagged = np.zeros(truth.size)
            judged = 0
            verdicts = None
            for index, loss, counts, sd, errors in run["rounds"]:
                if index < run["warmup"]:
                    continue
                result = EvidenceDetector().fit(loss, counts, sd, per_class_errors=errors)
                verdicts = result.verdicts
                flagged += [bool(v is not None and v.flag) for v in verdicts]
                judged += 1
            _, loss, counts, sd, errors = run["rounds"][-1]
            n, e = counts.sum(axis=1), errors.sum(axis=1)
            p0 = e[~truth].sum() / max(n[~truth].sum(), 1)
            k = truth.size
            print(
                f"{run['name']}: clean error rate {p0:.3f}; Benjamini-Hochberg at 0.01: "
                f"{0.01 / k:.5f} (rank 1) to {0.01 * truth.sum() / k:.4f} (rank {truth.sum()})"
            )
            for site in np.flatnonzero(truth):
                wrong = int(round(rates[(label, seed, f"client-{site:02d}")] * n[site]))
                tail = binom.sf(np.ceil(wrong + (n[site] - wrong) * p0) - 1, n[site], p0)
                last = None if verdicts is None else verdicts[site]
                p_last = None if last is None else last.evidence.get("p_value")
                print(
                    f"  site {site:2d}: {int(n[site]):4d} samples, {wrong:3d} wrong labels, "
                    f"oracle tail {tail:.2g}; flagged in {flagged[site] / max(judged, 1):.0%} "
                    f"of the rounds after the warm-up, p at the last round "
                    + ("n/a" if p_last is None else f"{p_last:.2g}")
                )


if __name__ == "__main__":
    main(sys.argv[1:])
