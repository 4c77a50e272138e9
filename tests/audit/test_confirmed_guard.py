"""FedNoRo's separation guard for a group already confirmed noisy (``confirmed`` /
``AuditConfig.fednoro_confirmed_groups``): D >= 2 suffices, the calibrated quantile does not
apply."""

from __future__ import annotations

import numpy as np
import pytest

from service.audit import (
    AuditConfig,
    ClientRoundData,
    DictStateReader,
    FedNoRoDetector,
    FedNoRoSettings,
    InvalidInputError,
    InvalidParameterError,
    StatusHistory,
    run_audit,
)
from service.audit.detectors.separation import null_separation_threshold
from tests.audit._readers import given
from tests.audit._synthetic import loss_clients

# Ten clients, two classes, 20 samples of each. Clients 6-9 lose more on both classes, but
# their group is spread out (class-standardised excess about 0.7, 0.9, 2.0, 2.6 against -1.7
# to -0.3 for the others): the mixture puts exactly 6-9 in its noisy group, with Ashman's D
# between 2 (the first design's fixed threshold) and the calibrated threshold for 4 of 10 (5.1).
LOSS = np.array(
    [
        [0.30, 0.32],
        [0.34, 0.40],
        [0.38, 0.36],
        [0.42, 0.46],
        [0.46, 0.42],
        [0.50, 0.52],
        [0.62, 0.66],
        [0.70, 0.64],
        [0.80, 0.84],
        [0.95, 0.88],
    ]
)
COUNTS = np.full((10, 2), 20)
GROUP = np.arange(10) >= 6
NOBODY = np.zeros(10, dtype=bool)


def MAJORITY() -> FedNoRoDetector:  # noqa: N802 (reads as the detector it builds)
    """The detector judging the majority's group only: the rule these cases were built for
    (with ``separation_groups="all_fits"``, the default, other fits' groups are judged too;
    ``test_separation_groups.py``)."""
    return FedNoRoDetector(separation_groups="majority")


def confirmed(*clients: int) -> np.ndarray:
    out = np.zeros(10, dtype=bool)
    out[list(clients)] = True
    return out


def test_the_case_lies_between_the_two_thresholds() -> None:
    detector = MAJORITY().fit(LOSS, COUNTS)
    summary = detector.result_.summary
    assert summary.mixture_noisy_count == 4
    d = detector.ashman_d_
    assert d is not None
    assert 2.0 <= d < null_separation_threshold(10, 4) == summary.separation_threshold
    # a new group: the calibrated guard holds the flags back
    np.testing.assert_array_equal(detector.labels_, NOBODY)
    assert summary.separation_confirmed_group is False


@pytest.mark.parametrize(
    "known",
    [confirmed(6, 7, 8, 9), confirmed(4, 5, 6, 7, 8, 9), np.ones(10, dtype=bool)],
    ids=["exactly", "superset", "everybody"],
)
def test_a_group_within_the_confirmed_clients_keeps_its_flags(known: np.ndarray) -> None:
    detector = MAJORITY().fit(LOSS, COUNTS, known)
    np.testing.assert_array_equal(detector.labels_, GROUP)
    summary = detector.result_.summary
    assert summary.separation_confirmed_group is True
    assert summary.separation_threshold == 2.0
    assert "already noisy" in given(summary.guard)


@pytest.mark.parametrize(
    "known",
    [confirmed(7, 8, 9), confirmed(0, 1, 2), NOBODY],
    ids=["one-member-new", "others", "none"],
)
def test_a_group_with_a_new_member_needs_the_calibrated_threshold(known: np.ndarray) -> None:
    detector = MAJORITY().fit(LOSS, COUNTS, known)
    np.testing.assert_array_equal(detector.labels_, NOBODY)
    assert detector.result_.summary.separation_confirmed_group is False


def test_a_confirmed_group_below_d_2_is_not_flagged() -> None:
    # two clusters in the per-class losses (clients 0-5 lose more on class 1, clients 6-9 on
    # class 0), so the mixture splits them, but every client's total excess is about 0: D < 2
    loss = np.array(
        [
            [0.30, 0.60],
            [0.32, 0.62],
            [0.34, 0.58],
            [0.31, 0.61],
            [0.33, 0.63],
            [0.35, 0.59],
            [0.60, 0.31],
            [0.62, 0.33],
            [0.64, 0.30],
            [0.61, 0.32],
        ]
    )
    detector = MAJORITY().fit(loss, COUNTS, np.ones(10, dtype=bool))
    d = detector.ashman_d_
    assert given(detector.result_.summary.mixture_noisy_count) > 0
    assert d is not None
    assert d < 2.0
    np.testing.assert_array_equal(detector.labels_, NOBODY)


def test_the_rule_is_permutation_invariant() -> None:
    order = np.array([9, 3, 6, 0, 8, 1, 7, 2, 5, 4])
    detector = MAJORITY().fit(LOSS[order], COUNTS[order], confirmed(6, 7, 8, 9)[order])
    np.testing.assert_array_equal(detector.labels_, GROUP[order])


@pytest.mark.parametrize(
    ("known", "match"),
    [(np.ones(9, dtype=bool), r"confirmed: shape \(9,\)"), (np.ones((10, 1)), "confirmed")],
)
def test_a_malformed_confirmed_is_refused(known: np.ndarray, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        MAJORITY().fit(LOSS, COUNTS, known)


# -- through run_audit: the statuses before the round are the confirmed clients ---------------


def round_clients() -> list[ClientRoundData]:
    return loss_clients(LOSS, COUNTS)


GLOBAL = DictStateReader({"w": np.zeros(2, dtype=np.float32)})
NOISY_BEFORE = [
    StatusHistory(status="noisy" if k >= 6 else "trusted", flags=[k >= 6] * 2) for k in range(10)
]
DETECTOR_ONLY = AuditConfig(detectors=("fednoro",), primary_detector="fednoro")


def test_run_audit_reads_the_noisy_statuses_as_confirmed() -> None:
    outcome = run_audit(
        GLOBAL, round_clients(), DETECTOR_ONLY, round_index=5, status_history=NOISY_BEFORE
    )
    assert outcome.primary_flags == GROUP.tolist()
    # without the history (or with every client trusted) the group is new: no flag
    fresh = run_audit(GLOBAL, round_clients(), DETECTOR_ONLY, round_index=5)
    assert fresh.primary_flags == [False] * 10


def test_the_relief_can_be_switched_off() -> None:
    config = AuditConfig(
        detectors=("fednoro",),
        primary_detector="fednoro",
        fednoro=FedNoRoSettings(confirmed_groups=False),
    )
    outcome = run_audit(GLOBAL, round_clients(), config, round_index=5, status_history=NOISY_BEFORE)
    assert outcome.primary_flags == [False] * 10
    with pytest.raises(InvalidParameterError, match="fednoro_confirmed_groups"):
        AuditConfig.from_flat(fednoro_confirmed_groups="yes")
