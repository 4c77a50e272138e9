"""Literal report values (``service.report_views``) for tests of what reads them (the CSV, the
dashboard): each builder gives a neutral value, a trusted site never audited, with the fields a
test names on top (``dataclasses.replace``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from service.report_views import (
    ClientPageView,
    ClientRound,
    DetectorEvidenceEntry,
    FlagRound,
    LatestAudit,
    PageRound,
    ReportRow,
    ReportView,
    RoundRow,
    RoundView,
)

NO_EVIDENCE = DetectorEvidenceEntry(evidence=None, fednoro=None, fedncl=None, expertise=None)

ROW = ReportRow(
    client_id="c1",
    name="site-a",
    status="trusted",
    detected_status="trusted",
    pinned_status=None,
    pin_reason=None,
    anchor=False,
    anchor_reason=None,
    num_samples=100,
    times_flagged=0,
    rounds_audited=1,
    flag_history=[],
    latest_round=None,
    latest_flags=None,
    flag_basis=None,
    latest_scores=None,
    latest_statuses=None,
    noisy_classes=[],
    classes_by_detector={},
    latest_detector_evidence=None,
    latest_class_evidence=[],
    reliability=None,
    neighbors=None,
    last_weight=None,
    inconsistent_updates=0,
    last_inconsistent_at=None,
    epsilon_round=None,
    epsilon_total=None,
)
"""A trusted site's row of the report (``c1``, ``site-a``, 100 samples, never audited)."""

LATEST = LatestAudit(
    round=1,
    primary_detector=None,
    primary_status="ok",
    primary_reason=None,
    primary_summary=None,
    aggregation_rule=None,
    fallback_reason=None,
    in_warmup=None,
    detectors={},
    warnings=[],
)
"""The report's latest audit: round 1, the primary answered ok, nothing else said."""

REPORT = ReportView(
    federation_id="fid",
    federation="fed",
    status="running",
    status_reason=None,
    rounds_audited=2,
    warmup_rounds=1,
    primary_detector="fednoro",
    latest=None,
    clients=[],
    site_errors=[],
    privacy=None,
)
"""A running federation's report (``fid``, ``fed``, FedNoRo primary) with no client."""

ROUND = ClientRound(
    round=0,
    primary_flag=None,
    flag_basis=None,
    flags={},
    scores={},
    statuses={},
    noisy_classes=[],
    classes_by_detector={},
    detector_evidence=NO_EVIDENCE,
    class_evidence=[],
    reliability=None,
    neighbors=None,
    weight=None,
    epsilon_round=None,
    epsilon_total=None,
)
"""What an audit said of a client: no verdict, no evidence."""

PAGE = ClientPageView(
    federation_id="f1",
    federation="fed",
    client_id="c1",
    name="site-a",
    status="trusted",
    detected_status="trusted",
    pinned_status=None,
    pin_reason=None,
    pinned_by=None,
    anchor=False,
    anchor_reason=None,
    rounds=[],
    classes=["0", "1"],
    per_class_loss={},
    class_counts={},
    site_errors=[],
)
"""A trusted site's client page (``site-a`` of ``fed``, classes 0 and 1), no round."""

ROUND_VIEW = RoundView(
    round=0,
    state="closed",
    state_reason=None,
    audited=False,
    in_warmup=None,
    primary_detector=None,
    primary_status=None,
    primary_reason=None,
    guard=None,
    aggregation_rule=None,
    fallback_reason=None,
    classes=["0", "1"],
    clients=[],
)
"""A closed round, not audited, without updates."""

UPDATE = RoundRow(
    client_id="c1",
    name="site-a",
    num_samples=10,
    per_class_loss=None,
    weight=None,
    primary_flag=None,
    pruned=False,
)
"""An update of a round: 10 samples, no loss, weight or flag."""


def report_row(**fields: Any) -> ReportRow:
    """:data:`ROW` with ``fields``."""
    return replace(ROW, **fields)


def flag_round(round: int, primary: bool | None, *, in_warmup: bool = False) -> FlagRound:
    """A round of a flag history (no verdict recorded, no detector's own flag)."""
    return FlagRound(round=round, in_warmup=in_warmup, primary=primary, verdict=None, detectors={})


def latest_audit(**fields: Any) -> LatestAudit:
    """:data:`LATEST` with ``fields``."""
    return replace(LATEST, **fields)


def report(**fields: Any) -> ReportView:
    """:data:`REPORT` with ``fields``."""
    return replace(REPORT, **fields)


def client_round(round: int, **fields: Any) -> ClientRound:
    """:data:`ROUND` of ``round`` with ``fields``."""
    return replace(ROUND, round=round, **fields)


def page_round(audit: ClientRound, *, in_warmup: bool = False) -> PageRound:
    """A round of the client page, without neighbors."""
    return PageRound(audit=audit, in_warmup=in_warmup, neighbors=[])


def client_page(rounds: list[PageRound], **fields: Any) -> ClientPageView:
    """:data:`PAGE` with these ``rounds`` and ``fields``."""
    return replace(PAGE, rounds=rounds, **fields)


def round_row(client_id: str, name: str, **fields: Any) -> RoundRow:
    """:data:`UPDATE` of another client, with ``fields``."""
    return replace(UPDATE, client_id=client_id, name=name, **fields)


def round_view(round: int, rows: list[RoundRow], **fields: Any) -> RoundView:
    """:data:`ROUND_VIEW` of ``round`` with these updates and ``fields``."""
    return replace(ROUND_VIEW, round=round, clients=rows, **fields)
