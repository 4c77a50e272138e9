"""Tests of fedaudit_sim.partition against the partitions and noise models docs/evaluation.md
defines."""

from __future__ import annotations

import numpy as np
import pytest

from fedaudit_sim.partition import (
    PARTITION_METHODS,
    PartitionError,
    as_generator,
    bernoulli_dirichlet,
    dirichlet,
    iid,
    k_classes,
    lognormal_quantity,
    partition,
    shards,
)


def _assert_valid(parts: list[np.ndarray], n: int, num_clients: int) -> None:
    """Disjoint, complete, every client non-empty, sorted int64."""
    assert len(parts) == num_clients
    for part in parts:
        assert part.dtype == np.int64
        assert part.size >= 1
        assert np.all(np.diff(part) > 0)
    joined = np.concatenate(parts)
    assert joined.size == n  # no duplicates: size n and ...
    assert np.array_equal(np.sort(joined), np.arange(n))  # ... every index exactly once


def _labels(counts: list[int]) -> np.ndarray:
    return np.repeat(np.arange(len(counts)), counts)


# Default-ish parameters for the method-generic property tests.
_CASES = [
    ("iid", {}),
    ("shards", {"num_shards_per_client": 2}),
    ("k_classes", {"k": 2}),
    ("dirichlet", {"beta": 0.5}),
    ("bernoulli_dirichlet", {"p": 0.9, "alpha": 2.0}),
    ("lognormal_quantity", {"sigma": 0.3}),
]


def test_every_method_is_covered():
    assert {m for m, _ in _CASES} == set(PARTITION_METHODS)


@pytest.mark.parametrize(("method", "params"), _CASES)
class TestCommonProperties:
    def test_disjoint_complete_nonempty(self, method, params):
        labels = np.random.default_rng(0).integers(0, 10, size=500)
        parts = partition(labels, 20, method, np.random.default_rng(1), **params)
        _assert_valid(parts, 500, 20)

    def test_same_seed_identical_different_seed_different(self, method, params):
        labels = _labels([30] * 10)
        a = partition(labels, 10, method, np.random.default_rng(7), **params)
        b = partition(labels, 10, method, 7, **params)  # an int seed means the same generator
        c = partition(labels, 10, method, np.random.default_rng(8), **params)
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
        assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))

    def test_single_client_gets_everything(self, method, params):
        labels = _labels([3, 4])
        parts = partition(labels, 1, method, 0, **params)
        assert len(parts) == 1
        assert parts[0].tolist() == list(range(7))

    def test_more_clients_than_samples_is_an_error(self, method, params):
        with pytest.raises(PartitionError, match="num_clients"):
            partition(_labels([2, 2]), 5, method, 0, **params)


class TestIID:
    def test_sizes_differ_by_at_most_one(self):
        # 10 samples, 3 clients: sizes 4, 3, 3 (array_split gives the extra one to the first).
        parts = iid(np.zeros(10, dtype=np.int64), 3, 0)
        assert [p.size for p in parts] == [4, 3, 3]
        _assert_valid(parts, 10, 3)


class TestShards:
    def test_each_client_gets_two_single_class_shards(self):
        # 4 classes x 10 samples, K = 4, S = 2: 8 shards of 40/8 = 5 samples, each within one
        # class (a class of 10 is exactly two shards), so every client holds 10 samples of at
        # most 2 classes.
        labels = _labels([10, 10, 10, 10])
        parts = shards(labels, 4, np.random.default_rng(3), num_shards_per_client=2)
        _assert_valid(parts, 40, 4)
        for part in parts:
            assert part.size == 10
            classes, counts = np.unique(labels[part], return_counts=True)
            assert classes.size <= 2
            assert set(counts.tolist()) <= {5, 10}

    def test_too_many_shards_is_an_error(self):
        with pytest.raises(PartitionError, match="shards exceed"):
            shards(_labels([3, 3]), 4, 0, num_shards_per_client=2)  # 8 shards > 6 samples
        with pytest.raises(PartitionError, match="num_shards_per_client"):
            shards(_labels([3, 3]), 2, 0, num_shards_per_client=0)


class TestKClasses:
    @pytest.mark.parametrize(("counts", "clients", "k"), [([6] * 5, 4, 2), ([9] * 10, 7, 3)])
    def test_exactly_k_classes_per_client_and_every_class_held(self, counts, clients, k):
        labels = _labels(counts)
        parts = k_classes(labels, clients, 0, k=k)
        _assert_valid(parts, labels.size, clients)
        held = [set(labels[p].tolist()) for p in parts]
        assert all(len(h) == k for h in held)
        assert set().union(*held) == set(range(len(counts)))

    def test_holders_balanced_and_samples_split_among_them(self):
        # 5 classes of 6 samples, 4 clients x 2 classes = 8 holdings over 5 classes: holder
        # counts 2, 2, 2, 1, 1 in some order (fewest-holders-first); a class with two holders
        # gives each 3 of its 6 samples, one with a single holder gives it all 6.
        labels = _labels([6] * 5)
        parts = k_classes(labels, 4, 0, k=2)
        holders = [[i for i, p in enumerate(parts) if np.any(labels[p] == c)] for c in range(5)]
        assert sorted(len(h) for h in holders) == [1, 1, 2, 2, 2]
        for c, who in enumerate(holders):
            shares = sorted(int(np.sum(labels[parts[i]] == c)) for i in who)
            assert shares == ([6] if len(who) == 1 else [3, 3])

    def test_k_is_explicit_where_shards_are_not(self):
        # 3 classes of 5, 3 clients, 2 shards each: shards are 9 pieces of sizes 2/2/2/2/2/2/1/1/1
        # cut from the label-sorted order, so some shard straddles two classes and some client
        # ends up with a class count other than 2; k_classes gives exactly 2 to everyone.
        labels = _labels([5, 5, 5])
        counts_shards = [
            len(set(labels[p].tolist())) for p in shards(labels, 3, 0, num_shards_per_client=2)
        ]
        assert counts_shards != [2, 2, 2]
        assert [len(set(labels[p].tolist())) for p in k_classes(labels, 3, 0, k=2)] == [2, 2, 2]

    def test_errors(self):
        labels = _labels([4, 4, 4])
        with pytest.raises(PartitionError, match="k=4 exceeds the 3 classes"):
            k_classes(labels, 2, 0, k=4)
        with pytest.raises(PartitionError, match="every class needs a holder"):
            k_classes(_labels([4] * 5), 2, 0, k=2)
        with pytest.raises(PartitionError, match="must be an int >= 1"):
            k_classes(labels, 2, 0, k=0)
        # 6 clients x 3 classes: each class of 4 samples would need 6 holders
        with pytest.raises(PartitionError, match="class 0 has 4 sample"):
            k_classes(labels, 6, 0, k=3)
        with pytest.raises(PartitionError, match="no parameter"):
            partition(labels, 2, "k_classes", 0, num_shards_per_client=2)


class TestDirichlet:
    def test_huge_beta_is_nearly_uniform_per_class(self):
        # beta = 1e4: proportions ~ 1/K each (std of one share ~ sqrt(1/K * (1-1/K) / (K*beta))
        # ~ 0.002), so each client gets floor-cut ~ 100/5 = 20 samples of each class, +-2.
        labels = _labels([100] * 5)
        parts = dirichlet(labels, 5, 0, beta=1e4)
        for part in parts:
            counts = np.bincount(labels[part], minlength=5)
            assert np.all(np.abs(counts - 20) <= 2)

    def test_small_beta_concentrates_each_class(self):
        # 20 classes x 100 samples, K = 5. With beta = 0.001 a class's Dirichlet mass sits almost
        # entirely on one client, so the mean (over classes) largest client share is >= 0.9.
        # With beta = 100 every share is ~ 1/5 (std sqrt(0.2 * 0.8 / 501) ~ 0.018), so the mean
        # largest share stays <= 0.3.
        labels = _labels([100] * 20)

        def mean_top_share(beta: float) -> float:
            parts = dirichlet(labels, 5, 1, beta=beta)
            tops = [max(int(np.sum(labels[p] == c)) for p in parts) / 100 for c in range(20)]
            return float(np.mean(tops))

        assert mean_top_share(0.001) >= 0.9
        assert mean_top_share(100.0) <= 0.3

    def test_repair_gives_every_client_a_sample(self):
        # 6 samples, 5 clients, beta tiny and no redraws: the raw draw leaves clients empty
        # almost surely; the repair moves single samples so every client has one.
        labels = _labels([3, 3])
        for seed in range(20):
            parts = dirichlet(labels, 5, seed, beta=0.01, max_redraws=0)
            _assert_valid(parts, 6, 5)

    def test_bad_parameters(self):
        with pytest.raises(PartitionError, match="beta"):
            dirichlet(_labels([5, 5]), 2, 0, beta=0.0)
        with pytest.raises(PartitionError, match="max_redraws"):
            dirichlet(_labels([5, 5]), 2, 0, max_redraws=-1)


class TestBernoulliDirichlet:
    def test_p_one_huge_alpha_is_nearly_uniform(self):
        # p = 1: every client holds every class; alpha = 1e4 makes the categorical probabilities
        # ~ 1/4 each, so each of 4 clients gets ~ 400/4 = 100 of each class (binomial std
        # sqrt(400 * 1/4 * 3/4) ~ 8.7; allow 4 std).
        labels = _labels([400, 400])
        parts = bernoulli_dirichlet(labels, 4, 0, p=1.0, alpha=1e4)
        for part in parts:
            counts = np.bincount(labels[part], minlength=2)
            assert np.all(np.abs(counts - 100) <= 35)

    def test_every_class_has_a_holder_even_when_phi_leaves_one_out(self):
        # K = 2 clients, 10 classes, p = 0.05: Phi leaves most classes without a holder (FedCorr
        # would crash); ours gives each orphan class to a client, so all 10 classes are held and
        # the split is complete.
        labels = _labels([5] * 10)
        for seed in range(10):
            parts = bernoulli_dirichlet(labels, 2, seed, p=0.05, alpha=2.0)
            _assert_valid(parts, 50, 2)
            held = set(np.concatenate([np.unique(labels[p]) for p in parts]).tolist())
            assert held == set(range(10))

    def test_presence_probability_shapes_label_skew(self):
        # With p = 0.3, a client holds on average 0.3 * 10 = 3 classes (at least 1 because empty
        # rows are redrawn); it can receive 0 samples of a held class, so the observed number of
        # classes per client is at most that. With p = 1 and alpha = 1e4 each of a class's 200
        # samples lands on a given client with probability 1/50, so a client misses a class with
        # probability (49/50)^200 = 0.018 and holds 10 * (1 - 0.018) = 9.82 classes on average.
        labels = _labels([200] * 10)
        skewed = bernoulli_dirichlet(labels, 50, 0, p=0.3, alpha=2.0)
        flat = bernoulli_dirichlet(labels, 50, 0, p=1.0, alpha=1e4)
        mean_skewed = np.mean([np.unique(labels[p]).size for p in skewed])
        mean_flat = np.mean([np.unique(labels[p]).size for p in flat])
        assert 2.0 <= mean_skewed <= 4.5
        assert mean_flat >= 9.5

    def test_repair_gives_every_client_a_sample(self):
        labels = _labels([2, 2, 2])
        for seed in range(20):
            parts = bernoulli_dirichlet(labels, 5, seed, p=0.4, alpha=0.05, max_redraws=0)
            _assert_valid(parts, 6, 5)

    def test_bad_parameters(self):
        with pytest.raises(PartitionError, match="p="):
            bernoulli_dirichlet(_labels([5, 5]), 2, 0, p=0.0)
        with pytest.raises(PartitionError, match="p="):
            bernoulli_dirichlet(_labels([5, 5]), 2, 0, p=1.5)
        with pytest.raises(PartitionError, match="alpha"):
            bernoulli_dirichlet(_labels([5, 5]), 2, 0, alpha=-1.0)


class TestLognormalQuantity:
    def test_sigma_zero_gives_equal_sizes(self):
        # All weights exp(0) = 1: 12 samples / 4 clients = 3 each.
        parts = lognormal_quantity(np.zeros(12, dtype=np.int64), 4, 0, sigma=0.0)
        assert [p.size for p in parts] == [3, 3, 3, 3]

    def test_size_spread_matches_the_lognormal(self):
        # Coefficient of variation of lognormal(0, 0.3) = sqrt(exp(0.09) - 1) = 0.307; with 200
        # clients the sample CV lies well inside [0.25, 0.37].
        parts = lognormal_quantity(np.zeros(20_000, dtype=np.int64), 200, 0, sigma=0.3)
        sizes = np.array([p.size for p in parts], dtype=np.float64)
        assert sizes.sum() == 20_000
        assert 0.25 <= sizes.std() / sizes.mean() <= 0.37

    def test_tiny_shares_are_lifted_to_one_sample(self):
        # sigma = 5 makes some shares round to 0 samples for N = 10, K = 8; each must get 1.
        for seed in range(10):
            parts = lognormal_quantity(np.zeros(10, dtype=np.int64), 8, seed, sigma=5.0)
            _assert_valid(parts, 10, 8)

    def test_negative_sigma(self):
        with pytest.raises(PartitionError, match="sigma"):
            lognormal_quantity(np.zeros(4, dtype=np.int64), 2, 0, sigma=-0.1)


class TestValidation:
    def test_unknown_method_and_parameter(self):
        with pytest.raises(PartitionError, match="not a partition method"):
            partition(_labels([2, 2]), 2, "pathological", 0)
        with pytest.raises(PartitionError, match="beta"):
            partition(_labels([2, 2]), 2, "iid", 0, beta=0.5)

    @pytest.mark.parametrize(
        "labels",
        [np.array([[0, 1]]), np.array([0.0, 1.0]), np.array([-1, 0]), np.array([], dtype=int)],
    )
    def test_bad_labels(self, labels):
        with pytest.raises(PartitionError, match="labels"):
            partition(labels, 1, "iid", 0)

    def test_bad_num_clients_and_rng(self):
        with pytest.raises(PartitionError, match="num_clients"):
            iid(_labels([2]), 0, 0)
        with pytest.raises(PartitionError, match="rng"):
            iid(_labels([2]), 1, None)  # type: ignore[arg-type]
        gen = np.random.default_rng(0)
        assert as_generator(gen) is gen
        assert issubclass(PartitionError, ValueError)
