"""The accuracy evidence (service/audit/accuracy_evidence.py) and its place in the evidence
detector: literal inputs with hand-checked answers, properties, a simulated false-alarm rate."""

from __future__ import annotations

import numpy as np
import pytest

from service.audit import InvalidInputError
from service.audit.accuracy_evidence import accuracy_evidence
from service.audit.evidence import EvidenceDetector
from service.audit.verdict_types import ABSENT
from tests.audit._readers import given


class TestAccuracyEvidence:
    def test_one_site_far_below_six_equal_ones(self):
        # Errors 0.1 (six sites) and 0.5, 100 samples each. Centre 0.1 (the median); no spread
        # beyond sampling (tau 0). Shrunk error at the centre p = (0.1 * 100 + 1) / 102 =
        # 11/102, sampling variance p (1 - p) / 100 = 9.6213e-4; the centre's variance
        # pi/2 / (7 / 9.6213e-4) = 2.1590e-4. z = 0.4 / sqrt(9.6213e-4 + 2.1590e-4) = 11.654.
        result = accuracy_evidence([0.9] * 6 + [0.5], [100] * 7, q=0.01, min_gap=0.05)
        assert result.centre == pytest.approx(0.1)
        assert result.tau == 0.0
        assert result.z[6] == pytest.approx(11.654, abs=1e-3)
        assert result.z[:6] == pytest.approx([0.0] * 6, abs=1e-12)
        assert result.gap[6] == pytest.approx(0.4)
        assert result.flags.tolist() == [False] * 6 + [True]

    def test_equal_accuracies_flag_nobody(self):
        result = accuracy_evidence([0.8] * 9, [50] * 9, q=0.05, min_gap=0.0)
        assert not result.flags.any()
        assert result.z == pytest.approx([0.0] * 9, abs=1e-12)

    def test_perfect_fits_everywhere_still_have_a_sampling_variance(self):
        # All errors 0: the shrunk centre 1/102 keeps the variance positive, z finite.
        result = accuracy_evidence([1.0] * 5 + [0.97], [100] * 6, q=0.01, min_gap=0.0)
        assert np.isfinite(result.z).all()
        assert result.z[5] > 0

    def test_a_significant_but_small_gap_is_not_flagged(self):
        # 100,000 samples each: 2 points below the others is very significant, and irrelevant.
        acc = [0.99] * 6 + [0.97]
        loose = accuracy_evidence(acc, [100_000] * 7, q=0.01, min_gap=0.0)
        strict = accuracy_evidence(acc, [100_000] * 7, q=0.01, min_gap=0.05)
        assert loose.flags[6]
        assert not strict.flags[6]

    def test_an_anchor_is_never_flagged(self):
        never = [False] * 6 + [True]
        result = accuracy_evidence([0.9] * 6 + [0.5], [100] * 7, q=0.01, min_gap=0.05, never=never)
        assert not result.flags.any()

    def test_permuting_the_sites_permutes_the_answer(self):
        rng = np.random.default_rng(3)
        acc = rng.uniform(0.6, 0.95, 12)
        acc[4] = 0.2
        n = rng.integers(20, 300, 12)
        perm = rng.permutation(12)
        a = accuracy_evidence(acc, n, q=0.05, min_gap=0.05)
        b = accuracy_evidence(acc[perm], n[perm], q=0.05, min_gap=0.05)
        assert b.z == pytest.approx(a.z[perm])
        assert b.flags.tolist() == a.flags[perm].tolist()

    @pytest.mark.parametrize(
        ("acc", "n", "message"),
        [
            ([0.9, 0.9, 1.2], [10, 10, 10], "<= 1"),
            ([0.9, 0.9, 0.9], [10, 10], "entries"),
            ([0.9, 0.9], [10, 10], "at least 3"),
            ([0.9, 0.9, 0.9], [10, 0, 10], "num_samples"),
        ],
    )
    def test_bad_input(self, acc, n, message):
        with pytest.raises(InvalidInputError, match=message):
            accuracy_evidence(acc, n, q=0.01, min_gap=0.05)


def test_false_alarm_rate_of_binomial_accuracies():
    """Clean sites whose accuracies differ only by sampling (Binomial(n, 0.9) out of n,
    n from 30 to 300): BH at q = 0.01 with no gap floor flags somebody in at most q of the
    rounds in expectation; 400 rounds of 10 sites, we allow 12 (3 %)."""
    rng = np.random.default_rng(7)
    rounds_with_flag = 0
    for _ in range(400):
        n = rng.integers(30, 301, 10)
        acc = rng.binomial(n, 0.9) / n
        rounds_with_flag += bool(accuracy_evidence(acc, n, q=0.01, min_gap=0.0).flags.any())
    assert rounds_with_flag <= 12


def _flat_losses(k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """k sites with identical per-class losses, spreads and counts: no loss evidence at all."""
    loss = np.tile([0.2, 0.3, 0.25], (k, 1))
    counts = np.full((k, 3), 40)
    sd = np.full((k, 3), 0.3)
    return loss, counts, sd


class TestInTheEvidenceDetector:
    def test_a_site_whose_losses_look_clean_is_flagged_by_its_accuracy(self):
        loss, counts, sd = _flat_losses(8)
        acc = [0.95] * 7 + [0.55]
        result = EvidenceDetector(mixture_check=False, accuracy_check=True).fit(
            loss, counts, sd, train_accuracy=acc, num_samples=[120] * 8
        )
        assert result.status == "ok"
        assert [v.flag for v in result.verdicts] == [False] * 7 + [True]
        last = result.verdicts[7].evidence
        assert last.flagged_by_accuracy is True
        assert last.significant is False  # the loss evidence alone did not flag it
        assert result.verdicts[7].score == pytest.approx(last.accuracy_z)  # scored by it
        assert last.accuracy_gap == pytest.approx(0.4)
        assert result.summary.accuracy_flagged == 1
        assert result.summary.accuracy_centre == pytest.approx(0.95)

    def test_switched_off_or_missing_it_changes_nothing(self):
        loss, counts, sd = _flat_losses(8)
        acc = [0.95] * 7 + [0.55]
        off = EvidenceDetector(mixture_check=False, accuracy_check=False).fit(
            loss, counts, sd, train_accuracy=acc, num_samples=[120] * 8
        )
        missing = EvidenceDetector(mixture_check=False, accuracy_check=True).fit(loss, counts, sd)
        for result in (off, missing):
            assert not any(v.flag for v in result.verdicts)
            assert result.verdicts[7].evidence.accuracy_z is ABSENT
        assert missing.summary.accuracy_note.startswith("no accuracy evidence")

    def test_it_never_flags_max_flagged_fraction_of_the_sites(self):
        # 4 of 9 sites far below: under the default one half they are flagged; with
        # max_flagged_fraction 0.4 (4 >= 3.6) they are set aside, and the summary says so.
        loss, counts, sd = _flat_losses(9)
        acc = [0.95] * 5 + [0.3] * 4
        flagged = EvidenceDetector(mixture_check=False, accuracy_check=True).fit(
            loss, counts, sd, train_accuracy=acc, num_samples=[120] * 9
        )
        assert [v.flag for v in flagged.verdicts] == [False] * 5 + [True] * 4
        strict = EvidenceDetector(
            mixture_check=False, accuracy_check=True, max_flagged_fraction=0.4
        )
        aside = strict.fit(loss, counts, sd, train_accuracy=acc, num_samples=[120] * 9)
        assert not any(v.flag for v in aside.verdicts)
        assert aside.summary.accuracy_note.startswith("accuracy evidence set aside: with it 4")

    def test_it_never_flags_half_the_samples(self):
        # 2 of 8 sites far below, but they hold 2 x 600 of the 1920 samples (their class counts
        # are 200 per class). Each counts up to 4 x the median site's 120 (service.audit.pooling):
        # 960 of 720 + 960, 57 % of the samples, so their flags are set aside.
        loss, counts, sd = _flat_losses(8)
        counts[6:] = 200
        sizes = counts.sum(axis=1).tolist()
        acc = [0.95] * 6 + [0.3] * 2
        result = EvidenceDetector(mixture_check=False, accuracy_check=True).fit(
            loss, counts, sd, train_accuracy=acc, num_samples=sizes
        )
        assert not any(v.flag for v in result.verdicts)
        assert "holding 57% of the samples" in given(result.summary.accuracy_note)

    def test_two_sites_get_no_accuracy_evidence(self):
        # min_clients 2: the loss evidence judges two sites; the accuracy test needs three.
        loss, counts, sd = _flat_losses(2)
        result = EvidenceDetector(mixture_check=False, accuracy_check=True, min_clients=2).fit(
            loss, counts, sd, train_accuracy=[0.9, 0.2], num_samples=[120, 120]
        )
        assert not any(v.flag for v in result.verdicts if v is not None)
        assert result.summary.accuracy_note == "no accuracy evidence: 2 sites (it needs 3)"

    def test_wrong_length_is_refused(self):
        loss, counts, sd = _flat_losses(6)
        with pytest.raises(InvalidInputError, match="entries"):
            EvidenceDetector(mixture_check=False, accuracy_check=True).fit(
                loss, counts, sd, train_accuracy=[0.9] * 5, num_samples=[10] * 5
            )
