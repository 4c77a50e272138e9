"""A federation whose consensus was once seen to be the noisy side stays unaudited by it.

The evidence detector abstains when the sites it would flag, or the higher-loss group of
FedNoRo's loss mixture, are not a clear minority (:mod:`service.audit.evidence_abstention`): the
consensus it measures against may then be the noisy side. The labels of a federation do not
change from round to round, but the global model does: trained on a noisy majority, it learns
their labels over the rounds, the mixture stops separating the two groups and nobody stands out
any more. The audit then said ``ok`` with nobody flagged, as if the federation were clean. In the
stress matrix's noisy majority (6 of 10 breast-cancer sites at 30-50 % flipped labels,
``docs/evaluation.md``) that happened from about round 50 of 100 in every seed, while no other
row of the matrix (about 4,000 rounds after the warm-up, clean controls and noisy minorities, with
FedNoRo and with FedAvg) abstained for a majority even once.

So the audit remembers: after ``MAJORITY_MEMORY`` rounds past the warm-up in which it abstained
because the would-be flagged group was not a clear minority, a round whose consensus verdict is
``ok`` becomes ``inconclusive`` (nobody flagged, the scores and the evidence kept) with that
reason. Trust anchors end it: in anchored mode the anchors, not the consensus, say which side is
clean (:mod:`service.audit.evidence`, "Trust anchors").
"""

from __future__ import annotations

from dataclasses import replace

from service.audit.detection import DetectionResult, EvidenceResult
from service.audit.evidence_abstention import is_majority_reason

__all__ = ["MAJORITY_MEMORY", "majority_suspected", "remember_majority"]

MAJORITY_MEMORY = 3
"""Rounds (after the warm-up) of abstention for a majority after which the consensus is not
trusted again."""


def majority_suspected(result: DetectionResult) -> bool:
    """Whether the evidence detector abstained this round because the group it would flag (or
    the loss mixture's higher-loss group) is not a clear minority."""
    return result.status == "inconclusive" and is_majority_reason(result.reason)


def remember_majority(result: EvidenceResult, majority_rounds: int) -> EvidenceResult:
    """The evidence detector's result, made ``inconclusive`` when its consensus verdict is
    ``ok`` and the federation abstained for a majority in ``majority_rounds`` >=
    ``MAJORITY_MEMORY`` earlier rounds; unchanged otherwise. Its ``summary`` always carries
    ``majority_suspected`` (this round) and ``majority_rounds`` (the earlier ones)."""
    summary = replace(
        result.summary,
        majority_suspected=majority_suspected(result),
        majority_rounds=int(majority_rounds),
    )
    if (
        result.status != "ok"
        or result.summary.mode != "consensus"
        or majority_rounds < MAJORITY_MEMORY
    ):
        return replace(result, summary=summary)
    reason = (
        f"in {majority_rounds} earlier rounds the sites that looked noisy were not a clear "
        "minority: the consensus may be the noisy side, and a global model that has since "
        "learned its labels makes nobody stand out (a trust anchor lets the audit orient "
        "itself)"
    )
    verdicts = [None if v is None else replace(v, flag=None) for v in result.verdicts]
    summary = replace(summary, verdict="inconclusive", reason=reason, flagged=0)
    return replace(result, status="inconclusive", reason=reason, verdicts=verdicts, summary=summary)
