"""Tests of fedaudit_sim.metrics against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from fedaudit_sim.metrics import (
    MetricInputError,
    accuracy,
    auroc,
    balanced_accuracy,
    class_recall,
    detection_metrics,
    detection_scores,
    label_precision_recall,
    spearman,
    summarise_curve,
)


class TestDetectionMetrics:
    def test_hand_computed(self):
        # Prepare: 6 clients, noisy = {0, 1, 2}; flagged = {1, 2, 4, 5}.
        truth = [True, True, True, False, False, False]
        flagged = [False, True, True, False, True, True]
        # Execute
        scores = detection_metrics(truth, flagged)
        # Assert: TP = 2 (clients 1, 2), FP = 2 (4, 5), FN = 1 (0).
        # precision = 2 / 4 = 0.5; recall = 2 / 3; F1 = 2 * 0.5 * (2/3) / (0.5 + 2/3)
        # = (2/3) / (7/6) = 4/7 = 0.571428...; matching = 0 (sets differ).
        assert scores["precision"] == pytest.approx(0.5)
        assert scores["recall"] == pytest.approx(2 / 3)
        assert scores["f1"] == pytest.approx(4 / 7)
        assert scores["matching"] == 0.0

    def test_exact_match(self):
        scores = detection_metrics([True, False, True], [True, False, True])
        assert scores == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "matching": 1.0}

    def test_no_flags_conventions(self):
        # Nothing noisy and nothing flagged: perfect (precision 1 by convention, recall vacuous 1).
        assert detection_metrics([False, False], [False, False]) == {
            "precision": 1.0,
            "recall": 1.0,
            "f1": 1.0,
            "matching": 1.0,
        }
        # Noisy clients exist but nothing flagged: precision 0 by convention, recall 0/2 = 0,
        # F1 = 0 (P + R = 0, no NaN).
        assert detection_metrics([True, True, False], [False, False, False]) == {
            "precision": 0.0,
            "recall": 0.0,
            "f1": 0.0,
            "matching": 0.0,
        }

    def test_false_alarm_with_nobody_noisy(self):
        # V4 (all clean): one flag -> precision 0/1 = 0, recall vacuous 1, F1 = 0.
        scores = detection_metrics([False, False, False], [False, True, False])
        assert scores == {"precision": 0.0, "recall": 1.0, "f1": 0.0, "matching": 0.0}

    def test_permutation_invariance(self):
        truth = np.array([True, False, True, False, False])
        flagged = np.array([True, True, False, False, False])
        perm = np.array([4, 2, 0, 3, 1])
        assert detection_metrics(truth, flagged) == detection_metrics(truth[perm], flagged[perm])

    def test_bad_input(self):
        with pytest.raises(MetricInputError, match="shape"):
            detection_metrics([True, False], [True])
        with pytest.raises(MetricInputError, match="boolean"):
            detection_metrics([0, 2], [0, 1])
        with pytest.raises(MetricInputError, match="at least one"):
            detection_metrics([], [])


class TestDetectionScores:
    """The results' convention: undefined figures are None, never a flattering 1.0."""

    def test_hand_computed(self):
        # Same decision as TestDetectionMetrics: TP 2, FP 2, FN 1. precision 2/4, recall 2/3,
        # F1 = 2TP / (2TP + FP + FN) = 4 / 7 (equal to 2PR / (P + R)).
        scores = detection_scores(
            [True, True, True, False, False, False], [False, True, True, False, True, True]
        )
        assert scores == {
            "precision": 0.5,
            "recall": pytest.approx(2 / 3),
            "f1": pytest.approx(4 / 7),
            "matching": 0.0,
            "true_positives": 2,
            "false_positives": 2,
            "false_negatives": 1,
        }

    def test_clean_federation_is_undefined_not_perfect(self):
        # Nothing noisy, nothing flagged: nothing to measure (None), but the flags match.
        quiet = detection_scores([False, False], [False, False])
        assert (quiet["precision"], quiet["recall"], quiet["f1"]) == (None, None, None)
        assert (quiet["matching"], quiet["false_positives"]) == (1.0, 0)
        # Nothing noisy, one flag: still undefined; the false alarm is counted, not hidden.
        alarm = detection_scores([False, False, False], [False, True, False])
        assert (alarm["precision"], alarm["recall"], alarm["f1"]) == (None, None, None)
        assert (alarm["matching"], alarm["false_positives"]) == (0.0, 1)

    def test_no_flag_with_noisy_clients(self):
        # Noisy {0, 1}, nothing flagged: precision undefined (no flag), recall 0/2 = 0 and
        # F1 = 0 / (0 + 0 + 2) = 0 (a miss is a defined failure).
        scores = detection_scores([True, True, False], [False, False, False])
        assert (scores["precision"], scores["recall"], scores["f1"]) == (None, 0.0, 0.0)
        assert scores["false_negatives"] == 2

    def test_bad_input(self):
        with pytest.raises(MetricInputError, match="at least one"):
            detection_scores([], [])


class TestAuroc:
    def test_hand_computed_with_a_tie(self):
        # noisy scores {0.9, 0.4}, clean scores {0.4, 0.1, 0.3}. Pairs (noisy, clean), 2 x 3 = 6:
        # 0.9 beats all 3; 0.4 ties 0.4 (1/2), beats 0.1 and 0.3 -> 2.5. AUROC = 5.5 / 6.
        truth = [True, True, False, False, False]
        scores = [0.9, 0.4, 0.4, 0.1, 0.3]
        assert auroc(truth, scores) == pytest.approx(5.5 / 6)

    def test_perfect_and_reversed(self):
        assert auroc([False, False, True], [0.1, 0.2, 0.3]) == 1.0
        assert auroc([False, False, True], [0.3, 0.2, 0.1]) == 0.0
        # All scores equal: every pair ties -> 0.5.
        assert auroc([False, True, True], [1.0, 1.0, 1.0]) == 0.5

    def test_single_class_is_none(self):
        assert auroc([True, True], [0.1, 0.9]) is None
        assert auroc([False, False], [0.1, 0.9]) is None

    def test_bad_scores(self):
        with pytest.raises(MetricInputError, match="finite"):
            auroc([True, False], [np.nan, 0.1])


class TestSpearman:
    def test_hand_computed(self):
        # x = [1, 2, 3, 4], y = [1, 3, 2, 4]: ranks are the values themselves; d = [0, -1, 1, 0],
        # sum d^2 = 2, rho = 1 - 6 * 2 / (4 * (16 - 1)) = 1 - 12/60 = 0.8.
        assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)

    def test_monotone_transform_and_reversal(self):
        x = np.array([0.1, 0.5, 0.2, 0.9])
        assert spearman(x, np.exp(x)) == pytest.approx(1.0)
        assert spearman(x, -(x**3)) == pytest.approx(-1.0)

    def test_ties_use_average_ranks(self):
        # x = [1, 2, 2, 3] -> ranks [1, 2.5, 2.5, 4]; y = [1, 2, 3, 4] -> ranks [1, 2, 3, 4].
        # Centred (mean 2.5): a = [-1.5, 0, 0, 1.5], b = [-1.5, -0.5, 0.5, 1.5].
        # sum(ab) = 2.25 + 0 + 0 + 2.25 = 4.5; sum(a^2) = 4.5; sum(b^2) = 2.25+0.25+0.25+2.25 = 5.
        # rho = 4.5 / sqrt(4.5 * 5) = 4.5 / 4.7434 = 0.948683.
        assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.948683, abs=1e-6)

    def test_constant_is_none(self):
        assert spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) is None
        assert spearman([1.0, 2.0, 3.0], [0.5, 0.5, 0.5]) is None
        assert spearman([1.0], [2.0]) is None

    def test_bad_input(self):
        with pytest.raises(MetricInputError, match="shape"):
            spearman([1, 2, 3], [1, 2])


class TestLabelPrecisionRecall:
    def test_hand_computed(self):
        # 8 samples, clean = {0..4} (5 clean), selected = {0, 1, 2, 5} (4 selected).
        # selected and clean = {0, 1, 2} = 3 -> precision 3/4 = 0.75, recall 3/5 = 0.6.
        clean = [True, True, True, True, True, False, False, False]
        selected = [True, True, True, False, False, True, False, False]
        assert label_precision_recall(clean, selected) == {"precision": 0.75, "recall": 0.6}

    def test_edge_conventions(self):
        # Nothing selected, clean samples exist: precision 0 (convention), recall 0/2 = 0.
        assert label_precision_recall([True, True, False], [False] * 3) == {
            "precision": 0.0,
            "recall": 0.0,
        }
        # No clean sample at all: recall vacuously 1; selecting noisy samples gives precision 0.
        assert label_precision_recall([False, False], [True, False]) == {
            "precision": 0.0,
            "recall": 1.0,
        }


class TestAccuracy:
    def test_accuracy_and_balanced_accuracy_hand_computed(self):
        # y_true has 6 of class 0, 2 of class 1, 0 of class 2 (C = 3).
        # y_pred: class 0 -> 5/6 right; class 1 -> 1/2 right.
        y_true = [0, 0, 0, 0, 0, 0, 1, 1]
        y_pred = [0, 0, 0, 0, 0, 2, 1, 0]
        # accuracy = (5 + 1) / 8 = 0.75.
        assert accuracy(y_true, y_pred) == pytest.approx(0.75)
        # balanced = mean over PRESENT classes {0, 1} = (5/6 + 1/2) / 2 = (4/3) / 2 = 2/3.
        assert balanced_accuracy(y_true, y_pred, 3) == pytest.approx(2 / 3)

    def test_class_recall_hand_computed_none_for_an_absent_class(self):
        # the same labels: class 0 5 of 6 right, class 1 1 of 2, class 2 absent
        y_true = [0, 0, 0, 0, 0, 0, 1, 1]
        y_pred = [0, 0, 0, 0, 0, 2, 1, 0]
        assert class_recall(y_true, y_pred, 3) == [pytest.approx(5 / 6), 0.5, None]
        with pytest.raises(MetricInputError, match="outside"):
            class_recall([0, 1], [0, 3], 3)

    def test_balanced_equals_plain_on_balanced_data(self):
        # 2 samples per class, 3 of 6 correct spread 1/2, 1/2, 1/2 -> both 0.5.
        y_true = [0, 0, 1, 1, 2, 2]
        y_pred = [0, 1, 1, 2, 2, 0]
        assert accuracy(y_true, y_pred) == 0.5
        assert balanced_accuracy(y_true, y_pred, 3) == 0.5

    def test_bad_input(self):
        with pytest.raises(MetricInputError, match="at least one"):
            accuracy([], [])
        with pytest.raises(MetricInputError, match="integer"):
            accuracy([0.5, 1.0], [0, 1])
        with pytest.raises(MetricInputError, match="outside"):
            balanced_accuracy([0, 3], [0, 1], 3)


class TestSummariseCurve:
    def test_hand_computed(self):
        # 12 rounds: ceil(10% of 12) = ceil(1.2) = 2 -> mean of the last two (0.6, 0.8) = 0.7;
        # best = 0.9 (round 9).
        curve = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.5, 0.6, 0.8]
        assert summarise_curve(curve) == {"best": 0.9, "last10": pytest.approx(0.7)}

    def test_thirty_rounds_use_exactly_three(self):
        # ceil(30 / 10) = 3 rounds exactly: values 0..29 -> mean(27, 28, 29) = 28.
        assert summarise_curve(np.arange(30.0))["last10"] == 28.0

    def test_short_curves(self):
        # 1 round: tail of 1. 10 rounds: tail of 1. 11 rounds: ceil(1.1) = 2.
        assert summarise_curve([0.4]) == {"best": 0.4, "last10": 0.4}
        assert summarise_curve(np.arange(10.0))["last10"] == 9.0
        assert summarise_curve(np.arange(11.0))["last10"] == 9.5  # mean(9, 10)

    def test_bad_input(self):
        with pytest.raises(MetricInputError, match="at least one"):
            summarise_curve([])
        with pytest.raises(MetricInputError, match="finite"):
            summarise_curve([0.1, float("nan")])
