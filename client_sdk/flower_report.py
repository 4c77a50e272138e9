"""The report file a Flower run audited by fedaudit writes, read and shown like a coordinator's.

``fedaudit_flower.FedAuditStrategy(report_path=...)`` rewrites one JSON file after every training
round (``format``: :data:`FLOWER_REPORT_FORMAT`): the audit configuration, one entry per round
(whether it was audited, decided and applied, the primary detector's status and reason, each
site's flag, status, weight and verdict, the whole audit) and each node's status. This module
reads it for ``fedaudit report --file`` (no coordinator involved): a table per site, or its CSV.
It needs neither Flower nor torch.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

__all__ = [
    "FLOWER_REPORT_FORMAT",
    "FlowerReportError",
    "flower_report_csv",
    "flower_report_rows",
    "read_flower_report",
    "render_flower_report",
]

FLOWER_REPORT_FORMAT = "fedaudit.flower-report/1"
"""Value of the report file's ``format`` entry."""

CSV_COLUMNS = (
    "node_id",
    "status",
    "times_flagged",
    "rounds_audited",
    "latest_flag",
    "latest_score",
    "noisy_classes",
    "latest_weight",
    "num_samples",
)


class FlowerReportError(ValueError):
    """The file is not a readable fedaudit Flower report (the message says why)."""


def read_flower_report(path: str | Path) -> dict[str, Any]:
    """Load and check a Flower run's report file.

    Raises
    ------
    FlowerReportError
        If the file cannot be read, is not JSON, or is not a ``fedaudit.flower-report/1``.
    """
    file = Path(path)
    try:
        document = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise FlowerReportError(f"{file}: cannot be read ({exc.strerror or exc})") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FlowerReportError(f"{file}: not a JSON file ({exc})") from exc
    if not isinstance(document, dict) or document.get("format") != FLOWER_REPORT_FORMAT:
        found = document.get("format") if isinstance(document, dict) else type(document).__name__
        raise FlowerReportError(
            f"{file}: not a fedaudit Flower report (format {found!r}, expected "
            f"{FLOWER_REPORT_FORMAT!r}); a coordinator's report is read by federation id"
        )
    if not isinstance(document.get("rounds"), list) or not isinstance(
        document.get("statuses"), dict
    ):
        raise FlowerReportError(f"{file}: the report has no 'rounds' list or 'statuses' object")
    return document


def _noisy_classes(verdict: Any) -> list[int]:
    evidence = verdict.get("evidence") if isinstance(verdict, dict) else None
    classes = evidence.get("noisy_classes") if isinstance(evidence, dict) else None
    return [int(c) for c in classes] if isinstance(classes, list) else []


def flower_report_rows(document: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per node that any round audited (``CSV_COLUMNS``), by node id: its status now,
    the rounds that flagged it among those that audited it, and its row of the latest round
    that audited it (flag, the primary detector's score, noisy classes, weight, samples)."""
    latest: dict[int, dict[str, Any]] = {}
    flagged: dict[int, int] = {}
    audited: dict[int, int] = {}
    for entry in document["rounds"]:
        for row in entry.get("clients") or []:
            node = int(row["node_id"])
            latest[node] = row
            audited[node] = audited.get(node, 0) + (row.get("flag") is not None)
            flagged[node] = flagged.get(node, 0) + bool(row.get("flag"))
    statuses = document["statuses"]
    rows = []
    for node in sorted(set(latest) | {int(n) for n in statuses}):
        row = latest.get(node, {})
        verdict = row.get("verdict")
        score = verdict.get("score") if isinstance(verdict, dict) else None
        rows.append(
            {
                "node_id": node,
                "status": (statuses.get(str(node)) or {}).get("status", row.get("status")),
                "times_flagged": flagged.get(node, 0),
                "rounds_audited": audited.get(node, 0),
                "latest_flag": row.get("flag"),
                "latest_score": score,
                "noisy_classes": _noisy_classes(verdict),
                "latest_weight": row.get("weight"),
                "num_samples": row.get("num_samples"),
            }
        )
    return rows


def _caption(document: dict[str, Any]) -> str:
    rounds = document["rounds"]
    if not rounds:
        return "no training round finished yet"
    last = rounds[-1]
    said = f"round {last.get('round')}: "
    if not last.get("audited"):
        return said + str(last.get("reason") or "not audited")
    status = last.get("detector_status") or {}
    primary = (document.get("audit_config") or {}).get("primary_detector")
    said += f"primary detector {primary} {status.get(primary, '?') if primary else '?'}, "
    said += f"model from {last.get('applied')}"
    return said + (f" ({last['reason']})" if last.get("reason") else "")


def render_flower_report(document: dict[str, Any]) -> Table:
    """The report file as a rich table (a site per row)."""
    rounds = document["rounds"]
    audited = sum(1 for r in rounds if r.get("audited"))
    coordinator = document.get("coordinator") or {}
    where = f", forwarded to {coordinator['url']}" if coordinator.get("url") else ", in process"
    title = escape(
        f"Flower run ({document.get('wrapped_strategy', '?')} wrapped{where}): "
        f"{len(rounds)} training rounds, {audited} audited"
    )
    table = Table(title=title, caption=escape(_caption(document)))
    for name, right in (
        ("node", False),
        ("status", False),
        ("flagged", True),
        ("latest score", True),
        ("noisy classes", False),
        ("weight", True),
        ("samples", True),
    ):
        table.add_column(name, justify="right" if right else "left", no_wrap=name == "node")
    styles = {"noisy": "bold red", "suspect": "yellow", "trusted": "green"}
    for row in flower_report_rows(document):
        status = str(row["status"])
        score, weight = row["latest_score"], row["latest_weight"]
        table.add_row(
            str(row["node_id"]),
            f"[{styles.get(status, 'white')}]{escape(status)}[/]",
            f"{row['times_flagged']} of {row['rounds_audited']}",
            "-" if score is None else f"{score:.2f}",
            ", ".join(str(c) for c in row["noisy_classes"]) or "-",
            "-" if weight is None else f"{weight:.3f}",
            "-" if row["num_samples"] is None else str(row["num_samples"]),
        )
    return table


def _cell(column: str, value: Any) -> str:
    if value is None:
        return ""
    if column == "noisy_classes":
        return " ".join(str(c) for c in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def flower_report_csv(document: dict[str, Any]) -> str:
    """The table's rows as CSV (``CSV_COLUMNS``; noisy classes separated by spaces)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in flower_report_rows(document):
        writer.writerow([_cell(c, row[c]) for c in CSV_COLUMNS])
    return out.getvalue()
