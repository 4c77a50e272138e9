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
from dataclasses import dataclass
from typing import Any, Generic, Literal, cast

import numpy as np
from typing_extensions import TypeVar

from service.audit._json import to_jsonable
from service.audit._typing import FloatArray
from service.audit._validation import InvalidInputError, check_choice, check_int
from service.audit.verdict_types import (
    EmptySummary,
    EvidenceSummary,
    EvidenceVerdictEvidence,
    ExpertiseSummary,
    ExpertiseVerdictEvidence,
    FedNCLSummary,
    FedNCLVerdictEvidence,
    FedNoRoSummary,
    FedNoRoVerdictEvidence,
    JsonRecord,
)

__all__ = [
    "ClientStatus",
    "ClientVerdict",
    "DetectionResult",
    "EvidenceResult",
    "ExpertiseResult",
    "FedNCLResult",
    "FedNoRoResult",
    "next_status",
]

ClientStatus = Literal["trusted", "suspect", "noisy"]
"""A client's status derived from its detection history."""

E = TypeVar("E", bound=JsonRecord, default=Any)
"""A verdict's evidence type (:data:`~service.audit.verdict_types.VerdictEvidence`)."""
S = TypeVar("S", bound=JsonRecord, default=Any)
"""A result's summary type (:data:`~service.audit.verdict_types.DetectionSummary`)."""

RANGE_EPS = 1e-12
"""A min-max range at or below this carries no information (FedNoRo eq. 3's normalisation)."""


# --------------------------------------------------------------------------------------------
# Common result types
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientVerdict(Generic[E]):
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
    evidence : JsonRecord
        The facts behind the verdict, the detector's own record
        (:mod:`service.audit.verdict_types`).
    probability : float or None
        Noisy probability in [0, 1] where the detector has one (``fednoro``: the GMM posterior
        of the noisy component, 0 when the separation guard withheld the flags); None
        otherwise.
    """

    score: float | None
    flag: bool | None
    evidence: E
    probability: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the verdict as plain JSON values."""
        return {
            "score": to_jsonable(self.score, "$.score"),
            "probability": to_jsonable(self.probability, "$.probability"),
            "flag": to_jsonable(self.flag, "$.flag"),
            "evidence": self.evidence.to_json("$.evidence"),
        }


@dataclass(frozen=True)
class DetectionResult(Generic[S, E]):
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
    summary : JsonRecord
        Federation-level facts, the detector's own record
        (:mod:`service.audit.verdict_types`), e.g. FedNoRo's ``ashman_d`` and
        ``separation_passed``.
    """

    method: str
    status: Literal["ok", "undetermined", "inconclusive"]
    reason: str | None
    verdicts: list[ClientVerdict[E] | None]
    summary: S

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
            "summary": self.summary.to_json("$.summary"),
        }


EvidenceResult = DetectionResult[EvidenceSummary, EvidenceVerdictEvidence]
"""The evidence detector's result (:mod:`service.audit.evidence`)."""
FedNoRoResult = DetectionResult[FedNoRoSummary, FedNoRoVerdictEvidence]
"""FedNoRo's result (:mod:`service.audit.detectors.fednoro`)."""
FedNCLResult = DetectionResult[FedNCLSummary, FedNCLVerdictEvidence]
"""Fed-NCL's result (:mod:`service.audit.detectors.fedncl`)."""
ExpertiseResult = DetectionResult[ExpertiseSummary, ExpertiseVerdictEvidence]
"""FedRN expertise as a result (:mod:`service.audit.detectors.expertise`)."""


def undetermined(method: str, n_clients: int, reason: str, summary: S) -> DetectionResult[S, E]:
    """An "undetermined" result for ``n_clients`` clients (every verdict None); ``summary`` is
    the detector's record of what it found before it gave up (often empty)."""
    verdicts: list[ClientVerdict[E] | None] = [None] * n_clients
    return DetectionResult(method, "undetermined", reason, verdicts, summary)


def not_run(method: str, n_clients: int, reason: str) -> DetectionResult:
    """The result of a detector that could not run (every verdict None, an empty summary)."""
    return undetermined(method, n_clients, reason, EmptySummary())


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
