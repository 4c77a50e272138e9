"""Tests of fedaudit_sim.noise: client noise levels, label flips, injection reports."""

from __future__ import annotations

import numpy as np
import pytest

from fedaudit_sim.noise import (
    NOISE_PROTOCOLS,
    NoiseError,
    flip_labels,
    inject_noise,
    instance_probabilities,
    noise_levels,
)

# ------------------------------------------------------------------------------------------
# client noise levels


class TestNoiseLevels:
    def test_none(self):
        assert noise_levels(4, "none", 0).tolist() == [0.0, 0.0, 0.0, 0.0]

    def test_linear_is_fedrn_formula(self):
        # rate_u = lo + u * (hi - lo) / K: K = 4, 0.0-0.8 -> 0, 0.2, 0.4, 0.6 (never reaches 0.8).
        np.testing.assert_allclose(noise_levels(4, "linear", 0, lo=0.0, hi=0.8), [0, 0.2, 0.4, 0.6])
        # FedRN's "0.0-0.4" with 100 clients ends at 0 + 99 * 0.4 / 100 = 0.396.
        assert noise_levels(100, "linear", 0, lo=0.0, hi=0.4)[-1] == pytest.approx(0.396)

    def test_rho_tau_exact_count(self):
        rates = noise_levels(10, "rho_tau", np.random.default_rng(0), rho=0.4, tau=0.5)
        noisy = rates > 0
        assert noisy.sum() == 4  # floor(0.4 * 10)
        assert np.all((rates[noisy] >= 0.5) & (rates[noisy] <= 1.0))

    def test_rho_tau_bernoulli_count_varies(self):
        # exact_count=False: each client noisy with probability 0.4 independently, so the number
        # of noisy clients among 10 varies with the seed (it is 4 in every exact draw).
        counts = {
            int((noise_levels(10, "rho_tau", s, rho=0.4, tau=0.5, exact_count=False) > 0).sum())
            for s in range(20)
        }
        assert len(counts) > 1
        # Over 2000 clients the fraction is 0.4 +- 4 std (std = sqrt(0.24 / 2000) = 0.011).
        big = noise_levels(2000, "rho_tau", 0, rho=0.4, tau=0.5, exact_count=False)
        assert abs(np.mean(big > 0) - 0.4) < 0.044

    def test_exact_count_is_not_fooled_by_float_rounding(self):
        # 0.29 * 100 = 28.999999999999996 in floating point; the count must still be 29.
        rates = noise_levels(100, "rho_range", 0, rho=0.29, lo=0.5, hi=0.7)
        assert int((rates > 0).sum()) == 29

    def test_rho_range(self):
        rates = noise_levels(20, "rho_range", 3, rho=0.4, lo=0.5, hi=0.7)
        noisy = rates > 0
        assert noisy.sum() == 8  # floor(0.4 * 20)
        assert np.all((rates[noisy] >= 0.5) & (rates[noisy] <= 0.7))
        assert np.all(rates[~noisy] == 0.0)

    def test_bernoulli(self):
        rates = noise_levels(2000, "bernoulli", 0, p=0.7)
        assert set(np.unique(rates).tolist()) == {0.0, 1.0}
        # Clean with probability 0.7: fraction within 4 std (sqrt(0.21 / 2000) = 0.010).
        assert abs(np.mean(rates == 0.0) - 0.7) < 0.04
        assert noise_levels(5, "bernoulli", 0, p=1.0).tolist() == [0.0] * 5
        assert noise_levels(5, "bernoulli", 0, p=0.0).tolist() == [1.0] * 5

    def test_truncated_gaussian_is_truncated_not_clipped(self):
        rates = noise_levels(20_000, "truncated_gaussian", 0, mu=0.3, sigma=0.4)
        assert np.all((rates >= 0) & (rates <= 1))
        # Clipping would pile Phi(-0.75) = 22.7% of the mass exactly on 0; truncation puts none.
        assert np.sum(rates == 0.0) == 0
        assert np.sum(rates == 1.0) == 0
        # Truncated-normal mean: a = (0 - 0.3)/0.4 = -0.75, b = (1 - 0.3)/0.4 = 1.75,
        # phi(a) = 0.30114, phi(b) = 0.08628, Z = Phi(b) - Phi(a) = 0.95994 - 0.22663 = 0.73331,
        # mean = 0.3 + 0.4 * (0.30114 - 0.08628) / 0.73331 = 0.3 + 0.4 * 0.29300 = 0.41720.
        assert abs(rates.mean() - 0.41720) < 0.01

    def test_truncated_gaussian_with_no_mass_in_range(self):
        with pytest.raises(NoiseError, match="mass"):
            noise_levels(3, "truncated_gaussian", 0, mu=10.0, sigma=0.1)
        with pytest.raises(NoiseError, match="sigma"):
            noise_levels(3, "truncated_gaussian", 0, mu=0.3, sigma=0.0)

    def test_clipped_gaussian_puts_the_tails_exactly_on_the_bounds(self):
        # Seed 0, N(0.3, 0.4^2), 8 draws: 0.3503, 0.2472, 0.5562, 0.3420, 0.0857, 0.4446,
        # 0.8216, 0.6788 (the truncated Gaussian's draws below, all inside [0, 1] and so all
        # accepted). Clipped to [0.1, 0.5]: the three draws above 0.5 become exactly 0.5, the
        # one below 0.1 exactly 0.1, the rest stay.
        clipped = noise_levels(8, "clipped_gaussian", 0, mu=0.3, sigma=0.4, lo=0.1, hi=0.5)
        truncated = noise_levels(8, "truncated_gaussian", 0, mu=0.3, sigma=0.4)
        np.testing.assert_allclose(
            truncated,
            [0.3503, 0.2472, 0.5562, 0.3420, 0.0857, 0.4446, 0.8216, 0.6788],
            atol=5e-5,
        )
        assert clipped[[2, 6, 7]].tolist() == [0.5, 0.5, 0.5]
        assert clipped[4] == 0.1
        np.testing.assert_array_equal(clipped[[0, 1, 3, 5]], truncated[[0, 1, 3, 5]])

    def test_clipped_gaussian_mass_at_the_bounds_where_truncation_has_none(self):
        # 50 clients, seed 0, the defaults mu 0.3, sigma 0.4, [0, 1]: 6 rates exactly 0 (exactly
        # clean) and 2 exactly 1; the truncated Gaussian puts no rate on either bound.
        clipped = noise_levels(50, "clipped_gaussian", 0)
        truncated = noise_levels(50, "truncated_gaussian", 0)
        assert (int(np.sum(clipped == 0.0)), int(np.sum(clipped == 1.0))) == (6, 2)
        assert (int(np.sum(truncated == 0.0)), int(np.sum(truncated == 1.0))) == (0, 0)
        assert np.all((clipped >= 0) & (clipped <= 1))

    def test_clipped_gaussian_errors(self):
        with pytest.raises(NoiseError, match="sigma"):
            noise_levels(3, "clipped_gaussian", 0, sigma=0.0)
        with pytest.raises(NoiseError, match="lo=0.6 must not exceed hi=0.5"):
            noise_levels(3, "clipped_gaussian", 0, lo=0.6, hi=0.5)
        with pytest.raises(NoiseError, match="hi"):
            noise_levels(3, "clipped_gaussian", 0, hi=1.5)

    @pytest.mark.parametrize("protocol", ["rho_tau", "rho_range", "bernoulli"])
    def test_exact_number_of_noisy_clients(self, protocol):
        for count in (0, 3, 7):
            rates = noise_levels(7, protocol, 11, noisy_clients=count)
            assert int(np.sum(rates > 0)) == count

    def test_exact_count_draws_the_same_clients_as_the_rate(self):
        # floor(0.375 * 8) = 3: noisy_clients=3 is the same draw (same clients, same rates).
        np.testing.assert_array_equal(
            noise_levels(8, "rho_range", 0, noisy_clients=3),
            noise_levels(8, "rho_range", 0, rho=0.375),
        )
        # seed 0 picks clients 2, 3 and 4
        assert np.flatnonzero(noise_levels(8, "rho_range", 0, noisy_clients=3)).tolist() == [
            2,
            3,
            4,
        ]
        assert noise_levels(5, "bernoulli", 0, noisy_clients=2).tolist() == [0, 0, 1, 0, 1]

    def test_exact_count_errors(self):
        with pytest.raises(NoiseError, match="give rho or noisy_clients, not both"):
            noise_levels(5, "rho_range", 0, rho=0.4, noisy_clients=2)
        with pytest.raises(NoiseError, match="give p or noisy_clients, not both"):
            noise_levels(5, "bernoulli", 0, p=0.5, noisy_clients=2)
        with pytest.raises(NoiseError, match=r"noisy_clients=6 must lie in \[0, 5\]"):
            noise_levels(5, "rho_tau", 0, noisy_clients=6)
        with pytest.raises(NoiseError, match="must be an int"):
            noise_levels(5, "rho_tau", 0, noisy_clients=2.5)
        with pytest.raises(NoiseError, match="exact_count=false"):
            noise_levels(5, "rho_tau", 0, noisy_clients=2, exact_count=False)
        with pytest.raises(NoiseError, match="no parameter"):
            noise_levels(5, "linear", 0, noisy_clients=2)

    def test_uniform_all(self):
        assert noise_levels(3, "uniform_all", 0, eps=0.2).tolist() == [0.2, 0.2, 0.2]

    @pytest.mark.parametrize(
        "protocol", ["rho_tau", "rho_range", "bernoulli", "truncated_gaussian", "clipped_gaussian"]
    )
    def test_seeded(self, protocol):
        a = noise_levels(30, protocol, np.random.default_rng(5))
        b = noise_levels(30, protocol, 5)
        c = noise_levels(30, protocol, 6)
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c)

    def test_errors(self):
        with pytest.raises(NoiseError, match="not a noise protocol"):
            noise_levels(3, "gaussian", 0)
        with pytest.raises(NoiseError, match="tau"):
            noise_levels(3, "rho_range", 0, tau=0.5)
        with pytest.raises(NoiseError, match="rho"):
            noise_levels(3, "rho_tau", 0, rho=1.5)
        with pytest.raises(NoiseError, match="lo"):
            noise_levels(3, "linear", 0, lo=0.8, hi=0.2)
        with pytest.raises(NoiseError, match="num_clients"):
            noise_levels(0, "none", 0)
        assert set(NOISE_PROTOCOLS) == {
            "none",
            "linear",
            "rho_tau",
            "rho_range",
            "bernoulli",
            "truncated_gaussian",
            "clipped_gaussian",
            "uniform_all",
        }


# ------------------------------------------------------------------------------------------
# label flips


class TestSymmetricAndPairflip:
    def test_symmetric_exact_count_and_never_the_true_label(self):
        labels = np.arange(10) % 3
        noisy, mask = flip_labels(labels, 0.3, 3, "symmetric", 0)
        assert mask.sum() == 3  # floor(0.3 * 10)
        assert np.all(noisy[mask] != labels[mask])
        np.testing.assert_array_equal(noisy[~mask], labels[~mask])
        assert noisy.dtype == np.int64

    def test_symmetric_floor_of_the_count(self):
        # floor(0.25 * 10) = floor(2.5) = 2.
        _, mask = flip_labels(np.zeros(10, dtype=np.int64), 0.25, 2, "symmetric", 0)
        assert mask.sum() == 2

    def test_symmetric_targets_are_uniform_over_other_classes(self):
        # 3000 samples of class 0, rate 1: all flipped, each to 1 or 2 with probability 1/2
        # (binomial std sqrt(3000 / 4) = 27; allow 4 std ~ 110).
        noisy, mask = flip_labels(np.zeros(3000, dtype=np.int64), 1.0, 3, "symmetric", 1)
        assert mask.all()
        counts = np.bincount(noisy, minlength=3)
        assert counts[0] == 0
        assert abs(counts[1] - 1500) < 110

    def test_rate_zero_and_one(self):
        labels = np.array([0, 1, 2, 1])
        noisy, mask = flip_labels(labels, 0.0, 3, "symmetric", 0)
        assert not mask.any()
        np.testing.assert_array_equal(noisy, labels)
        _, mask = flip_labels(labels, 1.0, 3, "symmetric", 0)
        assert mask.all()

    def test_symmetric_any_draws_over_all_classes(self):
        # 3000 samples of class 0 with C = 3 at rate 1: every sample is chosen and redrawn from
        # {0, 1, 2} with probability 1/3 each, so about 1000 keep label 0 and are not flipped
        # (binomial std sqrt(3000 * 2 / 9) = 26; allow 4 std ~ 105).
        noisy, mask = flip_labels(np.zeros(3000, dtype=np.int64), 1.0, 3, "symmetric_any", 1)
        counts = np.bincount(noisy, minlength=3)
        assert all(abs(c - 1000) < 105 for c in counts)
        assert mask.sum() == counts[1] + counts[2]  # the mask marks exactly the changed labels
        np.testing.assert_array_equal(mask, noisy != 0)

    def test_symmetric_any_with_two_classes_realises_half_the_rate(self):
        # C = 2: a chosen sample keeps its label with probability 1/2; 4000 samples at rate 0.8
        # choose floor(3200) and flip about 1600 (std sqrt(3200 / 4) = 28; allow 4 std)
        labels = np.arange(4000) % 2
        noisy, mask = flip_labels(labels, 0.8, 2, "symmetric_any", 0)
        assert abs(int(mask.sum()) - 1600) < 115
        np.testing.assert_array_equal(noisy[~mask], labels[~mask])
        assert np.all(noisy[mask] == 1 - labels[mask])
        # ... and never more than floor(rate * n) labels change
        _, few = flip_labels(np.arange(10) % 2, 0.35, 2, "symmetric_any", 3)
        assert few.sum() <= 3

    def test_pairflip(self):
        # c -> (c + 1) mod 3: [0, 1, 2, 2] -> [1, 2, 0, 0].
        noisy, mask = flip_labels(np.array([0, 1, 2, 2]), 1.0, 3, "pairflip", 0)
        assert noisy.tolist() == [1, 2, 0, 0]
        assert mask.all()
        noisy, mask = flip_labels(np.arange(20) % 4, 0.5, 4, "pairflip", 0)
        assert mask.sum() == 10
        labels = np.arange(20) % 4
        np.testing.assert_array_equal(noisy[mask], (labels[mask] + 1) % 4)

    def test_seeded(self):
        labels = np.arange(50) % 5
        a = flip_labels(labels, 0.4, 5, "symmetric", np.random.default_rng(2))
        b = flip_labels(labels, 0.4, 5, "symmetric", 2)
        c = flip_labels(labels, 0.4, 5, "symmetric", 3)
        np.testing.assert_array_equal(a[0], b[0])
        assert not np.array_equal(a[0], c[0])


class TestAsymmetric:
    def test_class_map_per_class_counts_and_swap(self):
        # 10 samples each of classes 0, 1, 2; map 0 -> 1 and 1 -> 0 (a cat <-> dog swap), rate 0.5:
        # floor(0.5 * 10) = 5 samples of class 0 become 1, 5 of class 1 become 0, class 2 never
        # flips. Realised rate = 10 / 30 = 1/3 < 0.5.
        labels = np.repeat([0, 1, 2], 10)
        noisy, mask = flip_labels(labels, 0.5, 3, "asymmetric", 0, class_map={0: 1, 1: 0})
        assert mask[labels == 0].sum() == 5
        assert mask[labels == 1].sum() == 5
        assert not mask[labels == 2].any()
        assert np.all(noisy[(labels == 0) & mask] == 1)
        assert np.all(noisy[(labels == 1) & mask] == 0)
        assert mask.mean() == pytest.approx(1 / 3)

    def test_class_map_errors(self):
        labels = np.array([0, 1])
        with pytest.raises(NoiseError, match="class_map"):
            flip_labels(labels, 0.5, 2, "asymmetric", 0)
        with pytest.raises(NoiseError, match="itself"):
            flip_labels(labels, 0.5, 2, "asymmetric", 0, class_map={1: 1})
        with pytest.raises(NoiseError, match="outside"):
            flip_labels(labels, 0.5, 2, "asymmetric", 0, class_map={0: 5})


class TestInstance:
    def test_hand_made_probabilities(self):
        # 4 samples, 3 classes, rate 0.5 -> floor(2) = 2 flips. Samples 0 and 1 have p(true) = 1
        # (weight 1 - 1 = 0, never chosen); samples 2 and 3 have weight 0.8, so exactly they flip.
        # Sample 2 (true 0): other-class probs [0, 0.8, 0] -> new label 1.
        # Sample 3 (true 1): other-class probs [0, 0, 0.8] -> new label 2.
        labels = np.array([0, 1, 0, 1])
        probs = np.array(
            [
                [1.0, 0.0, 0.0],
                [0.0, 1.0, 0.0],
                [0.2, 0.8, 0.0],
                [0.0, 0.2, 0.8],
            ]
        )
        for seed in range(5):
            noisy, mask = flip_labels(labels, 0.5, 3, "instance", seed, instance_probs=probs)
            assert mask.tolist() == [False, False, True, True]
            assert noisy.tolist() == [0, 1, 1, 2]

    def test_hard_samples_are_preferred(self):
        # 500 easy samples (p(true) = 0.9, weight 0.1) and 500 hard ones (p(true) = 0.1,
        # weight 0.9); 100 picks. The first pick is hard with probability 0.9*500 / (0.9*500 +
        # 0.1*500) = 0.9, and 100 picks barely deplete 500, so ~90 hard; require >= 80.
        labels = np.zeros(1000, dtype=np.int64)
        probs = np.zeros((1000, 2))
        probs[:500] = [0.9, 0.1]
        probs[500:] = [0.1, 0.9]
        noisy, mask = flip_labels(labels, 0.1, 2, "instance", 0, instance_probs=probs)
        assert mask.sum() == 100
        assert mask[500:].sum() >= 80
        assert np.all(noisy[mask] == 1)

    def test_new_label_is_never_the_true_one(self):
        gen = np.random.default_rng(0)
        labels = gen.integers(0, 5, size=300)
        probs = gen.dirichlet(np.ones(5), size=300)
        noisy, mask = flip_labels(labels, 0.6, 5, "instance", 1, instance_probs=probs)
        assert mask.sum() == 180  # floor(0.6 * 300)
        assert np.all(noisy[mask] != labels[mask])

    def test_confident_model_falls_back_without_losing_the_count(self):
        # Only sample 3 has any other-class mass; rate 0.5 of 4 needs 2 flips: sample 3 plus one
        # uniformly drawn other sample, whose new label is a uniform OTHER class.
        labels = np.array([0, 0, 1, 1])
        probs = np.array([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.5, 0.5, 0.0]])
        noisy, mask = flip_labels(labels, 0.5, 3, "instance", 0, instance_probs=probs)
        assert mask.sum() == 2
        assert mask[3]
        assert noisy[3] == 0  # its only other-class mass is on class 0
        assert np.all(noisy[mask] != labels[mask])

    def test_probability_validation(self):
        with pytest.raises(NoiseError, match="instance_probs"):
            flip_labels(np.array([0, 1]), 0.5, 2, "instance", 0)
        with pytest.raises(NoiseError, match="shape"):
            flip_labels(np.array([0, 1]), 0.5, 2, "instance", 0, instance_probs=np.ones((2, 3)))
        with pytest.raises(NoiseError, match="non-negative"):
            flip_labels(
                np.array([0, 1]), 0.5, 2, "instance", 0, instance_probs=[[1.0, -1.0], [0.5, 0.5]]
            )


def test_flip_validation():
    with pytest.raises(NoiseError, match="labels"):
        flip_labels(np.array([0, 3]), 0.5, 3, "symmetric", 0)
    with pytest.raises(NoiseError, match="rate"):
        flip_labels(np.array([0, 1]), 1.5, 2, "symmetric", 0)
    with pytest.raises(NoiseError, match="flip"):
        flip_labels(np.array([0, 1]), 0.5, 2, "shuffle", 0)
    with pytest.raises(NoiseError, match="num_classes >= 2"):
        flip_labels(np.array([0, 0]), 1.0, 1, "symmetric", 0)
    assert issubclass(NoiseError, ValueError)


# ------------------------------------------------------------------------------------------
# instance probabilities


class TestInstanceProbabilities:
    def test_separable_blobs_give_confident_out_of_fold_probabilities(self):
        gen = np.random.default_rng(0)
        # Two tight blobs 10 std apart; the task declares 4 classes, so columns 2 and 3 stay 0.
        x = np.concatenate([gen.normal(-5, 1, (20, 2)), gen.normal(5, 1, (20, 2))])
        y = np.repeat([0, 1], 20)
        result = instance_probabilities(x, y, 4, 0)
        assert result.probs.shape == (40, 4)
        assert result.converged
        assert result.n_folds == 5
        np.testing.assert_allclose(result.probs.sum(axis=1), 1.0)
        assert np.all(result.probs[:, 2:] == 0.0)
        assert np.all(result.probs[np.arange(40), y] > 0.9)

    def test_single_class_is_one_hot(self):
        result = instance_probabilities(np.zeros((3, 2)), np.array([2, 2, 2]), 3, 0)
        assert result.probs.tolist() == [[0.0, 0.0, 1.0]] * 3
        assert result.n_folds == 0
        assert result.note is not None

    def test_singleton_class_uses_unstratified_folds(self):
        x = np.arange(12, dtype=np.float64).reshape(6, 2)
        result = instance_probabilities(x, np.array([0, 0, 0, 0, 0, 1]), 2, 0)
        assert result.note is not None
        assert "unstratified" in result.note
        np.testing.assert_allclose(result.probs.sum(axis=1), 1.0)

    def test_non_convergence_is_reported_not_warned(self):
        gen = np.random.default_rng(1)
        x = gen.normal(size=(30, 5))
        y = np.arange(30) % 3
        result = instance_probabilities(x, y, 3, 0, max_iter=1)  # filterwarnings=error would fail
        assert not result.converged

    def test_seeded(self):
        gen = np.random.default_rng(1)
        x = gen.normal(size=(30, 5))
        y = np.arange(30) % 3
        a = instance_probabilities(x, y, 3, np.random.default_rng(4)).probs
        b = instance_probabilities(x, y, 3, 4).probs
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------------------
# injection into a federation


def _three_clients() -> tuple[np.ndarray, list[np.ndarray]]:
    labels = np.arange(30) % 3
    parts = [np.arange(0, 10), np.arange(10, 20), np.arange(20, 30)]
    return labels, parts


class TestInjectNoise:
    def test_rates_masks_and_two_group_flags(self):
        labels, parts = _three_clients()
        report = inject_noise(
            labels, parts, [0.0, 0.5, 0.3], 3, "symmetric", 0, protocol="rho_range"
        )
        # Realised = floor(rate * 10) / 10 = 0, 5/10, 3/10.
        np.testing.assert_allclose(report.realised_rates, [0.0, 0.5, 0.3])
        np.testing.assert_allclose(report.target_rates, [0.0, 0.5, 0.3])
        assert report.noisy_clients.tolist() == [False, True, True]
        for idx, mask in zip(parts, report.client_flipped, strict=True):
            np.testing.assert_array_equal(report.flipped[idx], mask)
            assert np.all(report.noisy_labels[idx][mask] != labels[idx][mask])
        assert report.flipped.sum() == 8
        assert report.notes == ()

    def test_continuous_protocol_uses_realised_rate_and_threshold(self):
        labels, parts = _three_clients()
        # Realised 0.0, 0.1 (= 1/10, exactly at the default threshold 0.1), 0.4.
        report = inject_noise(labels, parts, [0.0, 0.1, 0.4], 3, "symmetric", 0, protocol="linear")
        assert report.noisy_clients.tolist() == [False, True, True]
        report = inject_noise(
            labels, parts, [0.0, 0.1, 0.4], 3, "symmetric", 0, protocol="linear", threshold=0.3
        )
        assert report.noisy_clients.tolist() == [False, False, True]

    def test_target_above_zero_but_no_flip_is_clean(self):
        # Rate 0.05 on 10 samples flips floor(0.5) = 0 labels: realised 0, so clean under
        # every rule (the truth comes from the realised flips, not from the target rate).
        labels, parts = _three_clients()
        levels = [0.05, 0.0, 0.0]
        two = inject_noise(labels, parts, levels, 3, "symmetric", 0, protocol="rho_tau")
        cont = inject_noise(labels, parts, levels, 3, "symmetric", 0, protocol="linear")
        assert two.noisy_clients.tolist() == [False, False, False]
        assert cont.noisy_clients.tolist() == [False, False, False]
        assert two.realised_rates[0] == 0.0
        assert two.target_rates[0] == 0.05

    def test_asymmetric_map_on_a_site_without_the_source_class_is_clean(self):
        # Client 0 holds only classes 1 and 2; the map flips class 0 -> 1 only. Its target
        # rate 0.5 realises nothing (no class-0 sample), so it is clean. Client 1 holds four
        # class-0 samples: floor(0.5 * 4) = 2 of its 6 labels flip, realised 2/6, noisy.
        labels = np.array([1, 2, 1, 2, 0, 0, 0, 0, 2, 2])
        parts = [np.arange(0, 4), np.arange(4, 10)]
        report = inject_noise(
            labels, parts, [0.5, 0.5], 3, "asymmetric", 0, protocol="rho_range", class_map={0: 1}
        )
        assert report.realised_rates.tolist() == [0.0, pytest.approx(2 / 6)]
        assert report.noisy_clients.tolist() == [False, True]
        assert report.flipped.sum() == 2
        # A threshold of 0 under a continuous protocol does not make a flip-less client noisy.
        cont = inject_noise(
            labels,
            parts,
            [0.5, 0.5],
            3,
            "asymmetric",
            0,
            protocol="linear",
            threshold=0.0,
            class_map={0: 1},
        )
        assert cont.noisy_clients.tolist() == [False, True]

    def test_samples_outside_every_client_keep_their_labels(self):
        labels = np.arange(12) % 2
        report = inject_noise(
            labels, [np.arange(0, 6)], [1.0], 2, "pairflip", 0, protocol="uniform_all"
        )
        np.testing.assert_array_equal(report.noisy_labels[6:], labels[6:])
        np.testing.assert_array_equal(report.noisy_labels[:6], 1 - labels[:6])

    def test_instance_with_features(self):
        gen = np.random.default_rng(0)
        x = np.concatenate([gen.normal(-2, 1, (20, 3)), gen.normal(2, 1, (20, 3))])
        labels = np.repeat([0, 1], 20)
        parts = [np.arange(0, 40, 2), np.arange(1, 40, 2)]
        report = inject_noise(
            labels, parts, [0.0, 0.5], 2, "instance", 0, protocol="rho_range", x=x
        )
        # floor(0.5 * 20) = 10 flips on client 1, none on client 0.
        np.testing.assert_allclose(report.realised_rates, [0.0, 0.5])
        assert np.all(
            report.noisy_labels[parts[1]][report.client_flipped[1]]
            != labels[parts[1]][report.client_flipped[1]]
        )

    def test_seeded(self):
        labels, parts = _three_clients()
        a = inject_noise(labels, parts, [0.2, 0.5, 0.3], 3, "symmetric", 9, protocol="rho_range")
        b = inject_noise(labels, parts, [0.2, 0.5, 0.3], 3, "symmetric", 9, protocol="rho_range")
        c = inject_noise(labels, parts, [0.2, 0.5, 0.3], 3, "symmetric", 10, protocol="rho_range")
        np.testing.assert_array_equal(a.noisy_labels, b.noisy_labels)
        assert not np.array_equal(a.noisy_labels, c.noisy_labels)

    def test_empty_client_is_noted(self):
        labels = np.array([0, 1, 0, 1])
        report = inject_noise(
            labels,
            [np.arange(4), np.array([], dtype=np.int64)],
            [0.5, 0.5],
            2,
            "symmetric",
            0,
            protocol="rho_range",
        )
        assert report.realised_rates.tolist() == [0.5, 0.0]
        assert any("client 1" in note for note in report.notes)

    def test_errors(self):
        labels, parts = _three_clients()
        with pytest.raises(NoiseError, match="disjoint"):
            inject_noise(
                labels,
                [np.arange(5), np.arange(3, 8)],
                [0.1, 0.1],
                3,
                "symmetric",
                0,
                protocol="rho_range",
            )
        with pytest.raises(NoiseError, match="levels"):
            inject_noise(labels, parts, [0.1, 0.1], 3, "symmetric", 0, protocol="rho_range")
        with pytest.raises(NoiseError, match="protocol"):
            inject_noise(labels, parts, [0.1] * 3, 3, "symmetric", 0, protocol="gauss")
        with pytest.raises(NoiseError, match="instance_probs or x"):
            inject_noise(labels, parts, [0.1] * 3, 3, "instance", 0, protocol="rho_range")
        with pytest.raises(NoiseError, match="outside"):
            inject_noise(
                labels, [np.array([0, 99])], [0.1], 3, "symmetric", 0, protocol="rho_range"
            )
