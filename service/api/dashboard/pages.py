"""HTML pages of the admin dashboard, built from the reports' typed values (service.report_views).

Plain f-strings: every value that reaches the page goes through `esc` (names, reasons and class
labels come from clients and admins); markup built here is trusted. No script anywhere, and the
routes send a Content-Security-Policy that would block one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import quote

from service.api.dashboard import svg
from service.api.dashboard.cells import (
    EPSILON_HEADERS,
    attendance_note,
    epsilon_cells,
    neighbors_cell,
    refused_cell,
)
from service.api.dashboard.evidence import evidence_section
from service.api.dashboard.plots import (
    audited_rounds,
    class_loss_heatmap,
    flag_grid,
    neighbor_matrix,
    weight_bars,
)
from service.api.dashboard.svg import ICON_SVG, esc, number
from service.report_views import (
    ClientPageView,
    ClientRound,
    FederationOverview,
    PageRound,
    ReportRow,
    ReportView,
    RoundView,
    SiteError,
)

CSS = """
body{font-family:system-ui,sans-serif;margin:0;color:#212529;background:#f8f9fa}
header{background:#343a40;color:#fff;padding:.6rem 1.2rem;display:flex;align-items:center;gap:1rem}
header a{color:#fff;text-decoration:none;font-weight:600}
header form:first-of-type{margin-left:auto}
main{padding:1rem 1.2rem;max-width:1400px}
section{background:#fff;border:1px solid #dee2e6;border-radius:6px;padding:.8rem 1rem;margin:1rem 0}
h1{font-size:1.4rem;margin:.2rem 0 .6rem}h2{font-size:1.1rem;margin:.2rem 0 .6rem}
table{border-collapse:collapse;font-size:.85rem}
th,td{border-bottom:1px solid #e9ecef;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f1f3f5}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;padding:0 .45rem;border-radius:.6rem;color:#fff;font-size:.8rem}
.trusted{background:#2b8a3e}.suspect{background:#f08c00}.noisy{background:#c92a2a}
.other{background:#868e96}
.muted{color:#868e96}.error{color:#c92a2a;font-weight:600}
.plots{display:flex;flex-wrap:wrap;gap:1rem}
.plots section{margin:0;overflow-x:auto}
dl{display:grid;grid-template-columns:max-content auto;gap:.15rem .8rem;margin:0}
dt{color:#868e96}dd{margin:0}
"""


FAVICON = f'<link rel="icon" href="data:image/svg+xml,{quote(ICON_SVG, safe="/:=")}">'
"""The pages' icon, inline (the CSP allows data: images): no request for /favicon.ico."""


def layout(title: str, body: str, *, logged_in: bool = True) -> str:
    logout = (
        '<form method="post" action="/admin/logout"><button type="submit">Log out</button></form>'
        '<form method="post" action="/admin/logout-everywhere">'
        '<button type="submit">Log out everywhere</button></form>'
        if logged_in
        else ""
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} \u2014 fedaudit</title>{FAVICON}<style>{CSS}</style></head><body>"
        f'<header><a href="/admin">fedaudit admin</a>{logout}</header>'
        f"<main>{body}</main></body></html>"
    )


def badge(status: str | None) -> str:
    css = status if status in svg.STATUS_COLORS else "other"
    return f'<span class="badge {css}">{esc(status or "-")}</span>'


def _when(value: datetime | None) -> str:
    return "-" if value is None else esc(value.strftime("%Y-%m-%d %H:%M UTC"))


def _definitions(items: Sequence[tuple[str, str]]) -> str:
    """A <dl> of (term, already escaped markup) pairs."""
    return "<dl>" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


def login_page(error: str | None = None) -> str:
    message = f'<p class="error">{esc(error)}</p>' if error else ""
    body = (
        "<section><h1>Log in</h1><p>Paste the coordinator's admin token "
        "(<code>FEDAUDIT_ADMIN_TOKEN</code>). The browser keeps a session cookie, not the "
        f"token.</p>{message}"
        '<form method="post" action="/admin/login">'
        '<label>Admin token <input type="password" name="token" autocomplete="current-password" '
        'required autofocus></label> <button type="submit">Log in</button></form></section>'
    )
    return layout("Log in", body, logged_in=False)


def not_found_page(detail: str) -> str:
    body = (
        f"<section><h1>Not found</h1><p>{esc(detail)}</p>"
        '<p><a href="/admin">All federations</a></p></section>'
    )
    return layout("Not found", body)


def federation_url(federation_id: str) -> str:
    return f"/admin/federations/{quote(federation_id, safe='')}"


def client_url(federation_id: str, client_id: str) -> str:
    return f"{federation_url(federation_id)}/clients/{quote(client_id, safe='')}"


def _noisy_count(noisy: int, suspect: int) -> str:
    if not noisy and not suspect:
        return '<span class="muted">none</span>'
    return (
        f'<span class="badge noisy">{esc(noisy)}</span> / '
        f'<span class="badge suspect">{esc(suspect)}</span>'
    )


def index_page(federations: Sequence[FederationOverview]) -> str:
    rows = "".join(
        "<tr>"
        f'<td><a href="{esc(federation_url(f.id))}">{esc(f.name)}</a></td>'
        f"<td>{esc(f.status)}</td><td>{esc(f.method or '-')}</td>"
        f'<td class="num">{esc(f.rounds_closed)} / {esc(f.rounds_planned)}</td>'
        f'<td class="num">{esc(f.clients)}</td>'
        f"<td>{_noisy_count(f.noisy, f.suspect)}</td><td>{_when(f.created_at)}</td>"
        "</tr>"
        for f in federations
    )
    table = (
        "<table><thead><tr><th>federation</th><th>status</th><th>method</th>"
        "<th>rounds closed / planned</th><th>clients</th><th>noisy / suspect sites</th>"
        "<th>created</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
        if federations
        else '<p class="muted">No federation yet.</p>'
    )
    return layout("Federations", f"<section><h1>Federations</h1>{table}</section>")


STATUS_MEANINGS = {
    "undetermined": "too few sites or signals to decide",
    "inconclusive": "the evidence computed, the detector abstained: the consensus is suspect",
}
"""Why a detector's score is missing, by its status (the API's ``latest_statuses``)."""


def _no_score(status: Any) -> str:
    """The cell of a score the detector did not give: "n/a (undetermined)" or "n/a
    (inconclusive)" when it did not answer ok, else a dash (no verdict for this site)."""
    if status not in STATUS_MEANINGS:
        return number(None)
    return f'<span class="muted" title="{esc(STATUS_MEANINGS[status])}">n/a ({esc(status)})</span>'


ScoresAndStatuses = tuple[Mapping[str, float | None] | None, Mapping[str, str] | None]
"""Each detector's score and status in one row (a client's latest audit, or a round)."""


def _marker_legend(entries: Iterable[ScoresAndStatuses]) -> list[str]:
    """What each "n/a (...)" marker shown in ``entries`` (scores and statuses) means, in
    words."""
    shown = {
        status
        for scores, statuses in entries
        for name, status in (statuses or {}).items()
        if status in STATUS_MEANINGS and (scores or {}).get(name) is None
    }
    return [f"n/a ({m}): {STATUS_MEANINGS[m]}" for m in sorted(shown)]


def _score_legend(clients: Sequence[ReportRow]) -> str:
    """What each score in the table means, in words, and each "n/a (...)" marker shown."""
    shown = sorted({d for c in clients for d in (c.latest_scores or {})})
    if not shown:
        return ""
    lines = [SCORE_MEANINGS.get(d, d) for d in shown]
    lines += _marker_legend((c.latest_scores, c.latest_statuses) for c in clients)
    return '<p class="muted">' + "<br>".join(esc(line) for line in lines) + "</p>"


def _flag_mark(name: str, flag: Any, primary: str | None) -> str:
    """\u2691 after a detector's score when it flagged the site; a secondary detector's flag
    says so (only the primary detector sets the status)."""
    if flag is not True:
        return ""
    return " \u2691" if name == primary else ' <span class="muted">\u2691 (secondary)</span>'


def _scores(client: ReportRow, primary: str | None) -> str:
    """Each detector's latest score ("n/a (why)" where it did not answer ok); a flag marked
    \u2691, a secondary detector's as such (it does not set the status)."""
    scores = client.latest_scores
    if not scores:
        return '<span class="muted">-</span>'
    flags = client.latest_flags or {}
    statuses = client.latest_statuses or {}
    parts = []
    for name, score in sorted(scores.items()):
        mark = _flag_mark(name, flags.get(name), primary)
        cell = _no_score(statuses.get(name)) if score is None else number(score)
        parts.append(f"{esc(name)}: {cell}{mark}")
    return "<br>".join(parts)


def client_table(
    federation_id: str,
    clients: Sequence[ReportRow],
    primary: str | None = None,
    *,
    dp: bool = False,
) -> str:
    """The report's table, with the sites' epsilons under the Gaussian mechanism (``dp``)."""
    rows = []
    for c in clients:
        pinned = (
            f'<br><span class="muted">pinned: {esc(c.pin_reason or "")}'
            f" (detected {esc(c.detected_status)})</span>"
            if c.pinned_status
            else ""
        )
        pinned += attendance_note(c)
        classes = esc(_classes_text(c.noisy_classes, c.flag_basis))
        classes = '<span class="muted">-</span>' if classes == "-" else classes
        epsilons = epsilon_cells(c.epsilon_round, c.epsilon_total) if dp else ""
        rows.append(
            "<tr>"
            f'<td><a href="{esc(client_url(federation_id, c.client_id))}">{esc(c.name)}</a>'
            f"</td><td>{badge(c.status)}{pinned}</td>"
            f'<td class="num">{esc(c.times_flagged)} / {esc(c.rounds_audited)}</td>'
            f"<td>{_scores(c, primary)}</td>"
            f'<td>{classes}</td><td class="num">{number(c.reliability)}</td>'
            f"<td>{neighbors_cell(c.neighbors)}</td>"
            f'<td class="num">{number(c.last_weight)}</td>'
            f'<td class="num">{number(c.num_samples)}</td>'
            f'<td class="num">{refused_cell(c)}</td>'
            f"{epsilons}"
            "</tr>"
        )
    return (
        "<table><thead><tr><th>client</th><th>status</th><th>flagged / audited</th>"
        "<th>latest scores (\u2691 flagged)</th><th>noisy classes</th><th>reliability</th>"
        "<th>neighbors (weight)</th><th>last weight</th><th>samples</th>"
        '<th title="updates refused: num_samples / class_counts inconsistent with the join">'
        f"inconsistent claims</th>{EPSILON_HEADERS if dp else ''}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _summary(report: ReportView) -> str:
    latest = report.latest
    status = esc(report.status)
    if report.status_reason:
        status += f" ({esc(report.status_reason)})"
    items = [
        ("status", status),
        ("primary detector", esc(report.primary_detector)),
        ("warm-up rounds", esc(report.warmup_rounds)),
        ("rounds audited", esc(report.rounds_audited)),
    ]
    privacy = report.privacy
    if privacy is not None:
        items.append(
            (
                "Gaussian mechanism",
                f"\u03c3 = {number(privacy.noise_multiplier)}, loss clip "
                f"{number(privacy.clip_loss)}, probe clip {number(privacy.clip_probe)}; "
                f"\u03b5 = {number(privacy.epsilon_per_round, 3)} per round at "
                f"\u03b4 = {esc(privacy.delta)} ({esc(privacy.accountant)})",
            )
        )
    if latest is not None:
        items += [
            ("latest audited round", esc(latest.round)),
            (
                "primary verdict",
                f"{esc(latest.primary_status)} {esc(latest.primary_reason or '')}",
            ),
            ("aggregation", esc(latest.aggregation_rule or "-")),
        ]
        if latest.fallback_reason:
            items.append(("fallback", esc(latest.fallback_reason)))
        for name, outcome in sorted(latest.detectors.items()):
            if name != latest.primary_detector and outcome.status != "ok":
                why = f": {outcome.reason}" if outcome.reason else ""
                items.append((f"{esc(name)} verdict", esc(f"{outcome.status}{why}")))
        if latest.guard:
            items.append(("separation guard", esc(latest.guard)))
        items += [("warning", esc(w)) for w in latest.warnings]
    return _definitions(items)


def _round_links(federation_id: str, clients: Sequence[ReportRow]) -> str:
    rounds = audited_rounds(clients)
    if not rounds:
        return ""
    base = federation_url(federation_id)
    links = " ".join(f'<a href="{esc(base)}/rounds/{int(r)}">{int(r)}</a>' for r in rounds)
    return f"<p>Rounds: {links}</p>"


def site_error_table(errors: Sequence[SiteError]) -> str:
    """The latest errors the sites reported (nothing when there is none)."""
    if not errors:
        return ""
    rows = "".join(
        "<tr>"
        f"<td>{esc(e.at)}</td><td>{esc(e.name)}</td>"
        f'<td class="num">{esc(e.round)}</td><td>{esc(e.stage)}</td>'
        f"<td>{esc(e.error_type)}: {esc(e.message)}</td>"
        "</tr>"
        for e in errors
    )
    return (
        "<section><h2>Site errors</h2><table><thead><tr><th>at</th><th>site</th>"
        "<th>round</th><th>stage</th><th>error</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></section>"
    )


def federation_page(report: ReportView, latest_round: RoundView | None) -> str:
    """The noisy-client report of one federation, with its plots."""
    clients = report.clients
    statuses = {c.client_id: c.status for c in clients}
    dp = report.privacy is not None
    if latest_round is None:
        round_plots = (
            "<section><h2>Per-class loss and aggregation weights</h2>"
            '<p class="muted">No audited round yet: the plots appear once a round has closed.</p>'
            "</section>"
        )
    else:
        index = latest_round.round
        round_plots = (
            f"<section><h2>Per-class loss, round {esc(index)}</h2>"
            f"{class_loss_heatmap(latest_round, statuses)}</section>"
            f"<section><h2>Aggregation weights, round {esc(index)}</h2>"
            f"{weight_bars(latest_round, statuses)}</section>"
        )
    body = (
        f"<section><h1>{esc(report.federation)}</h1>{_summary(report)}"
        f"{_round_links(report.federation_id, clients)}</section>"
        f"{site_error_table(report.site_errors)}"
        f"<section><h2>Noisy-client report</h2>"
        f"{client_table(report.federation_id, clients, report.primary_detector, dp=dp)}"
        f"{_score_legend(clients)}</section>"
        f"<section><h2>Primary flags over rounds</h2>{flag_grid(clients)}</section>"
        f'<div class="plots">{round_plots}'
        f"<section><h2>Reliable neighbors (latest audit)</h2>{neighbor_matrix(clients)}</section>"
        "</div>"
    )
    return layout(str(report.federation), body)


FLAG_WORDS: dict[bool | None, str] = {True: "flagged", False: "clear"}
"""A round's primary flag in a word (a dash where there is none)."""


def round_page(federation_id: str, federation_name: str, view: RoundView) -> str:
    """One round: state, the primary verdict, aggregation, per-class losses and weights."""
    rows = "".join(
        "<tr>"
        f'<td>{esc(r.name)}</td><td class="num">{esc(r.num_samples)}</td>'
        f"<td>{esc(FLAG_WORDS.get(r.primary_flag, '-'))}</td>"
        f'<td class="num">{number(r.weight)}</td>'
        "</tr>"
        for r in view.clients
    )
    flagged = {r.client_id: "noisy" for r in view.clients if r.primary_flag is True}
    details = [
        (
            "state",
            esc(view.state) + (f" ({esc(view.state_reason)})" if view.state_reason else ""),
        ),
        ("audited", "yes" if view.audited else "no"),
        ("warm-up", ("yes" if view.in_warmup else "no") if view.audited else "-"),
    ]
    if view.audited:
        details.append(
            (
                "primary verdict",
                f"{esc(view.primary_detector)}: {esc(view.primary_status)} "
                f"{esc(view.primary_reason or '')}",
            )
        )
        if view.guard:
            details.append(("separation guard", esc(view.guard)))
    details.append(("aggregation", esc(view.aggregation_rule or "-")))
    if view.fallback_reason:
        details.append(("fallback", esc(view.fallback_reason)))
    pruned = sum(1 for r in view.clients if r.pruned)
    if pruned:
        details.append(
            (
                "retention",
                f"{pruned} of {len(view.clients)} model updates pruned (the flags, weights "
                "and losses shown stay; a what-if of this round needs them left out)",
            )
        )
    body = (
        f'<section><p><a href="{esc(federation_url(federation_id))}">{esc(federation_name)}</a>'
        f"</p><h1>Round {esc(view.round)}</h1>{_definitions(details)}</section>"
        "<section><h2>Updates</h2><table><thead><tr><th>client</th><th>samples</th>"
        f"<th>primary flag</th><th>weight</th></tr></thead><tbody>{rows}</tbody></table></section>"
        '<div class="plots"><section><h2>Per-class loss</h2>'
        f"{class_loss_heatmap(view, flagged)}</section>"
        f"<section><h2>Aggregation weights</h2>{weight_bars(view, {})}</section></div>"
    )
    return layout(f"{federation_name}: round {view.round}", body)


SCORE_MEANINGS = {
    "evidence": "calibrated evidence: the site's excess loss in standard errors (about N(0, 1) "
    "when clean)",
    "fednoro": "FedNoRo: its separation statistic (by default the class-standardised loss "
    "excess, in standard errors)",
    "fedncl": "Fed-NCL: the site's q (loss and divergence; higher = noisier)",
    "expertise": "FedRN: expertise, the local model's accuracy on its own labels, min-max "
    "normalised over the round's sites (higher = more reliable; not a noise score)",
}
"""What each detector's score means, shown beside it on the client page."""


def _detector_cell(name: str, entry: ClientRound, primary: str | None) -> str:
    value = entry.scores.get(name)
    status = entry.statuses.get(name)
    score = _no_score(status) if value is None else number(value)
    mark = _flag_mark(name, entry.flags.get(name), primary)
    return f'<td class="num">{score}{mark}</td>'


def _detector_flag_kind(flag: Any, in_warmup: bool, status: Any = None) -> str:
    if in_warmup:
        return "warmup"
    if flag is None and status in ("inconclusive", "undetermined"):
        return str(status)
    return "flagged" if flag is True else "clear" if flag is False else "noverdict"


def _primary_text(entry: PageRound) -> str:
    primary = entry.audit.primary_flag
    flag = "flagged" if primary is True else "clear" if primary is False else "-"
    return f'{flag} <span class="muted">(warm-up)</span>' if entry.in_warmup else flag


def client_page(view: ClientPageView, primary: str | None) -> str:
    """One client: status and pins, scores and flags per detector over rounds, each detector's
    evidence beside the latest verdict (per detector and per class), per-class loss over rounds,
    neighbors, weights and its site errors."""
    rounds = view.rounds
    detectors = sorted({d for r in rounds for d in r.audit.scores})
    if primary in detectors:
        detectors = [primary, *[d for d in detectors if d != primary]]
    status = badge(view.status)
    if view.pinned_status:
        status += (
            f' <span class="muted">pinned by {esc(view.pinned_by or "an admin")}: '
            f"{esc(view.pin_reason or '')} (detected {esc(view.detected_status)})</span>"
        )
    details = [("status", status)]
    if view.anchor:
        details.append(("trust anchor", esc(view.anchor_reason or "yes")))
    details += [(f"{esc(d)} score", esc(SCORE_MEANINGS.get(d, d))) for d in detectors]
    legend = _marker_legend((r.audit.scores, r.audit.statuses) for r in rounds)
    details += [("n/a", esc(line)) for line in legend]
    header = "".join(f"<th>{esc(d)}</th>" for d in detectors)
    dp = any(r.audit.epsilon_round is not None for r in rounds)
    rows = "".join(
        "<tr>"
        f'<td class="num">{esc(r.audit.round)}</td>'
        f"<td>{_primary_text(r)}</td>"
        + "".join(_detector_cell(d, r.audit, primary) for d in detectors)
        + f"<td>{esc(_classes_text(r.audit.noisy_classes, r.audit.flag_basis))}</td>"
        f'<td class="num">{number(r.audit.reliability)}</td>'
        f'<td class="num">{number(r.audit.weight)}</td>'
        f"<td>{neighbors_cell(r.neighbors)}</td>"
        f"{epsilon_cells(r.audit.epsilon_round, r.audit.epsilon_total) if dp else ''}"
        "</tr>"
        for r in rounds
    )
    history = (
        "<table><thead><tr><th>round</th><th>primary flag</th>"
        f"{header}<th>noisy classes</th><th>reliability</th><th>weight</th>"
        f"<th>neighbors (weight)</th>{EPSILON_HEADERS if dp else ''}</tr></thead>"
        f"<tbody>{rows}</tbody></table>"
        if rounds
        else '<p class="muted">No audited round yet.</p>'
    )
    body = (
        f'<section><p><a href="{esc(federation_url(view.federation_id))}">'
        f"{esc(view.federation)}</a></p><h1>{esc(view.name)}</h1>"
        f"{_definitions(details)}</section>"
        f"{site_error_table(view.site_errors)}"
        f"<section><h2>Scores and flags over rounds (\u2691 flagged)</h2>{history}</section>"
        f"{evidence_section(view, primary)}"
        f'<div class="plots"><section><h2>Flags per detector</h2>'
        f"{_detector_flags(rounds, detectors)}</section>"
        f"<section><h2>Per-class loss over rounds</h2>{_loss_over_rounds(view)}</section></div>"
    )
    return layout(f"{view.federation}: {view.name}", body)


def _detector_flags(rounds: Sequence[PageRound], detectors: Sequence[str]) -> str:
    if not rounds or not detectors:
        return '<p class="muted">No audited round yet.</p>'
    cells = [
        [
            _detector_flag_kind(r.audit.flags.get(d), r.in_warmup, r.audit.statuses.get(d))
            for r in rounds
        ]
        for d in detectors
    ]
    return svg.flag_grid(
        list(detectors), [int(r.audit.round) for r in rounds], cells, label="flags per detector"
    )


def _loss_over_rounds(view: ClientPageView) -> str:
    per_round = view.per_class_loss
    if not per_round:
        return '<p class="muted">No per-class loss sent.</p>'
    rounds = sorted(per_round)
    classes = view.classes
    values = [[per_round[r][c] for r in rounds] for c in range(len(classes))]
    return (
        "<p class=\"muted\">The global model's mean cross-entropy (nats) on the site's samples "
        "of each given label (rows) in each round (columns), computed when the round opened; "
        "colours from the smallest to the largest value shown, grey: the site holds no sample "
        "of the class.</p>"
        + svg.heatmap(
            values, list(classes), [str(r) for r in rounds], label="per-class loss over rounds"
        )
    )


_BASIS_WORDS = {"update_direction": "update direction", "accuracy": "own-label accuracy"}


def _classes_text(noisy_classes: Sequence[str], flag_basis: str | None) -> str:
    """The noisy classes, and what a flag rests on when not the losses (service's report)."""
    classes = ", ".join(str(c) for c in noisy_classes)
    basis = _BASIS_WORDS.get(flag_basis or "")
    if basis is None:
        return classes or "-"
    return f"{classes} ({basis})".strip()
