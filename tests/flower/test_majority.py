"""Flower's in-process auditor remembers a noisy majority as the coordinator does.

The coordinator counts its ``audit.inconclusive`` events that say "not a clear minority"; the
ServerApp has no database, so :class:`InProcessAuditor` counts the rounds whose primary
detector abstained for that reason and passes the count to every later audit
(:mod:`service.audit.majority_memory`).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip(
    "flwr", reason="flwr is not installed here (the flower extra); scripts/test-flower runs these"
)

from flwr.app import Array, ArrayRecord  # noqa: E402

from fedaudit_flower import WireSignals  # noqa: E402
from fedaudit_flower.auditing import InProcessAuditor, SiteReply  # noqa: E402
from service.audit import AuditConfig  # noqa: E402
from service.audit.majority_memory import MAJORITY_MEMORY  # noqa: E402

CONFIG = AuditConfig(detectors=("evidence",), aggregation="fedavg")
MAJORITY = [0.20, 0.21, 0.50, 0.52, 0.55]
"""Per-class loss of five sites (5 + 5 samples, spread 0.5): three stand out, not a minority."""
CALM = [0.20, 0.21, 0.22, 0.21, 0.20]
"""The model has learned the majority's labels: nobody stands out."""
GLOBAL = ArrayRecord({"w": Array(np.zeros(2, dtype=np.float32))})


def replies(losses: list[float]) -> list[SiteReply]:
    return [
        SiteReply(
            node_id=100 + i,
            signals=WireSignals(
                num_samples=10,
                class_counts=[5, 5],
                per_class_loss=[loss, loss],
                per_class_loss_sd=[0.5, 0.5],
            ),
            arrays=ArrayRecord({"w": Array(np.full(2, 0.1 * i, dtype=np.float32))}),
        )
        for i, loss in enumerate(losses)
    ]


def test_after_rounds_abstained_for_a_majority_a_calm_round_stays_inconclusive() -> None:
    auditor = InProcessAuditor(CONFIG)
    for server_round in range(1, MAJORITY_MEMORY + 1):
        audit = auditor.audit_round(server_round, GLOBAL, replies(MAJORITY))
        assert audit.detector_status == "inconclusive"
        assert "not a clear minority" in (audit.detector_reason or "")
    audit = auditor.audit_round(MAJORITY_MEMORY + 1, GLOBAL, replies(CALM))
    assert audit.detector_status == "inconclusive"
    assert f"in {MAJORITY_MEMORY} earlier rounds" in (audit.detector_reason or "")
    assert all(site.flag is None for site in audit.sites)
    # the same calm round, for an auditor that has seen no such rounds: an ordinary verdict
    fresh = InProcessAuditor(CONFIG).audit_round(1, GLOBAL, replies(CALM))
    assert fresh.detector_status == "ok"


def test_fewer_rounds_than_the_memory_are_not_enough() -> None:
    auditor = InProcessAuditor(CONFIG)
    for server_round in range(1, MAJORITY_MEMORY):
        auditor.audit_round(server_round, GLOBAL, replies(MAJORITY))
    assert auditor.audit_round(MAJORITY_MEMORY, GLOBAL, replies(CALM)).detector_status == "ok"
