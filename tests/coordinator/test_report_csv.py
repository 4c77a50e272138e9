"""The report's CSV (``service.coordinator.report_csv``) from a literal report: the primary
detector's columns, and text cells kept from running as formulas."""

from __future__ import annotations

import csv
import io
from typing import Any

from service.coordinator.report_csv import report_csv


def row(name: str, scores: dict[str, Any] | None, statuses: dict[str, str] | None) -> dict:
    return {
        "client_id": f"id-{name}",
        "name": name,
        "status": "trusted",
        "pinned_status": None,
        "num_samples": 10,
        "times_flagged": 0,
        "rounds_audited": 2,
        "latest_round": None if scores is None else 3,
        "latest_scores": scores,
        "latest_statuses": statuses,
        "reliability": None,
        "noisy_classes": [],
        "last_weight": None,
        "neighbors": None,
        "inconsistent_updates": 0,
        "last_inconsistent_at": None,
        "epsilon_round": None,
        "epsilon_total": None,
    }


def test_the_primary_detectors_score_has_its_own_column() -> None:
    report = {
        "primary_detector": "evidence",
        "clients": [
            row("a", {"evidence": -1.25, "fednoro": 0.5}, {"evidence": "ok", "fednoro": "ok"}),
            row("=b", {"evidence": None}, {"evidence": "inconclusive"}),
            row("c", None, None),  # never audited
        ],
    }
    parsed = {r["client_id"]: r for r in csv.DictReader(io.StringIO(report_csv(report)))}
    a, b, c = parsed["id-a"], parsed["id-=b"], parsed["id-c"]
    assert (a["primary_detector"], a["primary_status"], a["primary_score"]) == (
        "evidence",
        "ok",
        "-1.25",  # a number stays a number, its minus sign included
    )
    assert a["fednoro_score"] == "0.5"
    assert (b["primary_status"], b["primary_score"]) == ("inconclusive", "")
    assert b["name"] == "'=b"  # a name is not run as a formula
    assert (c["primary_status"], c["primary_score"]) == ("", "")
    assert a["flag_basis"] == ""


def test_new_columns_come_last() -> None:
    # a script that reads the CSV by position keeps its columns (the ones before 27 November)
    header = report_csv({"primary_detector": "evidence", "clients": []}).splitlines()[0]
    assert header.split(",")[:8] == [
        "client_id",
        "name",
        "status",
        "pinned_status",
        "num_samples",
        "times_flagged",
        "rounds_audited",
        "latest_round",
    ]
    assert header.split(",")[8] == "fednoro_score"
    assert header.split(",")[-4:] == [
        "primary_detector",
        "primary_status",
        "primary_score",
        "flag_basis",
    ]
