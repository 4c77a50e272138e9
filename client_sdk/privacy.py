"""The federation's signal privacy policy, applied on the site before anything is sent.

The coordinator sends the policy with the task (before the join) and with each round's
instructions (:class:`~client_sdk._responses.SignalPolicy`); :class:`~client_sdk.Participant`
applies it here to the join's counts and to every update, and the coordinator refuses what does
not obey it (422, ``/problems/privacy-policy``). docs/what-leaves-the-site.md describes it for a
site's data-protection officer.

- ``min_class_count`` m (0 or 1: off): a class the site holds 1 to m-1 samples of is
  *suppressed*: its class count is sent as ``None`` (JSON ``null``, meaning "fewer than m"), and
  its ``per_class_loss``, ``per_class_loss_sd`` and ``per_class_errors`` as ``None``.
- ``count_bucket`` b (1: off): ``num_samples`` and every class count are sent rounded up to a
  multiple of b; 0 stays 0.

A site whose every class is suppressed has nothing left to report: :class:`SignalPolicyError`
is raised before anything is sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from client_sdk._responses import SignalPolicy

__all__ = ["PER_CLASS_SIGNALS", "SignalPolicyError", "private_counts", "private_signals"]

PER_CLASS_SIGNALS = ("per_class_loss", "per_class_loss_sd", "per_class_errors")
"""The signals with one entry per class that a suppressed class sends as None."""


class SignalPolicyError(ValueError):
    """The federation's privacy policy leaves this site nothing to report."""


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
) -> tuple[int, dict[str, Any]]:
    """(num_samples, signals) of an update as the policy lets them leave the site.

    ``signals`` are the update's signals with the site's exact ``class_counts``
    (``reported_signals``); the per-class signals of a suppressed class become None, the counts
    are coarsened by :func:`private_counts`. RoFL's ``centroids`` have no null: a suppressed
    class's row is replaced by the one the coordinator sent (``global_centroids``, zeros in
    the first round), so it carries nothing of the site's samples (the audit does not read it:
    for the audit the class is not held). The other signals are unchanged.
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
    return sent_samples, result
