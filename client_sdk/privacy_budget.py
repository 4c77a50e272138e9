"""The privacy accounting of the Gaussian mechanism, shared by the site and the coordinator.

Under a federation's Gaussian mechanism (``config.privacy.dp_noise_multiplier`` sigma > 0) every
noised signal an update carries (:data:`NOISED_SIGNALS`) is one Gaussian mechanism of noise
multiplier sigma (:mod:`client_sdk.privacy` adds N(0, (sigma * sensitivity)^2) to it): an update
with k noised signals is k releases. :func:`epsilon` composes releases with Google's
``dp-accounting`` package (its Renyi-DP accountant, Mironov 2017, converted to (epsilon, delta));
nothing here derives a bound by hand.

The coordinator accounts each round's audit with these functions
(``service/coordinator/privacy_budget.py``); :meth:`client_sdk.Participant.preview` shows a
site the same numbers before it sends anything (:func:`preview_privacy`). Pure functions: no
HTTP, no torch, nothing else of the SDK, so the coordinator may import this module.

``dp-accounting`` is the optional extra ``fedaudit[dp]``; without it :func:`accountant` and
:func:`epsilon` raise :class:`ImportError` and :func:`preview_privacy` says that epsilon cannot
be computed.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterable
from typing import Any, Protocol

__all__ = [
    "ACCOUNTANT",
    "NOISED_SIGNALS",
    "accountant",
    "epsilon",
    "preview_privacy",
    "releases_per_update",
]

ACCOUNTANT = "dp-accounting RDP"
"""How the epsilons are computed (the reports and the preview say so)."""

NOISED_SIGNALS = ("per_class_loss", "probe_softmax")
"""The signals the Gaussian mechanism noises; each update carrying one is one release."""

UNAVAILABLE = (
    "epsilon cannot be computed: the privacy accountant of the 'dp-accounting' package is not "
    "installed here (install fedaudit[dp]); the coordinator computes it with that package"
)


class _Policy(Protocol):
    """What :func:`preview_privacy` reads of a policy (the SDK's and the coordinator's
    ``SignalPolicy`` both have it)."""

    min_class_count: int
    count_bucket: int
    dp_noise_multiplier: float
    dp_clip_loss: float | None
    dp_clip_probe: float | None
    dp_delta: float | None


def accountant() -> Any:
    """The ``dp_accounting`` module; :class:`ImportError` (saying what to install) without it."""
    try:
        return importlib.import_module("dp_accounting")
    except ImportError as exc:
        raise ImportError(UNAVAILABLE) from exc


@functools.lru_cache(maxsize=4096)
def epsilon(noise_multiplier: float, delta: float, releases: int) -> float:
    """The epsilon at ``delta`` of ``releases`` Gaussian mechanisms of noise multiplier
    ``noise_multiplier`` (noise standard deviation / L2 sensitivity), composed; 0 for none."""
    if releases <= 0:
        return 0.0
    dp_accounting = accountant()
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(dp_accounting.GaussianDpEvent(noise_multiplier), releases)
    return float(rdp.get_epsilon(delta))


def releases_per_update(signals: Iterable[str]) -> int:
    """How many noised releases an update of a federation requiring ``signals`` carries."""
    wanted = set(signals)
    return sum(1 for name in NOISED_SIGNALS if name in wanted)


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
