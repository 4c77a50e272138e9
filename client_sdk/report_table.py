"""The noisy-client report as a terminal table, for anyone who reads reports with the SDK.

``render_report`` takes the JSON report of ``GET /federations/{id}/report``
(``AdminClient.get_json``) and returns a rich table: one row per site with its status (a trust
anchor marked), how often it was flagged, each detector's latest score (the evidence detector's
q-value and update-geometry z beside its z, where the report has them), the classes that look
noisy and its aggregation weight; the caption says how the latest round was judged.
``fedaudit report`` prints it, and so does the simulator's ``fedaudit demo`` (with the true
noise rates beside the verdicts).

Only rich is imported, not torch: an operator's script that prints reports stays light.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

__all__ = ["SITE_ERRORS_SHOWN", "output_console", "render_report"]


def output_console() -> Console:
    """Standard output; when it is not a terminal (a file, a pipe) tables get 120 columns
    instead of rich's default 80, so the report does not wrap."""
    console = Console()
    if not console.is_terminal and console.width < 120:
        console = Console(width=120)
    return console


_SCORE_NAMES = {
    "class_z": "class-standardised loss excess (standard errors; about N(0, 1) when clean)",
    "mean_loss": "mean loss on the site's own labels",
}
"""What FedNoRo's graded score is, by its ``separation_statistic``."""


def _separation_text(summary: dict[str, Any]) -> str:
    """ ", Ashman's D 6.8 (needs 12.0)" from FedNoRo's summary; empty without a D.

    When the mixture's fits proposed several groups (``groups_tested``), it says so and which
    one the D belongs to: "(needs 5.8; 2 groups judged, this one from 4 of 9 fits)".
    """
    separation = summary.get("ashman_d")
    if not isinstance(separation, int | float):
        return ""
    needed = summary.get("separation_threshold")
    if not isinstance(needed, int | float):
        return f", Ashman's D {separation:.1f}"
    confirmed = ", the group already noisy" if summary.get("separation_confirmed_group") else ""
    judged, votes, fits = (summary.get(k) for k in ("groups_tested", "vote_count", "n_fits"))
    groups = (
        f"; {judged} groups judged, this one from {votes} of {fits} fits"
        if isinstance(judged, int) and judged > 1
        else ""
    )
    return f", Ashman's D {separation:.1f} (needs {needed:.1f}{confirmed}{groups})"


def _inconsistent_text(row: dict[str, Any]) -> str:
    """ "3 (2026-11-25 09:12)" for a site with refused inconsistent claims; "-" for none."""
    count = row.get("inconsistent_updates") or 0
    if not count:
        return "-"
    last = row.get("last_inconsistent_at")
    if isinstance(last, str):  # the JSON report: an ISO 8601 timestamp
        last = datetime.fromisoformat(last.replace("Z", "+00:00"))
    when = f" ({last:%Y-%m-%d %H:%M})" if isinstance(last, datetime) else ""
    return f"[bold red]{count}[/]{escape(when)}"


def _privacy_text(privacy: dict[str, Any] | None) -> str:
    """The Gaussian mechanism on the signals: its settings and the epsilon of one round (the
    table's "eps" columns give each site's); empty without it."""
    if not privacy:
        return ""
    return (
        f"\nGaussian mechanism: sigma {privacy['noise_multiplier']:g}, loss clip "
        f"{privacy['clip_loss']:g}; epsilon {privacy['epsilon_per_round']:.3g} per round at "
        f"delta {privacy['delta']:g} ({privacy['accountant']}); eps total: each site's so far"
    )


STATUS_MEANINGS = {
    "undetermined": "too few sites or signals to decide",
    "inconclusive": "the evidence computed, the detector abstained: the consensus is suspect",
    "not run": "the detector is not configured, or no site sent what it reads",
}
"""What a score cell without a score says, in words (the API's detector statuses)."""

_DETECTOR_LABELS = {"fednoro": "FedNoRo", "fedncl": "Fed-NCL"}


def _missing_score(row: dict[str, Any], name: str) -> str:
    """Why a site's latest score of detector ``name`` is missing: "n/a (undetermined)" or
    "n/a (inconclusive)" when the detector did not answer ok, "n/a (not run)" when it did not
    run; "-" when the site was never audited (or the report predates detector statuses)."""
    scores = row.get("latest_scores")
    if scores is None:
        return "-"
    if name not in scores:
        return "n/a (not run)"
    status = (row.get("latest_statuses") or {}).get(name)
    return f"n/a ({status})" if status in STATUS_MEANINGS else "-"


def _detector_notes(latest: dict[str, Any], shown: set[str]) -> str:
    """Under the table: each secondary detector that did not answer ok in the latest round, with
    its reason, and what the markers in the score cells mean (the primary's verdict is already
    in the caption's first line)."""
    notes = ""
    for name, outcome in sorted((latest.get("detectors") or {}).items()):
        status = (outcome or {}).get("status")
        if name == latest.get("primary_detector") or status in (None, "ok"):
            continue
        reason = f": {outcome['reason']}" if outcome.get("reason") else ""
        notes += f"\n{_DETECTOR_LABELS.get(name, name)} {status} in round {latest['round']}{reason}"
    for marker in sorted(shown):
        notes += f"\nn/a ({marker}): {STATUS_MEANINGS[marker]}"
    return notes


SITE_ERRORS_SHOWN = 3
"""The latest site errors the report table shows (the JSON report has more)."""


def _caption(data: dict[str, Any], latest: dict[str, Any]) -> str:
    """How the latest round was judged and aggregated, its warnings, the Gaussian mechanism and
    the latest site errors (console text, not yet escaped)."""
    caption = ""
    if latest:
        summary = latest.get("primary_summary") or {}
        caption = (
            f"round {latest['round']}: {latest['primary_detector']} {latest['primary_status']}"
            + (f" ({latest['primary_reason']})" if latest.get("primary_reason") else "")
            + _separation_text(summary)
            + (
                f"; FedNoRo score = {_SCORE_NAMES.get(statistic, statistic)}"
                if isinstance(statistic := summary.get("separation_statistic"), str)
                else ""
            )
            + f"; aggregation {latest.get('aggregation_rule')}"
            + (f" (fallback: {latest['fallback_reason']})" if latest.get("fallback_reason") else "")
            + "".join(f"\nWARNING: {w}" for w in latest.get("warnings") or [])
        )
    caption += _privacy_text(data.get("privacy"))
    for error in (data.get("site_errors") or [])[:SITE_ERRORS_SHOWN]:
        # torch puts the cause on the second line ("Error(s) in loading state_dict for ...:"
        # then "size mismatch for ..."): the first lines, joined, up to 300 characters
        lines = [line.strip() for line in str(error.get("message") or "").splitlines()]
        shown = " / ".join(line for line in lines[:3] if line)[:300]
        caption += (
            f"\nSITE ERROR: {error.get('name')} round {error.get('round')} "
            f"({error.get('stage')}): {error.get('error_type')}: {shown}"
        )
    return caption


def _add_columns(
    table: Table, truth: bool, with_q: bool, with_geometry: bool, refused: bool, privacy: bool
) -> None:
    """The table's columns, the optional ones where a row has something to show in them."""
    table.add_column("client", no_wrap=True)
    table.add_column("status")
    if truth:
        table.add_column("true noise", justify="right", no_wrap=True)
    table.add_column("flagged", justify="right")
    table.add_column("evidence z", justify="right")
    if with_q:
        table.add_column("q-value", justify="right")
    if with_geometry:
        table.add_column("geometry z", justify="right")
    for name in ("FedNoRo score", "Fed-NCL q", "expertise"):
        table.add_column(name, justify="right")
    table.add_column("noisy classes")
    table.add_column("weight", justify="right")
    if refused:
        table.add_column("inconsistent claims (last)")
    for name in ("eps round", "eps total") if privacy else ():
        table.add_column(name, justify="right")


ATTENDANCE_MARKS = {
    "not_joined": " (not joined)",
    "absent": " (absent)",
    "suspended": " (suspended)",
    "token_revoked": " (token revoked)",
}
"""After a site's status: why it does not take part in the next rounds (the report's
``attendance``)."""


def render_report(data: dict[str, Any], truth: dict[str, float] | None = None) -> Table:
    """The report as a rich table; `truth` (simulation only) adds the true noise rate."""
    latest = data.get("latest") or {}
    # Names, reasons and warnings are data, not console markup (escape: "site[a]" stays whole).
    title = escape(
        f"{data['federation']}: {data['rounds_audited']} rounds audited, primary detector "
        f"{data['primary_detector']}"
    )
    if data.get("status") in ("failed", "stopped"):
        title += escape(
            f"; {data['status'].upper()}: {data.get('status_reason') or 'no reason recorded'}"
        )
    caption = _caption(data, latest)
    privacy = data.get("privacy")
    table = Table(title=title, caption=escape(caption.lstrip("\n")))
    # The primary verdict's own parts (report rows' latest_detector_evidence): the q-value its
    # flag is decided on, and the update geometry's z where some site was judged by it.
    parts = [_evidence_parts(row) for row in data["clients"]]
    with_q = any(part.get("q_value") is not None for part in parts)
    with_geometry = any(part.get("geometry_z") is not None for part in parts)
    # Updates refused for num_samples / class_counts inconsistent with the join: shown when any.
    refused = any(row.get("inconsistent_updates") for row in data["clients"])
    _add_columns(table, truth is not None, with_q, with_geometry, refused, bool(privacy))
    styles = {"noisy": "bold red", "suspect": "yellow", "trusted": "green"}

    def number(value: Any, fmt: str = ".2f") -> str:
        return "-" if value is None else format(float(value), fmt)

    shown: set[str] = set()

    def score(row: dict[str, Any], name: str, fmt: str = ".2f") -> str:
        value = (row.get("latest_scores") or {}).get(name)
        if value is not None:
            return format(float(value), fmt)
        text = _missing_score(row, name)
        shown.update(m for m in STATUS_MEANINGS if text == f"n/a ({m})")
        return text

    for row, part in zip(data["clients"], parts, strict=True):
        status = (
            row["status"]
            + (" (pinned)" if row.get("pinned_status") else "")
            + (" (anchor)" if row.get("anchor") else "")
            + ATTENDANCE_MARKS.get(row.get("attendance") or "present", "")
        )
        cells = [escape(row["name"]), f"[{styles.get(row['status'], '')}]{escape(status)}[/]"]
        if truth is not None:
            cells.append(number(truth.get(row["name"])))
        cells += [f"{row['times_flagged']}/{row['rounds_audited']}", score(row, "evidence")]
        if with_q:  # beside a z the detector answered with: an abstaining one decided nothing
            answered = (row.get("latest_scores") or {}).get("evidence") is not None
            cells.append(number(part.get("q_value") if answered else None, ".2g"))
        if with_geometry:
            cells.append(number(part.get("geometry_z"), ".1f"))
        cells += [
            score(row, "fednoro"),
            score(row, "fedncl", ".3g"),
            number(row.get("reliability")),
            escape(_classes_text(row)),
            number(row.get("last_weight"), ".3f"),
        ]
        if refused:
            cells.append(_inconsistent_text(row))
        if privacy:
            cells += [number(row.get(key), ".3g") for key in ("epsilon_round", "epsilon_total")]
        table.add_row(*cells)
    notes = _detector_notes(latest, shown)
    if notes:  # the caption, once the rows have said which markers they show
        table.caption = escape((caption + notes).lstrip("\n"))
    return table


def _evidence_parts(row: dict[str, Any]) -> dict[str, Any]:
    """The evidence detector's parts on the site in its latest audit ({} where none)."""
    found = (row.get("latest_detector_evidence") or {}).get("evidence")
    return found if isinstance(found, dict) else {}


def _classes_text(row: dict[str, Any]) -> str:
    """The noisy classes, or what a flag without classes rests on (the update's direction, the
    model's accuracy on its own labels)."""
    classes = ", ".join(row.get("noisy_classes") or [])
    basis = {"update_direction": "update direction", "accuracy": "own-label accuracy"}.get(
        row.get("flag_basis") or ""
    )
    if basis is None:
        return classes or "-"
    return f"{classes} ({basis})" if classes else f"({basis})"
