"""A clean federation of very unequal, label-skewed sites (the fourth held-out draw's h4-08).

Six clean BreastMNIST sites at Dirichlet(0.3) hold 376, 1, 109, 10, 34 and 94 samples; the last
holds 88 of the federation's 168 malignant images (class 0) and 6 benign ones. The global model
gets that site's malignant images wrong more often, and more confidently, than the other sites'
(loss 1.02 against 0.02-0.43; 16 of its 25 errors confident, against 1 of the other sites' 8
errors in the class), and it was flagged in 5 of 27 rounds. Two parts of the null model were too
sure of themselves: the class's between-site spread was fitted as 0 because the holders of one
and two samples (which say nothing about it) sat near the centre and pulled the median residual
down, and the confident share of the class was taken as known when it rested on 8 errors.
The inputs below are that round's signals as the sites sent them (round 21 of the FedAvg
federation, seed 0).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.audit.class_null import class_evidence
from service.audit.evidence import EvidenceDetector

NAN = math.nan
COUNTS = np.array([[24, 352], [1, 0], [43, 66], [10, 0], [2, 32], [88, 6]])
LOSS = np.array(
    [
        [0.015277, 0.354436],
        [0.010598, NAN],
        [0.293891, 0.104096],
        [0.431843, NAN],
        [0.006690, 0.510242],
        [1.022056, 0.184058],
    ]
)
SD = np.array(
    [
        [0.017394, 0.617097],
        [0.0, NAN],
        [0.437853, 0.177871],
        [0.750669, NAN],
        [0.004800, 0.933771],
        [1.768636, 0.298016],
    ]
)
ERRORS = np.array([[0, 59], [0, 0], [5, 1], [3, 0], [0, 8], [25, 1]])
CONFIDENT = np.array([[0, 8], [0, 0], [0, 0], [1, 0], [0, 1], [16, 0]])


def test_the_class_spread_is_fitted_on_the_holders_of_five_or_more() -> None:
    # Class 0 without the holders of 1 and 2 samples: losses 0.01528, 0.29389, 0.43184, 1.02206
    # with standard errors 0.144, 0.107, 0.250, 0.190 (the pooled variance over n). The centre
    # is the second site's 0.29389 (the weighted median), and tau^2 = t solves the median of the
    # four |residuals| = 0.6745, i.e. the mean of the second and third:
    # (0.13795 / sqrt(0.0625 + t) + 0.27861 / sqrt(0.0207 + t)) / 2 = 0.6745 at t = 0.0635,
    # tau = 0.252. With every holder in the fit (min_fit_count 1, the rule before) the two tiny
    # holders' residuals (0.40, 0.58) made the median 0.565 already at tau = 0.
    loss, sd = np.nan_to_num(LOSS), np.nan_to_num(SD)
    before = class_evidence(loss, COUNTS, sd)
    after = class_evidence(loss, COUNTS, sd, min_fit_count=5)
    assert before.tau[0] == 0.0
    assert before.z[5, 0] > 3.0
    assert after.mu[0] == pytest.approx(0.293891)
    assert after.tau[0] == pytest.approx(0.252, abs=0.002)
    assert after.z[5, 0] == pytest.approx(1.98, abs=0.01)
    # class 1: every holder has 6 samples or more, nothing changes
    assert after.tau[1] == before.tau[1]
    assert np.array_equal(after.z[:, 1], before.z[:, 1], equal_nan=True)


def test_holders_of_a_handful_at_the_centre_do_not_shrink_the_spread() -> None:
    # Five holders of 30 samples whose losses differ beyond their standard errors, then the
    # same five plus four holders of one or two samples at the centre: with min_fit_count 5 the
    # centre and tau are the five's (tau within 1 %: the tiny holders' spreads still enter the
    # pooled within-site variance); with every holder in the fit, tau falls to 0 (0.204 alone).
    rng = np.random.default_rng(0)
    five = np.array([0.2, 0.35, 0.5, 0.65, 0.8])
    loss = np.concatenate([five, np.full(4, 0.5)])[:, None]
    counts = np.array([30, 30, 30, 30, 30, 1, 2, 1, 2])[:, None]
    sd = rng.uniform(0.4, 0.6, size=(9, 1))
    alone = class_evidence(loss[:5], counts[:5], sd[:5])
    fitted = class_evidence(loss, counts, sd, min_fit_count=5)
    every = class_evidence(loss, counts, sd)
    assert alone.tau[0] > 0.1
    assert fitted.mu[0] == pytest.approx(alone.mu[0])
    assert fitted.tau[0] == pytest.approx(alone.tau[0], rel=0.01)
    assert every.tau[0] == 0.0
    # the tiny holders still get their z
    assert np.isfinite(fitted.z[5:, 0]).all()


def test_the_clean_site_holding_most_of_the_minority_class_is_not_flagged() -> None:
    result = EvidenceDetector().fit(
        LOSS, COUNTS, SD, per_class_errors=ERRORS, per_class_confident_errors=CONFIDENT
    )
    assert result.status == "ok"
    assert not any(v.flag for v in result.verdicts if v is not None)
    site = result.verdicts[5]
    assert site is not None
    # its confident share, 16 of 25, against a share estimated from 8 errors elsewhere: the
    # estimate's own variance (an intra-site correlation of about 0.1, above rho's 0.05) keeps
    # the p-value at 0.0031 (3e-4 with the share taken as known); the site's p is three times
    # its smallest part, 0.0092, above BH's 0.01 / 6 for the first of six
    assert site.evidence.confident_errors_p_value == pytest.approx(0.00305, rel=0.01)
    assert site.evidence.p_value == pytest.approx(3 * 0.00305, rel=0.01)
