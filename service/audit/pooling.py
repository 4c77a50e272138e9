"""How much of one site enters a pooled estimate: no site outweighs the federation.

The audit compares each site with quantities pooled over the other sites: a class's error rate
(:mod:`service.audit.error_evidence`), the share of errors that are confident
(:mod:`service.audit.confident_errors`), the label histogram and the informativeness of the
global model (:mod:`service.audit.evidence_abstention`), the share of the samples the flagged
sites hold. A site's size is what it claims when it joins (bounded by the join's drift, issue
20), so one site that joined claiming 20,000 samples would otherwise set every pooled rate on
its own: reporting no errors, it made ten clean sites of 100 samples significant and the round
abstain as "not a clear minority" in 20 of 20 simulated rounds (and hid a noisy site in each);
reporting many, it hid the noisy ones.

A site enters a pool with at most a multiple of the median member's amount (its size, its
errors): the cap is a multiple of a median, so no single site moves it. Two multiples:

* :data:`RATE_CAP` (1) in a pooled *rate*, a class's error rate and the confident share of the
  errors: a rate is the consensus a site is measured against, and each site is at most one
  median site's vote in it. At 4 times the median a site claiming 20,000 samples without an
  error still pulled the rates of a ten-site round down by 4 / 14 and a clean site was flagged in
  9 of 20 simulated rounds; at 1, in none. In a class's error rate a holder's count of the class
  is also capped at :data:`POOL_CAP` times the median holder's: a site of ordinary size claiming
  100 samples of a class the others hold 10 of, without an error, otherwise set that class's
  rate at 10 / 200 instead of 10 / 140 (``tests/audit/test_pooling.py``).
* :data:`POOL_CAP` (4) in pooled *sample totals*: the label histogram, the informativeness, the
  share of the samples the flagged sites hold, the classes' weights in I^2. A legitimately large
  site keeps most of its weight there (a Dirichlet partition's spread of sizes is not touched).
  In a small federation the multiple is lower (:func:`sample_factor`, ``min(4, K - 4)``, at
  least 1): a site and one other must hold less than half of the capped samples, or a liar
  claiming 4 times the median's samples and flagged beside one noisy site made every round of
  5 to 7 sites abstain as "not a clear minority" (an independent review's counter-example).
* In the pooled within-class variance of the losses (:mod:`service.audit.class_null`), a holder's
  degrees of freedom count up to :data:`POOL_CAP` times the median holder's samples and its
  variance up to :data:`POOL_CAP` times the other holders' pooled variance, where the others
  rest on enough degrees of freedom (:mod:`service.audit.class_null`): one site of ordinary
  size reporting a per-sample spread of 5 raised every site's standard error and hid a noisy
  site in 5-6 of 8 rounds of 5-7 sites (the review again). Not the median holder's
  variance: the variances are as skewed as the losses (a site of one or two samples of a class
  reports about 0), and that cap flagged clean sites of the stress matrix.

The same idea as the aggregation's weight cap (:mod:`service.audit.aggregators.weight_cap`),
for the audit's own statistics. A site's *own* test still uses its own counts: capping its
precision too (its loss's standard error) cost the stress matrix's PneumoniaMNIST row, whose
sites hold 35 to 1,727 samples, a flag on its largest noisy site, and gained nothing: the loss
consensus (a weighted median with a fitted between-site spread) was not moved by one large site
reporting a loss from 0.15 to 0.6 against the others' 0.3 (``tests/audit/test_pooling.py``).
"""

from __future__ import annotations

import numpy as np

from service.audit._typing import BoolArray, FloatArray, IntArray

__all__ = [
    "POOL_CAP",
    "RATE_CAP",
    "capped",
    "capped_sizes",
    "pool_weights",
    "sample_factor",
    "sample_weights",
]

POOL_CAP = 4.0
"""A site enters a pooled sample total with at most this many times the median site's size."""

RATE_CAP = 1.0
"""A site enters a pooled rate with at most the median member's amount (this many times it)."""


def sample_factor(sites: int) -> float:
    """The multiple of the median site's size a site's samples count up to in the pooled sample
    totals of a round of ``sites`` sites: :data:`POOL_CAP`, lowered in a small federation so
    that a site and one other hold less than half of the capped samples
    (``(f + 1) / (f + K - 1) < 1/2``, so ``f <= K - 4``), at least 1.

    >>> [sample_factor(k) for k in (3, 5, 6, 7, 8, 20)]
    [1.0, 1.0, 2.0, 3.0, 4.0, 4.0]
    """
    return float(min(POOL_CAP, max(1, sites - 4)))


def pool_weights(
    amounts: FloatArray | IntArray, members: BoolArray | None = None, factor: float = POOL_CAP
) -> FloatArray:
    """Per site, the fraction of its amount that enters the pool: ``min(1, cap / amount)``
    with ``cap = factor * median`` of the members' positive amounts (at least 1); 0 for a
    site that is not a member. ``members`` None: every site. Amounts must be finite and
    non-negative (counts, sizes, variances).

    >>> pool_weights(np.array([10.0, 10.0, 10.0, 400.0])).tolist()
    [1.0, 1.0, 1.0, 0.1]
    """
    amounts = np.asarray(amounts, dtype=np.float64)
    inside = np.ones(amounts.shape, dtype=bool) if members is None else members
    positive = amounts[inside & (amounts > 0)]
    cap = factor * max(float(np.median(positive)) if positive.size else 1.0, 1.0)
    weight = np.minimum(1.0, cap / np.maximum(amounts, 1e-300))
    return np.where(inside, weight, 0.0)


def capped(
    amounts: FloatArray, members: BoolArray | None = None, factor: float = POOL_CAP
) -> FloatArray:
    """The amounts as they enter a pool: each at most ``factor`` times the members' median
    (non-members keep theirs: they are compared, not pooled).

    >>> capped(np.array([10.0, 12.0, 8.0, 1000.0])).tolist()
    [10.0, 12.0, 8.0, 44.0]
    """
    amounts = np.asarray(amounts, dtype=np.float64)
    inside = np.ones(amounts.shape, dtype=bool) if members is None else members
    return np.where(inside, amounts * pool_weights(amounts, inside, factor), amounts)


def sample_weights(sizes: FloatArray) -> FloatArray:
    """The fraction of each site's samples that enters the pooled sample totals of a round of
    these sites: :func:`pool_weights` at :func:`sample_factor` of their number."""
    return pool_weights(sizes, factor=sample_factor(sizes.size))


def capped_sizes(sizes: FloatArray) -> FloatArray:
    """The sites' sizes as they enter the pooled sample totals: each at most
    :func:`sample_factor` times the median site's.

    >>> capped_sizes(np.array([10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 100.0])).tolist()
    [10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 30.0]
    """
    return capped(sizes, factor=sample_factor(sizes.size))
