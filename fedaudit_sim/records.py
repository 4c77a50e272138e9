"""Records of simulated federations: the clients' ground truth and what each round said.

A :class:`RunResult` is one method configuration run with one seed; it holds, per round
(:class:`RoundRecord`), what the coordinator's stored audit said about every client
(:class:`ClientRoundRecord`) next to the ground truth (:class:`ClientRecord`), and the global
model's accuracy on the clean test split. The metrics are computed from these records by
``fedaudit_sim.summaries``; the files are written by ``fedaudit_sim.results``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

__all__ = [
    "DETECTOR_NAMES",
    "ClientRecord",
    "ClientRoundRecord",
    "RoundRecord",
    "RunResult",
    "clean_json",
    "detectors_of",
]

#: Detectors the coordinator knows, in table order: the service's registry
#: (``service.audit.DETECTORS``), which the simulator may not import; a test keeps the two equal.
DETECTOR_NAMES: Final[tuple[str, ...]] = ("fednoro", "fedncl", "expertise", "evidence")


@dataclass
class ClientRecord:
    """A simulated client and its ground truth."""

    index: int
    name: str
    client_id: str
    num_samples: int
    class_counts: list[int]
    target_rate: float
    realised_rate: float
    true_noisy: bool
    lies_about_losses: bool = False


@dataclass
class ClientRoundRecord:
    """What one round's audit and training said about one client.

    ``detectors`` maps a detector name to ``{"status", "score", "flag", "noisiness"}`` where
    ``noisiness`` is the score used for AUROC/Spearman (``fedaudit_sim.summaries``). Since FedNoRo's
    score became graded it equals ``score`` for every detector; it stays a key of its own so
    the JSON and CSV columns of older runs and newer ones line up.
    """

    name: str
    role: str | None
    detectors: dict[str, dict[str, Any]]
    primary_flag: bool | None
    status: str | None
    expertise: float | None
    neighbors: list[str] | None
    self_weight: float | None
    weight: float | None
    train_loss: float | None
    train_seconds: float
    signal_seconds: float
    upload_bytes: int
    download_bytes: int
    label_precision: float | None
    label_recall: float | None
    normalised_loss: list[float | None] | None = None
    per_class_loss: list[float | None] | None = None


@dataclass
class RoundRecord:
    """One closed round."""

    index: int
    in_warmup: bool
    accuracy: float
    balanced_accuracy: float
    coordinator_seconds: float | None
    wall_seconds: float
    aggregation_rule: str | None
    fallback_reason: str | None
    primary: str | None
    detector_status: dict[str, str | None]
    detector_reason: dict[str, str | None]
    ashman_d: float | None
    clients: list[ClientRoundRecord]
    metrics: dict[str, Any] = field(default_factory=dict)
    class_recall: list[float | None] | None = None
    """Per class, the global model's recall on the test split (None: the class is not in it);
    None where not measured."""


@dataclass
class RunResult:
    """One method configuration run with one seed."""

    scenario: str
    label: str
    seed: int
    federation_id: str
    config: dict[str, Any]
    clients: list[ClientRecord]
    rounds: list[RoundRecord]
    noise_protocol: str
    noise_threshold: float
    num_classes: int
    wall_seconds: float = 0.0
    report: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def warmup_rounds(self) -> int:
        """The federation's resolved warm-up (rounds before flags take effect)."""
        return int(self.config.get("warmup_rounds", 0))

    @property
    def true_noisy(self) -> np.ndarray:
        """Ground-truth noisy flags, in client order."""
        return np.asarray([c.true_noisy for c in self.clients], dtype=bool)

    @property
    def realised_rates(self) -> np.ndarray:
        """Realised noise rates, in client order."""
        return np.asarray([c.realised_rate for c in self.clients], dtype=np.float64)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values (no NaN)."""
        data: dict[str, Any] = clean_json(dataclasses.asdict(self))
        return data


def clean_json(value: Any) -> Any:
    """Replace non-finite floats by None so the JSON is strict."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_json(v) for v in value]
    if isinstance(value, np.generic):
        return clean_json(value.item())
    return value


def detectors_of(runs: Iterable[RunResult]) -> list[str]:
    """The detectors named in the runs' rounds: the known ones in table order, then the rest."""
    seen = {name for run in runs for r in run.rounds for c in r.clients for name in c.detectors}
    known = [d for d in DETECTOR_NAMES if d in seen]
    return known + sorted(seen - set(known))
