"""The federation's signal privacy policy, applied on the site before anything is sent.

The coordinator sends the policy with the task (before the join) and with each round's
instructions (:class:`~client_sdk._responses.SignalPolicy`); :class:`~client_sdk.Participant`
applies it here to the join's counts and to every update, and the coordinator refuses what does
not obey it (422, ``/problems/privacy-policy``). docs/what-leaves-the-site.md describes it for a
site's data-protection officer.

- ``min_class_count`` m (0 or 1: off): a class the site holds 1 to m-1 samples of is
  *suppressed*: its class count is sent as ``None`` (JSON ``null``, meaning "fewer than m"), and
  its ``per_class_loss``, ``per_class_loss_sd``, ``per_class_errors`` and
  ``per_class_confident_errors`` as ``None``.
- ``count_bucket`` b (1: off): ``num_samples`` and every class count are sent rounded up to a
  multiple of b; 0 stays 0.

A site whose every class is suppressed has nothing left to report: :class:`SignalPolicyError`
is raised before anything is sent.

- ``dp_noise_multiplier`` sigma (0: off), with ``dp_clip_loss`` B and ``dp_clip_probe`` R: the
  Gaussian mechanism (:func:`gaussian_signals`). The per-class loss must be the mean of the
  per-sample losses clipped to [0, B] (``compute_signals(loss_clip=B)``, as
  :class:`~client_sdk.Participant` does); N(0, (sigma B / n_c)^2) is added to the mean of a class
  of n_c samples, and the result clamped to [0, B]. Each probe softmax row is clipped to L2
  distance R of the uniform row, N(0, (sigma sqrt(P) min(2R, sqrt 2))^2) is added to every entry
  of the P rows, and each row is projected back onto the probability simplex. The clamp and the
  projection act on noised values only (post-processing: they cost no privacy).
  ``per_class_loss_sd`` and the two error counts are not sent. The noise comes from
  ``numpy.random.default_rng()`` (seeded from the operating system's entropy) unless a
  generator is given. docs/what-leaves-the-site.md states the sensitivities and what the
  coordinator's (epsilon, delta) covers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from client_sdk._exceptions import SignalPolicyError
from client_sdk._responses import SignalPolicy

__all__ = [
    "PER_CLASS_SIGNALS",
    "SignalPolicyError",
    "clip_probe_rows",
    "gaussian_signals",
    "noised_per_class_loss",
    "noised_probe",
    "private_counts",
    "private_signals",
    "probe_sensitivity",
    "project_to_simplex",
]

PER_CLASS_SIGNALS = (
    "per_class_loss",
    "per_class_loss_sd",
    "per_class_errors",
    "per_class_confident_errors",
)
"""The signals with one entry per class that a suppressed class sends as None."""


def _round_up(count: int, bucket: int) -> int:
    return -(-count // bucket) * bucket


def private_counts(
    num_samples: int, class_counts: Sequence[int], policy: SignalPolicy
) -> tuple[int, list[int | None]]:
    """(num_samples, class_counts) as the policy lets them leave the site.

    >>> private_counts(37, [30, 3, 4, 0], SignalPolicy(min_class_count=5, count_bucket=10))
    (40, [30, None, None, 0])
    """
    m, b = policy.min_class_count, max(policy.count_bucket, 1)
    sent: list[int | None] = []
    for count in class_counts:
        count = int(count)
        sent.append(None if 0 < count < m else _round_up(count, b))
    if m > 1 and not any(sent):
        raise SignalPolicyError(
            f"every class this site holds has fewer than the federation's min_class_count "
            f"({m}) samples: the privacy policy leaves nothing to report, so the site cannot "
            f"take part"
        )
    return _round_up(int(num_samples), b), sent


def private_signals(
    num_samples: int,
    signals: Mapping[str, Any],
    policy: SignalPolicy,
    *,
    global_centroids: Sequence[Sequence[float]] | None = None,
    rng: np.random.Generator | None = None,
) -> tuple[int, dict[str, Any]]:
    """(num_samples, signals) of an update as the policy lets them leave the site.

    ``signals`` are the update's signals with the site's exact ``class_counts``
    (``reported_signals``); the per-class signals of a suppressed class become None, the counts
    are coarsened by :func:`private_counts`. RoFL's ``centroids`` have no null: a suppressed
    class's row is replaced by the one the coordinator sent (``global_centroids``, zeros in
    the first round), so it carries nothing of the site's samples (the audit does not read it:
    for the audit the class is not held). Under the Gaussian mechanism the per-class loss and
    the probe softmax are then noised (:func:`gaussian_signals`, with ``rng``). The other
    signals are unchanged.
    """
    exact = [int(c) for c in signals["class_counts"]]
    sent_samples, sent_counts = private_counts(num_samples, exact, policy)
    result = dict(signals)
    result["class_counts"] = sent_counts
    suppressed = [
        c for c, (n, sent) in enumerate(zip(exact, sent_counts, strict=True)) if n and sent is None
    ]
    for name in PER_CLASS_SIGNALS:
        values = result.get(name)
        if values is None or not suppressed:
            continue
        values = list(values)
        for c in suppressed:
            values[c] = None
        result[name] = values
    centroids = result.get("centroids")
    if centroids is not None and suppressed:
        rows = [list(row) for row in centroids]
        for c in suppressed:
            given = global_centroids[c] if global_centroids is not None else None
            rows[c] = [float(v) for v in given] if given is not None else [0.0] * len(rows[c])
        result["centroids"] = rows
    if policy.dp_active:
        result = gaussian_signals(result, exact, policy, rng)
    return sent_samples, result


def noised_per_class_loss(
    per_class_loss: Sequence[float | None],
    class_counts: Sequence[int],
    *,
    clip: float,
    noise_multiplier: float,
    rng: np.random.Generator,
) -> list[float | None]:
    """Each class's mean clipped loss plus N(0, (sigma B / n_c)^2), clamped to [0, B].

    ``per_class_loss[c]`` is the mean over the n_c = ``class_counts[c]`` samples of class c of
    their losses clipped to [0, B] (B = ``clip``); one sample changes it by at most B / n_c, the
    noise's sd is sigma times that. None stays None (a class not held or suppressed).

    >>> rng = np.random.default_rng(0)
    >>> noised_per_class_loss([0.5, None], [10, 0], clip=1.0, noise_multiplier=0.0, rng=rng)
    [0.5, None]
    """
    sent: list[float | None] = []
    for mean, count in zip(per_class_loss, class_counts, strict=True):
        if mean is None:
            sent.append(None)
            continue
        if count < 1:
            raise ValueError("a per-class loss for a class with no sample")
        value = min(max(float(mean), 0.0), clip)  # a mean of values in [0, B] is in it
        noisy = value + float(rng.normal(0.0, noise_multiplier * clip / int(count)))
        sent.append(min(max(noisy, 0.0), clip))
    return sent


def clip_probe_rows(probe: np.ndarray, radius: float | None) -> np.ndarray:
    """Each softmax row moved towards the uniform row until it is within L2 distance ``radius``
    of it (rows already within, and every row when ``radius`` is None, unchanged). The moved row
    lies between the row and the uniform row, so it is still a probability vector."""
    rows = np.asarray(probe, dtype=np.float64)
    if radius is None:
        return rows.copy()
    uniform = np.full(rows.shape[1], 1.0 / rows.shape[1])
    offsets = rows - uniform
    norms = np.linalg.norm(offsets, axis=1, keepdims=True)
    scale = np.minimum(1.0, radius / np.maximum(norms, np.finfo(np.float64).tiny))
    clipped: np.ndarray = uniform + offsets * scale
    return clipped


def probe_sensitivity(num_rows: int, radius: float | None) -> float:
    """The L2 sensitivity of the P = ``num_rows`` clipped probe rows: sqrt(P) min(2R, sqrt 2).

    A row is a probability vector within R of the uniform row, so any two rows (of any two
    data sets) are at most min(2R, sqrt 2) apart (sqrt 2: the simplex's diameter); the P rows
    can all change at once."""
    per_row = math.sqrt(2.0) if radius is None else min(2.0 * radius, math.sqrt(2.0))
    return math.sqrt(num_rows) * per_row


def project_to_simplex(rows: np.ndarray) -> np.ndarray:
    """The Euclidean projection of each row onto the probability simplex (Duchi et al. 2008,
    "Efficient projections onto the l1-ball", figure 1): non-negative, summing to 1."""
    values = np.asarray(rows, dtype=np.float64)
    ordered = -np.sort(-values, axis=1)
    cumulative = np.cumsum(ordered, axis=1) - 1.0
    ranks = np.arange(1, values.shape[1] + 1)
    last = np.count_nonzero(ordered - cumulative / ranks > 0, axis=1)
    theta = cumulative[np.arange(values.shape[0]), last - 1] / last
    projected: np.ndarray = np.maximum(values - theta[:, None], 0.0)
    return projected


def noised_probe(
    probe: Sequence[Sequence[float]],
    *,
    radius: float | None,
    noise_multiplier: float,
    rng: np.random.Generator,
) -> list[list[float]]:
    """The probe softmax clipped (:func:`clip_probe_rows`), with N(0, (sigma *
    :func:`probe_sensitivity`)^2) added to every entry, each row projected back onto the
    simplex."""
    rows = clip_probe_rows(np.asarray(probe, dtype=np.float64), radius)
    scale = noise_multiplier * probe_sensitivity(rows.shape[0], radius)
    noisy = rows + rng.normal(0.0, scale, size=rows.shape)
    result: list[list[float]] = project_to_simplex(noisy).tolist()
    return result


def gaussian_signals(
    signals: Mapping[str, Any],
    exact_counts: Sequence[int],
    policy: SignalPolicy,
    rng: np.random.Generator | None = None,
) -> dict[str, Any]:
    """``signals`` under the policy's Gaussian mechanism: the per-class loss and the probe
    softmax noised, the spread and both error counts left out (the mechanism does not noise
    them, so it does not send them). ``exact_counts``: the site's class counts (the noise of a
    class's mean depends on it)."""
    if not policy.dp_active:
        return dict(signals)
    generator = rng if rng is not None else np.random.default_rng()
    sigma = policy.dp_noise_multiplier
    result = {k: v for k, v in signals.items() if k not in PER_CLASS_SIGNALS[1:]}
    losses = signals.get("per_class_loss")
    if losses is not None:
        if policy.dp_clip_loss is None:
            raise SignalPolicyError("the Gaussian mechanism needs the policy's dp_clip_loss")
        result["per_class_loss"] = noised_per_class_loss(
            losses, exact_counts, clip=policy.dp_clip_loss, noise_multiplier=sigma, rng=generator
        )
    probe = signals.get("probe_softmax")
    if probe is not None:
        result["probe_softmax"] = noised_probe(
            probe, radius=policy.dp_clip_probe, noise_multiplier=sigma, rng=generator
        )
    return result
