"""The class-standardised loss excess and the FedNoRo guard computed on it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.audit import (
    FedNoRoDetector,
    InvalidParameterError,
    ashman_d,
    class_standardised_excess,
    null_separation_threshold,
)
from tests.audit._readers import given
from tests.audit._synthetic import synthetic_federation

NAN = np.nan


class TestLiteral:
    def test_one_class(self):
        # counts 1, 1, 2; losses 1, 3, 2: mu = (1 + 3 + 4) / 4 = 2,
        # sigma^2 = (1 * 1 + 1 * 1 + 2 * 0) / 3 = 2/3, z = sqrt(n) (L - mu) / sigma
        loss = np.array([[1.0], [3.0], [2.0]])
        counts = np.array([[1], [1], [2]])
        excess, classes = class_standardised_excess(loss, counts)
        s = math.sqrt(2.0 / 3.0)
        assert excess == pytest.approx([-1 / s, 1 / s, 0.0])
        assert classes.tolist() == [0]

    def test_two_classes_combined_with_stouffer_weights(self):
        loss = np.array([[1.0, 0.5], [3.0, 1.5], [2.0, 1.0]])
        counts = np.array([[1, 4], [1, 1], [2, 1]])
        # class 0 as above: n (L - mu) / sigma0 = -1.224745, +1.224745, 0
        # class 1: mu = (4 * 0.5 + 1.5 + 1.0) / 6 = 0.75,
        #   sigma1^2 = (4 * 0.0625 + 0.5625 + 0.0625) / 3 = 0.2916667, sigma1 = 0.5400617,
        #   n (L - mu) / sigma1 = -1.851640, +1.388730, +0.462910
        # Z = sum / sqrt(n_k): (-3.076385) / sqrt(5), 2.613475 / sqrt(2), 0.462910 / sqrt(3)
        excess, classes = class_standardised_excess(loss, counts)
        assert excess == pytest.approx([-1.375801, 1.848006, 0.267261], abs=1e-6)
        assert classes.tolist() == [0, 1]

    def test_classes_held_by_fewer_than_three_clients_and_constant_classes_are_left_out(self):
        loss = np.array([[1.0, 5.0, 0.3], [3.0, NAN, 0.3], [2.0, 7.0, 0.3], [2.0, NAN, 0.3]])
        counts = np.array([[1, 3, 2], [1, 0, 2], [2, 3, 2], [1, 0, 2]])
        excess, classes = class_standardised_excess(loss, counts)
        # class 1 has two holders, class 2 is constant: only class 0 enters.
        # mu0 = (1 + 3 + 4 + 2) / 5 = 2, sigma0^2 = (1 + 1 + 0 + 0) / 4 = 0.5
        assert classes.tolist() == [0]
        assert excess == pytest.approx([-1 / math.sqrt(0.5), 1 / math.sqrt(0.5), 0.0, 0.0])

    def test_clip_bounds_each_class_before_combining(self):
        # one class, counts 1, 1, 1, 1; losses 0, 0, 0, 4: mu = 1, sigma^2 = (1 + 1 + 1 + 9) / 4
        # = 3, z = (L - mu) / sqrt(3): -0.57735 three times and 1.73205; clip 1.5 caps the last
        loss = np.array([[0.0], [0.0], [0.0], [4.0]])
        counts = np.ones((4, 1), dtype=int)
        plain, _ = class_standardised_excess(loss, counts)
        clipped, _ = class_standardised_excess(loss, counts, clip=1.5)
        assert plain == pytest.approx([-1 / math.sqrt(3)] * 3 + [3 / math.sqrt(3)])
        assert clipped == pytest.approx([-1 / math.sqrt(3)] * 3 + [1.5])

    def test_no_usable_class_gives_zeros(self):
        loss = np.array([[1.0, NAN], [NAN, 2.0], [3.0, NAN]])
        counts = np.array([[5, 0], [0, 5], [5, 0]])
        excess, classes = class_standardised_excess(loss, counts)
        assert excess.tolist() == [0.0, 0.0, 0.0]
        assert classes.size == 0


class TestProperties:
    def test_client_permutation(self):
        loss, counts = synthetic_federation(12, 5, seed=3, n_noisy=3, noise_rate=0.4)
        excess, _ = class_standardised_excess(loss, counts)
        order = np.random.default_rng(0).permutation(12)
        permuted, _ = class_standardised_excess(loss[order], counts[order])
        assert permuted == pytest.approx(excess[order])

    def test_class_difficulty_does_not_matter(self):
        # Adding a constant to a class, or scaling it, changes nothing: the statistic only
        # compares clients within a class.
        loss, counts = synthetic_federation(12, 5, seed=4, n_noisy=3, noise_rate=0.4)
        excess, _ = class_standardised_excess(loss, counts)
        shifted = loss * np.array([1.0, 3.0, 0.5, 1.0, 2.0]) + np.array([0.0, 1.0, 0.0, 5.0, 0.2])
        again, _ = class_standardised_excess(shifted, counts)
        assert again == pytest.approx(excess)

    def test_all_equal_losses(self):
        loss = np.full((6, 3), 0.7)
        excess, classes = class_standardised_excess(loss, np.full((6, 3), 9))
        assert excess.tolist() == [0.0] * 6
        assert classes.size == 0

    def test_roughly_standard_normal_on_a_clean_federation(self):
        # The calibrated guard assumes one normal population when nobody is noisy. Losses
        # drawn per sample (tests/audit/_synthetic.py), very different class mixes and sizes.
        loss, counts = synthetic_federation(600, 8, seed=11, p_missing=0.5)
        excess, classes = class_standardised_excess(loss, counts)
        assert classes.size == 8
        assert abs(float(excess.mean())) < 0.1
        assert float(excess.std()) == pytest.approx(1.0, abs=0.1)
        # the mean loss is nowhere near one population: it follows the class mix
        mean = np.nansum(loss * counts, axis=1) / counts.sum(axis=1)
        assert float(mean.std() / mean.mean()) > 0.1


def shard_federation(seed: int, n_noisy: int) -> tuple[np.ndarray, np.ndarray]:
    """50 clients holding 2 of 10 classes each (V3's label skew), per-sample losses drawn.

    Clean losses of class c ~ Exponential(mean mu_c), mu_c from 0.1 to 1.5 (a model early in
    training, some classes much harder than others); a wrong label's loss ~ Gamma(4, mean
    2.5). Clients 0 .. n_noisy - 1 have 30-50 % wrong labels.
    """
    rng = np.random.default_rng(seed)
    n_clients, n_classes = 50, 10
    mu = np.geomspace(0.1, 1.5, n_classes)
    loss = np.full((n_clients, n_classes), NAN)
    counts = np.zeros((n_clients, n_classes), dtype=np.int64)
    rates = np.zeros(n_clients)
    rates[:n_noisy] = rng.uniform(0.3, 0.5, n_noisy)
    for k in range(n_clients):
        for c in rng.choice(n_classes, size=2, replace=False):
            n = int(rng.integers(60, 140))
            samples = rng.exponential(mu[c], n)
            wrong = rng.random(n) < rates[k]
            samples[wrong] = rng.gamma(4.0, 2.5 / 4.0, int(wrong.sum()))
            counts[k, c], loss[k, c] = n, samples.mean()
    return loss, counts


class TestGuardUnderLabelSkew:
    def test_the_noisy_group_stands_out_where_its_mean_loss_does_not(self):
        # The guard's question for the right split (15 noisy of 50): is D above what one
        # population gives by chance? On the mean loss the clean clients holding hard classes
        # overlap the noisy ones; class by class they do not.
        threshold = null_separation_threshold(50, 15)
        passed = {"class_z": 0, "mean_loss": 0}
        for seed in range(8):
            loss, counts = shard_federation(seed, n_noisy=15)
            excess, _ = class_standardised_excess(loss, counts)
            mean = np.nansum(loss * counts, axis=1) / counts.sum(axis=1)
            for name, values in (("class_z", excess), ("mean_loss", mean)):
                d = ashman_d(values[:15], values[15:])
                assert d is not None
                passed[name] += d >= threshold
        assert passed["class_z"] == 8
        assert passed["mean_loss"] <= 2

    def test_clean_federations_stay_clean(self):
        for seed in range(10):
            loss, counts = shard_federation(seed, n_noisy=0)
            result = FedNoRoDetector().fit(loss, counts).result_
            assert not any(result.flags), (seed, result.summary.guard)

    def test_evidence_and_summary(self):
        loss, counts = synthetic_federation(12, 5, seed=4, n_noisy=4, noise_rate=0.5)
        result = FedNoRoDetector().fit(loss, counts).result_
        assert result.flags == [True] * 4 + [False] * 8
        excess, classes = class_standardised_excess(loss, counts)
        assert [v.evidence.class_z for v in result.verdicts] == pytest.approx(excess)
        assert result.summary.separation_statistic == "class_z"
        assert result.summary.class_z_classes == classes.tolist()
        flags = np.array(result.flags)
        assert result.summary.group_mean_statistic.noisy == pytest.approx(excess[flags].mean())

    def test_no_class_with_three_holders_flags_nobody_and_says_why(self):
        # every class held by two clients: nothing to standardise against
        loss = np.array(
            [
                [0.2, NAN, 0.3, NAN],
                [NAN, 0.2, NAN, 0.3],
                [2.2, NAN, 2.5, NAN],
                [NAN, 2.3, NAN, 2.4],
            ]
        )
        counts = np.where(np.isnan(loss), 0, 10)
        guarded = FedNoRoDetector().fit(loss, counts).result_
        assert guarded.status == "ok"
        assert not any(guarded.flags)
        assert "no class is held by 3 or more clients" in given(guarded.summary.guard)
        assert guarded.summary.ashman_d is None
        unguarded = FedNoRoDetector(require_separation=False).fit(loss, counts).result_
        assert unguarded.summary.guard == "separation guard off"

    def test_unknown_statistic_is_refused(self):
        with pytest.raises(InvalidParameterError, match="separation_statistic"):
            FedNoRoDetector(separation_statistic="median").fit(
                np.ones((4, 2)), np.ones((4, 2), dtype=int)
            )
