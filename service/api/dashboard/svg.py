"""Inline SVG plots for the admin dashboard, drawn on the server (no JavaScript, no matplotlib).

Every function takes plain Python values and returns one ``<svg>`` element as a string. Every
label is escaped here (`esc`), so callers may pass names that came from clients or admins.
Absent values (None or NaN) are drawn as a distinct grey "no data" cell, never as a colour.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

NO_DATA_FILL = "#d9d9d9"
STATUS_COLORS = {"trusted": "#2b8a3e", "suspect": "#f08c00", "noisy": "#c92a2a"}
UNKNOWN_COLOR = "#868e96"
# ColorBrewer YlOrRd end points and middle: low loss pale yellow, high loss dark red.
SCALE_STOPS = ((255, 255, 204), (253, 141, 60), (189, 0, 38))
FLAG_CELLS = {
    "flagged": ("#c92a2a", "flagged noisy"),
    "clear": ("#2b8a3e", "not flagged"),
    "undetermined": ("#adb5bd", "undetermined (too few sites or signals)"),
    "inconclusive": ("#ffe066", "inconclusive (the audit abstained: suspect consensus)"),
    "noverdict": ("#e9ecef", "no verdict (detector not run, or none for this site)"),
    "warmup": ("#d0ebff", "warm-up (not counted)"),
    "absent": ("#ffffff", "no update"),
}
FONT = 'font-family="system-ui, sans-serif" font-size="11"'
ICON_SVG = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">'
    '<rect width="16" height="16" rx="3" fill="#343a40"/>'
    '<circle cx="8" cy="8" r="4" fill="#c92a2a"/></svg>'
)
"""The dashboard's icon: inline in every page, and served at ``/favicon.ico`` for browsers and
probes that ask for it there."""


def esc(value: object) -> str:
    """Escape a value for HTML or SVG text and attributes."""
    return html.escape(str(value), quote=True)


def number(value: object, digits: int = 4) -> str:
    """A number with `digits` significant digits; "-" for None; anything else escaped."""
    if value is None:
        return '<span class="muted">-</span>'
    if isinstance(value, bool) or not isinstance(value, int | float):
        return esc(value)
    return esc(f"{value:.{digits}g}" if isinstance(value, float) else value)


def short(label: str, limit: int = 24) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "\u2026"


def _present(value: float | None) -> float | None:
    """The value as a float, or None when it is absent (None or NaN)."""
    return None if value is None or math.isnan(value) else float(value)


def is_missing(value: float | None) -> bool:
    return _present(value) is None


def sequential_color(t: float) -> str:
    """Colour of a position t in [0, 1] (clipped) on the yellow-orange-red scale."""
    t = min(1.0, max(0.0, t))
    scaled = t * (len(SCALE_STOPS) - 1)
    low = min(int(scaled), len(SCALE_STOPS) - 2)
    frac = scaled - low
    a, b = SCALE_STOPS[low], SCALE_STOPS[low + 1]
    rgb = (round(x + (y - x) * frac) for x, y in zip(a, b, strict=True))
    return "#" + "".join(f"{c:02x}" for c in rgb)


def _svg(width: float, height: float, body: list[str], label: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{esc(label)}" {FONT}>'
        + "".join(body)
        + "</svg>"
    )


def _row_label(left: float, baseline: float, label: object) -> str:
    """A row's label, right-aligned just left of the plot area."""
    return (
        f'<text x="{left - 6:.1f}" y="{baseline:.1f}" text-anchor="end">'
        f"{esc(short(str(label)))}</text>"
    )


def _label_width(labels: Sequence[str], limit: int = 24) -> float:
    return 12 + 6.5 * max((len(short(str(x), limit)) for x in labels), default=0)


def heatmap(
    values: Sequence[Sequence[float | None]],
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    *,
    cell: float = 26,
    label: str = "heat map",
) -> str:
    """Rows x columns of coloured cells, scaled from the smallest to the largest present value.

    A missing value (None or NaN) is a grey cell of class ``nodata``; the others have class
    ``cell`` with ``data-row``/``data-col`` attributes and a tooltip with the exact value.
    """
    present = [p for row in values for v in row if (p := _present(v)) is not None]
    vmin, vmax = (min(present), max(present)) if present else (0.0, 0.0)
    left = _label_width(row_labels)
    top = 16 + 6.5 * max((len(short(str(c), 12)) for c in col_labels), default=0)
    body: list[str] = []
    for j, column in enumerate(col_labels):
        x = left + j * cell + cell / 2
        body.append(
            f'<text x="{x:.1f}" y="{top - 6:.1f}" transform="rotate(-60 {x:.1f} {top - 6:.1f})">'
            f"{esc(short(str(column), 12))}</text>"
        )
    for i, row in enumerate(values):
        y = top + i * cell
        body.append(_row_label(left, y + cell / 2 + 4, row_labels[i]))
        for j, value in enumerate(row):
            x = left + j * cell
            where = f"{row_labels[i]}, {col_labels[j]}"
            v = _present(value)
            if v is None:
                fill, css, tip = NO_DATA_FILL, "nodata", f"{where}: no data"
            else:
                t = 0.5 if vmax == vmin else (v - vmin) / (vmax - vmin)
                fill, css, tip = sequential_color(t), "cell", f"{where}: {v:.4g}"
            body.append(
                f'<rect class="{css}" data-row="{i}" data-col="{j}" x="{x:.1f}" y="{y:.1f}" '
                f'width="{cell - 1:.1f}" height="{cell - 1:.1f}" fill="{fill}">'
                f"<title>{esc(tip)}</title></rect>"
            )
    legend_y = top + len(values) * cell + 14
    steps = 5
    for k in range(steps):
        body.append(
            f'<rect x="{left + k * 18:.1f}" y="{legend_y:.1f}" width="18" height="10" '
            f'fill="{sequential_color(k / (steps - 1))}"/>'
        )
    body.append(
        f'<text x="{left:.1f}" y="{legend_y + 22:.1f}">{vmin:.3g}</text>'
        f'<text x="{left + steps * 18:.1f}" y="{legend_y + 22:.1f}" text-anchor="end">'
        f"{vmax:.3g}</text>"
        f'<rect x="{left + steps * 18 + 16:.1f}" y="{legend_y:.1f}" width="10" height="10" '
        f'fill="{NO_DATA_FILL}"/>'
        f'<text x="{left + steps * 18 + 30:.1f}" y="{legend_y + 9:.1f}">no data</text>'
    )
    width = left + max(len(col_labels) * cell, steps * 18 + 90) + 10
    return _svg(width, legend_y + 30, body, label)


def bar_chart(
    labels: Sequence[str],
    values: Sequence[float | None],
    *,
    colors: Sequence[str] | None = None,
    bar_height: float = 18,
    width: float = 320,
    label: str = "bar chart",
) -> str:
    """Horizontal bars, longest = the largest value; a missing value shows "n/a" and no bar."""
    present = [p for v in values if (p := _present(v)) is not None]
    vmax = max(present, default=0.0)
    left = _label_width(labels)
    body: list[str] = []
    for i, (name, value) in enumerate(zip(labels, values, strict=True)):
        y = 4 + i * (bar_height + 4)
        body.append(_row_label(left, y + bar_height - 5, name))
        v = _present(value)
        if v is None:
            body.append(f'<text x="{left:.1f}" y="{y + bar_height - 5:.1f}">n/a</text>')
            continue
        length = 0.0 if vmax <= 0 else width * max(v, 0.0) / vmax
        fill = colors[i] if colors is not None else "#1c7ed6"
        body.append(
            f'<rect class="bar" x="{left:.1f}" y="{y:.1f}" width="{length:.1f}" '
            f'height="{bar_height:.1f}" fill="{fill}"><title>{esc(name)}: {v:.4g}</title></rect>'
            f'<text x="{left + length + 4:.1f}" y="{y + bar_height - 5:.1f}">{v:.3f}</text>'
        )
    return _svg(left + width + 60, 8 + len(labels) * (bar_height + 4), body, label)


def flag_grid(
    row_labels: Sequence[str],
    rounds: Sequence[int],
    cells: Sequence[Sequence[str]],
    *,
    cell: float = 16,
    label: str = "flags over rounds",
) -> str:
    """Clients x rounds strip: each cell one of `FLAG_CELLS` (flagged, clear, ...)."""
    left = _label_width(row_labels)
    top = 18.0
    body: list[str] = []
    step = max(1, math.ceil(len(rounds) / 20))
    for j, index in enumerate(rounds):
        if j % step == 0:
            body.append(
                f'<text x="{left + j * cell + cell / 2:.1f}" y="{top - 5:.1f}" '
                f'text-anchor="middle">{esc(index)}</text>'
            )
    for i, row in enumerate(cells):
        y = top + i * cell
        body.append(_row_label(left, y + cell - 4, row_labels[i]))
        for j, kind in enumerate(row):
            fill, meaning = FLAG_CELLS.get(kind, FLAG_CELLS["absent"])
            body.append(
                f'<rect class="flag {esc(kind)}" x="{left + j * cell:.1f}" y="{y:.1f}" '
                f'width="{cell - 1:.1f}" height="{cell - 1:.1f}" fill="{fill}" stroke="#dee2e6">'
                f"<title>{esc(row_labels[i])}, round {esc(rounds[j])}: {meaning}</title></rect>"
            )
    legend_y = top + len(cells) * cell + 8
    x = left
    for fill, meaning in FLAG_CELLS.values():
        body.append(
            f'<rect x="{x:.1f}" y="{legend_y:.1f}" width="10" height="10" fill="{fill}" '
            f'stroke="#adb5bd"/><text x="{x + 14:.1f}" y="{legend_y + 9:.1f}">{meaning}</text>'
        )
        x += 24 + 6 * len(meaning)
    width = max(left + len(rounds) * cell, x) + 10
    return _svg(width, legend_y + 18, body, label)
