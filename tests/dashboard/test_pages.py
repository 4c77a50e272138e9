"""Page builders of the dashboard, from literal report values."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace
from typing import Any

from service.api.dashboard import pages, plots, svg
from service.audit_records.detection_summaries import FedNoRoSummary
from service.report_views import (
    ClientPageView,
    ClientRound,
    DetectorState,
    FlagRound,
    NamedNeighbor,
    ReportRow,
    ReportView,
)
from tests.report_views import (
    client_page,
    client_round,
    flag_round,
    latest_audit,
    page_round,
    report,
    report_row,
    round_row,
    round_view,
)

NS = "{http://www.w3.org/2000/svg}"


def client(
    name: str,
    status: str,
    history: list[FlagRound],
    neighbors: list[NamedNeighbor] | None = None,
) -> ReportRow:
    return report_row(
        client_id=f"id-{name}", name=name, status=status, flag_history=history, neighbors=neighbors
    )


def test_neighbor_matrix_has_one_cell_per_known_neighbor_noisy_sites_first() -> None:
    clients = [
        client("a", "trusted", [], [NamedNeighbor(client_id="id-b", weight=0.8, name="b")]),
        client(
            "b",
            "noisy",
            [],
            [
                NamedNeighbor(client_id="id-a", weight=0.4, name="a"),
                NamedNeighbor(client_id="id-gone", weight=0.9, name="gone"),  # not in the report
            ],
        ),
    ]
    html = plots.neighbor_matrix(clients)
    root = ET.fromstring(html[html.index("<svg") :])
    cells = {
        (r.get("data-row"), r.get("data-col")): r.findtext(f"{NS}title")
        for r in root.iter(f"{NS}rect")
        if r.get("class") in ("cell", "nodata")
    }
    # b (noisy) is row/column 0, a (trusted) 1; the neighbor outside the report is left out
    assert cells == {
        ("0", "0"): "noisy: b, b: no data",
        ("0", "1"): "noisy: b, a: 0.4",
        ("1", "0"): "trusted: a, b: 0.8",
        ("1", "1"): "trusted: a, a: no data",
    }


def test_neighbor_matrix_says_when_there_is_no_neighbor() -> None:
    clients = [client("a", "trusted", [], None), client("b", "trusted", [], [])]
    assert "No neighbor relation" in plots.neighbor_matrix(clients)


def test_flag_grid_kinds_follow_the_history() -> None:
    clients = [
        client(
            "a",
            "suspect",
            [
                flag_round(0, True, in_warmup=True),
                flag_round(1, True),
                flag_round(3, None),
            ],
        ),
        client("b", "trusted", [flag_round(1, False)]),
    ]
    root = ET.fromstring(plots.flag_grid(clients))
    kinds = [r.get("class") for r in root.iter(f"{NS}rect") if "flag" in (r.get("class") or "")]
    assert kinds == [
        "flag warmup",
        "flag flagged",
        "flag undetermined",
        "flag absent",
        "flag clear",
        "flag absent",
    ]


def test_number_formatting_and_escaping() -> None:
    assert svg.number(None) == '<span class="muted">-</span>'
    assert svg.number(0.000123456) == "0.0001235"
    assert svg.number(12) == "12"
    assert svg.number("<b>") == "&lt;b&gt;"


def test_round_page_escapes_names() -> None:
    view = round_view(
        2,
        [round_row("id-x", "<x>", num_samples=3, per_class_loss=[1.0, None])],
        state="failed",
        state_reason="<img src=x onerror=alert(1)>",
        audited=False,
        in_warmup=None,
        aggregation_rule=None,
        fallback_reason=None,
        classes=["<cat>", "dog"],
    )
    html = pages.round_page("fid", "<fed>", view)
    assert "<img" not in html
    assert "<x>" not in html
    assert "<cat>" not in html
    assert "&lt;fed&gt;" in html


def federation_report(latest: dict[str, Any]) -> ReportView:
    """A report with no client and the given latest-audit summary."""
    return report(latest=latest_audit(round=1, primary_status="ok", **latest))


def test_federation_page_shows_the_latest_audits_warnings_escaped():
    shown = federation_report({"warnings": ["hold 57% <of> the data"]})
    html = pages.federation_page(shown, None)
    assert "<dt>warning</dt><dd>hold 57% &lt;of&gt; the data</dd>" in html
    shown = replace(shown, latest=latest_audit(warnings=[]))
    assert "<dt>warning</dt>" not in pages.federation_page(shown, None)


def test_federation_page_shows_the_separation_guards_verdict():
    guard = "separation guard: Ashman's D (class_z) = 6.8 < 12"
    summary = FedNoRoSummary(guard=guard)
    html = pages.federation_page(federation_report({"primary_summary": summary}), None)
    assert (
        "<dt>separation guard</dt><dd>separation guard: Ashman&#x27;s D (class_z) = 6.8 &lt; 12"
        in html
    )


def test_client_table_shows_inconsistent_claims():
    from datetime import UTC, datetime

    row = report_row(
        client_id="c1",
        name="site-a",
        status="trusted",
        pinned_status=None,
        noisy_classes=[],
        times_flagged=0,
        rounds_audited=1,
        latest_scores=None,
        latest_flags=None,
        reliability=None,
        neighbors=None,
        last_weight=0.4,
        num_samples=100,
        inconsistent_updates=2,
        last_inconsistent_at=datetime(2026, 11, 25, 9, 12, tzinfo=UTC),
    )
    html = pages.client_table("f1", [row])
    assert "inconsistent claims</th>" in html
    assert '<td><a href="/admin/federations/f1/clients/c1">site-a</a></td>' in html
    assert (
        '<span class="badge noisy">2</span><br><span class="muted">last 2026-11-25 09:12 UTC'
        in html
    )
    clean = pages.client_table(
        "f1", [replace(row, inconsistent_updates=0, last_inconsistent_at=None)]
    )
    assert '<td class="num"><span class="muted">0</span></td>' in clean


def test_client_table_says_why_a_site_does_not_take_part() -> None:
    present = pages.client_table("f1", [_report_row(name="a")])
    assert "attendance" not in present
    suspended = _report_row(name="a", attendance="suspended", suspend_reason="audit <pending>")
    html = pages.client_table("f1", [suspended])
    assert (
        '<br><span class="muted attendance">suspended by the admin: audit &lt;pending&gt;</span>'
        in html
    )
    absent = pages.client_table("f1", [_report_row(name="a", attendance="absent")])
    assert "absent: missed its last rounds; selected again once it polls" in absent
    assert "has not joined" in pages.client_table("f1", [_report_row(attendance="not_joined")])


def _report_row(**fields: Any) -> ReportRow:
    """A trusted site's row of the report's client table, with ``fields`` on top."""
    return report_row(last_weight=0.4, **fields)


def test_the_report_table_marks_a_secondary_detectors_flag_as_such() -> None:
    row = _report_row(
        latest_scores={"evidence": 4.2, "fedncl": 0.5},
        latest_flags={"evidence": True, "fedncl": True},
    )
    html = pages.client_table("f1", [row], "evidence")
    assert "evidence: 4.2 \u2691<br>" in html
    assert 'fedncl: 0.5 <span class="muted">\u2691 (secondary)</span>' in html


def test_a_score_the_detector_did_not_give_says_why() -> None:
    row = _report_row(
        latest_scores={"evidence": 0.3, "fednoro": None},
        latest_flags={"evidence": False, "fednoro": None},
        latest_statuses={"evidence": "ok", "fednoro": "undetermined"},
        flag_history=[],
    )
    html = pages.client_table("f1", [row], "evidence")
    assert 'fednoro: <span class="muted" title="too few sites or signals to decide">' in html
    assert "n/a (undetermined)</span>" in html
    shown = federation_report(
        {
            "primary_detector": "evidence",
            "detectors": {
                "evidence": DetectorState(status="ok", reason=None),
                "fednoro": DetectorState(status="undetermined", reason="3 clients, fewer than 4"),
            },
        }
    )
    page = pages.federation_page(replace(shown, clients=[row]), None)
    assert "<dt>fednoro verdict</dt><dd>undetermined: 3 clients, fewer than 4</dd>" in page
    assert "<dt>evidence verdict</dt>" not in page  # the primary's verdict has its own line
    assert "n/a (undetermined): too few sites or signals to decide" in page  # the legend
    assert "n/a (inconclusive):" not in page


def _trusted_site_view(rounds: list[ClientRound], **fields: Any) -> ClientPageView:
    """A trusted site's client page view with these history ``rounds`` (after the warm-up) and
    nothing else."""
    return client_page([page_round(r) for r in rounds], **fields)


def test_the_client_page_marks_an_abstaining_detector_inconclusive() -> None:
    rounds = [
        client_round(
            4,
            primary_flag=None,
            flags={"evidence": None},
            scores={"evidence": None},
            statuses={"evidence": "inconclusive"},
        )
    ]
    html = pages.client_page(_trusted_site_view(rounds), "evidence")
    assert "n/a (inconclusive)</span></td>" in html
    assert "the detector abstained: the consensus is suspect" in html
    root = ET.fromstring(html[html.index("<svg") : html.index("</svg>") + 6])
    kinds = [r.get("class") for r in root.iter(f"{NS}rect") if "flag" in (r.get("class") or "")]
    assert kinds == ["flag inconclusive"]


def test_the_client_page_tells_undetermined_from_no_verdict() -> None:
    # round 5: evidence undetermined (too few sites); fedncl not run that round (no status);
    # round 6: fedncl answered ok but gave this site no flag (None)
    rounds = [
        client_round(
            5,
            primary_flag=None,
            flags={"evidence": None, "fedncl": None},
            scores={"evidence": None, "fedncl": None},
            statuses={"evidence": "undetermined"},
        ),
        client_round(
            6,
            primary_flag=False,
            flags={"evidence": False, "fedncl": None},
            scores={"evidence": 0.1, "fedncl": 0.2},
            statuses={"evidence": "ok", "fedncl": "ok"},
        ),
    ]
    html = pages.client_page(_trusted_site_view(rounds), "evidence")
    root = ET.fromstring(html[html.index("<svg") : html.index("</svg>") + 6])
    cells = [r.get("class") or "" for r in root.iter(f"{NS}rect")]
    # rows: evidence (rounds 5, 6), fedncl (rounds 5, 6)
    assert sorted(c for c in cells if "flag" in c) == sorted(
        ["flag undetermined", "flag clear", "flag noverdict", "flag noverdict"]
    )


def test_every_section_of_a_federation_page_before_its_first_audit_has_a_title() -> None:
    html = pages.federation_page(report(latest=None, rounds_audited=0), None)
    assert "No audited round yet" in html
    sections = html.split("<section>")[1:]
    assert sections
    untitled = [s[:80] for s in sections if not s.startswith(("<h1>", "<h2>"))]
    assert untitled == []


def _round_with_evidence() -> ClientRound:
    """A round of a client's history with hand-written evidence beside the verdict."""
    return client_round(
        7,
        primary_flag=True,
        flags={"evidence": True, "fedncl": False},
        scores={"evidence": 3.25, "fedncl": 0.8},
        statuses={"evidence": "ok", "fedncl": "ok"},
        detector_evidence={
            "evidence": {
                "p_value": 0.0012,
                "q_value": 0.0024,
                "site_z": 3.25,
                "site_factor": 1.75,
                "stouffer_z": 2.5,
                "mean_loss": 1.125,
                "errors": 7,
                "errors_expected": 2.5,
                "errors_z": 2.75,
                "errors_p_value": 0.003,
                "accuracy_z": None,
                "accuracy_p_value": None,
                "accuracy_gap": None,
                "geometry_cosine": 0.125,
                "geometry_z": 11.5,
                "geometry_p_value": 1e-6,
            },
            "fednoro": None,
            "fedncl": {"q": 0.8, "divergence": 72.0, "data_quality": 20.0, "deviation": -0.5},
            "expertise": None,
        },
        class_evidence=[
            {
                "index": 1,
                "label": "<b>dog</b>",
                "evidence_z": 4.5,
                "fednoro_normalised_loss": 0.875,
                "noisy_by": ["evidence"],
            }
        ],
    )


def test_the_client_page_shows_each_detectors_evidence_and_a_per_class_table() -> None:
    view = _trusted_site_view([_round_with_evidence()], class_counts={7: [40, 12]})
    html = pages.client_page(view, "evidence")
    section = html[html.index("Evidence beside the verdict, round 7") :]
    section = section[: section.index("</section>")]
    # the evidence detector's parts, each with its value and its meaning
    for part, value in (
        ("site_z", "3.25"),
        ("stouffer_z", "2.5"),
        ("errors_z", "2.75"),
        ("errors_p_value", "0.003"),
        ("geometry_cosine", "0.125"),
        ("geometry_z", "11.5"),
        ("q_value", "0.0024"),
    ):
        assert f'<td>{part}</td><td class="num">{value}</td>' in section
    assert '<td>accuracy_z</td><td class="num"><span class="muted">-</span></td>' in section
    assert "in robust standard deviations" in section  # geometry_z's meaning
    # Fed-NCL's terms beside q; FedNoRo gave no verdict: no rows
    assert '<td>divergence</td><td class="num">72</td>' in section
    assert '<td>data_quality</td><td class="num">20</td>' in section
    assert "separation_score" not in section
    # which evidence decides: the primary detector's; Fed-NCL's is shown only
    assert 'evidence<br><span class="muted">decides: the primary detector</span>' in section
    assert 'fedncl<br><span class="muted">shown; does not decide</span>' in section
    # per class: the label escaped, its count, the class z, FedNoRo's loss, who names it noisy
    assert (
        '<tr><td>&lt;b&gt;dog&lt;/b&gt;</td><td class="num">12</td><td class="num">4.5</td>'
        '<td class="num">0.875</td><td>evidence</td></tr>'
    ) in section
    assert "<b>dog" not in html
    assert "<script" not in html
    assert "style=" not in html


def test_the_client_page_of_an_older_audit_says_it_holds_no_evidence() -> None:
    older = client_round(
        3,
        primary_flag=False,
        flags={"evidence": False},
        scores={"evidence": 0.1},
        statuses={"evidence": "ok"},
    )
    html = pages.client_page(_trusted_site_view([older]), "evidence")
    assert "holds no detector evidence for the site" in html
    assert pages.client_page(_trusted_site_view([]), "evidence").count("Evidence beside") == 0
