"""SVG helpers of the dashboard, with small literal inputs."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest

from service.api.dashboard import svg

NS = "{http://www.w3.org/2000/svg}"


def parse(text: str) -> ET.Element:
    root = ET.fromstring(text)  # well-formed XML, or this raises
    assert root.tag == f"{NS}svg"
    return root


def num(element: ET.Element, name: str) -> float:
    value = element.get(name)
    assert value is not None, f"{element.tag} has no {name}"
    return float(value)


def rects(root: ET.Element, css: str) -> list[ET.Element]:
    return [r for r in root.iter(f"{NS}rect") if css in (r.get("class") or "").split()]


@pytest.mark.parametrize(
    ("t", "expected"),
    [(0.0, "#ffffcc"), (0.5, "#fd8d3c"), (1.0, "#bd0026"), (-3.0, "#ffffcc"), (7.0, "#bd0026")],
)
def test_sequential_color_stops_and_clipping(t: float, expected: str) -> None:
    assert svg.sequential_color(t) == expected


def test_sequential_color_interpolates_between_stops() -> None:
    # halfway between (255,255,204) and (253,141,60): (254, 198, 132)
    assert svg.sequential_color(0.25) == "#fec684"


class TestHeatmap:
    def test_two_by_two_colours_positions_and_no_data(self) -> None:
        # Prepare: min 0.0 (pale), max 1.0 (dark red), 0.5 the middle stop, one absent value
        values: list[list[float | None]] = [[0.0, 1.0], [None, 0.5]]

        # Execute
        root = parse(svg.heatmap(values, ["a", "b"], ["c0", "c1"], cell=20))

        # Assert
        cells = {(int(num(r, "data-row")), int(num(r, "data-col"))): r for r in rects(root, "cell")}
        nodata = rects(root, "nodata")
        assert set(cells) == {(0, 0), (0, 1), (1, 1)}
        assert [(r.get("data-row"), r.get("data-col")) for r in nodata] == [("1", "0")]
        assert cells[0, 0].get("fill") == "#ffffcc"
        assert cells[0, 1].get("fill") == "#bd0026"
        assert cells[1, 1].get("fill") == "#fd8d3c"
        assert nodata[0].get("fill") == svg.NO_DATA_FILL
        assert nodata[0].get("fill") not in {c.get("fill") for c in cells.values()}
        x00, y00 = num(cells[0, 0], "x"), num(cells[0, 0], "y")
        assert num(cells[0, 1], "x") == x00 + 20
        assert num(cells[0, 1], "y") == y00
        assert num(nodata[0], "x") == x00
        assert num(nodata[0], "y") == y00 + 20
        assert cells[1, 1].find(f"{NS}title").text == "b, c1: 0.5"

    def test_nan_is_no_data_and_equal_values_take_the_middle_colour(self) -> None:
        root = parse(svg.heatmap([[2.0, math.nan, 2.0]], ["a"], ["x", "y", "z"]))
        assert [r.get("fill") for r in rects(root, "cell")] == ["#fd8d3c", "#fd8d3c"]
        assert len(rects(root, "nodata")) == 1

    def test_labels_are_escaped(self) -> None:
        text = svg.heatmap([[1.0]], ["<script>alert(1)</script>"], ['"&'])
        assert "<script>" not in text
        root = parse(text)
        labels = [t.text for t in root.iter(f"{NS}text")]
        assert "<script>alert(1)</scrip\u2026" in labels
        assert '"&' in labels


def test_bar_chart_lengths_are_proportional_and_missing_has_no_bar() -> None:
    root = parse(svg.bar_chart(["a", "b", "c"], [0.5, 0.25, None], width=200))
    bars = rects(root, "bar")
    assert [num(b, "width") for b in bars] == [200.0, 100.0]
    assert "n/a" in [t.text for t in root.iter(f"{NS}text")]


def test_flag_grid_one_cell_per_client_and_round() -> None:
    cells = [["warmup", "flagged", "clear"], ["warmup", "absent", "undetermined"]]
    root = parse(svg.flag_grid(["a", "b"], [0, 1, 2], cells))
    flags = rects(root, "flag")
    assert len(flags) == 6
    assert [f.get("fill") for f in rects(root, "flagged")] == [svg.FLAG_CELLS["flagged"][0]]
    assert flags[4].find(f"{NS}title").text == "b, round 1: no update"
