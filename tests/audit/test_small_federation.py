"""Two to four sites: the calibrated evidence's narrower rule, "worse than the label prior"."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.audit.evidence import EvidenceDetector

LN2 = math.log(2.0)


def three_sites(noisy_loss: float = 1.5, noisy_sd: float = 0.5):
    """Two balanced classes, 5 + 5 samples per site; a and b clean, c at `noisy_loss`."""
    loss = np.array([[0.2, 0.2], [0.25, 0.25], [noisy_loss, noisy_loss]])
    counts = np.full((3, 2), 5)
    sd = np.array([[0.1, 0.1], [0.1, 0.1], [noisy_sd, noisy_sd]])
    return loss, counts, sd


def test_a_site_worse_than_the_prior_is_flagged_with_a_hand_checked_z():
    loss, counts, sd = three_sites()
    result = EvidenceDetector().fit(loss, counts, sd)
    assert result.status == "ok"
    assert [v.flag for v in result.verdicts] == [False, False, True]
    # c: L = 1.5, per-sample variance (5 * 0.25 + 5 * 0.25) / 10 = 0.25, se = sqrt(0.25 / 10)
    # = 0.158114; H = ln 2 = 0.693147; z = (1.5 - 0.693147) / 0.158114 = 5.1029.
    assert result.verdicts[2].score == pytest.approx(5.1029, abs=1e-3)
    # a: L = 0.2, variance 0.01, se 0.031623, z = (0.2 - 0.693147) / 0.031623 = -15.595.
    assert result.verdicts[0].score == pytest.approx(-15.595, abs=1e-2)
    assert result.verdicts[2].evidence.prior_loss == pytest.approx(LN2)
    # both classes are above their prior loss -log(0.5) = ln 2, equal excess: in class order
    assert result.verdicts[2].evidence.noisy_classes == [0, 1]
    assert result.verdicts[0].evidence.noisy_classes == []
    assert result.summary.mode.startswith("small federation")


def test_clean_small_federation_flags_nobody():
    loss, counts, sd = three_sites(noisy_loss=0.3, noisy_sd=0.2)
    result = EvidenceDetector().fit(loss, counts, sd)
    assert result.status == "ok"
    assert [v.flag for v in result.verdicts] == [False, False, False]


def test_a_site_just_below_the_prior_is_not_flagged():
    # mild noise: above the clean sites but under H; the rule does not see it (documented)
    loss, counts, sd = three_sites(noisy_loss=0.6, noisy_sd=0.3)
    result = EvidenceDetector().fit(loss, counts, sd)
    assert [v.flag for v in result.verdicts] == [False, False, False]


def test_two_of_three_worse_than_the_prior_is_inconclusive():
    loss, counts, sd = three_sites()
    loss[1] = [1.6, 1.6]
    sd[1] = [0.5, 0.5]
    result = EvidenceDetector().fit(loss, counts, sd)
    assert result.status == "inconclusive"
    assert [v.flag for v in result.verdicts] == [None, None, None]
    assert "not a clear minority" in (result.reason or "")


def test_a_model_that_beats_the_prior_nowhere_is_inconclusive():
    loss, counts, sd = three_sites()
    loss[:2] = 0.65  # barely under ln 2 on the other sites: 1 - L/H = 0.06 < 0.5
    result = EvidenceDetector().fit(loss, counts, sd)
    assert result.status == "inconclusive"
    assert "other sites either" in (result.reason or "")


def test_an_anchor_is_never_flagged_and_order_does_not_matter():
    loss, counts, sd = three_sites()
    anchored = EvidenceDetector().fit(loss, counts, sd, anchors=[False, False, True])
    assert [v.flag for v in anchored.verdicts] == [False, False, False]
    order = [2, 0, 1]
    permuted = EvidenceDetector().fit(loss[order], counts[order], sd[order])
    assert [v.flag for v in permuted.verdicts] == [True, False, False]


def test_false_alarm_rate_of_clean_small_federations_by_simulation():
    # 2-4 clean sites, 10 classes, skewed per-sample losses (gamma, mean 0.4) and 20-200 samples
    # per class: the loss sits far under H = ln 10, and no round of 500 flags anybody.
    rng = np.random.default_rng(0)
    flagged = 0
    for _ in range(500):
        k = int(rng.integers(2, 5))
        counts = rng.integers(20, 200, size=(k, 10))
        loss = np.zeros((k, 10))
        sd = np.zeros((k, 10))
        for i in range(k):
            for c in range(10):
                x = rng.gamma(0.5, 0.8 * (1 + 0.5 * rng.random()), size=counts[i, c])
                loss[i, c], sd[i, c] = x.mean(), x.std()
        result = EvidenceDetector().fit(loss, counts, sd)
        flagged += any(v is not None and v.flag for v in result.verdicts)
    assert flagged == 0


def test_a_model_that_knows_little_is_inconclusive_even_when_nobody_would_be_flagged():
    # Every site barely under ln 2 = 0.693147: nobody is worse than the prior, but the model
    # knows little. 1 - L/H per site: a 1 - 0.60/0.693147 = 0.1344, b 1 - 0.62/0.693147 =
    # 0.1055, c 1 - 0.65/0.693147 = 0.0622; equal sizes, so the weighted median is b's 0.1055.
    loss = np.array([[0.60, 0.60], [0.62, 0.62], [0.65, 0.65]])
    counts = np.full((3, 2), 5)
    sd = np.full((3, 2), 0.3)
    result = EvidenceDetector().fit(loss, counts, sd)
    assert result.status == "inconclusive"
    assert [v.flag for v in result.verdicts] == [None, None, None]
    assert result.reason == (
        "the global model does not clearly beat the label prior yet (median 1 - loss/H over "
        "the sites = 0.106 < 0.5): a site with wrong labels would not stand out"
    )
    assert result.summary.verdict == "inconclusive"
    assert result.summary.reason == result.reason
    assert result.summary.informativeness == pytest.approx(0.1055, abs=1e-4)


def test_a_model_that_beats_the_prior_half_way_gives_a_verdict():
    # 1 - L/H = 1 - 0.34/0.693147 = 0.5095 on every site: just over the threshold, nobody
    # flagged, the verdict is ok
    loss = np.full((3, 2), 0.34)
    counts = np.full((3, 2), 5)
    sd = np.full((3, 2), 0.2)
    result = EvidenceDetector().fit(loss, counts, sd)
    assert result.status == "ok"
    assert result.reason is None
    assert [v.flag for v in result.verdicts] == [False, False, False]


def test_a_site_claiming_most_samples_does_not_set_the_prior():
    # Four sites: two clean (loss 0.2 on balanced labels), one noisy (1.5, above ln 2 = 0.69)
    # and one claiming 10,000 samples of class 0 only. Pooled freely its samples made the prior
    # [10,150, 150] / 10,300 (H = 0.077 nats): every site lay above it and the round abstained
    # ("4 of 4 sites"). Each site now counts at most the median site's 100 samples
    # (sample_factor(4) = 1): the prior is [250, 150] / 400, H = 0.66, and only the noisy site
    # is worse than it.
    loss = np.array([[0.2, 0.2], [0.25, 0.15], [1.6, 1.4], [0.2, np.nan]])
    counts = np.array([[50, 50], [50, 50], [50, 50], [10000, 0]])
    sd = np.array([[0.5, 0.5], [0.5, 0.5], [0.8, 0.8], [0.5, np.nan]])
    result = EvidenceDetector().fit(loss, counts, sd)
    assert result.status == "ok", result.reason
    assert [bool(v is not None and v.flag) for v in result.verdicts] == [False, False, True, False]
    entropy = -(0.625 * math.log(0.625) + 0.375 * math.log(0.375))
    assert result.summary.label_entropy == pytest.approx(entropy)
