"""The neighbor search against a brute force on the full R matrix.

:func:`k_reliable_neighbors` ranks candidates with a float32 matrix product and decides on exact
float64 values of the few entries near each boundary; :func:`reliability_scores` builds every
R(c, n) in float64 element by element. Wherever every client is a candidate the two must agree
bit for bit, whatever the chunk size, including ties, nearly equal probes and probes that differ
in the last digits only.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.audit import k_reliable_neighbors, reliability_scores


def _brute_force(scores: np.ndarray, k: int) -> list[list[int]]:
    n = scores.shape[0]
    return [
        sorted((j for j in range(n) if j != c), key=lambda j: (-scores[c, j], j))[:k]
        for c in range(n)
    ]


def _inputs(kind: str, seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if kind == "random":
        probes = rng.dirichlet(np.ones(4), size=(n, 3))
        acc = rng.uniform(0.2, 0.95, size=n)
    elif kind == "near":  # probes one part in 1e7 apart: cosines within about 1e-13
        base = rng.dirichlet(np.ones(4), size=(1, 3))
        probes = base + rng.uniform(0.0, 1e-7, size=(n, 3, 4))
        probes /= probes.sum(axis=2, keepdims=True)
        acc = rng.uniform(0.2, 0.95, size=n)
    elif kind == "ties":  # duplicated probes and accuracies on a coarse grid
        probes = rng.dirichlet(np.ones(4), size=(n, 3))
        probes[1::3] = probes[0]
        probes[2::5] = probes[4]
        acc = np.round(rng.uniform(0.2, 0.95, size=n), 1)
    else:  # "clustered": a few groups, inside a group cosines agree to about 1e-9
        centres = rng.dirichlet(np.ones(4), size=(4, 3))
        probes = centres[rng.integers(0, 4, size=n)] + rng.uniform(0, 1e-5, size=(n, 3, 4))
        probes /= probes.sum(axis=2, keepdims=True)
        acc = rng.choice([0.5, 0.7, 0.9], size=n)
    return probes, acc


@pytest.mark.parametrize("kind", ["random", "near", "ties", "clustered"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_neighbors_equal_the_brute_force_on_the_full_matrix(kind, seed, alpha):
    probes, acc = _inputs(kind, seed, 37)
    scores = reliability_scores(probes, acc, alpha=alpha)
    for k in (1, 3, 36, 50):
        expected = _brute_force(scores, k)
        for chunk in (None, 1, 5, 64):
            sets = k_reliable_neighbors(probes, acc, k=k, alpha=alpha, chunk_size=chunk)
            assert sets.neighbors == expected, (k, chunk)
            for c, row in enumerate(sets.neighbors):
                # the reported R are the full matrix's values, bit for bit
                assert sets.scores[c] == [float(scores[c, j]) for j in row]
                assert sets.self_score[c] == float(scores[c, c])


def test_candidates_and_targets_against_a_direct_formula():
    # With a subset of candidates, R is normalised over each target's own candidates; the
    # direct formula (FedRN eq. 3-5) computed here with numpy's dot products.
    probes, acc = _inputs("random", 5, 40)
    candidates = [j for j in range(40) if j % 3 != 1]
    targets = [1, 0, 39, 39, 12]
    sets = k_reliable_neighbors(probes, acc, k=4, targets=targets, candidates=candidates)
    flat = probes.reshape(40, -1)
    unit = flat / np.linalg.norm(flat, axis=1, keepdims=True)
    for i, c in enumerate(targets):
        cand = [j for j in candidates if j != c]
        sim = np.array([unit[c] @ unit[j] for j in cand])
        sim_n = (sim - sim.min()) / (sim.max() - sim.min())
        pool = acc[[*cand, c]]
        exp_n = (acc[cand] - pool.min()) / (pool.max() - pool.min())
        r = 0.6 * exp_n + 0.4 * sim_n
        order = sorted(range(len(cand)), key=lambda t: (-r[t], cand[t]))[:4]
        assert sets.neighbors[i] == [cand[t] for t in order]
        np.testing.assert_allclose(sets.scores[i], r[order], rtol=0, atol=1e-12)


def test_a_target_with_no_candidate_and_few_candidates():
    probes, acc = _inputs("random", 3, 10)
    sets = k_reliable_neighbors(probes, acc, k=3, targets=[2, 4, 5], candidates=[2, 5])
    # fewer candidates than k: every candidate (never the target itself), by decreasing R
    assert [sets.neighbors[0], sorted(sets.neighbors[1]), sets.neighbors[2]] == [[5], [2, 5], [2]]
    assert sets.scores[1][0] >= sets.scores[1][1]
    alone = k_reliable_neighbors(probes, acc, k=2, targets=[7], candidates=[7])
    assert alone.neighbors == [[]]
    assert alone.self_weight == [1.0]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_tiny_logits_whose_norms_round_in_subnormals(seed):
    # Logits of about 1e-160: their squares are subnormal, so the "unit" vectors are off unit
    # length and some cosines clip at 1 (ties): the float32 pass must neither rank past the clip
    # nor miss the exact ties (found by a differential test against the previous search).
    rng = np.random.default_rng(seed)
    probes = rng.normal(size=(19, 1, 1 + seed % 2)) * 10.0 ** rng.uniform(-160.0, -158.7)
    acc = rng.uniform(0.0, 1.0, size=19)
    for alpha in (0.0, 0.6):
        scores = reliability_scores(probes, acc, alpha=alpha, variant="logit")
        for k in (1, 2, 5):
            sets = k_reliable_neighbors(probes, acc, k=k, alpha=alpha, variant="logit")
            assert sets.neighbors == _brute_force(scores, k)


def test_overlapping_one_blas_thread_contexts_restore_the_original_limit():
    # Two audits in two threads: A enters, B enters, A leaves, B leaves (the order that left
    # the process at one BLAS thread when each context saved and restored the limit itself).
    from service.audit._blas import _blas_controller, one_blas_thread

    def threads() -> list[int]:
        return [i["num_threads"] for i in _blas_controller().info() if i["user_api"] == "blas"]

    # Start from two BLAS threads, so that "left at one thread" shows whatever the process's
    # own limit is (OMP_NUM_THREADS=1 would hide it).
    with _blas_controller().limit(limits=2, user_api="blas"):
        before = threads()
        if not before or min(before) < 2:
            pytest.skip(f"BLAS cannot run on two threads here ({before})")
        first, second = one_blas_thread(), one_blas_thread()
        first.__enter__()
        second.__enter__()
        assert set(threads()) == {1}
        first.__exit__(None, None, None)
        assert set(threads()) == {1}  # B still audits
        second.__exit__(None, None, None)
        assert threads() == before
