"""Status history rule (docs/algorithms.md, status) and FedRN expertise (FedRN eq. 4)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from service.audit import (
    InvalidInputError,
    InvalidParameterError,
    expertise,
    expertise_detection,
    next_status,
)
from service.audit.verdict_types import ExpertiseVerdictEvidence
from tests.audit._readers import present


class TestNextStatus:
    @pytest.mark.parametrize(
        ("current", "flags", "expected"),
        [
            # no history: unchanged
            ("trusted", [], "trusted"),
            ("noisy", [None, None], "noisy"),
            # flagged once: suspect (1 < m = 2)
            ("trusted", [False, False, True], "suspect"),
            # flagged in 2 of the last 3 determined rounds: noisy
            ("suspect", [True, False, True], "noisy"),
            ("trusted", [True, True], "noisy"),
            # the third-last flag drops out of the window of 3: [F, F, T] -> suspect
            ("trusted", [True, False, False, True], "suspect"),
            # undetermined rounds are skipped: determined [T, F, T] -> noisy
            ("suspect", [True, None, False, None, True, None], "noisy"),
            # a suspect stays suspect until w clean rounds: determined [T, F]
            ("suspect", [True, False], "suspect"),
            ("suspect", [True, False, False], "suspect"),  # window [T, F, F]: 1 flag, not 3 clean
            ("suspect", [True, False, False, False], "trusted"),
            # a noisy client stays noisy until w clean rounds, even if flagged once
            ("noisy", [True, False, False], "noisy"),
            ("noisy", [False, False, True], "noisy"),
            ("noisy", [True, False, None, False, None, False], "trusted"),
            # fewer than w determined rounds, all clean: unchanged
            ("noisy", [False, False], "noisy"),
            ("trusted", [False], "trusted"),
        ],
    )
    def test_default_rule(self, current, flags, expected):
        assert next_status(current, flags) == expected

    def test_other_window(self):
        # m = 1, w = 1: noisy as soon as flagged, trusted after one clean round
        assert next_status("trusted", [True], m=1, w=1) == "noisy"
        assert next_status("noisy", [True, False], m=1, w=1) == "trusted"
        # m = 3, w = 5: [T, F, T, F, T] has 3 flags -> noisy
        assert next_status("trusted", [True, False, True, False, True], m=3, w=5) == "noisy"

    def test_numpy_booleans_accepted(self):
        assert next_status("trusted", [np.True_, np.True_]) == "noisy"  # type: ignore[list-item]

    @pytest.mark.parametrize(
        ("kwargs", "error", "match"),
        [
            ({"current": "clean"}, InvalidParameterError, "current"),
            ({"m": 4}, InvalidParameterError, "m"),
            ({"m": 0}, InvalidParameterError, "m"),
            ({"w": 0}, InvalidParameterError, "w"),
            ({"recent_flags": [1]}, InvalidInputError, r"recent_flags\[0\]"),
        ],
    )
    def test_bad_arguments(self, kwargs, error, match):
        arguments = {"current": "trusted", "recent_flags": [True]} | kwargs
        with pytest.raises(error, match=match):
            next_status(**arguments)


class TestExpertise:
    def test_min_max(self):
        # (acc - 0.5) / (0.9 - 0.5)
        assert expertise([0.5, 0.7, 0.9, 0.6]).tolist() == pytest.approx([0, 0.5, 1, 0.25])

    def test_all_equal_is_ones(self):
        assert expertise([0.8, 0.8, 0.8]).tolist() == [1.0, 1.0, 1.0]
        assert expertise([0.3]).tolist() == [1.0]

    def test_empty(self):
        assert expertise([]).tolist() == []

    def test_out_of_range(self):
        with pytest.raises(InvalidInputError, match="<= 1"):
            expertise([0.5, 1.2])
        with pytest.raises(InvalidInputError, match=">= 0"):
            expertise([-0.1])

    def test_detection_result(self):
        result = expertise_detection([0.5, 0.9])
        assert result.method == "expertise"
        assert result.status == "ok"
        assert result.flags == [None, None]
        assert result.scores == [0.0, 1.0]
        assert present(result.verdicts[1]).evidence == ExpertiseVerdictEvidence(train_accuracy=0.9)
        json.dumps(result.to_json(), allow_nan=False)
        empty = expertise_detection([])
        assert empty.status == "undetermined"
        assert empty.verdicts == []
