"""The confident errors beside the error counts (service.audit.confident_errors)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import betabinom

from service.audit import InvalidInputError
from service.audit.confident_errors import betabinom_upper, round_counts, share_evidence
from service.audit.evidence import EvidenceDetector
from service.audit.verdict_types import ABSENT
from tests.audit._readers import given


def test_the_share_by_hand() -> None:
    # Five sites of 100 samples in one class, 10 errors each; 2 of them confident, 9 at site 4.
    # First fit (every site): site 4's share from the others, (8 + s) / (40 + 1) with s the
    # overall share (17 + 0.5) / (50 + 1); far above: it leaves the fit set. Refit without it:
    # s = (8 + 0.5) / (40 + 1) = 0.207317; site 4's share (8 + s) / 41 = 0.200178, expected
    # confident errors 2.00178. The share is an estimate from the others' 40 errors: its
    # variance s (1 - s) / (40 + 2), times 10^2 for site 4's 10 errors, over the pairs
    # 10 x 9 x s (1 - s), is an intra-site correlation of 100 / 42 / 90 = 0.026455, and the
    # test takes the larger of it and rho: with rho = 0 and with rho = 0.02 alike, beta-binomial
    # at r = 0.026455 (a = s (1 / r - 1) = 7.36657, b = 29.43343), P(X >= 9) = scipy's
    # betabinom.sf(8, 10, 7.36657, 29.43343) = 5.473e-5 (the binomial, with the share taken as
    # known: 4.23e-6; rho = 0.02 alone: 3.37e-5). With rho = 0.05 it is rho's: 0.05. A clean
    # site: 2 against 2.0 expected, below the floor of 5 % of its 100 samples: p = 1.
    errors = np.full((5, 1), 10)
    confident = np.array([[2], [2], [2], [2], [9]])
    every = np.ones(5, dtype=bool)
    samples = np.full((5, 1), 100)
    ev = share_evidence(errors, confident, samples, reporting=every, dispersion=0.0)
    assert ev.fit_set.tolist() == [True, True, True, True, False]
    assert ev.expected[4] == pytest.approx(10 * (8 + 8.5 / 41) / 41)
    assert ev.p_value[4] == pytest.approx(5.473e-5, rel=0.01)
    spread = share_evidence(errors, confident, samples, reporting=every, dispersion=0.02)
    assert spread.p_value[4] == pytest.approx(5.473e-5, rel=0.01)
    # rho = 0.05 above the estimate's 0.026455: a = s x 19 = 3.80338, b = 15.19662,
    # scipy's betabinom.sf(8, 10, 3.80338, 15.19662)
    wide = share_evidence(errors, confident, samples, reporting=every, dispersion=0.05)
    assert wide.p_value[4] == pytest.approx(betabinom.sf(8, 10, 3.80338, 15.19662), rel=0.01)
    assert ev.p_value[:4].tolist() == [1.0] * 4
    assert ev.observed.tolist() == [2, 2, 2, 2, 9]


def test_a_site_that_did_not_send_its_confident_errors_is_left_out() -> None:
    errors = np.full((5, 1), 10)
    confident = np.array([[2], [2], [2], [2], [9]])
    sent = np.array([True, True, True, True, False])
    ev = share_evidence(errors, confident, np.full((5, 1), 100), reporting=sent)
    assert ev.p_value.tolist() == [1.0] * 5
    assert ev.observed[4] == 0
    assert not ev.fit_set[4]


def test_all_sites_at_the_same_share_flag_nobody_and_permute() -> None:
    rng = np.random.default_rng(3)
    errors = rng.integers(5, 30, size=(12, 3))
    confident = errors // 4
    counts = errors * 5
    ev = share_evidence(errors, confident, counts, reporting=np.ones(12, dtype=bool))
    assert (ev.p_value == 1.0).all()
    order = rng.permutation(12)
    confident[7] = errors[7]  # every error of site 7 confident
    a = share_evidence(errors, confident, counts, reporting=np.ones(12, dtype=bool))
    b = share_evidence(
        errors[order], confident[order], counts[order], reporting=np.ones(12, dtype=bool)
    )
    assert b.p_value == pytest.approx(a.p_value[order])
    assert int(np.argmin(a.p_value)) == 7


def _six_sites(
    confident0: int, per_class_errors: int = 5, errors0: int | None = None
) -> tuple[np.ndarray, ...]:
    """Six sites, 2 classes of 20 samples, losses alike, ``per_class_errors`` errors per class
    everywhere (at 5 the model errs on a quarter of the samples, half as often as always
    answering one label) but at site 0, which makes ``errors0`` (default the same: the error
    counts see nothing); one confident error per class everywhere but at site 0, which makes
    ``confident0`` per class."""
    counts = np.full((6, 2), 20)
    errors = np.full((6, 2), per_class_errors, dtype=np.int64)
    errors[0] = per_class_errors if errors0 is None else errors0
    confident = np.ones((6, 2), dtype=np.int64)
    confident[0] = confident0
    return np.full((6, 2), 0.3), counts, np.full((6, 2), 0.8), errors, confident


def test_confident_errors_find_a_site_the_error_counts_cannot_tell() -> None:
    # Every error of site 0 is confident, 8 per class where the others make 5 (1 confident).
    # Once site 0 has left the fit set, each class's share is (5 + s) / 26 (5 confident among
    # the other sites' 25 errors) with s = (10 + 0.5) / 51 = 0.205882 its overall share:
    # 0.200226; site 0's 16 errors should hold 3.2036 confident ones, and all 16 are. Below 10
    # sites the share is beta-binomial with rho = 0.05 (the shares' own estimation variance,
    # 2 classes x 8^2 x s (1 - s) / (25 + 2) over 16 x 15 x s (1 - s) = 0.019753, is below
    # it): P(X >= 16) = scipy's betabinom.sf(15, 16, 0.200226 x 19, 0.799774 x 19) =
    # 3.129e-7. Its errors, 16 against 2 x 20 x 25.5 / 101 = 10.099 expected (the others'
    # rate, (25 + 0.5) / (100 + 1) a class), are 5.90 above: more than a quarter of the
    # confident errors' excess, 12.80, so the share counts, and three times its p-value is
    # below BH's 0.01 / 6 for the first of six; the errors alone are not.
    loss, counts, sd, errors, confident = _six_sites(8, errors0=8)
    result = EvidenceDetector().fit(
        loss, counts, sd, per_class_errors=errors, per_class_confident_errors=confident
    )
    assert result.summary.confident_errors_counted is True
    first = result.verdicts[0]
    assert first is not None
    assert first.evidence.confident_errors == 16
    assert first.evidence.confident_errors_expected == pytest.approx(16 * (5 + 10.5 / 51) / 26)
    assert first.evidence.confident_errors_p_value == pytest.approx(3.129e-7, rel=1e-3)
    assert first.evidence.errors == 16
    assert first.evidence.errors_expected == pytest.approx(2 * 20 * 25.5 / 101)
    assert given(first.evidence.errors_p_value) > 0.01 / 6
    assert first.evidence.p_value == pytest.approx(
        3 * given(first.evidence.confident_errors_p_value)
    )
    assert [i for i, v in enumerate(result.verdicts) if v is not None and v.flag] == [0]
    # Without them: nothing to go on.
    plain = EvidenceDetector().fit(loss, counts, sd, per_class_errors=errors)
    assert plain.summary.confident_errors_counted is False
    assert plain.verdicts[0].evidence.confident_errors is ABSENT
    assert not any(v.flag for v in plain.verdicts if v is not None)


def test_confident_errors_without_more_errors_are_not_label_noise() -> None:
    # Site 0 makes as many errors as every site (5 a class, 10.099 expected) and all of them
    # confident. Its share p-value is 1, so it stays in the share's fit set: the overall
    # share s = (20 + 0.5) / (60 + 1) = 0.336066, its classes' (5 + s) / 26 = 0.205233, and
    # 10 x that = 2.0523 confident errors expected. Flips would have added errors, and its 10
    # are 0.099 below their expectation, short of a quarter of the confident excess (7.95 / 4 =
    # 1.99): its share does not count, and nobody is flagged. The share test alone, without
    # the error counts' evidence, trims it from the fit set (s = 10.5 / 51, the share
    # 0.200226) and gives it P(X >= 10) = betabinom.sf(9, 10, 0.200226 x 19,
    # 0.799774 x 19) = 1.668e-5 (the clean BreastMNIST
    # site of the fourth held-out draw's h4-08 looked like this: 19 confident of 30 errors,
    # its errors 2.3 above their expectation).
    loss, counts, sd, errors, confident = _six_sites(5)
    result = EvidenceDetector().fit(
        loss, counts, sd, per_class_errors=errors, per_class_confident_errors=confident
    )
    first = result.verdicts[0]
    assert first is not None
    assert first.evidence.confident_errors == 10
    assert first.evidence.confident_errors_expected == pytest.approx(10 * (5 + 20.5 / 61) / 26)
    assert first.evidence.confident_errors_p_value == 1.0
    assert first.evidence.errors_expected == pytest.approx(2 * 20 * 25.5 / 101)
    assert not any(v.flag for v in result.verdicts if v is not None)
    alone = share_evidence(
        errors, confident, counts, reporting=np.ones(6, dtype=bool), dispersion=0.05
    )
    assert alone.p_value[0] == pytest.approx(1.668e-5, rel=1e-3)


def test_no_confident_share_from_a_model_no_better_than_the_label_prior() -> None:
    # The same federation, but the model errs on 10 of 20 samples per class: as often as always
    # answering one label (1 - errors / prior's = 1 - 120 / 120 = 0 < 0.25). Such a model
    # contradicts labels with confidence class by class, not site by site: the share does not
    # enter (nor is site 0 flagged on it), the losses and the error counts still do.
    loss, counts, sd, errors, confident = _six_sites(10, per_class_errors=10)
    result = EvidenceDetector().fit(
        loss, counts, sd, per_class_errors=errors, per_class_confident_errors=confident
    )
    assert result.summary.accuracy_informativeness == pytest.approx(0.0)
    assert result.summary.errors_counted is True
    assert result.summary.confident_errors_counted is False
    assert result.verdicts[0].evidence.confident_errors is ABSENT
    assert not any(v.flag for v in result.verdicts if v is not None)


def test_all_equal_confident_errors_flag_nobody() -> None:
    loss, counts, sd, errors, confident = _six_sites(1)
    result = EvidenceDetector().fit(
        loss, counts, sd, per_class_errors=errors, per_class_confident_errors=confident
    )
    assert not any(v.flag for v in result.verdicts if v is not None)
    assert {v.evidence.confident_errors for v in result.verdicts if v is not None} == {2}
    assert {v.evidence.confident_errors_p_value for v in result.verdicts if v is not None} == {1.0}


def test_permuting_the_sites_permutes_the_verdicts() -> None:
    loss, counts, sd, errors, confident = _six_sites(5)
    order = np.array([3, 0, 5, 1, 4, 2])
    a = EvidenceDetector().fit(
        loss, counts, sd, per_class_errors=errors, per_class_confident_errors=confident
    )
    b = EvidenceDetector().fit(
        loss[order],
        counts[order],
        sd[order],
        per_class_errors=errors[order],
        per_class_confident_errors=confident[order],
    )
    for i, j in enumerate(order):
        va, vb = a.verdicts[j], b.verdicts[i]
        assert va is not None
        assert vb is not None
        assert vb.flag == va.flag
        assert vb.evidence.p_value == pytest.approx(va.evidence.p_value)


def test_round_counts_need_min_sites_and_at_most_the_errors() -> None:
    counts = np.full((4, 2), 10)
    errors = np.full((4, 2), 3.0)
    few = np.full((4, 2), np.nan)
    few[0] = [1, 1]
    got = round_counts(errors, few, counts, min_sites=3)
    assert got is not None
    assert got.confident is None
    assert round_counts(np.full((4, 2), np.nan), None, counts, min_sites=3) is None
    with pytest.raises(InvalidInputError, match="exceeds the class's errors"):
        round_counts(errors, np.full((4, 2), 4.0), counts, min_sites=3)
    without = errors.copy()
    without[1] = np.nan
    with pytest.raises(InvalidInputError, match="without its errors"):
        round_counts(without, np.full((4, 2), 1.0), counts, min_sites=3)


@pytest.mark.parametrize("spread", [False, True])
def test_false_alarms_with_both_counts_on_clean_federations(spread: bool) -> None:
    # 150 clean rounds of 20 sites, 3 classes of 60 samples; errors binomial at 8 % (times a
    # gamma site factor of variance 0.1 with ``spread``), a third of them confident; losses
    # alike. Without a spread the p-values are close to exact: the detector's q = 0.01 bounds
    # a round's chance of a flag at about 1 %; at most 3 % of rounds tolerated (measured: 0 of
    # 300). With it the error counts alone already flag clean sites whose losses do not show
    # the spread (measured: 26 of 300 rounds, the same with the confident counts): the
    # confident counts must add at most 2 rounds of 150 to theirs.
    rng = np.random.default_rng(11)
    k, c, n = 20, 3, 60
    counts = np.full((k, c), n)
    with_both = errors_only = 0
    for _ in range(150):
        factor = rng.gamma(10.0, 0.1, size=(k, 1)) if spread else np.ones((k, 1))
        errors = rng.binomial(n, np.minimum(0.08 * factor, 1.0) * np.ones((k, c)))
        confident = rng.binomial(errors, 1 / 3)
        loss = np.abs(0.3 + rng.normal(0.0, 0.8 / np.sqrt(n), size=(k, c)))
        sd = np.full((k, c), 0.8)
        detector = EvidenceDetector(mixture_check=False)
        both = detector.fit(
            loss, counts, sd, per_class_errors=errors, per_class_confident_errors=confident
        )
        alone = detector.fit(loss, counts, sd, per_class_errors=errors)
        with_both += any(v is not None and v.flag for v in both.verdicts)
        errors_only += any(v is not None and v.flag for v in alone.verdicts)
    if spread:
        assert with_both <= errors_only + 2
    else:
        assert with_both <= 4


def test_one_large_site_with_no_confident_error_does_not_make_the_others_noisy() -> None:
    # The review's counter-example: ten clean sites of 100 samples, 20 errors each, 8 of them
    # confident (share 0.4); one site claims 20,000 samples, 4,000 errors at the clean rate, none
    # confident. Pooled freely, the share is about 80 / 4200 = 0.02 and every clean site's 8
    # stands far above 0.4 expected. Capped at the median site's 20 errors (RATE_CAP 1), the
    # large site weighs 20 errors: overall share (80 + 0.5) / (220 + 1) = 0.36425; a clean
    # site's, leaving itself out, (72 + 0.36425) / (200 + 1) = 0.36002, expected 7.20 of its
    # 20: 0.8 above, below the floor. Nobody stands out.
    errors = np.array([[20]] * 10 + [[4000]])
    confident = np.array([[8]] * 10 + [[0]])
    counts = np.array([[100]] * 10 + [[20000]])
    ev = share_evidence(errors, confident, counts, reporting=np.ones(11, dtype=bool))
    assert (ev.p_value == 1.0).all()
    overall = 80.5 / 221
    assert ev.expected[0] == pytest.approx(20 * (72 + overall) / 201, rel=1e-9)


def test_with_no_anchor_reporting_the_share_says_nothing() -> None:
    # Anchored mode: the fit set is the anchors (exclude = every other site). Two anchors that
    # sent no confident errors leave no share to compare with: every p-value 1 (the review saw
    # 2e-5 for eight identical sites against a made-up share of 0.5).
    errors = np.full((10, 2), 15)
    confident = np.full((10, 2), 13)
    sent = np.array([False, False] + [True] * 8)
    anchors = np.array([True, True] + [False] * 8)
    ev = share_evidence(errors, confident, np.full((10, 2), 50), reporting=sent, exclude=~anchors)
    assert (ev.p_value == 1.0).all()


def test_a_class_without_errors_elsewhere_does_not_enter() -> None:
    # Class 1 holds errors at site 0 only: no other site says how confident its errors are,
    # so site 0 is judged on class 0 alone. Its 40 errors pool as the median site's 10 (weight
    # 1/4): overall share (20 + 1.25 + 7.5 + 0.5) / (40 + 2.5 + 7.5 + 1) = 29.25 / 51; the
    # others' in class 0 (20 + 29.25 / 51) / (40 + 1) = 0.5018, expected 5.018 of its 10 (it
    # has 5).
    errors = np.array([[10, 30], [10, 0], [10, 0], [10, 0], [10, 0]])
    confident = np.array([[5, 30], [5, 0], [5, 0], [5, 0], [5, 0]])
    ev = share_evidence(errors, confident, np.full((5, 2), 100), reporting=np.ones(5, bool))
    assert ev.expected[0] == pytest.approx(10 * (20 + 29.25 / 51) / 41)
    assert ev.p_value[0] == 1.0
    # what the report shows beside the expectation: the 5 of class 0, not the 35 of both
    assert ev.observed.tolist() == [5, 5, 5, 5, 5]


def test_a_handful_of_odd_samples_is_below_the_floor() -> None:
    # README's demo: a clean site of 80 samples with 5 of its 6 errors confident where the
    # others' share is about 1/6 (0.97 expected): 4.03 above, over 5 % of its samples but below
    # the 5 confident errors the floor asks for: p = 1. Two more confident errors (7 of 8,
    # 5.7 above) clear it.
    errors = np.array([[6]] * 12)
    confident = np.array([[5]] + [[1]] * 11)
    samples = np.full((12, 1), 80)
    every = np.ones(12, dtype=bool)
    assert share_evidence(errors, confident, samples, reporting=every).p_value[0] == 1.0
    errors[0], confident[0] = 8, 7
    assert share_evidence(errors, confident, samples, reporting=every).p_value[0] < 0.01


def test_beta_binomial_tail_by_hand() -> None:
    # a = b = 1: uniform on 0..n, so P(X >= x) = (n - x + 1) / (n + 1)
    n = np.array([2, 2, 2, 9, 9])
    x = np.array([0, 1, 2, 3, 9])
    got = betabinom_upper(x, n, np.ones(5), np.ones(5))
    np.testing.assert_allclose(got, [1.0, 2 / 3, 1 / 3, 7 / 10, 1 / 10], rtol=1e-12)
    # x beyond n: 0; x at or below 0: 1
    edges = betabinom_upper(np.array([3, -1]), np.array([2, 2]), np.ones(2), np.ones(2))
    assert edges.tolist() == [0.0, 1.0]


def test_beta_binomial_tail_keeps_tiny_tails() -> None:
    # a = 1, b = 40 integer: P(X >= n) = n! b! / (n + b)! = 1 / C(n + b, n); n = 20 gives
    # 1 / C(60, 20) = 1 / 4,191,844,505,805,495, below what 1 - CDF can resolve
    got = betabinom_upper(np.array([20]), np.array([20]), np.array([1.0]), np.array([40.0]))
    assert got[0] == pytest.approx(1 / 4191844505805495, rel=1e-10)


def test_beta_binomial_tail_agrees_with_scipy_where_it_is_not_tiny() -> None:
    from scipy.stats import betabinom

    rng = np.random.default_rng(3)
    n = rng.integers(0, 300, 2000)
    x = rng.integers(-2, 320, 2000)
    a, b = rng.uniform(0.05, 40, 2000), rng.uniform(0.05, 40, 2000)
    ours = betabinom_upper(x, n, a, b)
    theirs = betabinom.sf(x - 1, n, a, b)
    resolvable = theirs > 1e-6  # scipy's 1 - CDF has an absolute error near 1e-12
    assert resolvable.sum() > 500
    np.testing.assert_allclose(ours[resolvable], theirs[resolvable], rtol=1e-7)
    np.testing.assert_allclose(ours, theirs, atol=1e-10)


def test_a_beta_binomial_tail_of_millions_of_terms_is_left_to_scipy() -> None:
    import tracemalloc

    from scipy.stats import betabinom

    n, x = np.array([3_000_000]), np.array([360_000])
    a, b = np.array([0.06 * 19]), np.array([0.94 * 19])
    tracemalloc.start()
    got = betabinom_upper(x, n, a, b)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # the same computation as scipy's (1 - CDF), not 2.6 million terms at 72 bytes each
    assert got[0] == betabinom.sf(x - 1, n, a, b)[0]
    assert peak < 100 * 2**20


def test_the_errors_condition_needs_the_error_counts_to_see_the_class() -> None:
    # Classes 0 and 1 are held by sites 0 and 1 alone: the error counts' test needs three
    # holders of a class and enters neither (site 0's expected errors 0), while the share test
    # needs one other site with errors in it. Site 0 makes 20 errors of 40 in each, 18 of them
    # confident, against 8 and 1 elsewhere: with nothing to compare its errors with, its share
    # counts alone (found by an independent review: the condition had silenced it).
    counts = np.zeros((6, 4), dtype=np.int64)
    counts[0:2, 0:2] = 40
    counts[2:6, 2:4] = 40
    errors = np.where(counts > 0, 8, 0)
    confident = np.where(counts > 0, 1, 0)
    errors[0, 0:2], confident[0, 0:2] = 20, 18
    loss, sd = np.where(counts > 0, 0.3, np.nan), np.where(counts > 0, 0.8, np.nan)
    result = EvidenceDetector().fit(
        loss, counts, sd, per_class_errors=errors, per_class_confident_errors=confident
    )
    first = result.verdicts[0]
    assert first is not None
    assert first.evidence.errors_expected == 0.0
    alone = share_evidence(errors, confident, counts, reporting=np.ones(6, dtype=bool))
    assert first.evidence.confident_errors_p_value == pytest.approx(alone.p_value[0])
    assert given(first.evidence.confident_errors_p_value) < 1e-6
    assert [i for i, v in enumerate(result.verdicts) if v is not None and v.flag] == [0]
