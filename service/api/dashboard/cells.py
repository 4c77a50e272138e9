"""Cells of the dashboard's tables that say more than a number: a site's neighbours, its
refused updates, its epsilons, and why it does not take part in the next rounds.

Every value goes through `esc`, as in `service.api.dashboard.pages`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from service.api.dashboard.svg import esc, number
from service.report_views import NamedNeighbor, ReportRow


def neighbors_cell(neighbors: Sequence[NamedNeighbor] | None) -> str:
    if not neighbors:
        return '<span class="muted">-</span>'
    return ", ".join(f"{esc(n.name)} ({number(n.weight)})" for n in neighbors)


def refused_cell(client: ReportRow) -> str:
    """Updates refused as inconsistent with the site's join: how many, and the last one's time."""
    count = client.inconsistent_updates or 0
    if not count:
        return '<span class="muted">0</span>'
    last = client.last_inconsistent_at
    when = last.strftime("%Y-%m-%d %H:%M UTC") if isinstance(last, datetime) else str(last or "")
    return (
        f'<span class="badge noisy">{esc(count)}</span>'
        f'<br><span class="muted">last {esc(when)}</span>'
    )


def epsilon_cells(epsilon_round: float | None, epsilon_total: float | None) -> str:
    """The Gaussian mechanism's epsilon of a round and of every round so far."""
    return (
        f'<td class="num">{number(epsilon_round, 3)}</td>'
        f'<td class="num">{number(epsilon_total, 3)}</td>'
    )


EPSILON_HEADERS = (
    '<th title="epsilon of the site\'s update in the round (Gaussian mechanism)">'
    "\u03b5 round</th>"
    '<th title="epsilon of all the site\'s updates so far, composed by the accountant">'
    "\u03b5 total</th>"
)


ATTENDANCE_NOTES = {
    "not_joined": "has not joined",
    "absent": "absent: missed its last rounds; selected again once it polls",
    "suspended": "suspended by the admin",
    "token_revoked": "token revoked: not selected",
}
"""What the report's table says under a site's status when it does not take part."""


def attendance_note(client: ReportRow) -> str:
    note = ATTENDANCE_NOTES.get(client.attendance)
    if note is None:
        return ""
    if client.attendance == "suspended" and client.suspend_reason:
        note += f": {client.suspend_reason}"
    return f'<br><span class="muted attendance">{esc(note)}</span>'
