"""The privacy budget of the Gaussian mechanism: (epsilon, delta) per round and per site.

Under a federation's Gaussian mechanism (``config.privacy.dp_noise_multiplier`` sigma > 0;
:mod:`service.coordinator.signal_policy`) every noised signal an update carries
(``per_class_loss``, ``probe_softmax``) is one Gaussian mechanism with noise multiplier sigma:
the site adds N(0, (sigma * sensitivity)^2) noise to it. An update with k noised signals is k
releases; a site's updates up to round r are k times the number of its stored updates. The
epsilon at the federation's ``dp_delta`` is computed by Google's ``dp-accounting`` package
(its Renyi-DP accountant, Mironov 2017, composed over the releases and converted to
(epsilon, delta)); nothing here derives a bound by hand. The accounting functions live in
:mod:`fedaudit_privacy.accounting` (a package of its own that both sides import: the
coordinator does not import the SDK), so that a site's ``Participant.preview()`` shows the
epsilon computed by the same code.

What the epsilon covers, and what it does not (the model weights, the counts, the training loss
and accuracy), is in docs/what-leaves-the-site.md. The accounting runs at each round's audit and
is stored with it (``result["privacy"]``); the reports read it from there.

``dp-accounting`` is the optional extra ``fedaudit[dp]``: a coordinator without it refuses to
create a federation with the mechanism, and an audit that needs it raises
:class:`~service.errors.DpAccountingUnavailableError`; there is no fallback.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fedaudit_privacy.accounting import (
    ACCOUNTANT,
    accountant,
    releases_per_update,
    round_account,
)
from fedaudit_privacy.accounting import epsilon as shared_epsilon
from service.coordinator.signal_policy import SignalPolicy, policy_of
from service.errors import DpAccountingUnavailableError
from service.report_views import PrivacySummary

__all__ = [
    "ACCOUNTANT",
    "epsilon",
    "releases_per_update",
    "report_privacy",
    "require_accountant",
    "round_privacy",
]


def require_accountant() -> Any:
    """The ``dp_accounting`` module; :class:`DpAccountingUnavailableError` without it."""
    try:
        return accountant()
    except ImportError as exc:
        raise DpAccountingUnavailableError(
            "the federation's Gaussian mechanism (config.privacy.dp_noise_multiplier) needs the "
            "privacy accountant of the 'dp-accounting' package, which this coordinator does not "
            "have: install fedaudit[dp]",
        ) from exc


def epsilon(noise_multiplier: float, delta: float, releases: int) -> float:
    """The epsilon at ``delta`` of ``releases`` Gaussian mechanisms of noise multiplier
    ``noise_multiplier`` composed, 0 for none (:func:`fedaudit_privacy.accounting.epsilon`, the
    function the SDK's preview uses); :class:`DpAccountingUnavailableError` without the
    accountant."""
    if releases > 0:
        require_accountant()
    return shared_epsilon(noise_multiplier, delta, releases)


def round_privacy(
    policy: SignalPolicy,
    signals: Iterable[str],
    client_ids: Sequence[str],
    updates_so_far: Mapping[str, int],
) -> dict[str, Any] | None:
    """What a round's audit stores of the budget (None when the mechanism is off): the
    settings, the round's epsilon (the same for each site that sent an update), and per site,
    in the order of ``client_ids``, its releases and epsilon over every update it has sent up
    to this round (``updates_so_far``, this round's included)."""
    if not policy.dp_active:
        return None
    sigma = policy.dp_noise_multiplier
    delta = policy.dp_delta
    assert delta is not None  # required with the mechanism (SignalPolicy)
    k = releases_per_update(signals)
    totals = [k * int(updates_so_far[cid]) for cid in client_ids]
    return round_account(sigma, delta, k, totals, epsilon_of=epsilon)


def report_privacy(config: Mapping[str, Any]) -> PrivacySummary | None:
    """The report's ``privacy``: a federation's mechanism, and the epsilon of one round (None
    when it has none)."""
    policy = policy_of(config)
    if not policy.dp_active:
        return None
    assert policy.dp_delta is not None  # both required with the mechanism (SignalPolicy)
    assert policy.dp_clip_loss is not None
    k = releases_per_update(config["signals"])
    return PrivacySummary(
        noise_multiplier=policy.dp_noise_multiplier,
        clip_loss=policy.dp_clip_loss,
        clip_probe=policy.dp_clip_probe,
        delta=policy.dp_delta,
        accountant=ACCOUNTANT,
        releases_per_update=k,
        epsilon_per_round=epsilon(policy.dp_noise_multiplier, policy.dp_delta, k),
    )
