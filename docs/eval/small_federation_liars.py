"""One lying site in a small federation (5-10 sites), against the same site reporting honestly.

``one_site_attacks.py`` asks what one liar can do among twelve sites of equal size; this script
asks the questions that one leaves open, where a single site weighs more: each case is judged on
8 simulated rounds (seeds 0-7) by the product's ``EvidenceDetector`` (defaults), once with the
site reporting what it really has and once with its lie, so that what the lie does is not
mistaken for what a small federation cannot see anyway.

Every site's per-class mean loss, spread, error count and confident error count are computed
from simulated per-sample losses: a sample whose label is right has a small loss (exponential,
mean 0.1) unless it is one of the 10 % hard ones (1.5 plus an exponential of mean 1, the model
wrong); a wrong label costs 2 plus an exponential of mean 1 (the model wrong); an error is
confident where the loss is above -ln 0.1 (the SDK's p <= 0.1).

Cases (the liar's own flag is not counted: what it reports about itself is its business):

``spread``
    K sites of 3 x 33 samples, one with 25 % wrong labels, the liar reporting its losses with
    the spread multiplied by 2 or by 50 (it raises the pooled variance every site is judged by).
``deflate``
    6 or 8 tiny sites (20-60 samples over 5 classes, Dirichlet(0.1) class mixes), one with 40 %
    wrong labels, the liar reporting a spread of 0 and 4 or 20 times its class counts (it pulls
    the pooled variance and the class rates down).
``share``
    6 or 8 sites of log-normal sizes (sigma 0.5 or 1, median 100 samples, 3 classes), the
    largest one with 40 % wrong labels, the liar reporting the noisy site's losses and error
    rate with 4 times the median site's samples (two "noisy" sites then hold much of the data).

Per line: rounds the audit abstained in (``inconclusive``), rounds it was conclusive and missed
the noisy site, rounds it flagged a clean site; honest first, lying second.

With ``--honest N``: only the ``spread`` case's honest rounds, seeds 0 to N - 1, at 5, 6, 8
and 10 sites: how often a clean site is flagged when nobody lies (about half a minute for 200).

Usage (from the repository root; about ten seconds)::

    .venv/bin/python docs/eval/small_federation_liars.py [--honest 200]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from service.audit.evidence import EvidenceDetector  # noqa: E402

HARD_SHARE = 0.1
CONFIDENT_LOSS = -np.log(0.1)
SEEDS = range(8)


@dataclass
class Round:
    """One round's reports, (K, C) each; the noisy site's and the liar's rows."""

    loss: np.ndarray
    sd: np.ndarray
    counts: np.ndarray
    errors: np.ndarray
    confident: np.ndarray
    noisy: int
    liar: int


def reports(rng: np.random.Generator, counts: np.ndarray, wrong: np.ndarray) -> Round:
    """Per-class mean loss, spread, errors and confident errors from simulated samples
    (module docstring); ``wrong`` is each site's share of wrong labels."""
    k, c = counts.shape
    loss, sd = np.full((k, c), np.nan), np.full((k, c), np.nan)
    errors, confident = np.zeros((k, c)), np.zeros((k, c))
    for i in range(k):
        for j in range(c):
            n = int(counts[i, j])
            if n == 0:
                continue
            flipped = rng.random(n) < wrong[i]
            hard = ~flipped & (rng.random(n) < HARD_SHARE)
            sample = rng.exponential(0.1, n)
            sample = np.where(hard, 1.5 + rng.exponential(1.0, n), sample)
            sample = np.where(flipped, 2.0 + rng.exponential(1.0, n), sample)
            erred = flipped | hard
            loss[i, j], sd[i, j] = sample.mean(), sample.std()
            errors[i, j] = erred.sum()
            confident[i, j] = (erred & (sample > CONFIDENT_LOSS)).sum()
    return Round(loss, sd, counts.astype(np.int64), errors, confident, noisy=-1, liar=-1)


def judge(r: Round) -> tuple[bool, bool, bool]:
    """(abstained, noisy site missed while conclusive, a clean site flagged)."""
    result = EvidenceDetector().fit(
        r.loss, r.counts, r.sd, per_class_errors=r.errors, per_class_confident_errors=r.confident
    )
    flags = np.array([bool(v is not None and v.flag) for v in result.verdicts])
    clean = np.ones(flags.size, dtype=bool)
    clean[[r.noisy, r.liar]] = False
    abstained = result.status != "ok"
    return abstained, not abstained and not flags[r.noisy], bool(flags[clean].any())


def spread_round(seed: int, k: int, factor: float) -> Round:
    rng = np.random.default_rng(seed)
    wrong = np.zeros(k)
    wrong[0] = 0.25
    r = reports(rng, np.full((k, 3), 33), wrong)
    r.noisy, r.liar = 0, k - 1
    r.sd[r.liar] *= factor
    return r


def deflate_round(seed: int, k: int, factor: int) -> Round:
    rng = np.random.default_rng(seed)
    counts = np.zeros((k, 5), dtype=np.int64)
    for i in range(k):
        counts[i] = rng.multinomial(int(rng.integers(20, 61)), rng.dirichlet(np.full(5, 0.1)))
    wrong = np.zeros(k)
    wrong[0] = 0.4
    r = reports(rng, counts, wrong)
    r.noisy, r.liar = 0, k - 1
    if factor > 1:
        r.sd[r.liar] = np.where(counts[r.liar] > 0, 0.0, np.nan)
        r.counts[r.liar] *= factor
        r.errors[r.liar] *= factor
        r.confident[r.liar] *= factor
    return r


def share_round(seed: int, k: int, sigma: float, lying: bool) -> Round:
    rng = np.random.default_rng(seed)
    sizes = np.maximum(np.round(100 * rng.lognormal(0.0, sigma, k)).astype(np.int64), 6)
    sizes[-1] = int(np.median(sizes[:-1]))  # the liar's real size: the median site's
    noisy = int(np.argmax(sizes[:-1]))
    counts = np.stack([rng.multinomial(n, np.full(3, 1 / 3)) for n in sizes])
    wrong = np.zeros(k)
    wrong[noisy] = 0.4
    r = reports(rng, counts, wrong)
    r.noisy, r.liar = noisy, k - 1
    if lying:
        claimed = rng.multinomial(4 * int(sizes[-1]), np.full(3, 1 / 3))
        rate = r.errors[noisy] / np.maximum(r.counts[noisy], 1)
        share = r.confident[noisy] / np.maximum(r.errors[noisy], 1)
        r.counts[r.liar] = claimed
        r.loss[r.liar], r.sd[r.liar] = r.loss[noisy], r.sd[noisy]
        r.errors[r.liar] = np.round(rate * claimed)
        r.confident[r.liar] = np.round(share * r.errors[r.liar])
    return r


def tally(rounds: list[Round]) -> str:
    outcomes = np.array([judge(r) for r in rounds])
    a, m, f = outcomes.sum(axis=0)
    return f"{a}/{len(rounds)} {m}/{len(rounds)} {f}/{len(rounds)}"


def honest_rounds(count: int) -> None:
    """The ``spread`` case's honest rounds only, ``count`` seeds at each size."""
    print("| sites | rounds | abstained | noisy site missed | a clean site flagged |")
    print("| --- | --- | --- | --- | --- |")
    for k in (5, 6, 8, 10):
        outcomes = np.array([judge(spread_round(s, k, 1.0)) for s in range(count)])
        a, m, f = outcomes.sum(axis=0)
        print(f"| {k} | {count} | {a} | {m} | {f} |")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--honest":
        honest_rounds(int(sys.argv[2]))
        return
    print("| case | sites | the lie | honest: abstained, missed, false | lying: same |")
    print("| --- | --- | --- | --- | --- |")
    for k in (5, 6, 7, 10):
        honest = tally([spread_round(s, k, 1.0) for s in SEEDS])
        for factor in (2.0, 50.0):
            lying = tally([spread_round(s, k, factor) for s in SEEDS])
            print(f"| spread | {k} | spread x {factor:g} | {honest} | {lying} |")
    for k in (6, 8):
        honest = tally([deflate_round(s, k, 1) for s in SEEDS])
        for factor in (4, 20):
            lying = tally([deflate_round(s, k, factor) for s in SEEDS])
            print(f"| deflate | {k} | spread 0, counts x {factor} | {honest} | {lying} |")
    for k in (6, 8):
        for sigma in (0.5, 1.0):
            honest = tally([share_round(s, k, sigma, False) for s in SEEDS])
            lying = tally([share_round(s, k, sigma, True) for s in SEEDS])
            print(
                f"| share | {k} | sizes sigma {sigma:g}: looks noisy, 4 x median | "
                f"{honest} | {lying} |"
            )


if __name__ == "__main__":
    main()
