"""Which clients a round's aggregation treats as noisy (:func:`noisy_set`), and which it may
(:func:`possible_noisy`, known before the detectors run: DaAgg plans the round's shared pass
with it, :class:`~service.audit.round_pass.NoisySplit`).

By default a client is noisy when its status after this round
(:func:`~service.audit.detection.next_status` over its flag history and this round's flag of the
primary detector) is "noisy"; with ``config.aggregation_settings.flags == "round"`` when the
primary detector flags it this round. A pin (an admin's flag override) decides over both.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from service.audit._validation import InvalidInputError, InvalidParameterError
from service.audit.audit_config import AuditConfig
from service.audit.detection import ClientStatus, DetectionResult, next_status
from service.audit.round_inputs import StatusHistory

__all__ = ["noisy_set", "possible_noisy"]


def noisy_set(
    primary: DetectionResult,
    config: AuditConfig,
    history: Sequence[StatusHistory] | None,
    n_clients: int,
) -> np.ndarray | None:
    """The clients the aggregation treats as noisy, before pins; None when undetermined."""
    if primary.status != "ok":
        return None
    if config.aggregation_settings.flags == "round":
        return np.asarray(primary.flags, dtype=bool)
    noisy = np.zeros(n_clients, dtype=bool)
    for i, flag in enumerate(primary.flags):
        before = StatusHistory() if history is None else history[i]
        try:
            noisy[i] = _noisy_after(before, flag, config)
        except (InvalidInputError, InvalidParameterError) as exc:
            raise InvalidInputError(f"status_history[{i}]: {exc}") from None
    return noisy


def _noisy_after(before: StatusHistory, flag: bool | None, config: AuditConfig) -> bool:
    """Whether the status rule makes a client noisy with this round's ``flag``."""
    after: ClientStatus = next_status(
        before.status, [*before.flags, flag], m=config.status.m, w=config.status.w
    )
    return after == "noisy"


def possible_noisy(
    config: AuditConfig,
    history: Sequence[StatusHistory] | None,
    pins: Sequence[bool | None] | None,
    n_clients: int,
) -> np.ndarray | None:
    """True for each client :func:`noisy_set` may mark this round, whatever the primary
    detector says (flagged, not flagged or undetermined): a pinned client as pinned, the others
    as the status rule allows. None where any client may be (the round's flags decide) or where
    the history or the pins are malformed (the audit then raises its own error)."""
    if config.aggregation_settings.flags != "status":
        return None
    if pins is not None and len(pins) != n_clients:
        return None
    maybe = np.zeros(n_clients, dtype=bool)
    try:
        for i in range(n_clients):
            pin = None if pins is None else pins[i]
            if pin is not None:
                maybe[i] = bool(pin)
                continue
            before = StatusHistory() if history is None else history[i]
            maybe[i] = any(_noisy_after(before, flag, config) for flag in (True, False, None))
    except (InvalidInputError, InvalidParameterError, IndexError, TypeError):
        return None
    return maybe
