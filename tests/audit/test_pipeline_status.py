"""aggregation_flags="status": the aggregation's noisy set follows the status rule, not one flag."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.audit import (
    AuditConfig,
    InvalidInputError,
    InvalidParameterError,
    StatusHistory,
    StatusRule,
    run_audit,
)
from tests.audit.test_pipeline_overrides import GLOBAL, clients

# Fed-NCL flags client 0 (q = [18, 2, 2, 2], see test_pipeline_overrides.clients) and only it.
CONFIG = AuditConfig(detectors=("fedncl",), primary_detector="fedncl", aggregation="daagg")
NEW = StatusHistory()


def daagg_weights(distances: list[float]) -> np.ndarray:
    # equal n: w_k ∝ exp(-d_k / max d)
    d = np.asarray(distances)
    raw = np.exp(-d / d.max()) if d.max() > 0 else np.ones_like(d)
    return raw / raw.sum()


def test_status_is_the_default() -> None:
    assert AuditConfig().aggregation_settings.flags == "status"


def test_a_first_flag_does_not_change_the_aggregate() -> None:
    outcome = run_audit(GLOBAL, clients(), CONFIG, round_index=4)
    # the detector flags client 0 ...
    assert outcome.primary_flags == [True, False, False, False]
    # ... but one flag makes it "suspect" (m = 2 flags in w = 3 rounds for "noisy"), so DaAgg
    # has no noisy client: every d = 0 and the weights are FedAvg's, n / sum n = 1/4
    assert outcome.aggregation_flags == [False, False, False, False]
    np.testing.assert_allclose(outcome.aggregation.weights, [0.25] * 4)
    assert outcome.to_json()["aggregation_flags"] == [False, False, False, False]


def test_a_second_flag_makes_the_client_noisy_for_daagg() -> None:
    history = [StatusHistory(status="suspect", flags=[True]), NEW, NEW, NEW]
    outcome = run_audit(GLOBAL, clients(), CONFIG, round_index=4, status_history=history)
    assert outcome.aggregation_flags == [True, False, False, False]
    # d_0 = min_j ||3 - 1|| over 4 coordinates = 4 -> D_0 = 1: w_0 = e^-1 / (e^-1 + 3)
    assert outcome.aggregation.weights[0] == pytest.approx(math.exp(-1) / (math.exp(-1) + 3))


def test_a_noisy_client_stays_noisy_until_w_clean_rounds() -> None:
    # client 1 (not flagged now) was noisy with flags T, T, F: determined T, T, F, F -> the last
    # three hold one flag (< m) and one flag (not all clean): status kept, still noisy
    still = [NEW, StatusHistory(status="noisy", flags=[True, True, False]), NEW, NEW]
    outcome = run_audit(GLOBAL, clients(), CONFIG, round_index=4, status_history=still)
    assert outcome.aggregation_flags == [False, True, False, False]
    # client 1 is noisy, client 0 only suspect: d_1 = min over clean c0, c2, c3 of the distance
    # = ||1 - 1|| = 0 -> D = [0, 0, 0, 0] with max d = 0: DaAgg's recorded FedAvg fallback
    assert outcome.aggregation.rule == "fedavg"
    np.testing.assert_allclose(outcome.aggregation.weights, [0.25] * 4)
    # undetermined rounds (None) count neither way: T, T, None, F, F -> last three T, F, F
    gap = [NEW, StatusHistory(status="noisy", flags=[True, True, None, False]), NEW, NEW]
    outcome = run_audit(GLOBAL, clients(), CONFIG, round_index=4, status_history=gap)
    assert outcome.aggregation_flags == [False, True, False, False]
    # a third clean round in a row: F, F, F -> trusted again
    back = [NEW, StatusHistory(status="noisy", flags=[True, True, False, False]), NEW, NEW]
    outcome = run_audit(GLOBAL, clients(), CONFIG, round_index=4, status_history=back)
    assert outcome.aggregation_flags == [False, False, False, False]


def test_a_pin_wins_over_the_status() -> None:
    history = [StatusHistory(status="suspect", flags=[True]), NEW, NEW, NEW]
    trusted = run_audit(
        GLOBAL,
        clients(),
        CONFIG,
        round_index=4,
        status_history=history,
        flag_overrides=[False, None, None, None],
    )
    assert trusted.aggregation_flags == [False, False, False, False]
    noisy = run_audit(
        GLOBAL, clients(), CONFIG, round_index=4, flag_overrides=[None, True, None, None]
    )
    # client 0 is only suspect (no history), client 1 pinned noisy: d_1 = 0 -> FedAvg fallback
    assert noisy.aggregation_flags == [False, True, False, False]


def test_status_m_and_w_come_from_the_config() -> None:
    # m = 1: one flag is enough
    config = AuditConfig(
        detectors=("fedncl",),
        primary_detector="fedncl",
        aggregation="daagg",
        status=StatusRule(m=1),
    )
    outcome = run_audit(GLOBAL, clients(), config, round_index=4)
    assert outcome.aggregation_flags == [True, False, False, False]
    np.testing.assert_allclose(outcome.aggregation.weights, daagg_weights([4.0, 0.0, 0.0, 0.0]))


def test_rules_without_a_noisy_set_record_none() -> None:
    config = AuditConfig(detectors=("fedncl",), primary_detector="fedncl", aggregation="median")
    outcome = run_audit(GLOBAL, clients(), config, round_index=4)
    assert outcome.aggregation_flags is None
    assert outcome.to_json()["aggregation_flags"] is None


@pytest.mark.parametrize(
    ("history", "match"),
    [
        ([NEW], r"status_history: 1 entries for 4 clients"),
        ([NEW, NEW, NEW, "trusted"], r"status_history\[3\]: expected StatusHistory"),
        ([NEW, NEW, StatusHistory(status="calm"), NEW], r"status_history\[2\]: .*current"),
        (
            [NEW, StatusHistory(flags=[1]), NEW, NEW],  # type: ignore[list-item]
            r"status_history\[1\]: .*recent_flags\[0\]",
        ),
        ([NEW, StatusHistory(flags="TT"), NEW, NEW], r"status_history\[1\]\.flags"),  # type: ignore[arg-type]
    ],
)
def test_a_malformed_history_is_refused(history: list, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        run_audit(GLOBAL, clients(), CONFIG, round_index=4, status_history=history)


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(InvalidParameterError, match="aggregation_flags"):
        AuditConfig.from_flat(aggregation_flags="sometimes")
