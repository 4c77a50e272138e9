"""FedRN similarity, reliability R(c, n) and k-reliable neighbors (FedRN, Kim et al. 2022,
section 4.1, eq. 3-7)."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest

from service.audit import (
    InvalidInputError,
    InvalidParameterError,
    k_reliable_neighbors,
    probe_similarity,
    reliability_scores,
)

# Three clients, one probe input, two classes.
PROBES = np.array([[[1.0, 0.0]], [[0.5, 0.5]], [[0.0, 1.0]]])
ACC = np.array([0.9, 0.5, 0.7])
S = np.sqrt(0.5)  # cos([1, 0], [0.5, 0.5]) = 0.5 / sqrt(0.5) = 0.70711


class TestProbeSimilarity:
    def test_hand_values(self):
        sim = probe_similarity(PROBES)
        expected = [[1.0, S, 0.0], [S, 1.0, S], [0.0, S, 1.0]]
        np.testing.assert_allclose(sim, expected, rtol=0, atol=1e-12)

    def test_logit_variant_and_zero_vector(self):
        # logits may be negative; cos([1, -1], [-1, 1]) = -1; a zero vector has cosine 0
        # with everybody; the diagonal is 1 by definition (Sim(c, c) = 1).
        logits = np.array([[[1.0, -1.0]], [[-1.0, 1.0]], [[0.0, 0.0]]])
        sim = probe_similarity(logits, variant="logit")
        np.testing.assert_allclose(sim, [[1, -1, 0], [-1, 1, 0], [0, 0, 1]], atol=1e-12)
        assert not np.isnan(sim).any()

    def test_flattens_probe_inputs(self):
        # two probe inputs: vectors [1, 0, 0, 1] and [1, 0, 1, 0]: cos = 1 / 2
        probes = np.array([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [1.0, 0.0]]])
        assert probe_similarity(probes)[0, 1] == pytest.approx(0.5)

    @pytest.mark.parametrize(
        ("probes", "match"),
        [
            (np.ones((2, 2)), "3-D"),
            (np.array([[[0.7, 0.7]]]), "sum to 1"),
            (np.array([[[1.5, -0.5]]]), r"\[0, 1\]"),
            (np.array([[[np.nan, 1.0]]]), "NaN"),
        ],
    )
    def test_bad_probes(self, probes, match):
        with pytest.raises(InvalidInputError, match=match):
            probe_similarity(probes)

    def test_bad_variant(self):
        with pytest.raises(InvalidParameterError, match="variant"):
            probe_similarity(PROBES, variant="cosine")


class TestReliability:
    def test_reliability_matrix_by_hand(self):
        # Exp over all clients: (acc - 0.5) / 0.4 = [1, 0, 0.5]; alpha = 0.6.
        # Row 0: candidate sims (S, 0) -> normalised (1, 0):
        #   R(0,1) = 0.6*0 + 0.4*1 = 0.4, R(0,2) = 0.6*0.5 + 0.4*0 = 0.3, R(0,0) = 0.6 + 0.4 = 1
        # Row 1: sims (S, S) equal -> both 1:
        #   R(1,0) = 0.6 + 0.4 = 1.0, R(1,2) = 0.3 + 0.4 = 0.7, R(1,1) = 0 + 0.4 = 0.4
        # Row 2: sims (0, S) -> (0, 1):
        #   R(2,0) = 0.6, R(2,1) = 0.4, R(2,2) = 0.3 + 0.4 = 0.7
        scores = reliability_scores(PROBES, ACC)
        expected = [[1.0, 0.4, 0.3], [1.0, 0.4, 0.7], [0.6, 0.4, 0.7]]
        np.testing.assert_allclose(scores, expected, rtol=0, atol=1e-12)

    def test_neighbors_k1_by_hand(self):
        sets = k_reliable_neighbors(PROBES, ACC, k=1)
        assert sets.targets == [0, 1, 2]
        assert sets.neighbors == [[1], [0], [0]]
        assert sets.scores == [pytest.approx([0.4]), pytest.approx([1.0]), pytest.approx([0.6])]
        assert sets.self_score == pytest.approx([1.0, 0.4, 0.7])
        # R' = R / (R(c,c) + R(c,n)): 0.4/1.4, 1/1.4, 0.6/1.3
        assert sets.weights == [
            pytest.approx([0.4 / 1.4]),
            pytest.approx([1.0 / 1.4]),
            pytest.approx([0.6 / 1.3]),
        ]
        assert sets.self_weight == pytest.approx([1.0 / 1.4, 0.4 / 1.4, 0.7 / 1.3])

    def test_neighbors_k2_are_all_others_ordered_by_r(self):
        # k >= K - 1: every other client, best first. Row 1: R(1,0) = 1.0 > R(1,2) = 0.7
        sets = k_reliable_neighbors(PROBES, ACC, k=2)
        assert sets.neighbors == [[1, 2], [0, 2], [0, 1]]
        # row 0: total 1 + 0.4 + 0.3 = 1.7
        assert sets.weights[0] == pytest.approx([0.4 / 1.7, 0.3 / 1.7])
        assert sets.self_weight[0] == pytest.approx(1.0 / 1.7)
        assert k_reliable_neighbors(PROBES, ACC, k=10) == sets

    def test_alpha_extremes(self):
        # alpha = 1: expertise only -> row 2 picks client 0 (Exp 1); alpha = 0: similarity
        # only -> row 2 picks client 1 (normalised sim 1 vs 0)
        assert k_reliable_neighbors(PROBES, ACC, k=1, alpha=1.0).neighbors[2] == [0]
        assert k_reliable_neighbors(PROBES, ACC, k=1, alpha=0.0).neighbors[2] == [1]

    def test_expertise_normalised_over_target_and_candidates(self):
        # Target 0 is not a candidate; candidates {1, 2}. Exp over {0, 1, 2} (FedRN eq. 4):
        # client 1 -> 0, client 2 -> 0.5, so R(0,1) = 0.4 beats R(0,2) = 0.3. (Normalising
        # over the candidates only would give client 2 Exp 1 and R = 0.6.)
        sets = k_reliable_neighbors(PROBES, ACC, k=1, targets=[0], candidates=[1, 2])
        assert sets.neighbors == [[1]]
        assert sets.scores == [pytest.approx([0.4])]

    def test_candidates_restrict_neighbors(self):
        sets = k_reliable_neighbors(PROBES, ACC, k=2, candidates=[0, 1])
        assert sets.neighbors == [[1], [0], [0, 1]]
        # target 0 has one candidate (1): its similarity range is a single value -> 1;
        # Exp over {0, 1} = [1, 0]: R(0,1) = 0.4 * 1 = 0.4; R(0,0) = 1.0
        assert sets.scores[0] == pytest.approx([0.4])

    def test_single_client(self):
        sets = k_reliable_neighbors(np.array([[[0.3, 0.7]]]), [0.4])
        assert sets.neighbors == [[]]
        assert sets.weights == [[]]
        assert sets.self_weight == [1.0]
        # Exp of a single client is 1: R(c,c) = 0.6 + 0.4
        assert sets.self_score == pytest.approx([1.0])

    def test_no_candidate_at_all(self):
        sets = k_reliable_neighbors(PROBES, ACC, targets=[2], candidates=[])
        assert sets.neighbors == [[]]
        assert sets.self_weight == [1.0]

    def test_all_equal_inputs_tie_by_lower_index(self):
        probes = np.full((4, 2, 3), 1.0 / 3.0)
        sets = k_reliable_neighbors(probes, [0.6] * 4, k=2)
        assert sets.neighbors == [[1, 2], [0, 2], [0, 1], [0, 1]]
        # every R = 0.6 * 1 + 0.4 * 1 = 1 -> R' = 1/3 each
        for weights, self_weight in zip(sets.weights, sets.self_weight, strict=True):
            assert weights == pytest.approx([1 / 3, 1 / 3])
            assert self_weight == pytest.approx(1 / 3)
        assert not np.isnan(reliability_scores(probes, [0.6] * 4)).any()

    def test_permutation_invariance(self):
        rng = np.random.default_rng(5)
        probes = rng.dirichlet(np.ones(4), size=(9, 3))
        acc = rng.uniform(0.2, 0.9, size=9)
        perm = rng.permutation(9)
        base = reliability_scores(probes, acc)
        permuted = reliability_scores(probes[perm], acc[perm])
        assert permuted == pytest.approx(base[np.ix_(perm, perm)])

    def test_json(self):
        sets = k_reliable_neighbors(PROBES, ACC)
        assert json.loads(json.dumps(sets.to_json(), allow_nan=False))["neighbors"] == [
            [1, 2],
            [0, 2],
            [0, 1],
        ]

    @pytest.mark.parametrize(
        ("kwargs", "error", "match"),
        [
            ({"k": 0}, InvalidParameterError, "k"),
            ({"alpha": 1.2}, InvalidParameterError, "alpha"),
            ({"chunk_size": 0}, InvalidParameterError, "chunk_size"),
            ({"targets": [3]}, InvalidParameterError, r"targets\[0\]"),
            ({"candidates": [-1]}, InvalidParameterError, r"candidates\[0\]"),
            ({"train_accuracy": [0.5, 0.5]}, InvalidInputError, "length"),
            ({"train_accuracy": [0.5, 0.5, 1.5]}, InvalidInputError, "<= 1"),
        ],
    )
    def test_bad_arguments(self, kwargs, error, match):
        arguments = {"probes": PROBES, "train_accuracy": ACC} | kwargs
        with pytest.raises(error, match=match):
            k_reliable_neighbors(**arguments)


class TestChunkedTopK:
    @staticmethod
    def _inputs(seed: int, n_clients: int, with_ties: bool) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seed)
        probes = rng.dirichlet(np.ones(5), size=(n_clients, 2))
        acc = rng.uniform(0.1, 0.95, size=n_clients)
        if with_ties:
            # duplicated probes and accuracies, and accuracies on a coarse grid
            probes[1::4] = probes[0]
            acc = np.round(acc, 1)
            acc[2::5] = acc[0]
        return probes, acc

    @pytest.mark.parametrize("seed", [0, 1, 2])
    @pytest.mark.parametrize("with_ties", [False, True])
    @pytest.mark.parametrize("chunk_size", [1, 3, 7, 64])
    def test_chunked_equals_exact(self, seed, with_ties, chunk_size):
        probes, acc = self._inputs(seed, 41, with_ties)
        for k in (1, 2, 5):
            exact = k_reliable_neighbors(probes, acc, k=k)
            chunked = k_reliable_neighbors(probes, acc, k=k, chunk_size=chunk_size)
            assert chunked == exact  # bit-for-bit, ties included

    def test_chunked_equals_exact_with_targets_and_candidates(self):
        probes, acc = self._inputs(7, 30, True)
        targets = [29, 3, 3, 0, 17]
        candidates = list(range(0, 30, 2))
        exact = k_reliable_neighbors(probes, acc, 3, targets=targets, candidates=candidates)
        chunked = k_reliable_neighbors(
            probes, acc, 3, targets=targets, candidates=candidates, chunk_size=2
        )
        assert chunked == exact
        assert exact.targets == [29, 3, 3, 0, 17]
        assert all(n % 2 == 0 for row in exact.neighbors for n in row)
        assert 0 not in exact.neighbors[3]

    def test_ties_resolved_by_lower_index(self):
        probes, acc = self._inputs(3, 20, True)
        probes[:] = probes[0]
        acc[:] = 0.5
        for chunk in (None, 3):
            sets = k_reliable_neighbors(probes, acc, k=3, chunk_size=chunk)
            assert sets.neighbors[0] == [1, 2, 3]
            assert sets.neighbors[5] == [0, 1, 2]

    def test_exact_top_k_against_a_brute_force_sort(self):
        probes, acc = self._inputs(11, 25, True)
        scores = reliability_scores(probes, acc)
        sets = k_reliable_neighbors(probes, acc, k=4, chunk_size=5)
        for c in range(25):
            others = [n for n in range(25) if n != c]
            # sort by decreasing R, then increasing index
            expected = sorted(others, key=lambda n: (-scores[c, n], n))[:4]
            assert sets.neighbors[c] == expected

    def test_chunked_never_builds_k_by_k(self):
        n_clients = 3000
        rng = np.random.default_rng(0)
        probes = rng.dirichlet(np.ones(5), size=(n_clients, 1))
        acc = rng.uniform(size=n_clients)
        full_matrix = n_clients * n_clients * 8
        tracemalloc.start()
        try:
            k_reliable_neighbors(probes, acc, chunk_size=20)
            _, chunked_peak = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            k_reliable_neighbors(probes[:600], acc[:600])
            _, exact_peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        # the exact path does build its matrix (600 x 600 floats), so memory is measurable
        assert exact_peak > 600 * 600 * 8
        # chunked: about ten 20 x 3000 temporaries (~5 MB) instead of 3000 x 3000 (72 MB)
        assert chunked_peak < full_matrix / 8
