"""FedRN data expertise (Kim et al., CIKM 2022, eq. 4; docs/algorithms.md, "Detectors").

* :func:`expertise` -- min-max normalised training accuracy;
* :func:`expertise_detection` -- the same as a :class:`~service.audit.detection.DetectionResult`
  (method ``"expertise"``): a reliability signal that never flags a client.
"""

from __future__ import annotations

from typing import Any

from service.audit._typing import FloatArray
from service.audit._validation import InvalidInputError, as_float_array
from service.audit.detection import (
    ClientVerdict,
    DetectionResult,
    ExpertiseResult,
    minmax,
    undetermined,
)
from service.audit.verdict_types import ExpertiseSummary, ExpertiseVerdictEvidence

__all__ = ["expertise", "expertise_detection"]


def expertise(train_accuracy: Any) -> FloatArray:
    """FedRN data expertise: min-max normalised training accuracy (FedRN eq. 4).

    Parameters
    ----------
    train_accuracy : array-like of shape (n_clients,)
        Accuracy of each client's local model on its own (given) labels, in [0, 1].

    Returns
    -------
    ndarray of shape (n_clients,)
        Values in [0, 1]; all ones when the accuracies span 1e-12 or less (no information).

    Raises
    ------
    InvalidInputError
        If the array is not 1-D or a value is outside [0, 1].
    """
    acc = as_float_array("train_accuracy", train_accuracy, ndim=1, min_value=0.0)
    if (acc > 1.0).any():
        raise InvalidInputError("train_accuracy: values must be <= 1")
    return minmax(acc)


def expertise_detection(train_accuracy: Any) -> ExpertiseResult:
    """Wrap :func:`expertise` as a :class:`DetectionResult` (method ``"expertise"``).

    Expertise is a reliability signal, not a detector (FedRN eq. 4): every verdict has
    ``flag=None``; ``score`` is the normalised expertise and the evidence holds the raw
    ``train_accuracy``. Undetermined only when there is no client.
    """
    acc = as_float_array("train_accuracy", train_accuracy, ndim=1, min_value=0.0)
    if acc.size == 0:
        reason = "no client reported a training accuracy"
        return undetermined("expertise", 0, reason, ExpertiseSummary())
    values = expertise(acc)
    verdicts: list[ClientVerdict[ExpertiseVerdictEvidence] | None] = [
        ClientVerdict(float(values[k]), None, ExpertiseVerdictEvidence(float(acc[k])))
        for k in range(acc.size)
    ]
    summary = ExpertiseSummary(
        min_accuracy=float(acc.min()),
        max_accuracy=float(acc.max()),
        note="expertise is a reliability signal and never flags a client",
    )
    return DetectionResult("expertise", "ok", None, verdicts, summary)
