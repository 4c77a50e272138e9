"""Schedule scaling (docs/algorithms.md, schedules)."""

from __future__ import annotations

import pytest

from service.audit import InvalidParameterError, scale_rounds


@pytest.mark.parametrize(
    ("value", "paper", "planned", "expected"),
    [
        (10, 100, 50, 5),  # FedNoRo warm-up T1 on a 50-round run: 10 * 50 / 100
        (39, 100, 30, 12),  # FedNoRo ramp: 11.7 -> 12
        (60, 150, 100, 40),  # Fed-NCL T_corr: 60 * 100 / 150
        (5, 100, 50, 3),  # 2.5 rounds half up (not to even) -> 3
        (7, 100, 50, 4),  # 3.5 -> 4
        (1, 100, 10, 1),  # 0.1 -> 0 -> at least 1
        (0, 100, 50, 1),  # 0 -> at least 1
        (100, 100, 100, 100),
        (50, 300, 900, 150),  # FLR R_w on a longer run
    ],
)
def test_scale_rounds(value, paper, planned, expected):
    assert scale_rounds(value, paper, planned) == expected


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((-1, 100, 50), "paper_value"),
        ((10, 0, 50), "paper_rounds"),
        ((10, 100, 0), "planned_rounds"),
        ((10.0, 100, 50), "paper_value"),
        ((True, 100, 50), "paper_value"),
    ],
)
def test_bad_arguments(args, match):
    with pytest.raises(InvalidParameterError, match=match):
        scale_rounds(*args)
