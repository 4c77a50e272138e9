"""The dashboard's per-site plots (inline SVG from :mod:`service.api.dashboard.svg`): the
primary flags over rounds, a round's per-class losses and aggregation weights, FedRN's neighbor
matrix. Each stays a size a browser renders: a plot of every site shows at most
:data:`PLOT_SITES` of them (the neighbor matrix, which grows with their square,
:data:`MATRIX_SITES`), noisy and flagged sites first, and says what it left out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from service.api.dashboard import svg
from service.report_views import FlagRound, ReportRow, RoundRow, RoundView

__all__ = [
    "MATRIX_SITES",
    "PLOT_ROUNDS",
    "PLOT_SITES",
    "audited_rounds",
    "by_status",
    "class_loss_heatmap",
    "flag_grid",
    "neighbor_matrix",
    "weight_bars",
]


def _flag_kind(entry: FlagRound | None) -> str:
    if entry is None:
        return "absent"
    if entry.in_warmup:
        return "warmup"
    primary = entry.primary
    if primary is None and entry.verdict == "inconclusive":
        return "inconclusive"
    return "flagged" if primary is True else "clear" if primary is False else "undetermined"


def audited_rounds(clients: Sequence[ReportRow]) -> list[int]:
    """Every round that appears in some client's flag history, in order."""
    return sorted({h.round for c in clients for h in c.flag_history if h.round is not None})


STATUS_ORDER = {"noisy": 0, "suspect": 1, "trusted": 2}

PLOT_SITES = 200
"""At most this many sites in a per-site plot (the flag grid, the loss heat map): noisy first,
then suspect, then by name; the JSON report has every site."""
MATRIX_SITES = 60
"""At most this many sites in the sites x sites neighbor matrix (it grows with their square)."""
PLOT_ROUNDS = 200
"""At most this many rounds (the latest) in the flag grid."""


def by_status(clients: Sequence[ReportRow]) -> list[ReportRow]:
    """The clients noisy first, then suspect, then trusted, each group by name."""
    return sorted(clients, key=lambda c: _status_key(c.status, c.name))


def _status_key(status: str | None, name: str) -> tuple[int, str]:
    """Noisy first, then suspect, then trusted, then any other; each group by name."""
    return (STATUS_ORDER.get(status or "", 3), name)


def _shown_note(shown: int, total: int, what: str) -> str:
    """Below a plot cut to its first sites or rounds: what it leaves out, and where to look."""
    if shown >= total:
        return ""
    return (
        f'<p class="muted">The first {shown} of {total} {what} (noisy and flagged sites first, '
        "then suspect, then by name); the JSON report (<code>GET .../report</code>) has them "
        "all.</p>"
    )


def flag_grid(clients: Sequence[ReportRow]) -> str:
    """Clients x rounds of the primary detector's flags, from each client's flag history: at
    most :data:`PLOT_SITES` sites (noisy first) and the latest :data:`PLOT_ROUNDS` rounds."""
    every_round = audited_rounds(clients)
    if not every_round:
        return '<p class="muted">No audited round yet.</p>'
    rounds = every_round[-PLOT_ROUNDS:]
    shown = by_status(clients)[:PLOT_SITES] if len(clients) > PLOT_SITES else list(clients)
    cells = []
    for client in shown:
        by_round = {h.round: h for h in client.flag_history}
        cells.append([_flag_kind(by_round.get(r)) for r in rounds])
    note = _shown_note(len(shown), len(clients), "sites")
    if len(rounds) < len(every_round):
        note += f'<p class="muted">The latest {len(rounds)} of {len(every_round)} rounds.</p>'
    grid = svg.flag_grid([c.name for c in shown], rounds, cells, label="flags over rounds")
    return grid + note


LOSS_CAPTION = (
    "<p class=\"muted\">The global model's mean cross-entropy (nats) on each site's samples of "
    "each given label; colours from the smallest to the largest value shown, grey: the site "
    "holds no sample of the class.</p>"
)


def class_loss_heatmap(round_view: RoundView, statuses: Mapping[str, str] | None = None) -> str:
    """Sites x classes of the round's per-class losses; beyond :data:`PLOT_SITES` sites, the
    first of them by ``statuses`` (client id -> status; noisy first)."""
    every_row = round_view.clients
    classes = round_view.classes
    if not every_row:
        return '<p class="muted">No update in this round.</p>'
    rows: Sequence[RoundRow] = every_row
    if len(every_row) > PLOT_SITES:
        known = statuses or {}
        rows = sorted(every_row, key=lambda r: _status_key(known.get(r.client_id), r.name))
        rows = rows[:PLOT_SITES]
    values = [r.per_class_loss or [None] * len(classes) for r in rows]
    return (
        LOSS_CAPTION
        + svg.heatmap(
            values,
            [r.name for r in rows],
            classes,
            label=f"per-class loss, round {round_view.round}",
        )
        + _shown_note(len(rows), len(every_row), "sites of the round")
    )


def weight_bars(round_view: RoundView, statuses: Mapping[str, str]) -> str:
    rows = round_view.clients
    if not rows:
        return '<p class="muted">No update in this round.</p>'
    colors = [svg.STATUS_COLORS.get(statuses.get(r.client_id, ""), svg.UNKNOWN_COLOR) for r in rows]
    return svg.bar_chart(
        [r.name for r in rows],
        [r.weight for r in rows],
        colors=colors,
        label=f"aggregation weights, round {round_view.round}",
    )


def neighbor_matrix(clients: Sequence[ReportRow]) -> str:
    """FedRN's reliable neighbors as a sites x sites matrix: row = the site, column = a
    neighbor it was given, colour = that neighbor's weight; the sites sorted by status (noisy
    first), then name, so that a noisy site's row and column stand together. Readable at 50
    sites, where a graph is not. Beyond :data:`MATRIX_SITES` sites, the rows are the first of
    them and the columns the neighbors those rows were given (at most :data:`MATRIX_SITES`)."""
    if not clients:
        return '<p class="muted">No client.</p>'
    everyone = by_status(clients)
    rows_shown = everyone[:MATRIX_SITES]
    if len(everyone) <= MATRIX_SITES:
        columns = rows_shown
    else:
        given = {n.client_id for c in rows_shown for n in c.neighbors or []}
        columns = [c for c in everyone if c.client_id in given][:MATRIX_SITES]
    position = {c.client_id: j for j, c in enumerate(columns)}
    values: list[list[float | None]] = [[None] * len(columns) for _ in rows_shown]
    for i, c in enumerate(rows_shown):
        for n in c.neighbors or []:
            j = position.get(n.client_id)
            if j is not None:
                values[i][j] = float(n.weight or 0.0)
    note = _shown_note(len(rows_shown), len(everyone), "sites as rows, their neighbors as columns")
    if not any(v is not None for row in values for v in row):
        where = "among the sites shown" if note else "in the latest audit"
        return f'<p class="muted">No neighbor relation {where}.</p>' + note
    rows = [f"{c.status}: {c.name}" for c in rows_shown]
    return (
        '<p class="muted">Row: a site (its status first); column: a reliable neighbor FedRN gave '
        "it, in the same order; colour: the neighbor's weight in the site's local model (from "
        "the smallest to the largest shown); grey: not its neighbor. Sites sorted by status, "
        "noisy first.</p>"
        + svg.heatmap(values, rows, [c.name for c in columns], label="reliable-neighbor matrix")
        + note
    )
