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
flagged only at ``z >= max(geometry_min_z, critical_z(n))``. At ``NULL_ALPHA`` = 1e-4 a clean group
of peers whose cosines scatter normally raises a flag in at most one round of 10,000: 24.9 for 9
peers, 16.9 for 10, 13.8 for 12, 10.5 for 16, the 10 of ``geometry_min_z`` from 18 on. The normal
null is not enough at 1e-3 (13.2 for 9 peers, 10.3 for 10): in a clean 10-site breast-cancer
federation of the held-out draw one clean site stood 10.6 and 11.2 out in two rounds of 27 (the
same site twice: clean cosines stood out more often than the normal null allows). The price: three
sites lying about their losses among 10 (the liar federation of docs/evaluation.md, z 11-21) are
still all flagged, from round 3-7, but not in every round (F1 mean 0.39 / 0.75 / 0.92 over seeds
0-2 instead of 0.92 / 0.96 / 0.92). The table was simulated with :func:`simulate_critical_z`
(4,000,000 groups per size, seed 2026; ``python -m service.audit.geometry_null`` prints it again)
and is checked by a smaller simulation in the tests. Beyond the table (``n > 30``) the value at 30
is used, which is larger than the exact one (the quantile falls with ``n``). The normal null is a
model: heavier-tailed cosines stand out more often; the measured clean maxima over the stored
rounds are in docs/evaluation.md.

The statistic is the one Hampel (1974) standardises by (the median and the normal-consistent
MAD); its small-sample distribution is taken by simulation, as for Rousseeuw and Croux's (1993)
finite-sample correction factors of robust scales.
"""

from __future__ import annotations

import math

import numpy as np

from service.audit._typing import FloatArray

__all__ = ["MAD_TO_SD", "NULL_ALPHA", "critical_z", "mad_z", "simulate_critical_z"]

NULL_ALPHA = 1e-4
"""The probability, per round and group of peers, that the largest z of a clean group reaches
:func:`critical_z` under the normal null (module docstring)."""

MAD_TO_SD = 1.4826
"""The median absolute deviation times this estimates a normal standard deviation."""

_CRITICAL_Z: dict[int, float] = {
    5: 141.92,
    6: 39.17,
    7: 43.70,
    8: 23.31,
    9: 24.88,
    10: 16.88,
    11: 17.28,
    12: 13.75,
    13: 13.97,
    14: 11.87,
    15: 12.04,
    16: 10.53,
    17: 10.55,
    18: 9.65,
    19: 9.77,
    20: 8.96,
    21: 9.06,
    22: 8.41,
    23: 8.57,
    24: 8.09,
    25: 8.09,
    26: 7.72,
    27: 7.82,
    28: 7.52,
    29: 7.56,
    30: 7.30,
}
"""``n`` -> the ``1 - NULL_ALPHA`` quantile of the group's largest z (module docstring). The
even sizes sit lower than their odd neighbours: an even group's median is the mean of two."""


def mad_z(values: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(median - x) / (1.4826 MAD)`` of each value against its row (the last axis), and each
    row's scale ``1.4826 MAD``; a row of scale 0 gives infinite or NaN z (the caller decides)."""
    centre = np.median(values, axis=-1, keepdims=True)
    scale = MAD_TO_SD * np.median(np.abs(values - centre), axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (centre - values) / scale
    return np.asarray(z, dtype=np.float64), np.asarray(scale[..., 0], dtype=np.float64)


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
    """The ``1 - alpha`` quantile of ``max_k`` of :func:`mad_z` over ``draws``
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
        z, _ = mad_z(rng.standard_normal((size, n)))
        largest.append(z.max(axis=1))
    return float(np.quantile(np.concatenate(largest), 1.0 - alpha))


if __name__ == "__main__":  # pragma: no cover - regenerates the table above
    for size in range(min(_CRITICAL_Z), max(_CRITICAL_Z) + 1):
        print(f"    {size}: {simulate_critical_z(size):.2f},")
