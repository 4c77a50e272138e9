"""The calibrated evidence detector (service/audit/evidence.py).

Literal inputs with hand-checked answers, properties, and simulated clean and noisy federations
(fixed seeds, stated tolerances) for the false-alarm rate and the power.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.audit import (
    AuditConfig,
    ClientRoundData,
    DictStateReader,
    InvalidInputError,
    InvalidParameterError,
    run_audit,
)
from service.audit.class_null import (
    SMALL_CLASS_Z_CAP,
    _median_above,
    benjamini_hochberg,
    fit_class_null,
    site_p_values,
    weighted_median,
)
from service.audit.detection import ClientVerdict, DetectionResult, FedNoRoResult
from service.audit.evidence import EvidenceDetector
from service.audit.verdict_types import FedNoRoSummary, FedNoRoVerdictEvidence
from tests.audit._readers import given


class TestWeightedMedian:
    def test_odd_equal_weights(self):
        assert weighted_median(np.array([3.0, 1.0, 2.0]), np.ones(3)) == 2.0

    def test_even_equal_weights_take_the_midpoint(self):
        assert weighted_median(np.array([4.0, 1.0, 3.0, 2.0]), np.ones(4)) == 2.5

    def test_heavy_weight_wins(self):
        assert weighted_median(np.array([1.0, 10.0]), np.array([3.0, 1.0])) == 1.0


class TestBenjaminiHochberg:
    def test_hand_checked(self):
        # sorted p: 0.01, 0.03, 0.04, 0.5 against i * 0.05 / 4 = 0.0125, 0.025, 0.0375, 0.05:
        # only the first passes; adjusted p = min over j >= i of p_(j) * 4 / j.
        reject, adjusted = benjamini_hochberg(np.array([0.01, 0.04, 0.03, 0.5]), 0.05)
        assert reject.tolist() == [True, False, False, False]
        assert adjusted == pytest.approx([0.04, 0.16 / 3, 0.16 / 3, 0.5])

    def test_step_up_rejects_below_a_passing_rank(self):
        # p_(2) = 0.04 <= 2 * 0.05 / 2: both rejected although p_(1) = 0.03 > 0.025.
        reject, _ = benjamini_hochberg(np.array([0.04, 0.03]), 0.05)
        assert reject.tolist() == [True, True]

    def test_empty(self):
        reject, adjusted = benjamini_hochberg(np.array([]), 0.05)
        assert reject.size == 0
        assert adjusted.size == 0


class TestClassNull:
    def test_equal_values_give_no_spread(self):
        fit = fit_class_null(np.full(5, 0.3), np.full(5, 0.01))
        assert fit.mu == 0.3
        assert fit.tau2 == 0.0

    def test_one_outlier_moves_neither_centre_nor_spread(self):
        fit = fit_class_null(np.array([1.0, 1.0, 1.0, 1.0, 10.0]), np.ones(5))
        assert fit.mu == 1.0
        assert fit.tau2 == 0.0

    def test_spread_beyond_sampling_is_fitted(self):
        # Values +-2 around 0 with within variance 1: |r| = 2 everywhere at tau2 = 0, and the
        # median |r| reaches 0.6745 when 2 / sqrt(1 + tau2) = 0.6745: tau2 = 7.79.
        fit = fit_class_null(np.array([-2.0, -2.0, 2.0, 2.0, 2.0, -2.0]), np.ones(6))
        assert fit.tau2 == pytest.approx((2 / 0.6744897501960817) ** 2 - 1, rel=1e-6)


class TestSitePValues:
    def test_one_class(self):
        p, z = site_p_values(np.array([[3.0, np.nan]]), np.array([[4, 0]]))
        # Stouffer z = 3, p = Phi(-3) = 0.0013499; Bonferroni over 1 class the same; x 2.
        assert z[0] == pytest.approx(3.0)
        assert p[0] == pytest.approx(2 * 0.0013498980316301)

    def test_two_classes(self):
        p, z = site_p_values(np.array([[1.0, 1.0]]), np.array([[1, 1]]))
        # Stouffer: 2 / sqrt(2) = 1.41421, p = 0.0786496; min class p 0.158655 x 2 = 0.31731.
        assert z[0] == pytest.approx(math.sqrt(2))
        assert p[0] == pytest.approx(2 * 0.0786496035251426)

    def test_no_class_counts(self):
        p, z = site_p_values(np.array([[np.nan, np.nan]]), np.array([[0, 0]]))
        assert p[0] == 1.0
        assert z[0] == 0.0

    def test_lower_direction(self):
        p, _ = site_p_values(np.array([[-3.0]]), np.array([[4]]), direction=-1.0)
        assert p[0] == pytest.approx(2 * 0.0013498980316301)


def _federation(
    rng: np.random.Generator,
    n_sites: int,
    noisy: dict[int, float],
    *,
    classes: int = 4,
    per_class: int = 40,
    hard: float = 0.03,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-class mean loss and spread from per-sample losses: most samples learned (loss ~
    Exp(0.1)), a fraction ``hard`` of hard samples at ~ 2 + Exp(1) nats, and each noisy site's
    wrong labels (its rate) at ~ 3 + Exp(1) nats."""
    loss = np.zeros((n_sites, classes))
    sd = np.zeros((n_sites, classes))
    counts = np.full((n_sites, classes), per_class)
    for k in range(n_sites):
        for c in range(classes):
            x = rng.exponential(0.1, per_class)
            h = rng.random(per_class) < hard
            x[h] = 2.0 + rng.exponential(1.0, int(h.sum()))
            if k in noisy:
                wrong = rng.random(per_class) < noisy[k]
                x[wrong] = 3.0 + rng.exponential(1.0, int(wrong.sum()))
            loss[k, c], sd[k, c] = x.mean(), x.std()
    return loss, counts, sd


class TestDetector:
    def test_one_noisy_site_is_flagged_with_its_classes(self):
        rng = np.random.default_rng(0)
        loss, counts, sd = _federation(rng, 8, {3: 0.4})
        result = EvidenceDetector().fit(loss, counts, sd)
        assert result.status == "ok"
        assert [v.flag for v in result.verdicts] == [k == 3 for k in range(8)]
        assert sorted(given(result.verdicts[3].evidence.noisy_classes)) == [0, 1, 2, 3]

    def test_all_equal_sites_flag_nobody(self):
        loss = np.full((6, 3), 0.2)
        sd = np.full((6, 3), 0.3)
        counts = np.full((6, 3), 30)
        result = EvidenceDetector().fit(loss, counts, sd)
        assert result.status == "ok"
        assert [v.flag for v in result.verdicts] == [False] * 6
        assert all(v.score == pytest.approx(0.0) for v in result.verdicts)

    def test_permutation_invariance(self):
        rng = np.random.default_rng(1)
        loss, counts, sd = _federation(rng, 10, {2: 0.3, 7: 0.5})
        order = rng.permutation(10)
        a = EvidenceDetector().fit(loss, counts, sd)
        b = EvidenceDetector().fit(loss[order], counts[order], sd[order])
        assert [a.verdicts[i].flag for i in order] == [v.flag for v in b.verdicts]
        assert [a.verdicts[i].score for i in order] == pytest.approx([v.score for v in b.verdicts])

    def test_a_site_is_judged_only_on_the_classes_it_holds(self):
        rng = np.random.default_rng(2)
        loss, counts, sd = _federation(rng, 8, {})
        # Site 0 holds only class 0, and its loss on the classes it does not hold is garbage.
        counts[0, 1:] = 0
        loss[0, 1:] = 99.0
        sd[0, 1:] = 99.0
        result = EvidenceDetector().fit(loss, counts, sd)
        assert result.verdicts[0].flag is False
        assert result.verdicts[0].evidence.class_z[1:] == [None, None, None]

    def test_too_few_sites_without_spreads_is_undetermined(self):
        loss, counts, _ = _federation(np.random.default_rng(3), 4, {0: 0.9})
        result = EvidenceDetector().fit(loss, counts, None)
        assert result.status == "undetermined"
        assert result.verdicts == [None] * 4
        assert "at least 5 (or 2 with per_class_loss_sd)" in (result.reason or "")
        single = EvidenceDetector().fit(loss[:1], counts[:1], None)
        assert single.status == "undetermined"

    def test_a_noisy_majority_is_never_flagged(self):
        loss, counts, sd = _federation(np.random.default_rng(4), 6, {0: 0.5, 1: 0.5, 2: 0.5})
        result = EvidenceDetector().fit(loss, counts, sd)
        # Three against three: no consensus (the robust fit takes the gap for heterogeneity).
        assert result.status == "inconclusive"
        assert [v.flag for v in result.verdicts] == [None] * 6  # an abstention is no verdict
        assert "disagree far beyond sampling error" in (result.reason or "")

    def test_flagging_max_flagged_fraction_of_the_sites_is_inconclusive(self):
        loss, counts, sd = _federation(np.random.default_rng(4), 10, {})
        loss[:4] += 1.0  # four of ten far above the other six
        result = EvidenceDetector(max_flagged_fraction=0.3).fit(loss, counts, sd)
        assert result.summary.significant_high == 4
        assert result.status == "inconclusive"
        assert "not a clear minority" in (result.reason or "")
        assert not any(v.flag for v in result.verdicts)

    def test_a_model_that_learned_nothing_gives_no_verdict(self):
        # Every site at ln 2 on a balanced binary task: the loss of predicting the prior.
        loss = np.full((6, 2), math.log(2))
        loss[5] = 2.0
        counts = np.full((6, 2), 50)
        sd = np.full((6, 2), 0.1)
        result = EvidenceDetector().fit(loss, counts, sd)
        assert result.status == "inconclusive"
        assert "label prior" in (result.reason or "")
        assert not any(v.flag for v in result.verdicts)

    def test_evidence_both_ways_flags_and_counts_the_lower_tail(self):
        loss = np.full((10, 2), 0.3)
        loss[0] = 1.5  # far above the consensus
        loss[1:3] = 0.01  # two sites far below it
        counts = np.full((10, 2), 100)
        sd = np.full((10, 2), 0.3)
        result = EvidenceDetector().fit(loss, counts, sd)
        # the lower tail is the report's warning, not a reason to abstain (issue 20: sites can
        # lie about their losses, and two that did silenced every round)
        assert result.status == "ok"
        assert [v.flag for v in result.verdicts] == [True] + [False] * 9
        assert result.summary.significant_high == 1
        assert result.summary.significant_low == 2

    @pytest.mark.parametrize("liars", [1, 2, 3])
    def test_sites_below_the_consensus_do_not_silence_the_audit(self, liars):
        # Issue 20's accomplices: sites report a near-perfect model (loss 0.01, a small spread)
        # so that the evidence "points both ways" and the noisy site 0 goes unflagged. One, two
        # or three of them among ten: the audit still flags site 0 and no one else, and the
        # accomplices' verdicts carry their large negative z.
        loss = np.full((10, 2), 0.3)
        loss[0] = 1.5
        loss[1 : 1 + liars] = 0.01
        counts = np.full((10, 2), 100)
        sd = np.full((10, 2), 0.3)
        sd[1 : 1 + liars] = 0.02
        result = EvidenceDetector().fit(loss, counts, sd)
        assert result.status == "ok"
        assert [v.flag for v in result.verdicts] == [True] + [False] * 9
        for liar in range(1, 1 + liars):
            assert given(result.verdicts[liar].evidence.stouffer_z) < -3

    def test_an_anchor_that_looks_noisy_inverts_the_orientation(self):
        # The global model learned inverted labels: the curated site (0) and the one other clean
        # site (1) have a high loss, the six inverted sites a low one.
        loss = np.array([[2.0, 2.0]] * 2 + [[0.2, 0.2]] * 6)
        loss[2:] += np.linspace(0.0, 0.01, 6)[:, None]
        counts = np.full((8, 2), 100)
        sd = np.full((8, 2), 0.5)
        plain = EvidenceDetector().fit(loss, counts, sd)
        assert [v.flag for v in plain.verdicts] == [True, True] + [False] * 6
        anchored = EvidenceDetector().fit(loss, counts, sd, anchors=[True] + [False] * 7)
        assert anchored.summary.mode == "anchored"
        assert anchored.summary.anchor_orientation == "inverted"
        assert [v.flag for v in anchored.verdicts] == [False, False] + [True] * 6

    def test_without_spreads_the_scale_is_fitted(self):
        loss, counts, _ = _federation(np.random.default_rng(5), 12, {4: 0.5})
        result = EvidenceDetector().fit(loss, counts)
        assert result.summary.spreads_reported is False
        assert [v.flag for v in result.verdicts] == [k == 4 for k in range(12)]

    def test_bad_input(self):
        loss = np.full((6, 2), 0.2)
        counts = np.full((6, 2), 10)
        with pytest.raises(InvalidInputError, match="class_counts: shape"):
            EvidenceDetector().fit(loss, counts[:, :1])
        bad = loss.copy()
        bad[0, 0] = np.nan
        with pytest.raises(InvalidInputError, match="held class"):
            EvidenceDetector().fit(bad, counts)
        with pytest.raises(InvalidInputError, match="anchors"):
            EvidenceDetector().fit(loss, counts, anchors=[True])
        with pytest.raises(InvalidParameterError, match="q"):
            EvidenceDetector(q=0.0)
        with pytest.raises(InvalidParameterError, match="q"):
            AuditConfig.from_flat(evidence_q=0.9)


@pytest.mark.parametrize("n_sites", [5, 20, 50])
def test_false_alarm_rate_on_clean_federations(n_sites):
    """Under the null, BH at q flags somebody in a round with probability <= q (module
    docstring). 300 simulated clean rounds per size with q = 0.01: expected <= 3 rounds with a
    flag; we allow 9 (3 %), far below what an uncalibrated rule gives (the mixture's split
    without its guard flags somebody every round)."""
    rng = np.random.default_rng(100 + n_sites)
    # The BH rule's calibration; the mixture cross-check is simulated below (and is slower).
    detector = EvidenceDetector(q=0.01, mixture_check=False)
    rounds_with_flag = 0
    for _ in range(300):
        loss, counts, sd = _federation(rng, n_sites, {})
        result = detector.fit(loss, counts, sd)
        rounds_with_flag += any(v is not None and v.flag for v in result.verdicts)
    assert rounds_with_flag <= 9


def test_finds_a_single_noisy_site_among_fifty():
    """One site with 20 % wrong labels among 50: flagged (and nobody else) in at least 95 of 100
    simulated rounds."""
    rng = np.random.default_rng(7)
    detector = EvidenceDetector(mixture_check=False)
    exact = 0
    for _ in range(100):
        loss, counts, sd = _federation(rng, 50, {17: 0.2})
        flags = [v.flag for v in detector.fit(loss, counts, sd).verdicts]
        exact += flags == [k == 17 for k in range(50)]
    assert exact >= 95


# One round of signals recorded from a simulated federation: breast cancer, 10 IID sites, sites
# 3, 4, 6, 7, 8 and 9 with 30-50 % symmetric label noise (the stress matrix's m09, fedavg, seed
# 0, round 30), rounded to 3 decimals. A noisy majority: the robust centre lies inside the noisy
# group and its spread widens, so that no site is significantly above or below it.
M09_LOSS = [
    [0.178, 0.206], [0.334, 0.19], [0.163, 0.235], [0.901, 0.524], [0.857, 0.273],
    [0.195, 0.249], [0.757, 0.821], [0.715, 0.892], [1.183, 0.351], [0.966, 0.556],
]  # fmt: skip
M09_COUNTS = [
    [23, 23], [20, 26], [21, 25], [22, 24], [24, 22],
    [11, 34], [25, 20], [18, 27], [26, 19], [25, 20],
]  # fmt: skip
M09_SD = [
    [0.156, 0.177], [0.396, 0.151], [0.27, 0.203], [0.806, 0.758], [0.618, 0.349],
    [0.159, 0.223], [0.905, 0.907], [0.673, 1.226], [0.76, 0.329], [0.851, 0.753],
]  # fmt: skip
M09_NOISY = [False, False, False, True, True, False, True, True, True, True]


class TestNoisyMajority:
    def test_the_evidence_alone_says_ok_and_flags_nobody(self):
        # The failure the mixture check is there for: "ok", nobody flagged, nothing said.
        result = EvidenceDetector(mixture_check=False).fit(M09_LOSS, M09_COUNTS, M09_SD)
        assert result.status == "ok"
        assert not any(v.flag for v in result.verdicts)

    def test_the_mixture_check_abstains(self):
        result = EvidenceDetector().fit(M09_LOSS, M09_COUNTS, M09_SD)
        assert result.status == "inconclusive"
        assert "loss mixture" in (result.reason or "")
        assert "6 of 10 sites" in (result.reason or "")
        assert [v.flag for v in result.verdicts] == [None] * 10
        assert result.summary.mixture_flagged == 6

    def test_a_mixture_given_by_the_caller_is_used(self):
        # A mixture result that flags only site 3 (a minority): no reason to abstain.
        verdicts: list[ClientVerdict[FedNoRoVerdictEvidence] | None] = [
            ClientVerdict(
                score=1.0, flag=k == 3, evidence=FedNoRoVerdictEvidence([], [], 0, 0, 0, 0)
            )
            for k in range(10)
        ]
        one = DetectionResult("fednoro", "ok", None, verdicts, FedNoRoSummary())
        result = EvidenceDetector().fit(M09_LOSS, M09_COUNTS, M09_SD, mixture=one)
        assert result.status == "ok"
        assert result.summary.mixture_flagged == 1
        undetermined: FedNoRoResult = DetectionResult(
            "fednoro", "undetermined", "x", [None] * 10, FedNoRoSummary()
        )
        result = EvidenceDetector().fit(M09_LOSS, M09_COUNTS, M09_SD, mixture=undetermined)
        assert result.status == "ok"
        assert result.summary.mixture_flagged is None

    def test_one_clean_anchor_flags_the_noisy_majority(self):
        anchors = [True] + [False] * 9
        result = EvidenceDetector().fit(M09_LOSS, M09_COUNTS, M09_SD, anchors=anchors)
        assert result.status == "ok"
        assert result.summary.mode == "anchored"
        assert [v.flag for v in result.verdicts] == M09_NOISY

    def test_a_single_noisy_site_is_not_a_majority_split(self):
        loss, counts, sd = _federation(np.random.default_rng(11), 10, {4: 0.4})
        result = EvidenceDetector().fit(loss, counts, sd)
        assert result.status == "ok"
        assert [v.flag for v in result.verdicts] == [k == 4 for k in range(10)]

    @pytest.mark.parametrize("n_sites", [6, 20])
    def test_clean_federations_rarely_abstain_on_the_mixture(self, n_sites):
        """On simulated clean rounds FedNoRo's calibrated guard (quantile 0.995 of Ashman's D
        for a split of one normal population) rarely passes, and a majority split more rarely
        still: 40 rounds per size, at most 2 abstentions for the mixture (none were seen in
        800 rounds of 5-50 sites while the rule was designed)."""
        rng = np.random.default_rng(300 + n_sites)
        detector = EvidenceDetector()
        abstained = 0
        for _ in range(40):
            loss, counts, sd = _federation(rng, n_sites, {})
            result = detector.fit(loss, counts, sd)
            abstained += "loss mixture" in (result.reason or "")
            assert not any(v is not None and v.flag for v in result.verdicts)
        assert abstained <= 2

    def test_mixture_check_must_be_a_bool(self):
        with pytest.raises(InvalidParameterError, match="mixture_check"):
            EvidenceDetector(mixture_check=1)  # type: ignore[arg-type]


def test_weighted_median_leaves_out_zero_weights():
    assert weighted_median(np.array([0.0, 1.0, 10.0]), np.array([1.0, 0.0, 1.0])) == 5.0


def test_median_above_by_counting_answers_as_the_median_does():
    # hand-checked: [1, 2, 3, 4] has median 2.5; [1, 1, 5] has median 1
    assert _median_above(np.array([4.0, 1.0, 3.0, 2.0]), 2.4)
    assert not _median_above(np.array([4.0, 1.0, 3.0, 2.0]), 2.5)
    assert _median_above(np.array([1.0, 5.0, 1.0]), 0.99)
    assert not _median_above(np.array([1.0, 5.0, 1.0]), 1.0)
    # every size up to 11, ties, thresholds at every value and every midpoint of two values
    # (where the two middle values straddle the threshold their mean decides, rounded alike)
    rng = np.random.default_rng(7)
    for _ in range(1500):
        x = rng.integers(0, 6, size=int(rng.integers(1, 12))) / rng.choice([1.0, 3.0, 7.0])
        pairs = (x[:, None] + x[None, :]).ravel() / 2.0
        for t in np.concatenate([x, pairs, np.nextafter(pairs, np.inf), [-1.0, 9.0]]):
            assert _median_above(x.copy(), float(t)) == bool(np.median(x) > t), (x, t)


class TestAnchorGuards:
    @staticmethod
    def inverted() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sites 0 and 1 far above six tight sites (as in the inverted-consensus test)."""
        loss = np.array([[2.0, 2.0]] * 2 + [[0.2, 0.2]] * 6)
        loss[2:] += np.linspace(0.0, 0.01, 6)[:, None]
        return loss, np.full((8, 2), 100), np.full((8, 2), 0.5)

    def test_anchors_that_disagree_give_no_verdict(self):
        loss, counts, sd = self.inverted()
        anchors = [True, False, True, False, False, False, False, False]  # one high, one low
        result = EvidenceDetector().fit(loss, counts, sd, anchors=anchors)
        assert result.status == "inconclusive"
        assert "anchors disagree" in (result.reason or "")
        assert not any(v.flag for v in result.verdicts)

    def test_anchored_mode_needs_the_spreads(self):
        loss, counts, _ = self.inverted()
        result = EvidenceDetector().fit(loss, counts, None, anchors=[True] + [False] * 7)
        assert result.status == "inconclusive"
        assert "per_class_loss_sd" in (result.reason or "")
        assert not any(v.flag for v in result.verdicts)

    def test_an_anchor_without_a_shared_class_changes_nothing(self):
        # An uninformative model (every loss ln 2) is inconclusive; an anchor that holds no
        # sample does not turn that into a verdict.
        loss = np.full((6, 2), math.log(2))
        counts = np.full((6, 2), 50)
        counts[0] = 0
        loss[0] = np.nan
        sd = np.full((6, 2), 0.1)
        result = EvidenceDetector().fit(loss, counts, sd, anchors=[True] + [False] * 5)
        assert result.status == "inconclusive"
        assert "label prior" in (result.reason or "")

    def test_one_class_is_inconclusive_even_with_an_anchor(self):
        loss = np.full((6, 2), np.nan)
        loss[:, 0] = 0.1 + 0.05 * np.arange(6)
        counts = np.zeros((6, 2), dtype=int)
        counts[:, 0] = 100
        sd = np.full((6, 2), np.nan)
        sd[:, 0] = 0.2
        result = EvidenceDetector().fit(loss, counts, sd, anchors=[True] + [False] * 5)
        assert result.status == "inconclusive"
        assert "one class" in (result.reason or "")

    def test_anchors_must_be_booleans(self):
        loss, counts, sd = self.inverted()
        with pytest.raises(InvalidInputError, match="booleans"):
            EvidenceDetector().fit(loss, counts, sd, anchors=["False"] * 8)


def test_a_class_held_once_does_not_flag_a_site_alone():
    # Site 0 holds one sample of class 1, a hard one (5 nats against 0.2): z of about 9 on that
    # class alone, but its 99 samples of class 0 are ordinary.
    loss = np.full((8, 2), 0.2)
    loss[:, 0] += np.linspace(-0.01, 0.01, 8)
    loss[0, 1] = 5.0
    counts = np.array([[99, 1]] + [[50, 50]] * 7)
    sd = np.full((8, 2), 0.5)
    sd[0, 1] = 0.0
    result = EvidenceDetector().fit(loss, counts, sd)
    assert given(given(result.verdicts[0].evidence.class_z)[1]) > 5
    assert result.verdicts[0].flag is False
    assert result.verdicts[0].evidence.noisy_classes == []
    with_single = EvidenceDetector(min_class_count=1).fit(loss, counts, sd)
    assert with_single.verdicts[0].flag is True


def test_small_classes_enter_stouffer_capped_at_three():
    # One site, two classes: class 0 held 4 times with z = 10 (capped to 3), class 1 held 16
    # times with z = 1 (not capped). Stouffer = (sqrt(4) * 3 + sqrt(16) * 1) / sqrt(20)
    # = (6 + 4) / 4.472136 = 2.236068. Uncapped it would be (20 + 4) / 4.472136 = 5.366563.
    z = np.array([[10.0, 1.0]])
    counts = np.array([[4, 16]])
    _, stouffer = site_p_values(z, counts, 1.0, min_class_count=5)
    assert stouffer[0] == pytest.approx(2.236068, abs=1e-6)
    _, uncapped = site_p_values(z, counts, 1.0, min_class_count=1)
    assert uncapped[0] == pytest.approx(5.366563, abs=1e-6)
    assert SMALL_CLASS_Z_CAP == 3.0


def test_a_small_site_noisy_in_every_class_is_still_found():
    """The case a distribution-free bound lost: 30 sites of 3 samples in each of 10 classes, one
    with 60 % wrong labels: every class a little above the others. Flagged (and nobody else)
    in at least 27 of 30 simulated rounds."""
    rng = np.random.default_rng(21)
    detector = EvidenceDetector(mixture_check=False)
    exact = 0
    for _ in range(30):
        loss, counts, sd = _federation(rng, 30, {5: 0.6}, classes=10, per_class=3)
        flags = [v.flag for v in detector.fit(loss, counts, sd).verdicts]
        exact += flags == [k == 5 for k in range(30)]
    assert exact >= 27


def test_one_hard_sample_of_a_class_held_once_does_not_carry_stouffer():
    # The clean-federation false alarm this guards against (digits, 50 Dirichlet sites): a
    # small site holds class 0 once, and that one sample is hard (3 nats against 0.05). Its
    # other classes are ordinary. Normal z on class 0: (3 - 0.05) / sqrt(0.2^2 + ...) ~ 14, and
    # Stouffer with weights sqrt(n) over the site's 10 samples would give ~ 4.6 (p ~ 4e-6, a
    # flag among 20 sites). Capped at 3 the class brings 3 / sqrt(10) ~ 0.95: no flag.
    loss = np.full((20, 4), 0.05)
    loss[:, 1:] = 0.2 + np.linspace(-0.01, 0.01, 20)[:, None]
    counts = np.full((20, 4), 30)
    counts[0] = [1, 3, 3, 3]
    sd = np.full((20, 4), 0.3)
    sd[:, 0] = 0.2
    loss[0, 0], sd[0, 0] = 3.0, 0.0
    result = EvidenceDetector().fit(loss, counts, sd)
    assert given(given(result.verdicts[0].evidence.class_z)[0]) > 10
    assert result.verdicts[0].flag is False
    assert given(result.verdicts[0].evidence.stouffer_z) < 1.5
    assert not any(v.flag for v in result.verdicts)


def test_an_inconclusive_primary_falls_back_to_fedavg_and_says_why():
    # Three sites far above three others: no consensus (I^2 > 0.9), so no flag and FedAvg.
    loss, counts, sd = _federation(np.random.default_rng(4), 6, {0: 0.5, 1: 0.5, 2: 0.5})
    state = DictStateReader({"w": np.zeros(2, dtype=np.float32)})
    clients = [
        ClientRoundData(
            client_id=f"s{k}",
            num_samples=int(counts[k].sum()),
            class_counts=counts[k],
            per_class_loss=loss[k],
            per_class_loss_sd=sd[k],
            state=DictStateReader({"w": np.full(2, float(k), dtype=np.float32)}),
        )
        for k in range(6)
    ]
    config = AuditConfig(detectors=("evidence",), primary_detector="evidence", aggregation="daagg")
    outcome = run_audit(state, clients, config, round_index=3)
    assert outcome.detections["evidence"].status == "inconclusive"
    assert outcome.primary_flags == [None] * 6
    assert outcome.aggregation.rule == "fedavg"
    assert "primary detector 'evidence' inconclusive" in (outcome.aggregation.fallback_reason or "")


def test_a_loss_beyond_any_model_is_refused_not_a_failed_round() -> None:
    # One site at 1e155 nats overflowed the class fit's squared deviations (ZeroDivisionError
    # in the round's close); up to MAX_LOSS the detector answers.
    from service.audit import MAX_LOSS, InvalidInputError

    rng = np.random.default_rng(0)
    loss = rng.uniform(0.2, 0.6, size=(12, 3))
    counts = np.full((12, 3), 30)
    sd = np.full((12, 3), 0.4)
    loss[0, 1] = MAX_LOSS
    assert EvidenceDetector().fit(loss, counts, sd).status in {"ok", "inconclusive"}
    loss[0, 1] = 1e155
    with pytest.raises(InvalidInputError, match="per_class_loss: a loss above 1e"):
        EvidenceDetector().fit(loss, counts, sd)


def test_a_class_the_sites_disagree_on_is_named_when_nobody_is_flagged() -> None:
    from service.audit.class_null import ClassEvidence
    from service.audit.evidence_abstention import disagreeing_classes

    def evidence(i2: list[float]) -> ClassEvidence:
        n = len(i2)
        zeros = np.zeros((1, n))
        return ClassEvidence(z=zeros, mu=np.zeros(n), tau=np.zeros(n), heterogeneity=np.asarray(i2))

    none, one = np.zeros(3, dtype=bool), np.array([False, True, False])
    i2 = evidence([0.5, 0.95, float("nan")])
    assert disagreeing_classes(i2, none, "ok", "consensus") == [1]
    assert disagreeing_classes(evidence([0.9, 0.89, 0.0]), none, "ok", "consensus") == []
    assert disagreeing_classes(i2, one, "ok", "consensus") == []  # someone stands out
    assert disagreeing_classes(i2, none, "inconclusive", "consensus") == []
    assert disagreeing_classes(i2, none, "ok", "anchored") == []


def test_a_spread_class_without_an_outlier_is_named_and_flags_nobody() -> None:
    # 20 sites: class 0 agrees (loss 0.05 everywhere); class 1 spreads evenly from 0.05 to 0.6
    # (about 100 standard errors of a site's mean across the range), a continuum with no site
    # apart from the rest: the fitted spread tau takes it in, nobody is significant, and the
    # summary says that the sites disagree in class 1. Sampling noise alone names nothing.
    k = 20
    loss = np.full((k, 2), 0.05)
    loss[:, 1] = np.linspace(0.05, 0.6, k)
    counts = np.full((k, 2), 100)
    sd = np.full((k, 2), 0.1)
    result = EvidenceDetector().fit(loss, counts, sd)
    assert result.status == "ok"
    assert not any(v.flag for v in result.verdicts)
    assert result.summary.disagreeing_classes == [1]
    calm = np.full((k, 2), 0.05) + np.random.default_rng(3).normal(0, 0.01, (k, 2))
    assert EvidenceDetector().fit(calm, counts, sd).summary.disagreeing_classes == []
