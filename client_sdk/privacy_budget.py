"""What taking part costs under the Gaussian mechanism, as a site's preview shows it.

:func:`preview_privacy` is what :meth:`client_sdk.Participant.preview` shows of a federation's
signal privacy policy: its settings and, under the Gaussian mechanism
(``config.privacy.dp_noise_multiplier`` sigma > 0), the (epsilon, delta) of one round and of the
federation's plan. The epsilons come from the accounting the coordinator uses for its reports
(:mod:`fedaudit_privacy.accounting`, Google's ``dp-accounting``; re-exported here), so a site
sees the coordinator's numbers before it sends anything. No HTTP, no torch.

``dp-accounting`` is the optional extra ``fedaudit[dp]``; without it :func:`accountant` and
:func:`epsilon` raise :class:`ImportError` and :func:`preview_privacy` says that epsilon cannot
be computed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from fedaudit_privacy.accounting import (
    ACCOUNTANT,
    NOISED_SIGNALS,
    UNAVAILABLE,
    accountant,
    epsilon,
    releases_per_update,
)

__all__ = [
    "ACCOUNTANT",
    "NOISED_SIGNALS",
    "UNAVAILABLE",
    "accountant",
    "epsilon",
    "preview_privacy",
    "releases_per_update",
]


class _Policy(Protocol):
    """What :func:`preview_privacy` reads of a policy (the SDK's and the coordinator's
    ``SignalPolicy`` both have it)."""

    min_class_count: int
    count_bucket: int
    dp_noise_multiplier: float
    dp_clip_loss: float | None
    dp_clip_probe: float | None
    dp_delta: float | None


def preview_privacy(
    policy: _Policy, signals: Iterable[str] | None = None, total_rounds: int | None = None
) -> dict[str, Any]:
    """The privacy policy and its cost, as :meth:`~client_sdk.Participant.preview` shows them.

    Always: ``min_class_count``, ``count_bucket`` and ``mechanism`` (``None``, or
    ``"gaussian"`` under the Gaussian mechanism). Under the mechanism also its settings
    (``noise_multiplier``, ``clip_loss``, ``clip_probe``, ``delta``), the ``accountant``, and:

    - ``releases_per_update`` k: the noised signals among the round's ``signals``;
    - ``epsilon_round``: the epsilon at ``delta`` of one update (k releases), the
      coordinator's ``epsilon_round``;
    - ``rounds`` (``total_rounds``, the federation's plan) and ``epsilon_total``: the epsilon of
      k x ``rounds`` releases, i.e. of an update in every round of the plan. The coordinator's
      ``epsilon_total`` for the site at the last round is this when the site sends an update in
      every round, and lower when it sends fewer: an upper bound of what taking part costs;
    - ``epsilon_unavailable``: ``None``, or why the epsilons are ``None``: the round's
      instructions are not known yet (``signals`` None: before a round is open, which signals
      are noised is not known), or ``dp-accounting`` is not installed here.
    """
    shown: dict[str, Any] = {
        "min_class_count": policy.min_class_count,
        "count_bucket": policy.count_bucket,
        "mechanism": None,
    }
    if policy.dp_noise_multiplier <= 0.0:
        return shown
    sigma, delta = policy.dp_noise_multiplier, policy.dp_delta
    k = releases_per_update(signals) if signals is not None else None
    shown.update(
        mechanism="gaussian",
        noise_multiplier=sigma,
        clip_loss=policy.dp_clip_loss,
        clip_probe=policy.dp_clip_probe,
        delta=delta,
        accountant=ACCOUNTANT,
        releases_per_update=k,
        epsilon_round=None,
        rounds=total_rounds,
        epsilon_total=None,
        epsilon_unavailable=None,
    )
    if delta is None:  # the coordinator refuses such a policy
        shown["epsilon_unavailable"] = "the policy states no dp_delta"
        return shown
    if k is None:
        shown["epsilon_unavailable"] = (
            "the round's instructions are not known yet: which signals are noised (and so the "
            "releases per update) comes with them; preview again once a round is open"
        )
        return shown
    try:
        accountant()  # before epsilon(), whose cache would answer without it
        shown["epsilon_round"] = epsilon(sigma, delta, k)
        if total_rounds is not None:
            shown["epsilon_total"] = epsilon(sigma, delta, k * total_rounds)
    except ImportError:
        shown["epsilon_unavailable"] = UNAVAILABLE
    return shown
