"""The dashboard's per-site plots stay a size a browser renders: at most PLOT_SITES sites
(MATRIX_SITES for the sites x sites matrix) and PLOT_ROUNDS rounds, noisy sites first, with a note
saying what was left out."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace

from service.api.dashboard import plots
from service.report_views import NamedNeighbor, ReportRow
from tests.report_views import flag_round, report_row, round_row, round_view

NS = "{http://www.w3.org/2000/svg}"


def svg_root(html: str) -> ET.Element:
    return ET.fromstring(html[html.index("<svg") : html.index("</svg>") + len("</svg>")])


def row_indices(html: str) -> set[str]:
    return {
        r.get("data-row", "")
        for r in svg_root(html).iter(f"{NS}rect")
        if r.get("class") in ("cell", "nodata")
    }


def site(
    i: int, status: str = "trusted", neighbors: list[NamedNeighbor] | None = None
) -> ReportRow:
    return report_row(
        client_id=f"id-{i:03d}",
        name=f"s{i:03d}",
        status=status,
        flag_history=[],
        neighbors=neighbors,
    )


def neighbor(i: int, weight: float) -> NamedNeighbor:
    return NamedNeighbor(client_id=f"id-{i:03d}", weight=weight, name=f"s{i:03d}")


def test_the_neighbor_matrix_keeps_sixty_sites_the_noisy_ones_first() -> None:
    # 70 sites; the last five are noisy, each the neighbor of site 0 (weight 0.5)
    sites = [site(i, "noisy" if i >= 65 else "trusted") for i in range(70)]
    sites[0] = replace(sites[0], neighbors=[neighbor(i, 0.5) for i in range(65, 70)])
    html = plots.neighbor_matrix(sites)
    assert plots.MATRIX_SITES == 60
    assert row_indices(html) == {str(i) for i in range(60)}  # 60 rows
    labels = [t.text for t in svg_root(html).iter(f"{NS}text")]
    # columns: the neighbors the shown rows were given (the five noisy sites), then the rows,
    # noisy first
    assert labels[:5] == [f"s{i:03d}" for i in range(65, 70)]
    assert labels[5:10] == [f"noisy: s{i:03d}" for i in range(65, 70)]
    assert labels[64] == "trusted: s054"  # the 60th row: 5 noisy, then s000-s054
    assert "The first 60 of 70 sites as rows" in html


def test_a_cut_matrix_whose_rows_have_no_neighbor_says_so_with_the_cut() -> None:
    # 70 sites; only site 69 (not among the first 60 rows) was given a neighbor
    sites = [site(i) for i in range(70)]
    sites[69] = replace(sites[69], neighbors=[neighbor(0, 1.0)])
    html = plots.neighbor_matrix(sites)
    assert "No neighbor relation among the sites shown" in html
    assert "The first 60 of 70 sites" in html


def test_the_flag_grid_keeps_two_hundred_sites_and_the_latest_rounds() -> None:
    history = [flag_round(r, False) for r in range(210)]
    sites = [replace(site(i), flag_history=history) for i in range(230)]
    sites[229] = replace(sites[229], status="noisy")
    html = plots.flag_grid(sites)
    cells = [
        r.findtext(f"{NS}title") or ""
        for r in svg_root(html).iter(f"{NS}rect")
        if (r.get("class") or "").startswith("flag ")
    ]
    assert len(cells) == 200 * 200
    assert len({c.split(",")[0] for c in cells}) == 200  # sites
    assert {c.split(",")[1].split(":")[0] for c in cells} == {f" round {r}" for r in range(10, 210)}
    assert "The first 200 of 230 sites" in html
    assert "The latest 200 of 210 rounds" in html
    assert "s229" in html  # the noisy site is among those shown
    assert "s228" not in html  # the last trusted ones by name are not


def test_a_small_federation_is_shown_whole_without_a_note() -> None:
    sites = [site(i, neighbors=[neighbor(0, 1.0)]) for i in range(5)]
    html = plots.neighbor_matrix(sites)
    assert row_indices(html) == {str(i) for i in range(5)}
    assert "The first" not in html


def test_the_loss_heat_map_puts_the_given_noisy_site_first() -> None:
    rows = [round_row(f"id-{i:03d}", f"s{i:03d}", per_class_loss=[0.1, 0.2]) for i in range(205)]
    view = round_view(3, rows, classes=["0", "1"])
    html = plots.class_loss_heatmap(view, {"id-204": "noisy"})
    assert len(row_indices(html)) == 200
    labels = [t.text for t in svg_root(html).iter(f"{NS}text")]
    assert labels[2] == "s204"  # after the two column labels, the noisy site's row comes first
    assert "The first 200 of 205 sites of the round" in html
