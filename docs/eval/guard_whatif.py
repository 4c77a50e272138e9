"""What-if for the FedNoRo separation guard (Ashman's D between the two groups of the mixture of
FedNoRo's §4.1) on stored signals.

The V4 evaluation (all clients clean) showed the guard letting single outlier clients through:
a one-member group has population spread 0, so Ashman's D becomes sqrt(2) * z, z being the
client's distance from the others in their standard deviations. This script re-scores the
signals clients actually sent (``model_update.signals`` in the coordinator database the
simulator keeps) with the product's ``FedNoRoDetector`` (paper-exact, guard off, so the mixture's
vote is visible) and applies guard variants to the vote:

- ``plain``: D >= 2 on the mean loss (the separation rule as first designed);
- ``min2``: D >= 2 and both groups have at least 2 clients (a single client is never flagged);
- ``singleton_z3.5``: D >= 2 for groups of 2 or more; a one-member group needs z >= 3.5 against
  the other clients (D >= 3.5 * sqrt(2));
- ``D4``: D >= 4 whatever the group sizes;
- ``min2+D4``: D >= 4 and both groups have at least 2 clients;
- ``calibrated``: D >= 2 and D above the 99th percentile of D for the same group sizes drawn
  from one normal population (``null_separation_threshold``; the product default before the
  class-standardised statistic, D on the mean loss);
- ``cal_q0.9``: as ``calibrated`` with the 90th percentile;
- ``cal_q0.8+persist``: the 80th percentile, and the same group must also have passed in the
  previous round;
- ``cal_adjusted``: as ``calibrated``, but D on a class-adjusted mean loss (each client's summed
  loss divided by what the per-class median client would lose on the same samples), which takes
  the class mix out of the statistic under label skew.
- ``cal_z_mean``: as ``calibrated``, D on the count-weighted mean over a client's classes of its
  per-class z-score across clients ((L_kc - mean_c) / std_c, classes held by 3 or more clients);
- ``cal_class_z``: as ``calibrated``, D on ``class_standardised_excess`` (per-class excess in
  standard errors, Stouffer-combined; the product default).
- ``cal_class_z_clip3``: as ``cal_class_z`` with each per-class z clipped to [-3, 3] before
  Stouffer's combination (bounds one class's influence; tried on the V4 FLR false flag, where
  one client holds nearly all of a class's loss and gets z = sqrt(K - 1)).
- ``cal_class_z+q0.9x2``: ``cal_class_z``, *or* the same vote as the previous round with D (on
  the class-standardised loss) above the 90th percentile in both rounds: a first flag from two
  rounds of weaker evidence, added to the one-round rule so that nothing it passes is lost
  (the candidate for ten-client federations, ``docs/evaluation.md``, "Known
  limits"). Like every column here it ignores the status and the confirmed-group rule.
- ``cal_class_z_w3``: as ``cal_class_z``, with each client's statistic averaged over this round
  and the two before it (from round 1 on): evidence from several rounds on the vote of this one.
- ``cal_class_z_closed``: as ``cal_class_z`` on the vote closed upwards along the statistic
  (every client scoring at least the lowest flagged one is flagged too), so that no unflagged
  client outscores a flagged one (V2 seed 0: the vote leaves out one of the four noisy clients
  that the statistic ranks with them).
- ``cal_class_z_gmm1d``: as ``cal_class_z`` with the vote taken from a two-component mixture on
  the statistic itself (9 fits, majority), instead of on the per-class normalised losses.
- ``cal_class_z_bestll``: as ``cal_class_z`` with the group of the one fit (of the same 9) whose
  likelihood is highest, instead of the fits' majority (V2 seed 0: 5 fits vote for three of the
  four noisy clients, 4 for exactly the four).

Every column judges the group of the fits' majority only (the product's rule until
``fednoro_separation_groups``, whose default ``"all_fits"`` also judges the other fits' groups:
``docs/eval/fits_whatif.py``).

Only federations whose flags do not change training are a fair counterfactual: the ``fedavg``
federations (FedNoRo's detector runs there reported only). For the ``fednoro`` federations the
flags fed back into training, so their numbers are shown but are not what the variant would
have produced.

Usage (from the repository root)::

    .venv/bin/python docs/eval/guard_whatif.py runs/eval/V1 runs/eval/V4 ...
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from claim1_ablation import indicator, load_runs  # noqa: E402

from fedaudit_sim.metrics import detection_metrics  # noqa: E402
from service.audit import FedNoRoDetector  # noqa: E402
from service.audit.detectors.separation import (  # noqa: E402
    ashman_d,
    class_standardised_excess,
    null_separation_threshold,
)

Rule = Callable[[float | None, int, int], bool]

RULES: dict[str, Rule] = {
    "plain": lambda d, a, b: d is not None and d >= 2.0,
    "min2": lambda d, a, b: d is not None and d >= 2.0 and min(a, b) >= 2,
    "singleton_z3.5": lambda d, a, b: (
        d is not None and (d >= 2.0 if min(a, b) >= 2 else d >= 3.5 * math.sqrt(2.0))
    ),
    "D4": lambda d, a, b: d is not None and d >= 4.0,
    "min2+D4": lambda d, a, b: d is not None and d >= 4.0 and min(a, b) >= 2,
    "calibrated": lambda d, a, b: (
        d is not None and d >= max(2.0, null_separation_threshold(a + b, a, 0.99))
    ),
    "cal_q0.9": lambda d, a, b: (
        d is not None and d >= max(2.0, null_separation_threshold(a + b, a, 0.9))
    ),
}
PERSIST_QUANTILE = 0.8
EXTRA_RULES = (
    "cal_q0.8+persist",
    "cal_adjusted",
    "cal_z_mean",
    "cal_class_z",
    "cal_class_z_clip3",
    "cal_class_z+q0.9x2",
    "cal_class_z_w3",
    "cal_class_z_closed",
    "cal_class_z_gmm1d",
    "cal_class_z_bestll",
)


def class_adjusted_mean_loss(loss: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Each client's summed loss over what the per-class median client would lose on its samples."""
    missing = counts == 0
    median = np.zeros(loss.shape[1])
    for c in range(loss.shape[1]):
        present = ~missing[:, c]
        if present.any():
            median[c] = float(np.median(loss[present, c]))
    summed = (np.where(missing, 0.0, loss) * counts).sum(axis=1)
    expected = (counts * median[None, :]).sum(axis=1)
    return np.asarray(summed / expected, dtype=np.float64)


def weighted_mean_z(loss: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Count-weighted mean of each client's per-class z-scores across clients."""
    total = np.zeros(loss.shape[0])
    weight = np.zeros(loss.shape[0])
    for c in range(loss.shape[1]):
        held = counts[:, c] > 0
        values = loss[held, c]
        if held.sum() < 3 or values.std() <= 1e-12:
            continue
        total[held] += counts[held, c] * (values - values.mean()) / values.std()
        weight[held] += counts[held, c]
    return np.divide(total, weight, out=np.zeros_like(total), where=weight > 0)


def mixture_vote_1d(values: np.ndarray) -> np.ndarray:
    """The majority noisy set of 9 two-component mixtures fitted on one value per client."""
    counts: dict[bytes, int] = {}
    labels_of: dict[bytes, np.ndarray] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for seed in range(9):
            mixture = GaussianMixture(n_components=2, random_state=seed).fit(values[:, None])
            noisy = int(np.argmax(np.asarray(mixture.means_)[:, 0]))
            labels = mixture.predict(values[:, None]) == noisy
            key = labels.tobytes()
            counts[key] = counts.get(key, 0) + 1
            labels_of.setdefault(key, labels)
    return labels_of[max(counts, key=counts.__getitem__)]


def best_likelihood_group(features: np.ndarray) -> np.ndarray:
    """The noisy group of the fit (random_state 0..8) with the highest mean log-likelihood."""
    best: tuple[float, np.ndarray] | None = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for seed in range(9):
            mixture = GaussianMixture(n_components=2, random_state=seed).fit(features)
            score = float(mixture.score(features))
            noisy = int(np.argmax(np.asarray(mixture.means_).sum(axis=1)))
            if best is None or score > best[0]:
                best = (score, mixture.predict(features) == noisy)
    assert best is not None
    return best[1]


def _passes_on(statistic: np.ndarray, group: np.ndarray) -> bool:
    """The calibrated guard (99th percentile) for ``group`` against the rest on ``statistic``."""
    a = int(group.sum())
    return _passes(ashman_d(statistic[group], statistic[~group]), a, group.size - a, 0.99)


def _passes(d: float | None, a: int, b: int, quantile: float) -> bool:
    if d is None or a == 0 or b == 0:
        return False
    return d >= max(2.0, null_separation_threshold(a + b, a, quantile))


def main() -> int:
    parser = argparse.ArgumentParser(description="separation-guard variants on stored signals")
    parser.add_argument("run_dirs", nargs="+", type=Path)
    args = parser.parse_args()
    print(
        "| scenario | federation | seed | rounds | truly noisy | "
        + " | ".join(f"{name}: F1 / rounds with a false alarm" for name in (*RULES, *EXTRA_RULES))
        + " |"
    )
    print("|" + " --- |" * (5 + len(RULES) + len(EXTRA_RULES)))
    with threadpool_limits(limits=1):
        for run_dir in args.run_dirs:
            for run in load_runs(run_dir):
                rounds = [r for r in run.rounds if r.index >= run.warmup]
                names = [*RULES, *EXTRA_RULES]
                f1: dict[str, list[float]] = {name: [] for name in names}
                alarms: dict[str, int] = dict.fromkeys(names, 0)
                previous: tuple[np.ndarray, bool] | None = None  # last round's vote, passed
                previous_z: tuple[np.ndarray, bool] | None = None  # the same on class z, q0.9
                history: dict[int, np.ndarray] = {}  # class z of every round, for the w3 column
                column_votes: dict[str, np.ndarray] = {}  # columns that flag another group
                for signals in sorted(run.rounds, key=lambda r: r.index):
                    detector = FedNoRoDetector(require_separation=False, separation_quantile=None)
                    detector.fit(signals.loss, signals.counts)
                    if detector.labels_ is None:
                        previous = previous_z = None
                        continue
                    vote = np.asarray(detector.labels_, dtype=bool)
                    a, b = int(vote.sum()), int((~vote).sum())
                    mean = indicator("mean", signals)[:, 0]
                    d = ashman_d(mean[vote], mean[~vote])
                    adjusted = class_adjusted_mean_loss(signals.loss, signals.counts)
                    passed_low = _passes(d, a, b, PERSIST_QUANTILE)
                    decisions = {name: rule(d, a, b) for name, rule in RULES.items()}
                    decisions["cal_q0.8+persist"] = (
                        passed_low
                        and previous is not None
                        and previous[1]
                        and np.array_equal(previous[0], vote)
                    )
                    decisions["cal_adjusted"] = _passes(
                        ashman_d(adjusted[vote], adjusted[~vote]), a, b, 0.99
                    )
                    z_mean = weighted_mean_z(signals.loss, signals.counts)
                    decisions["cal_z_mean"] = _passes(
                        ashman_d(z_mean[vote], z_mean[~vote]), a, b, 0.99
                    )
                    class_z, _ = class_standardised_excess(signals.loss, signals.counts)
                    decisions["cal_class_z"] = _passes(
                        ashman_d(class_z[vote], class_z[~vote]), a, b, 0.99
                    )
                    z_low = _passes(ashman_d(class_z[vote], class_z[~vote]), a, b, 0.9)
                    decisions["cal_class_z+q0.9x2"] = decisions["cal_class_z"] or (
                        z_low
                        and previous_z is not None
                        and previous_z[1]
                        and np.array_equal(previous_z[0], vote)
                    )
                    previous_z = (vote, z_low)
                    clipped, _ = class_standardised_excess(signals.loss, signals.counts, clip=3.0)
                    decisions["cal_class_z_clip3"] = _passes(
                        ashman_d(clipped[vote], clipped[~vote]), a, b, 0.99
                    )
                    previous = (vote, passed_low)
                    if signals.index >= 1:
                        history[signals.index] = class_z
                    window = [
                        history[i]
                        for i in range(signals.index - 2, signals.index + 1)
                        if i in history
                    ]
                    smoothed = np.mean(window, axis=0) if window else class_z
                    decisions["cal_class_z_w3"] = _passes_on(smoothed, vote)
                    closed = class_z >= class_z[vote].min() if vote.any() else vote
                    decisions["cal_class_z_closed"] = _passes_on(class_z, closed)
                    gmm1d = mixture_vote_1d(class_z)
                    decisions["cal_class_z_gmm1d"] = _passes_on(class_z, gmm1d)
                    bestll = best_likelihood_group(indicator("perclass_norm", signals))
                    decisions["cal_class_z_bestll"] = _passes_on(class_z, bestll)
                    column_votes = {
                        "cal_class_z_closed": closed,
                        "cal_class_z_gmm1d": gmm1d,
                        "cal_class_z_bestll": bestll,
                    }
                    if signals.index < run.warmup:
                        continue
                    for name in names:
                        group = column_votes.get(name, vote)
                        flags = group if decisions[name] else np.zeros_like(vote)
                        f1[name].append(detection_metrics(run.truth, flags)["f1"])
                        alarms[name] += int(bool((flags & ~run.truth).any()))
                cells = [
                    f"{np.mean(f1[name]):.2f} / {alarms[name]}" if f1[name] else "-"
                    for name in names
                ]
                print(
                    f"| {run.scenario} | {run.label} | {run.seed} | {len(rounds)} | "
                    f"{int(run.truth.sum())}/{run.truth.size} | " + " | ".join(cells) + " |"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
