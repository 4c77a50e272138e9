"""No site outweighs the federation in the audit's pooled estimates (issue 20, bounded influence):
hand-checked weights, the error rates and the informativeness with one site claiming 20,000
samples, and a simulation of such a site, lying or noisy, among ten of 100."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.audit.error_evidence import error_evidence
from service.audit.evidence import EvidenceDetector
from service.audit.evidence_abstention import model_informativeness
from service.audit.pooling import POOL_CAP, RATE_CAP, capped, pool_weights


def test_the_constants() -> None:
    # The tests below are worked out with these values.
    assert POOL_CAP == 4.0
    assert RATE_CAP == 1.0


def test_pool_weights_by_hand() -> None:
    # median 10: the cap is 40 (x4) or 10 (x1); 400 enters with 40 / 400 or 10 / 400.
    amounts = np.array([10.0, 10.0, 10.0, 400.0])
    assert pool_weights(amounts).tolist() == [1.0, 1.0, 1.0, 0.1]
    assert pool_weights(amounts, factor=1.0).tolist() == [1.0, 1.0, 1.0, 0.025]
    # median of 8, 10, 12, 1000 is 11: capped at 44
    assert capped(np.array([10.0, 12.0, 8.0, 1000.0])).tolist() == [10.0, 12.0, 8.0, 44.0]


def test_pool_weights_members_and_degenerate_inputs() -> None:
    # the median is over members only; a non-member weighs 0 in the pool and keeps its amount
    members = np.array([True, False, True, True])
    amounts = np.array([10.0, 1000.0, 20.0, 30.0])
    assert pool_weights(amounts, members).tolist() == [1.0, 0.0, 1.0, 1.0]
    assert capped(amounts, members).tolist() == [10.0, 1000.0, 20.0, 30.0]
    # all equal: nothing capped; zeros (a site without errors) enter whole
    assert pool_weights(np.full(5, 7.0)).tolist() == [1.0] * 5
    assert pool_weights(np.array([0.0, 0.0, 5.0])).tolist() == [1.0, 1.0, 1.0]
    assert pool_weights(np.zeros(3)).tolist() == [1.0, 1.0, 1.0]


def test_pool_weights_are_permutation_invariant() -> None:
    rng = np.random.default_rng(5)
    amounts = rng.integers(1, 500, size=12).astype(np.float64)
    amounts[3] = 1e6
    order = rng.permutation(12)
    assert pool_weights(amounts[order]) == pytest.approx(pool_weights(amounts)[order])


def test_a_site_claiming_20000_samples_without_errors_does_not_set_the_error_rate() -> None:
    # One class; ten sites of 100 samples with 10 errors each, one site claiming 20,000 with
    # none. Pooled freely the rate would be 100 / 21,000 = 0.0048 and every clean site's 10
    # errors far above the 0.48 expected. The large site enters the pool as the median site
    # (RATE_CAP 1: weight 100 / 20,000): rate 100 / 1,100; a clean site, leaving itself out,
    # expects 100 * (90 + 1/2) / (1,000 + 1) = 9.04 errors: 10 is no evidence (p 1, below the
    # 5 % floor).
    counts = np.array([[100]] * 10 + [[20000]])
    errors = np.array([[10]] * 10 + [[0]])
    ev = error_evidence(errors, counts)
    assert ev.class_rate[0] == pytest.approx(100 / 1100)
    assert ev.expected[0] == pytest.approx(100 * 90.5 / 1001)
    assert ev.p_value.tolist() == [1.0] * 11
    # The large site against the ten: (100 + 1/2) / (1,000 + 1) of its 20,000, and it made none.
    assert ev.expected[10] == pytest.approx(20000 * 100.5 / 1001)


def test_a_site_claiming_most_samples_does_not_set_the_informativeness() -> None:
    # Five sites whose loss is the prior's (ln 2 on balanced binary labels: informativeness 0)
    # and one claiming 20,000 samples at loss 0 (informativeness 1). By samples the median
    # would be that site's 1; each site weighs at most 4 x the median's 100: 500 against 400,
    # the median is 0.
    loss = np.array([[math.log(2)] * 2] * 5 + [[0.0, 0.0]])
    counts = np.array([[50, 50]] * 5 + [[10000, 10000]])
    sizes = counts.sum(axis=1).astype(np.float64)
    entropy, _, informativeness = model_informativeness(loss, counts, sizes)
    assert entropy == pytest.approx(math.log(2))
    assert informativeness.loss == pytest.approx(0.0, abs=1e-12)


def _round(rng: np.random.Generator, big_rate: float | None, big_loss: float | None):
    """Ten sites of 100 samples (two classes), site 9 noisy (35 % errors, a higher loss),
    the others at 10 %; with ``big_rate`` an eleventh site claiming 20,000 samples."""
    k = 10 if big_rate is None else 11
    counts = np.array([[50, 50]] * 10 + ([[10000, 10000]] if k == 11 else []))
    rates = np.array([0.1] * 9 + [0.35] + ([] if big_rate is None else [big_rate]))
    errors = rng.binomial(counts, rates[:, None])
    loss = 0.3 + 2.0 * (np.maximum(rates, 0.1)[:, None] - 0.1) + rng.normal(0, 0.03, (k, 2))
    if big_loss is not None:
        loss[10] = big_loss
    return loss, counts, np.full((k, 2), 0.6), errors.astype(np.float64), rates > 0.2


@pytest.mark.parametrize(
    ("big_rate", "big_loss"),
    [
        (0.0, None),  # a liar: no error, the clean sites' loss
        (0.01, None),
        (0.3, None),  # a large noisy site (its loss 0.7)
        (0.1, 0.15),  # a clean one reporting a lower or a higher loss
        (0.1, 0.6),
    ],
)
def test_one_large_site_neither_silences_nor_misleads_the_audit(big_rate, big_loss) -> None:
    # 20 rounds (seeds 0-19). Before the caps, the liar made 20 of 20 rounds abstain ("not a
    # clear minority": 7-10 of 11 sites flagged) and the large noisy site 20 of 20 ("96 % of the
    # samples"), the noisy site unflagged in each. Measured with the caps: no abstention, the
    # noisy site(s) flagged in every round, none of the nine clean sites of 100 flagged (the
    # large site reporting a loss of 0.6 is flagged: that is what it reports). Tolerance: 1
    # round in 20.
    abstained = missed = false = 0
    for seed in range(20):
        loss, counts, sd, errors, noisy = _round(np.random.default_rng(seed), big_rate, big_loss)
        result = EvidenceDetector().fit(loss, counts, sd, per_class_errors=errors)
        flags = np.array([bool(v is not None and v.flag) for v in result.verdicts])
        abstained += result.status != "ok"
        missed += bool((noisy & ~flags).any())
        false += bool(flags[:9].any())  # the nine ordinary clean sites
    assert abstained <= 1
    assert missed <= 1
    assert false <= 1


def _with_a_liar(seed: int, loss_value: float, spread: float, error_rate: float, size: int):
    """docs/eval/one_site_attacks.py's round: ten clean sites of 99 samples (three classes),
    site 10 noisy, site 11 reporting ``loss_value``, ``spread``, ``error_rate`` (none of its
    errors confident) in every class, and ``size`` samples."""
    rng = np.random.default_rng(seed)
    counts = np.full((12, 3), 33)
    counts[11] = size // 3
    rates = np.array([0.1] * 10 + [0.4, 0.1])
    errors = rng.binomial(counts, rates[:, None]).astype(np.float64)
    sure = np.where(rates[:, None] > 0.2, 0.7, 0.2)
    confident = rng.binomial(errors.astype(np.int64), sure).astype(np.float64)
    loss = 0.3 + 2.0 * (rates[:, None] - 0.1) + rng.normal(0.0, 0.03, size=(12, 3))
    sd = np.full((12, 3), 0.6)
    loss[11], sd[11] = loss_value, spread
    errors[11] = np.round(error_rate * counts[11])
    confident[11] = 0.0
    return loss, counts, sd, errors, confident


@pytest.mark.parametrize(
    ("loss_value", "spread", "error_rate", "size"),
    [
        (0.0, 0.01, 0.0, 99),  # a perfect model: before, every round abstained
        (0.02, 0.6, 0.1, 99),
        (0.3, 0.6, 0.0, 399),  # the clean loss, no error, 4 x the size: before, false flags
        (0.0, 3.0, 0.0, 399),
    ],
)
def test_one_liar_of_ordinary_size_changes_no_verdict(loss_value, spread, error_rate, size):
    # Of docs/eval/one_site_attacks.py's 240 reports, 34 changed a verdict before the caps and
    # the two-site lower tail (24 made all 8 rounds abstain, 10 flagged a clean site in 4 of 8)
    # and none after; these are four of the 34. 8 rounds each: the noisy site flagged and no
    # clean site flagged in every one, no abstention (no tolerance: measured 0 of 8).
    for seed in range(8):
        loss, counts, sd, errors, confident = _with_a_liar(
            seed, loss_value, spread, error_rate, size
        )
        result = EvidenceDetector().fit(
            loss, counts, sd, per_class_errors=errors, per_class_confident_errors=confident
        )
        flags = [bool(v is not None and v.flag) for v in result.verdicts]
        assert result.status == "ok", result.reason
        assert flags[10]
        assert not any(flags[:10])
