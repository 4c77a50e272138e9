"""The report's CSV (``service.coordinator.report_csv``) from a literal report: the primary
detector's columns, and text cells kept from running as formulas."""

from __future__ import annotations

import csv
import io
from dataclasses import replace

from service.coordinator.report_csv import report_csv
from service.report_views import ReportRow
from tests.report_views import report, report_row


def row(
    name: str, scores: dict[str, float | None] | None, statuses: dict[str, str] | None
) -> ReportRow:
    return report_row(
        client_id=f"id-{name}",
        name=name,
        num_samples=10,
        rounds_audited=2,
        latest_round=None if scores is None else 3,
        latest_scores=scores,
        latest_statuses=statuses,
    )


def test_the_primary_detectors_score_has_its_own_column() -> None:
    shown = report(
        primary_detector="evidence",
        clients=[
            row("a", {"evidence": -1.25, "fednoro": 0.5}, {"evidence": "ok", "fednoro": "ok"}),
            row("=b", {"evidence": None}, {"evidence": "inconclusive"}),
            row("c", None, None),  # never audited
        ],
    )
    parsed = {r["client_id"]: r for r in csv.DictReader(io.StringIO(report_csv(shown)))}
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
    header = report_csv(report(primary_detector="evidence")).splitlines()[0]
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
    assert header.split(",")[18:22] == [
        "primary_detector",
        "primary_status",
        "primary_score",
        "flag_basis",
    ]
    # then each detector's evidence beside the verdict, then whether the site is an anchor, then
    # the evidence parts added later (28 November: the confident errors), then its attendance
    assert header.split(",")[-4:] == [
        "anchor",
        "evidence_confident_errors_z",
        "evidence_confident_errors_p_value",
        "attendance",
    ]
    assert header.split(",")[22:-4] == [
        "evidence_p_value",
        "evidence_q_value",
        "evidence_site_z",
        "evidence_site_factor",
        "evidence_stouffer_z",
        "evidence_errors_z",
        "evidence_errors_p_value",
        "evidence_accuracy_z",
        "evidence_geometry_cosine",
        "evidence_geometry_z",
        "fedncl_divergence",
        "fedncl_data_quality",
        "evidence_class_z",
        "fednoro_normalised_loss",
    ]


def test_each_detectors_evidence_has_its_cells() -> None:
    with_evidence = replace(
        row("a", {"evidence": 3.25, "fedncl": 144.0}, {"evidence": "ok", "fedncl": "ok"}),
        latest_detector_evidence={
            "evidence": {
                "p_value": 0.0012,
                "q_value": 0.0024,
                "site_z": 3.25,
                "site_factor": 1.75,
                "stouffer_z": -2.5,
                "errors_z": 2.75,
                "errors_p_value": 0.003,
                "confident_errors_z": 3.5,
                "confident_errors_p_value": 0.0004,
                "accuracy_z": None,  # the accuracy check off
                "geometry_cosine": 0.125,
                "geometry_z": 11.5,
            },
            "fednoro": None,
            "fedncl": {"q": 144.0, "divergence": 72.0, "data_quality": 20.0, "deviation": 1.0},
            "expertise": None,
        },
        latest_class_evidence=[
            {
                "index": 0,
                "label": "=cat",  # a class label is not run as a formula either
                "evidence_z": -0.25,
                "fednoro_normalised_loss": None,
                "noisy_by": [],
            },
            {
                "index": 2,
                "label": "eel",
                "evidence_z": 4.5,
                "fednoro_normalised_loss": 0.875,
                "noisy_by": ["evidence"],
            },
        ],
    )
    shown = report(
        primary_detector="evidence",
        # b and c: never audited
        clients=[with_evidence, row("b", None, None), row("c", None, None)],
    )
    parsed = {r["client_id"]: r for r in csv.DictReader(io.StringIO(report_csv(shown)))}
    a = parsed["id-a"]
    assert [a[f"evidence_{part}"] for part in ("p_value", "q_value", "site_z", "site_factor")] == [
        "0.0012",
        "0.0024",
        "3.25",
        "1.75",
    ]
    assert a["evidence_stouffer_z"] == "-2.5"  # a number, its minus sign kept
    assert (a["evidence_errors_z"], a["evidence_errors_p_value"]) == ("2.75", "0.003")
    assert (a["evidence_confident_errors_z"], a["evidence_confident_errors_p_value"]) == (
        "3.5",
        "0.0004",
    )
    assert a["evidence_accuracy_z"] == ""
    assert (a["evidence_geometry_cosine"], a["evidence_geometry_z"]) == ("0.125", "11.5")
    assert (a["fedncl_divergence"], a["fedncl_data_quality"]) == ("72", "20")
    assert a["evidence_class_z"] == "'=cat:-0.25 eel:4.5"
    assert a["fednoro_normalised_loss"] == "eel:0.875"
    for empty in (parsed["id-b"], parsed["id-c"]):
        assert [empty[c] for c in list(empty)[22:-4]] == [""] * 14
        assert [empty[c] for c in list(empty)[-3:-1]] == ["", ""]


def test_the_anchor_column_says_which_sites_are_trust_anchors() -> None:
    shown = report(
        primary_detector="evidence",
        clients=[replace(row("a", None, None), anchor=True), row("b", None, None)],
    )
    rows = list(csv.DictReader(io.StringIO(report_csv(shown))))
    assert [(r["name"], r["anchor"]) for r in rows] == [("a", "true"), ("b", "false")]


def test_the_attendance_column_says_whether_a_site_takes_part() -> None:
    shown = report(
        primary_detector="evidence",
        clients=[replace(row("a", None, None), attendance="absent"), row("b", None, None)],
    )
    rows = list(csv.DictReader(io.StringIO(report_csv(shown))))
    assert [(r["name"], r["attendance"]) for r in rows] == [("a", "absent"), ("b", "present")]
