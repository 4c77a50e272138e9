"""Detection results and the client status history rule, shared by every detector.

The detectors live one per module in :mod:`service.audit.detectors` (docs/algorithms.md,
"Detectors"):

* :mod:`~service.audit.detectors.fednoro` -- :class:`FedNoRoDetector`, FedNoRo's per-class loss
  mixture (Wu et al., IJCAI 2023, section 4.1 / eq. 2-3), with its separation guard's statistics
  in :mod:`~service.audit.detectors.separation` (Ashman's D, its null threshold and the
  class-standardised loss excess).
* :mod:`~service.audit.detectors.fedncl` -- :class:`FedNCLDetector`, Fed-NCL's reliability score
  q = e * h / n and the mean + beta * sigma rule (Tam et al., section V-A, eq. 7-10), the model
  divergence e (eq. 7) and the label-correction candidates (eq. 17).
* :mod:`~service.audit.detectors.expertise` -- FedRN data expertise (Kim et al., CIKM 2022,
  eq. 4).
* :mod:`service.audit.evidence` -- the calibrated evidence detector.

This module holds what they share:

* :class:`ClientVerdict` and :class:`DetectionResult` -- every detector returns a
  :class:`DetectionResult`: per client a score, a flag and evidence, or "undetermined" with a
  reason. Degenerate statistics never raise; malformed arrays and invalid hyper-parameters raise
  :class:`~service.audit._validation.InvalidInputError` /
  :class:`~service.audit._validation.InvalidParameterError`.
* :func:`next_status` -- trusted / suspect / noisy from the flag history (2 flags in 3 rounds;
  docs/algorithms.md, "Status and warm-up").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import numpy as np

from service.audit._json import to_jsonable
from service.audit._typing import FloatArray
from service.audit._validation import InvalidInputError, check_choice, check_int

__all__ = [
    "ClientStatus",
    "ClientVerdict",
    "DetectionResult",
    "next_status",
]

ClientStatus = Literal["trusted", "suspect", "noisy"]
"""A client's status derived from its detection history."""

RANGE_EPS = 1e-12
"""A min-max range at or below this carries no information (FedNoRo eq. 3's normalisation)."""


# --------------------------------------------------------------------------------------------
# Common result types
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientVerdict:
    """One client's detector output.

    Attributes
    ----------
    score : float or None
        A graded score that ranks the clients of one round: for the detectors, higher = noisier,
        defined for every client whether or not anybody is flagged -- the separation statistic
        (``fednoro``: by default the class-standardised loss excess, in standard errors) or
        the raw reliability score q_k (``fedncl``); for ``expertise`` the normalised expertise
        (higher = more reliable). None if undetermined.
    flag : bool or None
        True = noisy. None if undetermined, and always None for ``expertise``, which is a
        reliability signal and never flags anybody.
    evidence : dict
        JSON-serialisable facts behind the verdict (see each detector).
    probability : float or None
        Noisy probability in [0, 1] where the detector has one (``fednoro``: the GMM posterior
        of the noisy component, 0 when the separation guard withheld the flags); None
        otherwise.
    """

    score: float | None
    flag: bool | None
    evidence: dict[str, Any] = field(default_factory=dict)
    probability: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the verdict as plain JSON values."""
        return cast(
            dict[str, Any],
            to_jsonable(
                {
                    "score": self.score,
                    "probability": self.probability,
                    "flag": self.flag,
                    "evidence": self.evidence,
                }
            ),
        )


@dataclass(frozen=True)
class DetectionResult:
    """A detector's output for one round.

    Attributes
    ----------
    method : str
        The detector's name in the registry
        (:data:`~service.audit.detector_registry.DETECTOR_REGISTRY`), e.g. ``"evidence"``.
    status : {"ok", "undetermined", "inconclusive"}
        "undetermined" when the detector could not decide (then every verdict is None);
        "inconclusive" when it computed every site's evidence but abstains from flagging
        (the consensus it measures against is suspect; every flag None, ``reason`` says why:
        :mod:`service.audit.evidence`).
    reason : str or None
        Why the result is undetermined or inconclusive (human readable); None when
        ``status == "ok"``.
    verdicts : list of ClientVerdict or None
        Aligned with the input rows.
    summary : dict
        Federation-level facts, e.g. ``{"ashman_d": 9.7, "separation_passed": True}``.
    """

    method: str
    status: Literal["ok", "undetermined", "inconclusive"]
    reason: str | None
    verdicts: list[ClientVerdict | None]
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def flags(self) -> list[bool | None]:
        """Per-client flags (None where undetermined)."""
        return [None if v is None else v.flag for v in self.verdicts]

    @property
    def scores(self) -> list[float | None]:
        """Per-client scores (None where undetermined)."""
        return [None if v is None else v.score for v in self.verdicts]

    @property
    def probabilities(self) -> list[float | None]:
        """Per-client noisy probabilities (None where undetermined or the detector has none)."""
        return [None if v is None else v.probability for v in self.verdicts]

    def to_json(self) -> dict[str, Any]:
        """Return the result as plain JSON values (no NaN, no infinity)."""
        return {
            "method": self.method,
            "status": self.status,
            "reason": self.reason,
            "verdicts": [None if v is None else v.to_json() for v in self.verdicts],
            "summary": to_jsonable(self.summary, "$.summary"),
        }


def undetermined(
    method: str, n_clients: int, reason: str, summary: dict[str, Any] | None = None
) -> DetectionResult:
    """An "undetermined" result for ``n_clients`` clients (every verdict None)."""
    return DetectionResult(
        method=method,
        status="undetermined",
        reason=reason,
        verdicts=[None] * n_clients,
        summary={} if summary is None else summary,
    )


def minmax(values: FloatArray) -> FloatArray:
    """Min-max normalise a 1-D array; a range <= 1e-12 gives all ones (no information)."""
    if values.size == 0:
        return values.copy()
    lo = float(values.min())
    spread = float(values.max()) - lo
    if spread <= RANGE_EPS:
        return np.ones_like(values)
    result: FloatArray = (values - lo) / spread
    return result


# --------------------------------------------------------------------------------------------
# Status history
# --------------------------------------------------------------------------------------------

_STATUSES = ("trusted", "suspect", "noisy")


def next_status(
    current: str,
    recent_flags: Sequence[bool | None],
    m: int = 2,
    w: int = 3,
) -> ClientStatus:
    """Next trusted / suspect / noisy status of a client from its flag history.

    Undetermined rounds (``None``) are removed first; they count neither for nor against the
    client. With ``D`` the remaining determined flags (oldest first) and ``last`` its final
    ``w`` entries, the first rule that applies decides:

    1. ``sum(last) >= m`` -> ``"noisy"`` (flagged in at least m of the last w determined rounds);
    2. ``len(D) >= w`` and no flag in ``last`` -> ``"trusted"`` (w consecutive clean rounds);
    3. the latest determined round is flagged -> ``"suspect"``, unless ``current`` is
       ``"noisy"``, which stays ``"noisy"``;
    4. otherwise ``current`` is kept (a suspect or noisy client needs w clean rounds in a row to
       become trusted again; an empty history changes nothing).

    Parameters
    ----------
    current : {"trusted", "suspect", "noisy"}
        The client's status before this round.
    recent_flags : sequence of bool or None
        The primary detector's flags for the client, oldest first, including this round.
    m : int, default=2
        Flags needed within the window (1 <= m <= w).
    w : int, default=3
        Window length, in determined rounds.

    Returns
    -------
    {"trusted", "suspect", "noisy"}

    Raises
    ------
    InvalidParameterError
        If ``current``, ``m`` or ``w`` is invalid.
    InvalidInputError
        If an entry of ``recent_flags`` is not a bool or None.
    """
    status = check_choice("current", current, _STATUSES)
    window = check_int("w", w, min_value=1)
    needed = check_int("m", m, min_value=1, max_value=window)
    determined: list[bool] = []
    for i, flag in enumerate(recent_flags):
        if flag is None:
            continue
        if not isinstance(flag, bool | np.bool_):
            raise InvalidInputError(
                f"recent_flags[{i}]: expected a bool or None, got {type(flag).__name__}"
            )
        determined.append(bool(flag))
    last = determined[-window:]
    if sum(last) >= needed:
        return "noisy"
    if len(determined) >= window and not any(last):
        return "trusted"
    if determined and determined[-1]:
        return "noisy" if status == "noisy" else "suspect"
    return cast(ClientStatus, status)
