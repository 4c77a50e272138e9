"""Error-count evidence: hand-checked tails, properties, simulated false-alarm rate and power."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from service.audit._validation import InvalidInputError
from service.audit.class_null import benjamini_hochberg
from service.audit.error_evidence import (
    error_evidence,
    fit_dispersion,
    nb_quantile,
    reported_counts,
    upper_p,
)
from service.audit.evidence import EvidenceDetector
from tests.audit._readers import given


def test_nb_quantile_by_hand_and_against_scipy() -> None:
    from scipy.stats import nbinom

    # Geometric (r = 1, p = 1/2): P(X <= q) = 1 - 2^-(q + 1) = 0.5, 0.75, 0.875 at 0, 1, 2, so
    # the 0.25 quantile is 0, the 0.6 quantile 1 and the 0.8 quantile 2, from any start.
    one, half = np.ones(3), np.full(3, 0.5)
    for level, q in ((0.25, 0.0), (0.6, 1.0), (0.8, 2.0)):
        got, at, below = nb_quantile(level, one, half, np.array([0.0, 2.0, 40.0]))
        assert got.tolist() == [q] * 3
        assert at == pytest.approx(1.0 - 2.0 ** -(q + 1.0))
        assert below == pytest.approx(0.0 if q == 0 else 1.0 - 2.0**-q)
    # scipy's quantile is the reference on a wide range of means and dispersions.
    rng = np.random.default_rng(0)
    mu = np.exp(rng.uniform(np.log(0.01), np.log(1e6), 4000))
    phi = np.where(rng.uniform(size=4000) < 0.1, 1e-12, rng.uniform(0.0, 1.2, 4000))
    r = 1.0 / phi
    p = r / (r + mu)
    for level in (0.05, 0.25, 0.9):
        expected = nbinom.ppf(level, r, p)
        # far starts take scipy's search after _MAX_STEPS; non-finite ones count as 0
        for start in (np.zeros(4000), np.floor(3.0 * mu), 1e6 * mu, np.full(4000, np.inf)):
            got, at, below = nb_quantile(level, r, p, start)
            assert np.array_equal(got, expected)
            assert np.array_equal(at, nbinom.cdf(got, r, p))
            assert np.array_equal(below, nbinom.cdf(got - 1.0, r, p))


def test_upper_p_by_hand() -> None:
    # Poisson(1): P(X = 0) = e^-1 = 0.367879, P(X = 1) = 0.367879, P(X > 1) = 0.264241.
    # P(X >= 0) = 1, P(X >= 1) = 0.632121, P(X >= 2) = 0.264241.
    assert upper_p(np.array([0.0, 1.0, 2.0]), np.full(3, 1.0), 0.0) == pytest.approx(
        [1.0, 0.632121, 0.264241], abs=1e-6
    )
    # Negative binomial with mean 1 and phi = 1 is geometric: P(X = x) = 2^-(x + 1), so
    # P(X >= x) = 2^-x: 1, 1/4 and 1/8 at 0, 2 and 3.
    assert upper_p(np.array([0.0, 2.0, 3.0]), np.full(3, 1.0), 1.0) == pytest.approx(
        [1.0, 0.25, 0.125]
    )


def test_fit_dispersion_sees_a_spread_in_the_lower_tail_only() -> None:
    rng = np.random.default_rng(4)
    mu = np.full(400, 20.0)
    poisson_counts = rng.poisson(mu).astype(np.float64)
    assert fit_dispersion(poisson_counts, mu, np.zeros(400)) < 0.02
    # Site factors Gamma(1/phi, phi) with phi = 0.25: the fit finds it within 0.1.
    spread = rng.poisson(mu * rng.gamma(4.0, 0.25, size=400)).astype(np.float64)
    assert fit_dispersion(spread, mu, np.zeros(400)) == pytest.approx(0.25, abs=0.1)
    # A quarter of the Poisson sites with ten times the errors: the lower tail does not move.
    noisy = poisson_counts.copy()
    noisy[:100] = rng.poisson(200.0, size=100)
    assert fit_dispersion(noisy, mu, np.zeros(400)) < 0.05


def test_one_site_with_many_errors_among_clean_ones() -> None:
    # One class, 4 sites of 10 samples, errors [0, 0, 0, 8]. Site 3 against the other three
    # (0 errors in 30): expected 10 * 0.5 / 31 = 0.16, a count of 8 is far beyond (the rate
    # estimated from no error is uncertain, which the test carries: p about 3e-6).
    counts = np.full((4, 1), 10)
    errors = np.array([[0], [0], [0], [8]])
    ev = error_evidence(errors, counts)
    assert ev.p_value[3] < 1e-4
    # The clean sites: no error above the 0.05 floor, p = 1; their rate is the others' (0/20).
    assert ev.p_value[:3].tolist() == [1.0, 1.0, 1.0]
    assert ev.observed.tolist() == [0, 0, 0, 8]
    # Site 3 was trimmed out of the fit: the class's rate is 0 / 30.
    assert ev.class_rate[0] == 0.0
    flags, _ = benjamini_hochberg(ev.p_value, 0.01)
    assert flags.tolist() == [False, False, False, True]


def test_a_single_error_where_errors_are_rare_is_no_evidence() -> None:
    # One hard sample in a class of 8, where the other 5 sites made 1 error in 50: expected
    # 8 * 1.5 / 51 = 0.24 errors; one error is 0.12 above the expected rate but P(X >= 1) is
    # 1 - e^-0.235 = 0.21 (a little less with the estimated rate's own variance): no evidence.
    # (Site 3, 1 error in 10 against 1 in 48 elsewhere, likewise: about 0.24.)
    counts = np.full((6, 1), 10)
    counts[0, 0] = 8
    errors = np.array([[1], [0], [0], [1], [0], [0]])
    ev = error_evidence(errors, counts)
    assert 0.18 < ev.p_value[0] < 0.22
    assert ev.p_value.min() > 0.18


def test_all_equal_sites_and_no_errors_give_no_evidence() -> None:
    counts = np.full((6, 3), 20)
    for wrong in (np.full((6, 3), 2), np.zeros((6, 3), dtype=np.int64)):
        ev = error_evidence(wrong, counts)
        assert ev.p_value.tolist() == [1.0] * 6


def test_permuting_the_sites_permutes_the_p_values() -> None:
    rng = np.random.default_rng(3)
    counts = rng.integers(1, 40, size=(9, 4))
    errors = rng.binomial(counts, 0.05)
    errors[2] = rng.binomial(counts[2], 0.6)
    order = rng.permutation(9)
    ev = error_evidence(errors, counts)
    ev_perm = error_evidence(errors[order], counts[order])
    assert ev_perm.p_value == pytest.approx(ev.p_value[order])


def test_a_class_held_by_fewer_than_min_holders_does_not_enter() -> None:
    counts = np.array([[10, 10], [10, 10], [10, 0], [10, 0]])
    errors = np.array([[0, 9], [0, 0], [0, 0], [0, 0]])
    ev = error_evidence(errors, counts, min_holders=3)
    assert np.isnan(ev.class_rate[1])
    assert ev.observed.tolist() == [0, 0, 0, 0]
    assert ev.p_value.tolist() == [1.0] * 4


def test_the_floor_keeps_a_small_excess_out() -> None:
    # 20 sites of 1000 samples at 1 % errors and one at 4 %: hugely significant, but 3 points
    # above the others, under the 5-point floor; with the floor at 0.02 it is flagged.
    counts = np.full((21, 1), 1000)
    errors = np.full((21, 1), 10)
    errors[0, 0] = 40
    assert error_evidence(errors, counts).p_value[0] == 1.0
    assert error_evidence(errors, counts, min_excess=0.02).p_value[0] < 1e-6


def _federation(
    rng: np.random.Generator,
    k: int,
    c: int,
    n_mean: int,
    spread: float,
    class_spread: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Clean sites: Dirichlet(0.5) label mix, Poisson sizes, per-class error rates 0.5-8 %,
    each site's rates times exp(N(0, spread^2)) (harder or easier data), each (site, class)
    rate times exp(N(0, class_spread^2)) (a class harder at one site than elsewhere)."""
    base = rng.uniform(0.005, 0.08, size=c)
    counts = np.stack(
        [rng.multinomial(max(5, rng.poisson(n_mean)), rng.dirichlet([0.5] * c)) for _ in range(k)]
    )
    factor = np.exp(rng.normal(0.0, spread, size=(k, 1)))
    if class_spread:
        factor = factor * np.exp(rng.normal(0.0, class_spread, size=(k, c)))
    rates = np.clip(base * factor, 0.0, 1.0)
    return rng.binomial(counts, rates), counts


@pytest.mark.parametrize(
    ("k", "spread", "class_spread"),
    [(20, 0.0, 0.0), (50, 0.0, 0.0), (5, 0.0, 0.0), (20, 0.3, 0.0), (20, 0.0, 0.5)],
)
def test_false_alarm_rate_on_clean_federations(k: int, spread: float, class_spread: float) -> None:
    # The detector's two passes, BH at q = 0.01: rounds with any flag, 150 simulated rounds.
    # The tolerance allows 3 %.
    rng = np.random.default_rng(0)
    rounds = 150
    alarms = 0
    for _ in range(rounds):
        errors, counts = _federation(rng, k, 10, 40, spread, class_spread)
        first, _ = benjamini_hochberg(error_evidence(errors, counts).p_value, 0.01)
        flags, _ = benjamini_hochberg(error_evidence(errors, counts, exclude=first).p_value, 0.01)
        alarms += bool(flags.any())
    assert alarms / rounds <= 0.03


def test_a_single_noisy_site_among_50_is_found() -> None:
    # 50 sites of about 30 samples; one with half its labels wrong: flagged in at least 90 % of
    # 60 simulated rounds (measured 97 % over 300).
    rng = np.random.default_rng(1)
    found = 0
    for _ in range(60):
        errors, counts = _federation(rng, 50, 10, 30, 0.0)
        errors[7] = rng.binomial(counts[7], 0.5)
        first, _ = benjamini_hochberg(error_evidence(errors, counts).p_value, 0.01)
        flags, _ = benjamini_hochberg(error_evidence(errors, counts, exclude=first).p_value, 0.01)
        found += bool(flags[7]) and int(flags.sum()) == 1
    assert found >= 54


def _mild_round() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """20 sites, 4 classes of 20 samples; every site's losses alike (0.3, sd 0.8) but site 0's
    errors: 6 of 20 per class where the others make 0 or 1."""
    k, c = 20, 4
    counts = np.full((k, c), 20)
    loss = np.full((k, c), 0.3)
    sd = np.full((k, c), 0.8)
    errors = np.zeros((k, c), dtype=np.int64)
    errors[1::2] = 1
    errors[0] = 6
    return loss, counts, sd, errors


def test_the_detector_combines_the_counts_with_the_losses() -> None:
    loss, counts, sd, errors = _mild_round()
    plain = EvidenceDetector().fit(loss, counts, sd)
    assert not any(v.flag for v in plain.verdicts if v is not None)
    counted = EvidenceDetector().fit(loss, counts, sd, per_class_errors=errors)  # on by default
    assert counted.status == "ok"
    assert [i for i, v in enumerate(counted.verdicts) if v is not None and v.flag] == [0]
    first = counted.verdicts[0]
    assert first is not None
    assert first.evidence.errors == 24
    assert first.evidence.errors_expected == pytest.approx(4 * 20 * 10.5 / 381.0)
    assert counted.summary.errors_counted is True
    off = EvidenceDetector(error_check=False).fit(loss, counts, sd, per_class_errors=errors)
    assert not any(v.flag for v in off.verdicts if v is not None)
    assert off.summary.errors_counted is False


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda e: e[:, :3], "shape"),
        (lambda e: e + 0.5, "integer"),
        (lambda e: e + 21, "exceeds"),
        (lambda e: e - 2, "negative"),
    ],
)
def test_bad_error_counts_are_refused(change, match) -> None:
    loss, counts, sd, errors = _mild_round()
    with pytest.raises(InvalidInputError, match=match):
        EvidenceDetector(error_check=True).fit(loss, counts, sd, per_class_errors=change(errors))


def test_the_counts_need_min_error_sites() -> None:
    # Nine of the mild round's sites: at min_error_sites=10 the counts stay out (and site 0,
    # whose losses are like the others', is not flagged); at the default (5) they enter.
    loss, counts, sd, errors = (a[:9] for a in _mild_round())
    few = EvidenceDetector(min_error_sites=10).fit(loss, counts, sd, per_class_errors=errors)
    assert few.summary.errors_counted is False
    assert not any(v.flag for v in few.verdicts if v is not None)
    enough = EvidenceDetector().fit(loss, counts, sd, per_class_errors=errors)
    assert enough.summary.errors_counted is True
    assert [i for i, v in enumerate(enough.verdicts) if v is not None and v.flag] == [0]


def _six_sites(site0_errors: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Six sites, 2 classes of 20 samples, losses alike; one error per class everywhere but at
    site 0, which makes ``site0_errors`` per class. Site 0's expected total, from the other five
    (leave-one-out (T + 1/2) / (N + 1) per class): 2 x 20 x 5.5 / 101 = 2.178."""
    counts = np.full((6, 2), 20)
    errors = np.ones((6, 2), dtype=np.int64)
    errors[0] = site0_errors
    return np.full((6, 2), 0.3), counts, np.full((6, 2), 0.8), errors


@pytest.mark.parametrize(
    ("per_class", "floor", "flagged"), [(5, 0.0, True), (5, 0.5, False), (10, 0.5, True)]
)
def test_below_ten_sites_phi_has_a_floor(per_class: int, floor: float, flagged: bool) -> None:
    # Below 10 sites no spread of difficulty is fitted, and the other sites' lower tail (every
    # one at its expected count here) says phi = 0. 10 errors against 2.18 expected: Poisson's
    # tail 9.3e-5 flags site 0; the negative binomial at the floor phi = 0.5 (r = 2,
    # p = 2 / 4.178) gives P(E >= 10) = 0.0086 (scipy.stats.nbinom.sf(9, 2, 2 / 4.178)), not
    # below BH's 0.01 / 6 once doubled for the two kinds of evidence. 20 errors are.
    loss, counts, sd, errors = _six_sites(per_class)
    result = EvidenceDetector(min_error_dispersion=floor).fit(
        loss, counts, sd, per_class_errors=errors
    )
    assert result.summary.errors_counted is True
    assert result.summary.errors_dispersion == pytest.approx(floor)
    first = result.verdicts[0]
    assert first is not None
    assert first.evidence.errors_expected == pytest.approx(2 * 20 * 5.5 / 101)
    if floor == 0.5 and per_class == 5:
        # at least the negative binomial's tail (the rate's own estimation variance adds to it)
        assert given(first.evidence.errors_p_value) >= 0.0086
    assert [i for i, v in enumerate(result.verdicts) if v is not None and v.flag] == (
        [0] if flagged else []
    )
    plain = EvidenceDetector(error_check=False).fit(loss, counts, sd)
    assert not any(v.flag for v in plain.verdicts if v is not None)


def test_phi_is_fitted_when_the_poisson_trim_would_remove_half_of_the_sites() -> None:
    # Twenty clean sites of 2000 samples whose error rates differ by a gamma factor of variance
    # 0.25 (phi): with phi = 0 most of them are "significant" against the others, so trimming
    # stops at half the sites; phi must still be fitted on what stays (it was left at 0).
    rng = np.random.default_rng(2)
    counts = np.full((20, 1), 2000)
    rates = 0.05 * rng.gamma(4.0, 0.25, size=(20, 1))
    errors = rng.binomial(counts, rates)
    ev = error_evidence(errors, counts)
    assert ev.dispersion > 0.05
    assert 2 * int(ev.fit_set.sum()) > 20


def test_the_per_class_part_sees_errors_in_one_class() -> None:
    # 12 sites, 4 classes of 20 samples, 1 error per class; site 0 has 9 in class 0. Its total,
    # 12 against 4 * 20 * (11 + 0.5) / 221 = 4.16 expected, is Poisson-unlikely (P(X >= 12)
    # = 1.3e-3; the estimated rates' own variance widens it to about 2e-3); class 0 alone, 9
    # against 1.04, far more (P(X >= 9) = 1.6e-6, times 4 classes and the factor of two of the
    # combination: 1.2e-5, widened likewise to about 8e-5), with ``class_part``.
    counts = np.full((12, 4), 20)
    errors = np.full((12, 4), 1)
    errors[0, 0] = 9
    total_only = error_evidence(errors, counts)
    assert total_only.observed[0] == 12
    assert total_only.expected[0] == pytest.approx(80 * 11.5 / 221)
    assert 1e-3 < total_only.p_value[0] < 3e-3
    with_classes = error_evidence(errors, counts, class_part=True)
    assert 1e-5 < with_classes.p_value[0] < 2e-4
    assert total_only.p_value[1:].tolist() == with_classes.p_value[1:].tolist() == [1.0] * 11


def test_psi_sees_classes_that_differ_within_sites() -> None:
    # 30 sites of 5 classes x 60 samples at 8 % errors: no class-level spread, psi = 0; the
    # same with each (site, class) rate times exp(N(0, 0.8^2)): psi well above 0.
    rng = np.random.default_rng(5)
    counts = np.full((30, 5), 60)
    alike = rng.binomial(counts, 0.08)
    assert error_evidence(alike, counts).class_dispersion == 0.0
    rates = np.clip(0.08 * np.exp(rng.normal(0.0, 0.8, size=(30, 5))), 0.0, 1.0)
    differ = error_evidence(rng.binomial(counts, rates), counts)
    assert differ.class_dispersion > 0.05


def test_phi_is_at_least_the_losses_spread_of_difficulty() -> None:
    # 20 clean binary sites of about 300 samples whose difficulty differs by a log-normal factor
    # of spread 0.5 (the simulation of docs/eval/error_counts_simulation.py). The counts' phi,
    # read from the lower tail of 20 sites, varied from 0 to 0.64 over 12 rounds: over these
    # 60 rounds (seed 0) a clean site was flagged in 13 without the floor, 4 with phi at least
    # exp(site_tau^2) - 1 (100 rounds: 24 %, 11 %; the losses alone 7 %). Tolerance: 9 of 60.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs" / "eval"))
    from error_counts_simulation import federation

    rng = np.random.default_rng(0)
    base = rng.uniform(0.005, 0.08, size=2)
    alarms = 0
    for _ in range(60):
        loss, counts, sd, errors = federation(rng, 20, 2, 300, base, 0.5, {})
        result = EvidenceDetector(mixture_check=False).fit(
            loss, counts, sd, per_class_errors=errors
        )
        summary = result.summary
        assert summary.errors_counted is True
        tau = given(summary.site_tau)
        assert given(summary.errors_dispersion) >= min(math.expm1(tau**2), 1.0) - 1e-12
        alarms += any(v is not None and v.flag for v in result.verdicts)
    assert alarms <= 9


def test_a_site_that_leaves_its_counts_out_is_judged_on_its_losses_alone() -> None:
    # The mild round: site 0's errors are what flag it. If site 0 sends no counts (NaN row), the
    # other 19 are still judged on both, and site 0 on its losses alone: its p-value is the loss
    # evidence's own (no factor of two), as with the counts off, and it is not flagged.
    loss, counts, sd, errors = _mild_round()
    sent = errors.astype(np.float64)
    sent[0] = np.nan
    result = EvidenceDetector().fit(loss, counts, sd, per_class_errors=sent)
    assert result.summary.errors_counted is True
    silent, other = result.verdicts[0], result.verdicts[1]
    assert silent is not None
    assert other is not None
    assert silent.evidence.errors is None
    assert silent.evidence.errors_p_value is None
    assert other.evidence.errors == 4
    losses_only = EvidenceDetector(error_check=False).fit(loss, counts, sd).verdicts[0]
    assert losses_only is not None
    assert silent.evidence.p_value == pytest.approx(losses_only.evidence.p_value)
    assert not silent.flag


def test_reported_counts_need_min_sites_and_whole_rows() -> None:
    counts = np.full((4, 2), 10)
    counts[3, 1] = 0
    sent = np.array([[1.0, 0.0], [np.nan, np.nan], [2.0, 1.0], [0.0, np.nan]])
    got = reported_counts(sent, counts, min_sites=3)
    assert got is not None
    assert got.reporting.tolist() == [True, False, True, True]  # site 3 does not hold class 1
    assert got.errors.tolist() == [[1, 0], [0, 0], [2, 1], [0, 0]]
    assert reported_counts(sent, counts, min_sites=4) is None
    sent[2, 1] = np.nan  # one held class's count missing, the other sent
    with pytest.raises(InvalidInputError, match="integer for every held class"):
        reported_counts(sent, counts, min_sites=3)
