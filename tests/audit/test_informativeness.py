"""Whether the consensus model beats the label prior (service.audit.evidence_abstention)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.audit.error_evidence import ReportedCounts
from service.audit.evidence import EvidenceDetector
from service.audit.evidence_abstention import (
    ACCURACY_INFORMATIVENESS,
    Informativeness,
    model_informativeness,
)


def test_both_measures_by_hand() -> None:
    # Two classes, 60 and 40 samples in all: H = -(0.6 ln 0.6 + 0.4 ln 0.4) = 0.673012. Site
    # 0 holds [30, 20], site 1 [30, 20]; losses 0.6 everywhere: 1 - 0.6 / H = 0.108479. The
    # most common label is class 0: always answering it errs on 20 of 50 (0.4) at each site.
    # Site 0 errs on 10 of 50 (0.2): 1 - 0.2 / 0.4 = 0.5; site 1 on 15 (0.3): 0.25. The
    # weighted median of two equal weights is their midpoint, 0.375.
    counts = np.array([[30, 20], [30, 20]])
    loss = np.full((2, 2), 0.6)
    sizes = counts.sum(axis=1).astype(np.float64)
    errors = ReportedCounts(np.array([[4, 6], [5, 10]]), np.array([True, True]))
    entropy, site_loss, got = model_informativeness(loss, counts, sizes, errors)
    assert entropy == pytest.approx(-(0.6 * math.log(0.6) + 0.4 * math.log(0.4)))
    assert site_loss.tolist() == pytest.approx([0.6, 0.6])
    assert got.loss == pytest.approx(1 - 0.6 / entropy)
    assert got.accuracy == pytest.approx(0.375)
    assert model_informativeness(loss, counts, sizes)[2].accuracy is None


def test_a_site_holding_only_the_most_common_label_does_not_enter_the_accuracy() -> None:
    counts = np.array([[50, 0], [30, 20]])
    sizes = counts.sum(axis=1).astype(np.float64)
    errors = ReportedCounts(np.array([[50, 0], [2, 3]]), np.array([True, True]))
    got = model_informativeness(np.full((2, 2), 0.6), counts, sizes, errors)[2]
    # only site 1: 1 - (5 / 50) / (20 / 50) = 0.75 (site 0's 50 errors do not count)
    assert got.accuracy == pytest.approx(0.75)


@pytest.mark.parametrize(
    ("loss", "accuracy", "learned"),
    [
        (0.01, None, False),
        (0.01, ACCURACY_INFORMATIVENESS - 0.01, False),
        (0.01, ACCURACY_INFORMATIVENESS, True),
        (0.05, None, True),
        (0.05, -0.5, True),
    ],
)
def test_either_measure_says_the_model_learned(
    loss: float, accuracy: float | None, learned: bool
) -> None:
    assert Informativeness(loss, accuracy).learned(0.05) is learned


def test_an_underconfident_model_that_is_right_is_not_abstained_on() -> None:
    # Ten sites of 10 classes, 10 samples each; the model is right on 6 of 10 samples per class
    # but hardly confident: every loss 2.2 against H = ln 10 = 2.303 (1 - L/H = 0.045, below
    # 0.05). Its errors: 4 of 10 per class against 9 of 10 for always answering one label,
    # 1 - 0.4 / 0.9 = 0.556. Site 0's labels are noisy: 9 errors per class and loss 2.6.
    k, c = 10, 10
    counts = np.full((k, c), 10)
    loss = np.full((k, c), 2.2)
    loss[0] = 2.6
    sd = np.full((k, c), 0.2)
    errors = np.full((k, c), 4)
    errors[0] = 9
    losses_only = EvidenceDetector().fit(loss, counts, sd)
    assert losses_only.status == "inconclusive"
    assert "does not beat the label prior" in str(losses_only.reason)
    counted = EvidenceDetector().fit(loss, counts, sd, per_class_errors=errors)
    assert counted.status == "ok"
    assert counted.summary["accuracy_informativeness"] == pytest.approx(1 - 0.4 / 0.9)
    assert [i for i, v in enumerate(counted.verdicts) if v is not None and v.flag] == [0]
