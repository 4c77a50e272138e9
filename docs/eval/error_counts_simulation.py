"""The evidence detector with and without the error counts, on simulated per-sample losses.

Each site holds a Dirichlet(0.5) mix of C classes, about ``n`` samples. Per sample: an easy one
has an exponential loss of mean 0.05 and is classified right; a hard one (class rate 0.5-8 %,
times the site's difficulty factor exp(N(0, spread^2))) has loss 0.7 + Exp(1.5) and is an error;
a wrongly labelled one (the noisy sites' rates) has loss 2 + Exp(2) and is an error. The
detector sees each site's per-class mean loss, its spread and its error counts, like the SDK's
signals. Per setting, over the rounds: the share of rounds with a clean site flagged, and per
noisy site the share of rounds it was flagged, for the losses alone (``error_check=False``) and
for both (the default). FedNoRo's mixture abstention is off (the simulation has no global model).

Usage (from the repository root)::

    .venv/bin/python docs/eval/error_counts_simulation.py [ROUNDS] [--large | --small]

``--large`` runs the clean rows with larger sites instead (300 and 1000 samples, spread 0.3).
``--small`` runs federations of 5 to 8 sites instead, with a third detector: the counts without
their dispersion floor below 10 sites (``min_error_dispersion=0``).
"class spread" is the standard deviation of a (site, class) log factor on the hard samples' rate
on top of the site's: one class harder at one site than elsewhere.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from service.audit.evidence import EvidenceDetector  # noqa: E402


def federation(
    rng: np.random.Generator,
    k: int,
    c: int,
    n: int,
    base: np.ndarray,
    spread: float,
    noisy: dict[int, float],
    class_spread: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(loss, counts, sd, errors) of one round, per site and class."""
    counts = np.stack(
        [rng.multinomial(max(5, rng.poisson(n)), rng.dirichlet([0.5] * c)) for _ in range(k)]
    )
    factor = np.exp(rng.normal(0.0, spread, size=k)) if spread else np.ones(k)
    # A site's classes given the site: one class's samples harder than its others.
    by_class = np.exp(rng.normal(0.0, class_spread, size=(k, c)))
    loss = np.full((k, c), np.nan)
    sd = np.full((k, c), np.nan)
    errors = np.zeros((k, c), dtype=np.int64)
    for i in range(k):
        for j in range(c):
            m = int(counts[i, j])
            if m == 0:
                continue
            wrong = rng.random(m) < noisy.get(i, 0.0)
            hard = rng.random(m) < min(1.0, base[j] * factor[i] * by_class[i, j])
            per_sample = rng.exponential(0.05 * factor[i], m)
            per_sample = np.where(hard, 0.7 + rng.exponential(1.5, m), per_sample)
            per_sample = np.where(wrong, 2.0 + rng.exponential(2.0, m), per_sample)
            loss[i, j] = per_sample.mean()
            sd[i, j] = per_sample.std()
            errors[i, j] = int((hard | wrong).sum())
    return loss, counts, sd, errors


def measure(
    k: int,
    c: int,
    n: int,
    spread: float,
    noisy: dict[int, float],
    rounds: int,
    seed: int = 0,
    class_spread: float = 0.0,
    no_floor: bool = False,
) -> str:
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.005, 0.08, size=c)
    truth = np.zeros(k, dtype=bool)
    truth[list(noisy)] = True
    kinds = ("losses", "both", "no floor")[: 3 if no_floor else 2]
    alarms = dict.fromkeys(kinds, 0)
    found = {kind: np.zeros(len(noisy)) for kind in kinds}
    for _ in range(rounds):
        loss, counts, sd, errors = federation(rng, k, c, n, base, spread, noisy, class_spread)
        for kind in kinds:
            detector = EvidenceDetector(
                mixture_check=False,
                error_check=kind != "losses",
                min_error_dispersion=0.0 if kind == "no floor" else 0.5,
            )
            wrong = errors if kind != "losses" else None
            result = detector.fit(loss, counts, sd, per_class_errors=wrong)
            flags = np.asarray([bool(v is not None and v.flag) for v in result.verdicts])
            alarms[kind] += bool((flags & ~truth).any())
            found[kind] += flags[list(noisy)]
    rates = ", ".join(f"{r:.2f}" for r in noisy.values()) or "none"
    cells = [f"{alarms[kind] / rounds:.3f}" for kind in kinds]
    cells += [" ".join(f"{v:.2f}" for v in found[kind] / rounds) or "-" for kind in kinds]
    return f"| {k} | {c} | {n} | {spread} | {class_spread} | {rates} | " + " | ".join(cells) + " |"


def main(rounds: int, large: bool = False, small: bool = False) -> None:
    mild = {i: 0.1 + 0.04 * i for i in range(6)}
    header = "| sites | classes | samples | spread | class spread | noisy rates | "
    if small:
        print(
            header + "false-alarm rounds, losses | false-alarm rounds, both | false-alarm rounds, "
            "both without the floor | found, losses | found, both | found, without the floor |"
        )
        print("| --- " * 12 + "|")
    else:
        print(
            header + "false-alarm rounds, losses | false-alarm rounds, both | found, losses | "
            "found, both |"
        )
        print("| --- " * 10 + "|")
    settings: tuple[tuple[int, int, int, float, float, dict[int, float]], ...] = (
        (20, 10, 70, 0.0, 0.0, {}),
        (20, 10, 70, 0.3, 0.0, {}),
        (20, 10, 70, 0.6, 0.0, {}),
        (10, 2, 300, 0.5, 0.0, {}),
        (20, 2, 300, 0.5, 0.0, {}),
        (20, 10, 70, 0.0, 0.5, {}),
        (20, 10, 70, 0.0, 1.0, {}),
        (20, 10, 70, 0.0, 0.0, mild),
        (20, 10, 70, 0.3, 0.0, mild),
        (20, 10, 70, 0.0, 0.5, mild),
        (50, 10, 30, 0.0, 0.0, {7: 0.5}),
    )
    if large:
        settings = (
            (20, 10, 300, 0.3, 0.0, {}),
            (20, 10, 1000, 0.3, 0.0, {}),
            (10, 10, 1000, 0.3, 0.0, {}),
        )
    if small:
        settings = (
            (5, 3, 35, 0.0, 0.0, {}),
            (5, 3, 35, 0.3, 0.0, {}),
            (6, 2, 90, 0.0, 0.0, {}),
            (6, 2, 90, 0.3, 0.0, {}),
            (6, 2, 90, 0.6, 0.0, {}),
            (6, 2, 90, 0.0, 0.5, {}),
            (8, 10, 70, 0.3, 0.0, {}),
            (8, 10, 70, 0.0, 1.0, {}),
            (6, 2, 90, 0.0, 0.0, {0: 0.3}),
            (6, 2, 90, 0.3, 0.0, {0: 0.2, 1: 0.4}),
            (5, 3, 35, 0.3, 0.0, {0: 0.4, 1: 0.5}),
            (8, 10, 70, 0.3, 0.0, {0: 0.1, 1: 0.2}),
        )
    for k, c, n, spread, class_spread, noisy in settings:
        print(
            measure(k, c, n, spread, noisy, rounds, class_spread=class_spread, no_floor=small),
            flush=True,
        )


if __name__ == "__main__":
    numbers = [a for a in sys.argv[1:] if not a.startswith("--")]
    main(int(numbers[0]) if numbers else 150, "--large" in sys.argv[1:], "--small" in sys.argv[1:])
