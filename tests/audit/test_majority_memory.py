"""The federation's memory of abstentions for a noisy majority (service.audit.majority_memory)."""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from service.audit import AuditConfig, DictStateReader, run_audit
from service.audit.detection import ClientVerdict, DetectionResult, EvidenceResult
from service.audit.evidence_abstention import (
    Informativeness,
    consensus_reason,
    is_majority_reason,
)
from service.audit.majority_memory import MAJORITY_MEMORY, majority_suspected, remember_majority
from service.audit.verdict_types import EmptySummary, EvidenceSummary, EvidenceVerdictEvidence
from tests.audit._synthetic import loss_clients, synthetic_federation


def _ok(mode: str = "consensus") -> EvidenceResult:
    verdicts: list[ClientVerdict[EvidenceVerdictEvidence] | None] = [
        ClientVerdict(score=4.0, flag=True, evidence=EvidenceVerdictEvidence(p_value=1e-6)),
        ClientVerdict(score=0.1, flag=False, evidence=EvidenceVerdictEvidence(p_value=0.8)),
        None,
    ]
    summary = EvidenceSummary(verdict="ok", reason=None, mode=mode, flagged=1)
    return DetectionResult("evidence", "ok", None, verdicts, summary)


def test_the_memory_starts_at_the_third_round_and_keeps_the_scores():
    assert MAJORITY_MEMORY == 3
    kept = remember_majority(_ok(), MAJORITY_MEMORY - 1)
    assert (kept.status, kept.flags) == ("ok", [True, False, None])
    assert kept.summary.majority_rounds == 2
    assert kept.summary.majority_suspected is False
    made = remember_majority(_ok(), MAJORITY_MEMORY)
    assert made.status == "inconclusive"
    assert made.flags == [None, None, None]
    assert made.scores == [4.0, 0.1, None]  # the evidence stays for the report
    assert made.reason is not None
    assert made.reason.startswith("in 3 earlier rounds the sites that looked noisy")
    assert (made.summary.verdict, made.summary.flagged) == ("inconclusive", 0)
    assert made.summary.reason == made.reason


def test_anchored_rounds_and_abstentions_are_left_as_they_are():
    anchored = remember_majority(_ok(mode="anchored"), 10)
    assert (anchored.status, anchored.flags[0]) == ("ok", True)
    already = DetectionResult(
        "evidence", "inconclusive", "the model is weak", [None], EvidenceSummary()
    )
    assert remember_majority(already, 10).reason == "the model is weak"


def test_only_the_majority_reasons_count():
    sizes = np.array([10.0, 10.0, 10.0, 10.0])

    class _Pass:  # the two fields consensus_reason reads of a pass (an EvidencePass)
        def __init__(self, flags: list[bool]) -> None:
            self.flags = np.array(flags)
            self.low = np.zeros(4, dtype=bool)

    def reason(flags: list[bool], informativeness: float, mixture: object) -> str | None:
        return consensus_reason(
            cast(Any, _Pass(flags)),
            sizes,
            1.0,
            Informativeness(informativeness),
            0.1,
            cast(Any, mixture),
            **kwargs,
        )

    kwargs: dict[str, Any] = {
        "min_informativeness": 0.05,
        "max_heterogeneity": 0.9,
        "max_flagged_fraction": 0.5,
    }
    mixture = reason([False] * 4, 0.5, np.array([True, True, False, False]))
    flagged = reason([True, True, True, False], 0.5, None)
    weak = reason([False] * 4, 0.01, None)
    assert mixture is not None
    assert is_majority_reason(mixture)
    assert flagged is not None
    assert is_majority_reason(flagged)
    assert weak is not None
    assert not is_majority_reason(weak)
    assert not is_majority_reason(None)
    abstained = DetectionResult("evidence", "inconclusive", flagged, [None] * 4, EmptySummary())
    assert majority_suspected(abstained)
    assert not majority_suspected(
        DetectionResult("evidence", "inconclusive", weak, [None] * 4, EmptySummary())
    )


def test_run_audit_passes_the_memory_to_the_evidence_detector():
    # 12 sites, 3 of them noisy: an ok consensus round that flags the noisy ones
    loss, counts = synthetic_federation(12, 5, seed=3, n_noisy=3, noise_rate=0.4)
    clients = loss_clients(loss, counts)
    state = DictStateReader({"w": np.zeros(2, dtype=np.float32)})
    config = AuditConfig(detectors=("fednoro", "evidence"), primary_detector="evidence")
    fresh = run_audit(state, clients, config, round_index=5)
    evidence = fresh.detections["evidence"]
    assert evidence.status == "ok"
    assert any(evidence.flags)
    assert evidence.summary.majority_rounds == 0
    remembered = run_audit(state, clients, config, round_index=5, majority_rounds=3)
    evidence = remembered.detections["evidence"]
    assert evidence.status == "inconclusive"
    assert not any(f for f in evidence.flags if f)
    assert remembered.primary_flags == [None] * 12
