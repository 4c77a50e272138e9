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
    # most common label is class 0: always answering it errs on 20 + 20 = 40 samples. The
    # sites err on 10 and 15: 1 - 25 / 40 = 0.375.
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
    # a site that did not send its counts is left out of both sums: site 1 alone, 1 - 15 / 20
    one = ReportedCounts(np.array([[0, 0], [5, 10]]), np.array([False, True]))
    assert model_informativeness(loss, counts, sizes, one)[2].accuracy == pytest.approx(0.25)


def test_a_model_siding_with_an_inverted_majority_by_a_hair_has_not_learned() -> None:
    # An independent review's counter-example. 20 binary sites of [50, 50]; 11 with inverted
    # labels. The model gives the majority's label p = 0.515: right on every sample of the 11,
    # wrong on every sample of the 9 clean ones. Always answering class 0 errs on 50 per site:
    # 1 - (9 x 100) / (20 x 50) = 0.1, below 0.25. 1 - L/H: L = -ln 0.515 on the 11 and
    # -ln 0.485 on the 9, median site 1 - 0.6636 / ln 2 = 0.043 < 0.05: the round abstains.
    k = 20
    counts = np.full((k, 2), 50)
    inverted = np.arange(k) < 11
    loss = np.where(inverted[:, None], -math.log(0.515), -math.log(0.485)) * np.ones((k, 2))
    wrong = np.where(inverted[:, None], 0, 50) * np.ones((k, 2), dtype=np.int64)
    sizes = counts.sum(axis=1).astype(np.float64)
    got = model_informativeness(loss, counts, sizes, ReportedCounts(wrong, np.ones(k, bool)))[2]
    assert got.accuracy == pytest.approx(0.1)
    assert not got.learned(0.05)
    result = EvidenceDetector().fit(loss, counts, np.full((k, 2), 0.05), per_class_errors=wrong)
    assert result.status == "inconclusive"
    assert not any(v is not None and v.flag for v in result.verdicts)


def test_a_model_answering_one_label_has_not_learned_under_label_skew() -> None:
    # The review's second counter-example: 5 sites hold only class 0 (110 samples each: the
    # most common label), 5 only class 1 (90 each); the model always answers class 1, wrong on
    # all 550 class-0 samples. Always answering class 0 errs on the 450 class-1 samples:
    # 1 - 550 / 450 = -0.222 (a median of per-site ratios over the sites holding some other
    # label than the most common would have been 1).
    counts = np.array([[110, 0]] * 5 + [[0, 90]] * 5)
    wrong = np.array([[110, 0]] * 5 + [[0, 0]] * 5)
    sizes = counts.sum(axis=1).astype(np.float64)
    loss = np.where(counts > 0, 1.0, np.nan)
    errors = ReportedCounts(wrong, np.ones(10, dtype=bool))
    got = model_informativeness(loss, counts, sizes, errors)[2]
    assert got.accuracy == pytest.approx(1 - 550 / 450)


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
    # 0.05). Its errors: 4 of 10 per class; site 0's labels are noisy: 9 errors per class and
    # loss 2.6. Pooled: 9 x 40 + 90 = 450 errors against 10 x 90 for always answering one
    # label, 1 - 450 / 900 = 0.5.
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
    assert counted.summary.accuracy_informativeness == pytest.approx(0.5)
    assert [i for i, v in enumerate(counted.verdicts) if v is not None and v.flag] == [0]
