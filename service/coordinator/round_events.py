"""The audit trail's events of a closed round's audit, each one INFO line of ``fedaudit.events``
(:mod:`service.store.event_log`): ``client.flagged`` for every site the primary detector flagged,
``audit.inconclusive`` / ``audit.undetermined`` when it gave no verdict, ``audit.anchor_led``
when the round's aggregate was led by the trust anchors (:mod:`service.audit.anchor_mode`; the
led rounds just before, in a row, make the lead last).

Both only after the warm-up, as the status rule: a flag in the warm-up counts toward no status
and an abstention there is expected (the global model is barely trained); the round page and
``fedaudit report`` still show either, with the detector's reason.
"""

from __future__ import annotations

import uuid

from sqlalchemy.orm import Session

from service.audit.evidence_abstention import is_majority_reason
from service.coordinator.stored_audit import StoredAudit, client_audit_in
from service.store import repositories as repo
from service.store.tables import Client, Round

__all__ = [
    "anchor_led_rounds",
    "majority_rounds",
    "record_abstention",
    "record_anchor_lead",
    "record_flags",
]

MAJORITY_SCAN = 1000
"""At most this many of a federation's latest ``audit.inconclusive`` events are read."""


def record_abstention(
    session: Session, federation_id: uuid.UUID, rnd: Round, audit: StoredAudit
) -> None:
    """An event ``audit.inconclusive`` / ``audit.undetermined`` when the primary detector gave no
    verdict in a round after the warm-up (``/metrics`` counts them, the event trail says why)."""
    primary = audit.primary
    detection = audit.primary_detection
    status = detection.status
    if audit.in_warmup or status not in ("inconclusive", "undetermined"):
        return
    reason = detection.reason or "no reason recorded"
    # whether it abstained for a noisy majority, as the detector said (majority_memory)
    majority = detection.majority_suspected
    repo.add_event(
        session,
        kind=f"audit.{status}",
        actor="system",
        message=f"round {rnd.index}: the primary detector {primary} is {status}: {reason}",
        federation_id=federation_id,
        round_id=rnd.id,
        data={
            "index": rnd.index,
            "detector": primary,
            "status": status,
            "reason": reason,
            "majority": majority,
        },
    )


def majority_rounds(session: Session, federation_id: uuid.UUID, before_index: int) -> int:
    """Rounds before ``before_index`` (after the warm-up) whose audit abstained because the group
    it would flag was not a clear minority: the ``audit.inconclusive`` events whose ``majority``
    is true (:mod:`service.audit.majority_memory`); events recorded before that field existed
    are judged by their reason's text."""
    events = repo.latest_events(
        session, federation_id, kind="audit.inconclusive", limit=MAJORITY_SCAN
    )
    return sum(
        1
        for e in events
        if int((e.data or {}).get("index", before_index)) < before_index
        and _for_majority(e.data or {})
    )


def record_anchor_lead(
    session: Session, federation_id: uuid.UUID, rnd: Round, result: dict[str, object]
) -> None:
    """An event ``audit.anchor_led`` when the round's aggregate was anchor-led: the aggregation's
    ``details.anchor_led`` (which round of the lead, how many sites)."""
    aggregation = result.get("aggregation")
    details = aggregation.get("details") if isinstance(aggregation, dict) else None
    lead = details.get("anchor_led") if isinstance(details, dict) else None
    if not isinstance(lead, dict):
        return
    repo.add_event(
        session,
        kind="audit.anchor_led",
        actor="system",
        message=(
            f"round {rnd.index}: aggregate led by the trust anchors (round {lead.get('round')} "
            f"of the lead, {lead.get('sites')} sites aggregated)"
        ),
        federation_id=federation_id,
        round_id=rnd.id,
        data={"index": rnd.index, **lead},
    )


def anchor_led_rounds(session: Session, federation_id: uuid.UUID, before_index: int) -> int:
    """The anchor-led rounds in a row just before ``before_index`` (``audit.anchor_led`` events of
    rounds ``before_index - 1``, ``before_index - 2``, ...): 0 when the round before was not led
    (the anchors left it, or it was never led), so that a lead, once broken, starts again only
    where the evidence detector takes the anchors as its reference. At most ``MAJORITY_SCAN``
    events are read."""
    events = repo.latest_events(
        session, federation_id, kind="audit.anchor_led", limit=MAJORITY_SCAN
    )
    led = {int((e.data or {}).get("index", -1)) for e in events}
    run = 0
    while before_index - 1 - run in led:
        run += 1
    return run


def _for_majority(data: dict[str, object]) -> bool:
    majority = data.get("majority")
    if isinstance(majority, bool):
        return majority
    reason = data.get("reason")
    return is_majority_reason(reason if isinstance(reason, str) else None)


def record_flags(
    session: Session,
    rnd: Round,
    clients: dict[uuid.UUID, Client],
    audit: StoredAudit,
    result: dict[str, object],
) -> None:
    """An event ``client.flagged`` for each site the primary detector flagged in a round after
    the warm-up: its name, the round, the detector and the site's score."""
    if audit.in_warmup:
        return
    for position, client_id in enumerate(audit.client_ids):
        if audit.primary_flag_at(position) is not True:
            continue
        client = clients[uuid.UUID(client_id)]
        verdict = client_audit_in(result, position, client_id)
        detector = verdict.primary or audit.primary
        score = verdict.detectors[detector].score if detector in verdict.detectors else None
        pinned = f", pinned {client.pinned_status}" if client.pinned_status else ""
        repo.add_event(
            session,
            kind="client.flagged",
            actor="system",
            message=(
                f"client {client.name!r} flagged in round {rnd.index} by {detector} (score "
                + ("n/a" if score is None else f"{score:.3f}")
                + f"{pinned})"
            ),
            federation_id=rnd.federation_id,
            round_id=rnd.id,
            client_id=client.id,
            data={"round": rnd.index, "detector": detector, "score": score},
        )
