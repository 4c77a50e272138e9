"""The noisy-client report as CSV, safe to open in a spreadsheet.

``report_csv`` writes the report of :func:`service.coordinator.reports.noisy_client_report`, one
row per client; ``csv_text`` keeps a text cell from being run as a formula (the CLI's CSV output
uses it too).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable

from service.report_views import ClassEvidenceEntry, ReportRow, ReportView

EVIDENCE_PARTS = (
    "p_value",
    "q_value",
    "site_z",
    "site_factor",
    "stouffer_z",
    "errors_z",
    "errors_p_value",
    "accuracy_z",
    "geometry_cosine",
    "geometry_z",
)
"""The evidence detector's parts written as columns (``evidence_<part>``)."""
LATER_EVIDENCE_PARTS = ("confident_errors_z", "confident_errors_p_value")
"""The same, for the parts added on 28 November 2026 (columns after ``anchor``)."""
FEDNCL_PARTS = ("divergence", "data_quality")
"""Fed-NCL's terms beside its q (``fedncl_<part>``; q is ``fedncl_score``)."""

CSV_COLUMNS = (
    "client_id",
    "name",
    "status",
    "pinned_status",
    "num_samples",
    "times_flagged",
    "rounds_audited",
    "latest_round",
    "fednoro_score",
    "fedncl_score",
    "expertise",
    "noisy_classes",
    "last_weight",
    "neighbors",
    "inconsistent_updates",
    "last_inconsistent_at",
    "epsilon_round",
    "epsilon_total",
    "primary_detector",
    "primary_status",
    "primary_score",
    "flag_basis",
    # Each detector's evidence beside the verdict (service.coordinator.report_evidence).
    *(f"evidence_{part}" for part in EVIDENCE_PARTS),
    *(f"fedncl_{part}" for part in FEDNCL_PARTS),
    "evidence_class_z",
    "fednoro_normalised_loss",
    "anchor",
    *(f"evidence_{part}" for part in LATER_EVIDENCE_PARTS),
    "attendance",
)
"""The columns: new ones go at the end, so that a script reading by position keeps working."""


def report_csv(report: ReportView) -> str:
    """One row per client. ``primary_detector`` is the federation's, ``primary_status`` what it
    answered in the client's latest audit (ok, undetermined, inconclusive; empty when it did not
    run), ``primary_score`` its score there (empty when it gave none), ``flag_basis`` what the
    latest primary flag rests on (empty when not flagged); then each detector's evidence beside the
    verdict in that audit (:func:`_evidence_cells`)."""
    primary = report.primary_detector
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in report.clients:
        scores = row.latest_scores or {}
        statuses = row.latest_statuses or {}
        writer.writerow(
            [
                row.client_id,
                csv_text(row.name),
                row.status,
                row.pinned_status or "",
                row.num_samples if row.num_samples is not None else "",
                row.times_flagged,
                row.rounds_audited,
                "" if row.latest_round is None else row.latest_round,
                _csv_number(scores.get("fednoro")),
                _csv_number(scores.get("fedncl")),
                _csv_number(row.reliability),
                csv_text(" ".join(row.noisy_classes)),
                _csv_number(row.last_weight),
                csv_text(" ".join(f"{n.name}:{n.weight:.3f}" for n in row.neighbors or [])),
                row.inconsistent_updates,
                "" if row.last_inconsistent_at is None else row.last_inconsistent_at.isoformat(),
                _csv_number(row.epsilon_round),
                _csv_number(row.epsilon_total),
                csv_text(primary),
                statuses.get(primary) or "",
                _csv_number(scores.get(primary)),
                row.flag_basis or "",
                *_evidence_cells(row),
                "true" if row.anchor else "false",
                *_later_evidence_cells(row),
                row.attendance,
            ]
        )
    return buffer.getvalue()


def _evidence_cells(row: ReportRow) -> list[str]:
    """The evidence columns of a client's row: empty where the detector gave no verdict or the
    audit holds no value; the per-class ones as ``label:value`` pairs, in class order."""
    found = row.latest_detector_evidence
    evidence = (found["evidence"] if found else None) or {}
    fedncl = (found["fedncl"] if found else None) or {}
    classes = row.latest_class_evidence

    def pairs(value: Callable[[ClassEvidenceEntry], float | None]) -> str:
        shown = [(c["label"], value(c)) for c in classes if value(c) is not None]
        return csv_text(" ".join(f"{label}:{_csv_number(v)}" for label, v in shown))

    return [
        *(_csv_number(evidence.get(part)) for part in EVIDENCE_PARTS),
        *(_csv_number(fedncl.get(part)) for part in FEDNCL_PARTS),
        pairs(lambda c: c["evidence_z"]),
        pairs(lambda c: c["fednoro_normalised_loss"]),
    ]


def _later_evidence_cells(row: ReportRow) -> list[str]:
    """The evidence columns added after ``anchor``: empty where the audit holds no value."""
    found = row.latest_detector_evidence
    evidence = (found["evidence"] if found else None) or {}
    return [_csv_number(evidence.get(part)) for part in LATER_EVIDENCE_PARTS]


FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def csv_text(value: str) -> str:
    """A text cell a spreadsheet will not run as a formula: one that starts with = + - @, a tab
    or a carriage return gets a leading apostrophe (OWASP's CSV injection advice). Numbers are
    written by `_csv_number` and left as they are, so negative scores stay numbers."""
    return "'" + value if value.startswith(FORMULA_PREFIXES) else value


def _csv_number(value: float | None) -> str:
    return "" if value is None else f"{float(value):.6g}"
