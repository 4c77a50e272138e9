"""The text and name rules (service.inputs) on hand-picked strings, and the regular expressions
the OpenAPI document gives for them, which must agree with the checks."""

from __future__ import annotations

import re

import pytest

from service.inputs import (
    NAME_PATTERN,
    TEXT_PATTERN,
    json_depth_exceeds,
    name_problem,
    text_problem,
)

GOOD_NAMES = ["a", "hospital-a", "Hôpital Saint-Louis", "病院 東京", "مستشفى", " padded "]
BAD_NAMES = [
    "a\x00",
    "a\tb",
    "a\nb",
    "\x1b[31m",
    "a\x7f",
    "a\x85",
    "\u202eexe.txt",
    "a\u2066b",
    "a\u200fb",
    " ",
    "\u3000\u2003",
]


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_good_names(name: str) -> None:
    assert name_problem(name) is None
    assert re.search(NAME_PATTERN, name)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names(name: str) -> None:
    assert name_problem(name) is not None
    assert not re.search(NAME_PATTERN, name)


def test_text_keeps_tabs_and_line_breaks_but_no_other_control() -> None:
    assert text_problem("line one\nline two\r\n\tindented") is None
    assert re.search(TEXT_PATTERN, "line one\nline two\r\n\tindented")
    for bad, why in (("a\x00b", "NUL"), ("a\x07", "control"), ("a\x9b", "control")):
        problem = text_problem(bad)
        assert problem is not None
        assert why in problem
        assert not re.search(TEXT_PATTERN, bad)
    assert text_problem("a\ud800") == "must not contain unpaired surrogates"


def test_json_depth() -> None:
    assert not json_depth_exceeds({"a": [1, [2]]}, limit=3)
    assert json_depth_exceeds({"a": [1, [2, {}]]}, limit=3)
    assert not json_depth_exceeds("not a container", limit=0)
    deep: object = 0
    for _ in range(100_000):  # iterative: no RecursionError however deep
        deep = [deep]
    assert json_depth_exceeds(deep)
