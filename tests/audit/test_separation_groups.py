"""FedNoRo's separation guard over every group the mixture's fits propose
(``separation_groups="all_fits"`` / ``AuditConfig.fednoro_separation_groups``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.audit import (
    AuditConfig,
    DictStateReader,
    FedNoRoDetector,
    FedNoRoSettings,
    InvalidParameterError,
    run_audit,
)
from service.audit.detectors.separation import null_separation_threshold
from tests.audit._readers import given
from tests.audit._synthetic import loss_clients

# Ten clients, two classes, 20 samples of each. Clients 0-5 lose little on both classes, 6-8
# much on both, and client 9 much on class 0 only (V2 seed 0's client-08 in small). The nine
# fits disagree: most put 6-8 in the noisy group, one puts 6-9 there.
LOSS = np.array(
    [
        [0.43, 0.23],
        [0.22, 0.22],
        [0.42, 0.36],
        [0.32, 0.24],
        [0.37, 0.28],
        [0.38, 0.32],
        [1.00, 1.12],
        [0.84, 1.03],
        [0.88, 1.12],
        [1.10, 0.30],
    ]
)
COUNTS = np.full((10, 2), 20)
THREE = np.arange(10) >= 6
THREE[9] = False
FOUR = np.arange(10) >= 6
NOBODY = np.zeros(10, dtype=bool)


def excess(loss: np.ndarray) -> np.ndarray:
    """The class-standardised excess for equal counts, written out (an independent oracle):
    z_kc = (L_kc - mean_c) / std_c (population std), Z_k = (z_k0 + z_k1) / sqrt(2)."""
    z = (loss - loss.mean(axis=0)) / loss.std(axis=0)
    return z.sum(axis=1) / math.sqrt(2.0)


def ashman(values: np.ndarray, group: np.ndarray) -> float:
    a, b = values[group], values[~group]
    return math.sqrt(2.0) * abs(a.mean() - b.mean()) / math.sqrt(a.var() + b.var())


def test_the_case_the_majority_misses() -> None:
    detector = FedNoRoDetector(separation_groups="majority").fit(LOSS, COUNTS)
    summary = detector.result_.summary
    np.testing.assert_array_equal(detector.labels_, NOBODY)
    assert summary.mixture_noisy_count == 3
    assert summary.groups_tested == 1
    d_three = ashman(excess(LOSS), THREE)
    assert detector.ashman_d_ == pytest.approx(d_three)
    assert d_three < null_separation_threshold(10, 3) == summary.separation_threshold


def test_all_fits_flags_the_minority_group_that_passes_the_corrected_threshold() -> None:
    detector = FedNoRoDetector(separation_groups="all_fits").fit(LOSS, COUNTS)
    summary = detector.result_.summary
    np.testing.assert_array_equal(detector.labels_, FOUR)
    assert summary.groups_tested == 2
    assert summary.group_rank == 1  # not the majority's group
    assert given(summary.vote_count) < 9 - given(summary.vote_count)
    # two groups tested: each at 1 - 0.01 / 2
    assert summary.separation_quantile_judged == pytest.approx(0.995)
    corrected = null_separation_threshold(10, 4, 0.995)
    assert summary.separation_threshold == pytest.approx(corrected)
    d_four = ashman(excess(LOSS), FOUR)
    assert detector.ashman_d_ == pytest.approx(d_four)
    assert d_four >= corrected
    # the majority's group was tested first, at its own corrected level, and failed
    assert ashman(excess(LOSS), THREE) < null_separation_threshold(10, 3, 0.995)
    assert summary.guard.startswith("separation guard passed (2 different groups")
    assert "each at the 0.995 quantile; flagged: the group of 1 fit(s)" in given(summary.guard)


def test_when_the_fits_agree_all_fits_is_the_majority_rule() -> None:
    # two well separated groups: every fit finds clients 7-9
    loss = np.array([[0.2 + 0.01 * k, 0.3 + 0.01 * k] for k in range(7)] + [[1.5, 1.6]] * 3)
    loss[7:] += np.array([[0.0, 0.02], [0.03, 0.0], [0.01, 0.05]])
    majority = FedNoRoDetector(separation_groups="majority").fit(loss, COUNTS)
    every = FedNoRoDetector().fit(loss, COUNTS)
    assert every.result_.summary.groups_tested == 1
    np.testing.assert_array_equal(every.labels_, majority.labels_)
    np.testing.assert_array_equal(every.labels_, np.arange(10) >= 7)
    assert (
        every.result_.summary.separation_threshold
        == majority.result_.summary.separation_threshold
        == pytest.approx(null_separation_threshold(10, 3))
    )


def test_a_confirmed_group_needs_only_d_2_among_all_fits() -> None:
    # the majority's three are already noisy: their group passes on D >= 2 and comes first
    known = THREE.copy()
    detector = FedNoRoDetector(separation_groups="all_fits").fit(LOSS, COUNTS, known)
    np.testing.assert_array_equal(detector.labels_, THREE)
    summary = detector.result_.summary
    assert summary.separation_confirmed_group is True
    assert summary.separation_threshold == 2.0


def test_all_fits_needs_a_quantile() -> None:
    with pytest.raises(InvalidParameterError, match="all_fits"):
        FedNoRoDetector(separation_groups="all_fits", separation_quantile=None).fit(LOSS, COUNTS)
    with pytest.raises(InvalidParameterError, match="separation_groups"):
        FedNoRoDetector(separation_groups="every").fit(LOSS, COUNTS)
    with pytest.raises(InvalidParameterError, match="fednoro_separation_groups"):
        FedNoRoSettings(separation_groups="all_fits", separation_quantile=None)
    with pytest.raises(InvalidParameterError, match="fednoro_separation_groups"):
        AuditConfig.from_flat(fednoro_separation_groups="every")


def test_run_audit_passes_the_setting_to_the_detector() -> None:
    clients = loss_clients(LOSS, COUNTS)
    start = DictStateReader({"w": np.zeros(2, dtype=np.float32)})

    def flags(groups: str) -> list[bool | None]:
        config = AuditConfig(
            detectors=("fednoro",),
            primary_detector="fednoro",
            fednoro=FedNoRoSettings(separation_groups=groups),
        )
        return run_audit(start, clients, config, round_index=5).primary_flags

    assert flags("majority") == NOBODY.tolist()
    assert flags("all_fits") == FOUR.tolist()


def test_when_no_group_passes_nobody_is_flagged_and_the_majority_is_reported() -> None:
    # at the 0.9999 quantile (0.99995 for each of the two groups) neither group passes
    detector = FedNoRoDetector(separation_groups="all_fits", separation_quantile=0.9999)
    detector.fit(LOSS, COUNTS)
    summary = detector.result_.summary
    np.testing.assert_array_equal(detector.labels_, NOBODY)
    assert summary.group_rank == 0
    assert summary.mixture_noisy_count == 3
    assert detector.ashman_d_ == pytest.approx(ashman(excess(LOSS), THREE))
    assert summary.separation_threshold == pytest.approx(
        null_separation_threshold(10, 3, 1 - 0.0001 / 2)
    )
    assert "none passed; the most voted of them is shown" in given(summary.guard)
    assert summary.separation_quantile_judged == pytest.approx(1 - 0.0001 / 2)


def test_without_the_guard_the_flags_are_the_papers_vote() -> None:
    # paper-exact runs (no guard): the majority's group, whatever the other fits propose
    detector = FedNoRoDetector(require_separation=False).fit(LOSS, COUNTS)
    np.testing.assert_array_equal(detector.labels_, THREE)
    assert detector.result_.summary.groups_tested == 1
    # and no quantile is needed then
    plain = FedNoRoDetector(require_separation=False, separation_quantile=None)
    np.testing.assert_array_equal(plain.fit(LOSS, COUNTS).labels_, THREE)
    FedNoRoSettings(require_separation=False, separation_quantile=None)


def test_all_fits_is_the_default_of_the_audit() -> None:
    config = AuditConfig(detectors=("fednoro",), primary_detector="fednoro")
    outcome = run_audit(
        DictStateReader({"w": np.zeros(2, dtype=np.float32)}),
        loss_clients(LOSS, COUNTS),
        config,
        round_index=5,
    )
    assert outcome.primary_flags == FOUR.tolist()


def test_a_one_sided_majority_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    # Make five of the nine fits put every client in the noisy component (injected into
    # sklearn, not into the detector). That one-sided "group" is the majority but splits
    # nobody, so the guard judges the others; the majority rule finds no two groups.
    from sklearn.mixture import GaussianMixture

    real_predict = GaussianMixture.predict

    def some_one_sided(self: GaussianMixture, x: np.ndarray) -> np.ndarray:
        if self.random_state < 5:
            return np.full(len(x), int(np.argmax(self.means_.sum(axis=1))))
        return np.asarray(real_predict(self, x))

    monkeypatch.setattr(GaussianMixture, "predict", some_one_sided)
    majority = FedNoRoDetector(separation_groups="majority").fit(LOSS, COUNTS)
    assert majority.ashman_d_ is None
    assert "every client on one side" in given(majority.result_.summary.guard)
    every = FedNoRoDetector().fit(LOSS, COUNTS)
    summary = every.result_.summary
    # the four other fits all propose clients 6-8: one group judged, at the plain quantile
    assert summary.group_rank == 1
    assert summary.groups_tested == 1
    assert summary.vote_count == 4
    assert summary.mixture_noisy_count == 3
    assert every.ashman_d_ == pytest.approx(ashman(excess(LOSS), THREE))
    assert summary.separation_threshold == pytest.approx(null_separation_threshold(10, 3))
    # D 5.23 < 5.38 for 3 of 10: judged, and nobody flagged
    np.testing.assert_array_equal(every.labels_, NOBODY)
    assert "not separated" in given(summary.guard)
