"""How far out a clean site's update can stand by chance among few peers (the update geometry's
floor; docs/algorithms.md, "Update geometry").

The geometry judges a site by ``z_k = (median - c_k) / (1.4826 MAD)`` over its group of ``n``
peers (:mod:`service.audit.geometry_evidence`). With few peers the MAD is itself a noisy
estimate: when half of the group's cosines happen to lie close together it shrinks, and every
other site stands far out. For ``n`` independent normal cosines the largest ``z`` of the group
exceeds 10 in 0.28 % of the rounds at ``n = 9`` (a clean 9-site BreastMNIST federation drawn by
``docs/eval/holdout.py`` had a clean site at z 12.7 in round 23 of 30, flagged), 0.005 % at
``n = 20``.

So the floor depends on the group's size: :func:`critical_z` is the ``1 - NULL_ALPHA`` quantile of
``max_k z_k`` for ``n`` independent standard normal cosines, the median and the MAD taken over the
same ``n`` (the statistic is location- and scale-free, so one table serves every round). A site is
flagged only at ``z >= max(geometry_min_z, critical_z(n))``. At ``NULL_ALPHA`` = 1e-3 a clean group
of peers whose cosines scatter normally raises a flag in at most one round of 1,000 (a tenth of the
loss evidence's ``q``): 13.2 for 9 peers, 10.3 for 10, 10.5 for 11, below ``geometry_min_z``'s 10
from 12 on. At 1e-4 the floors were 24.9 and 16.9 for 9 and 10 peers, and three sites lying about
their losses among 10 (the liar federation of docs/evaluation.md, z 11-21) were lost in most rounds
of one seed (F1 mean 0.39 instead of 0.92); the price of 1e-3 is one clean flag in 1,000 rounds of a
small group. The table was simulated with :func:`simulate_critical_z` (4,000,000 groups per size,
seed 2026; ``python -m service.audit.geometry_null`` prints it again) and is checked by a smaller
simulation in the tests. Beyond the table (``n > 30``) the value at 30 is used, which is larger than
the exact one (the quantile falls with ``n``). The normal null is a model: heavier-tailed cosines
stand out more often; the measured clean maxima over the stored rounds are in docs/evaluation.md.

The statistic is the one Hampel (1974) standardises by (the median and the normal-consistent
MAD); its small-sample distribution is taken by simulation, as for Rousseeuw and Croux's (1993)
finite-sample correction factors of robust scales.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["NULL_ALPHA", "critical_z", "simulate_critical_z"]

NULL_ALPHA = 1e-3
"""The probability, per round and group of peers, that the largest z of a clean group reaches
:func:`critical_z` under the normal null (module docstring)."""

MAD_TO_SD = 1.4826
"""The median absolute deviation times this estimates a normal standard deviation."""

_CRITICAL_Z: dict[int, float] = {
    5: 43.62,
    6: 18.09,
    7: 19.59,
    8: 12.61,
    9: 13.16,
    10: 10.25,
    11: 10.52,
    12: 8.84,
    13: 8.99,
    14: 7.98,
    15: 8.11,
    16: 7.40,
    17: 7.50,
    18: 6.97,
    19: 7.06,
    20: 6.65,
    21: 6.72,
    22: 6.38,
    23: 6.45,
    24: 6.20,
    25: 6.22,
    26: 6.03,
    27: 6.05,
    28: 5.89,
    29: 5.91,
    30: 5.80,
}
"""``n`` -> the ``1 - NULL_ALPHA`` quantile of the group's largest z (module docstring). The
even sizes sit lower than their odd neighbours: an even group's median is the mean of two."""


def critical_z(n: int) -> float:
    """The z a site must reach among ``n`` peers to stand out beyond chance (module docstring).

    Parameters
    ----------
    n : int
        The size of the group of peers, the judged site included.

    Returns
    -------
    float
        Infinite below 5 peers (nobody can stand out: the geometry needs at least 5), the
        tabulated quantile for 5 to 30, the value at 30 above.
    """
    if n < min(_CRITICAL_Z):
        return math.inf
    return _CRITICAL_Z[min(int(n), max(_CRITICAL_Z))]


def simulate_critical_z(
    n: int, alpha: float = NULL_ALPHA, draws: int = 4_000_000, seed: int = 2026
) -> float:
    """The ``1 - alpha`` quantile of ``max_k (median - x_k) / (1.4826 MAD)`` over ``draws``
    groups of ``n`` independent standard normal values (module docstring)."""
    if n < 3:
        raise ValueError(f"n = {n}: the median and MAD need at least 3 values")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha = {alpha}: expected a probability in (0, 1)")
    rng = np.random.default_rng([seed, n])
    largest = []
    left = int(draws)
    while left > 0:
        size = min(250_000, left)
        left -= size
        x = rng.standard_normal((size, n))
        centre = np.median(x, axis=1)
        scale = MAD_TO_SD * np.median(np.abs(x - centre[:, None]), axis=1)
        largest.append((centre - x.min(axis=1)) / scale)
    return float(np.quantile(np.concatenate(largest), 1.0 - alpha))


if __name__ == "__main__":  # pragma: no cover - regenerates the table above
    for size in range(min(_CRITICAL_Z), max(_CRITICAL_Z) + 1):
        print(f"    {size}: {simulate_critical_z(size):.2f},")
