"""The privacy accounting of the Gaussian mechanism, shared by the site and the coordinator.

Under a federation's Gaussian mechanism (``config.privacy.dp_noise_multiplier`` sigma > 0) every
noised signal an update carries (:data:`NOISED_SIGNALS`) is one Gaussian mechanism of noise
multiplier sigma (the site adds N(0, (sigma * sensitivity)^2) to it, ``client_sdk/privacy.py``):
an update with k noised signals is k releases. :func:`epsilon` composes releases with Google's
``dp-accounting`` package (its Renyi-DP accountant, Mironov 2017, converted to (epsilon, delta));
nothing here derives a bound by hand.

The coordinator accounts each round's audit with these functions
(``service/coordinator/privacy_budget.py``); ``client_sdk.Participant.preview`` shows a site the
same numbers before it sends anything (``client_sdk/privacy_budget.py``). Pure functions over the
standard library and, when called, ``dp-accounting``.

``dp-accounting`` is the optional extra ``fedaudit[dp]``; without it :func:`accountant` and
:func:`epsilon` raise :class:`ImportError` (saying what to install).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = [
    "ACCOUNTANT",
    "NOISED_SIGNALS",
    "UNAVAILABLE",
    "accountant",
    "epsilon",
    "releases_per_update",
    "round_account",
]

ACCOUNTANT = "dp-accounting RDP"
"""How the epsilons are computed (the reports and the preview say so)."""

NOISED_SIGNALS = ("per_class_loss", "probe_softmax")
"""The signals the Gaussian mechanism noises; each update carrying one is one release."""

UNAVAILABLE = (
    "epsilon cannot be computed: the privacy accountant of the 'dp-accounting' package is not "
    "installed here (install fedaudit[dp]); the coordinator computes it with that package"
)
"""What :func:`accountant` says without ``dp-accounting``."""


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


def round_account(
    noise_multiplier: float,
    delta: float,
    releases_per_round: int,
    releases_total: Sequence[int],
    *,
    epsilon_of: Callable[[float, float, int], float] = epsilon,
) -> dict[str, Any]:
    """What a round's audit records of the budget under the Gaussian mechanism: the settings,
    the round's epsilon (``releases_per_round`` releases), and per site its releases so far and
    their epsilon (``releases_total``, in the caller's site order). ``epsilon_of``: the
    composition to use (the coordinator's raises its own error without the accountant)."""
    totals = [int(n) for n in releases_total]
    return {
        "mechanism": "gaussian",
        "accountant": ACCOUNTANT,
        "noise_multiplier": noise_multiplier,
        "delta": delta,
        "releases_per_update": releases_per_round,
        "epsilon_round": epsilon_of(noise_multiplier, delta, releases_per_round),
        "releases_total": totals,
        "epsilon_total": [epsilon_of(noise_multiplier, delta, n) for n in totals],
    }
