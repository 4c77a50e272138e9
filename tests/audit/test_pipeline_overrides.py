"""flag_overrides (an admin's pins) reach the aggregation; the detectors' verdicts stay as found."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.audit import (
    AggregationSettings,
    AuditConfig,
    ClientRoundData,
    DictStateReader,
    InvalidInputError,
    run_audit,
)


def clients() -> list[ClientRoundData]:
    # theta_G = 0; client 0 sends all 3.0, the others all 1.0; equal n and train loss.
    # Fed-NCL e = ||theta_k||^2 over 4 floats: 36 for client 0, 4 for the others; q = e * loss.
    # q = [36, 4, 4, 4] * 0.5 = [18, 2, 2, 2]; mean 6, population std sqrt((144 + 3 * 16) / 4)
    # = sqrt(48) = 6.93; 18 - 6 = 12 > 6.93 -> client 0 flagged, the others not.
    out = []
    for i, value in enumerate([3.0, 1.0, 1.0, 1.0]):
        out.append(
            ClientRoundData(
                client_id=f"c{i}",
                num_samples=10,
                class_counts=[5, 5],
                train_loss=0.5,
                state=DictStateReader({"w": np.full(4, value, dtype=np.float32)}),
            )
        )
    return out


# "round": the aggregation reads this round's flags (the status mode is in test_pipeline_status)
CONFIG = AuditConfig(
    detectors=("fedncl",),
    primary_detector="fedncl",
    aggregation="daagg",
    aggregation_settings=AggregationSettings(flags="round"),
)
GLOBAL = DictStateReader({"w": np.zeros(4, dtype=np.float32)})


def test_detector_flag_drives_daagg_without_overrides() -> None:
    outcome = run_audit(GLOBAL, clients(), CONFIG, round_index=0)
    assert outcome.primary_flags == [True, False, False, False]
    # DaAgg: d_0 = min_j ||3 - 1|| over 4 coordinates = 4, D_0 = 1; w ∝ n * exp(-D):
    # w_0 = e^-1 / (e^-1 + 3) = 0.36788 / 3.36788 = 0.109232
    assert outcome.aggregation.weights[0] == pytest.approx(math.exp(-1) / (math.exp(-1) + 3))
    assert outcome.effective_flags is None


def test_trusted_pin_overrides_the_flag_for_aggregation() -> None:
    outcome = run_audit(
        GLOBAL, clients(), CONFIG, round_index=0, flag_overrides=[False, None, None, None]
    )
    # the detector still says client 0 is noisy ...
    assert outcome.primary_flags == [True, False, False, False]
    assert outcome.detections["fedncl"].verdicts[0].flag is True
    # ... but nobody is noisy for DaAgg: every d = 0, plain FedAvg weights n / sum n = 1/4
    assert outcome.effective_flags == [False, False, False, False]
    np.testing.assert_allclose(outcome.aggregation.weights, [0.25] * 4)
    assert outcome.to_json()["effective_flags"] == [False, False, False, False]


def test_noisy_pin_on_a_clean_client() -> None:
    outcome = run_audit(
        GLOBAL, clients(), CONFIG, round_index=0, flag_overrides=[None, True, None, None]
    )
    assert outcome.effective_flags == [True, True, False, False]
    # d_0 = min(||3-1|| over clean 2, 3) = 4, d_1 = min(||1-1||) = 0 -> D = [1, 0, 0, 0]
    expected = np.array([math.exp(-1), 1.0, 1.0, 1.0])
    np.testing.assert_allclose(outcome.aggregation.weights, expected / expected.sum())


def test_override_length_is_checked() -> None:
    with pytest.raises(InvalidInputError, match="flag_overrides"):
        run_audit(GLOBAL, clients(), CONFIG, round_index=0, flag_overrides=[True])
