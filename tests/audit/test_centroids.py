"""RoFL global centroid aggregation (RoFL eq. 11-12)."""

from __future__ import annotations

import numpy as np
import pytest

from service.audit import InvalidInputError, aggregate_centroids

PREVIOUS = np.array([[1.0, 0.0], [0.0, 1.0]])
LOCAL = np.array(
    [
        [[2.0, 0.0], [0.0, 3.0]],  # cos with previous: class 0 -> 1, class 1 -> 1
        [[1.0, 1.0], [1.0, 0.0]],  # class 0 -> 1/sqrt(2), class 1 -> 0
        [[-1.0, 0.0], [1.0, 1.0]],  # class 0 -> -1 (counts as 0), class 1 -> 1/sqrt(2)
    ]
)
R = 1 / np.sqrt(2)


def test_similarity_weighted_hand_worked():
    # class 0: s = [1, 0.70711, 0], sum 1.70711 -> weights [0.585786, 0.414214, 0]
    #   new = 0.585786 * [2, 0] + 0.414214 * [1, 1] = [1.585786, 0.414214]
    # class 1: s = [1, 0, 0.70711] -> weights [0.585786, 0, 0.414214]
    #   new = 0.585786 * [0, 3] + 0.414214 * [1, 1] = [0.414214, 2.171573]
    new, weights = aggregate_centroids(PREVIOUS, LOCAL)
    w = 1 / (1 + R)
    np.testing.assert_allclose(weights, [[w, w], [R * w, 0.0], [0.0, R * w]])
    np.testing.assert_allclose(new, [[2 * w + R * w, R * w], [R * w, 3 * w + R * w]])
    np.testing.assert_allclose(new, [[1.585786, 0.414214], [0.414214, 2.171573]], atol=1e-6)


def test_absent_classes_get_no_weight():
    # client 0 does not hold class 1: s = [0, 0, 0.70711] -> new class 1 = client 2's [1, 1]
    present = np.array([[True, False], [True, True], [True, True]])
    new, weights = aggregate_centroids(PREVIOUS, LOCAL, present)
    np.testing.assert_allclose(weights[:, 1], [0.0, 0.0, 1.0])
    np.testing.assert_allclose(new[1], [1.0, 1.0])


def test_all_non_positive_similarities_keep_previous():
    local = np.array([[[-1.0, 0.0], [0.0, -2.0]], [[0.0, 5.0], [4.0, 0.0]]])
    new, weights = aggregate_centroids(PREVIOUS, local)
    np.testing.assert_array_equal(new, PREVIOUS)
    np.testing.assert_array_equal(weights, np.zeros((2, 2)))


def test_first_round_uses_the_mean():
    # class 0: ([2,0] + [1,1] + [-1,0]) / 3 = [2/3, 1/3]; class 1: ([0,3] + [1,0] + [1,1]) / 3
    new, weights = aggregate_centroids(None, LOCAL)
    np.testing.assert_allclose(new, [[2 / 3, 1 / 3], [2 / 3, 4 / 3]])
    np.testing.assert_allclose(weights, np.full((3, 2), 1 / 3))


def test_first_round_mean_over_holders_and_empty_class():
    # class 0 held by clients 0 and 1: ([2,0] + [1,1]) / 2 = [1.5, 0.5]; class 1 by nobody
    present = np.array([[True, False], [True, False], [False, False]])
    new, weights = aggregate_centroids(None, LOCAL, present)
    np.testing.assert_allclose(new, [[1.5, 0.5], [0.0, 0.0]])
    np.testing.assert_allclose(weights, [[0.5, 0.0], [0.5, 0.0], [0.0, 0.0]])


def test_zero_vectors_are_nan_free():
    new, weights = aggregate_centroids(np.zeros((2, 2)), np.zeros((3, 2, 2)))
    assert not np.isnan(new).any()
    assert not np.isnan(weights).any()
    np.testing.assert_array_equal(new, np.zeros((2, 2)))


def test_single_client_and_permutation():
    new, _ = aggregate_centroids(PREVIOUS, LOCAL[:1])
    np.testing.assert_allclose(new, LOCAL[0])
    perm = [2, 0, 1]
    base, base_w = aggregate_centroids(PREVIOUS, LOCAL)
    permuted, permuted_w = aggregate_centroids(PREVIOUS, LOCAL[perm])
    np.testing.assert_allclose(permuted, base)
    np.testing.assert_allclose(permuted_w, base_w[perm])


@pytest.mark.parametrize(
    ("previous", "local", "present", "match"),
    [
        (PREVIOUS, LOCAL[:, :1], None, "previous: shape"),
        (PREVIOUS, np.zeros((0, 2, 2)), None, "at least one client"),
        (PREVIOUS, LOCAL, np.ones((3, 3), dtype=bool), "present: shape"),
        (PREVIOUS, LOCAL, np.ones((3, 2)), "present: expected booleans"),
        (PREVIOUS, LOCAL[0], None, "local: expected a 3-D"),
        (np.full((2, 2), np.nan), LOCAL, None, "previous: contains NaN"),
    ],
)
def test_bad_inputs(previous, local, present, match):
    with pytest.raises(InvalidInputError, match=match):
        aggregate_centroids(previous, local, present)
