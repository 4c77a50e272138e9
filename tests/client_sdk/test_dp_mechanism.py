"""The SDK's Gaussian mechanism (client_sdk/privacy.py) on literal inputs: what clipping
changes, the noise's scale (a statistical check with a fixed seed), the projection back onto the
simplex, and what an update under the mechanism leaves out."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from client_sdk._responses import SignalPolicy
from client_sdk.privacy import (
    clip_probe_rows,
    gaussian_signals,
    noised_per_class_loss,
    noised_probe,
    private_signals,
    probe_sensitivity,
    project_to_simplex,
)
from client_sdk.signals import _per_class_loss_signals

DP = SignalPolicy(dp_noise_multiplier=0.8, dp_clip_loss=2.0, dp_delta=1e-5)


def _loss(margin: float) -> float:
    """The cross-entropy of logits [margin, 0] against label 0: log(1 + exp(-margin))."""
    return math.log1p(math.exp(-margin))


def test_clipping_bounds_each_sample_loss_before_the_mean() -> None:
    # Class 0: losses about 0.018, 3.0 and 8.0; class 1: 0.048 and 0.31 (all below the bound).
    margins0 = [4.0, -2.95, -8.0]
    margins1 = [3.0, 1.0]
    logits = torch.tensor([[m, 0.0] for m in margins0] + [[0.0, m] for m in margins1])
    labels = torch.tensor([0, 0, 0, 1, 1])
    counts = torch.tensor([3, 2])
    plain, _, _, _ = _per_class_loss_signals(logits, labels, counts, 2, torch.device("cpu"))
    clipped, _, errors, confident = _per_class_loss_signals(
        logits, labels, counts, 2, torch.device("cpu"), loss_clip=2.0
    )
    losses0 = [_loss(m) for m in margins0]
    losses1 = [_loss(m) for m in margins1]
    assert plain[0] == pytest.approx(sum(losses0) / 3, rel=1e-6)
    # only the two losses above 2 change, each to 2
    assert clipped[0] == pytest.approx((losses0[0] + 2.0 + 2.0) / 3, rel=1e-6)
    assert clipped[1] == pytest.approx(sum(losses1) / 2, rel=1e-6)
    assert clipped[1] == pytest.approx(plain[1], rel=1e-9)
    assert errors == [2, 0]  # the error counts do not depend on the clip
    # nor the confident ones: p(label) = 1 / (1 + e^2.95) = 0.050 and 1 / (1 + e^8), both <= 0.1
    assert confident == [2, 0]


def test_a_probe_row_is_clipped_towards_uniform_to_the_radius() -> None:
    rows = np.array([[0.9, 0.05, 0.05], [0.4, 0.3, 0.3]])
    clipped = clip_probe_rows(rows, 0.2)
    uniform = np.full(3, 1 / 3)
    # the first row was 0.69 from uniform: now 0.2, in the same direction, still a distribution
    far = rows[0] - uniform
    assert np.linalg.norm(clipped[0] - uniform) == pytest.approx(0.2)
    assert np.allclose((clipped[0] - uniform) / 0.2, far / np.linalg.norm(far))
    assert clipped[0].sum() == pytest.approx(1.0)
    assert (clipped[0] >= 0).all()
    # the second row was within 0.2 (0.094): unchanged
    assert np.array_equal(clipped[1], rows[1])
    assert np.array_equal(clip_probe_rows(rows, None), rows)


def test_the_probe_sensitivity_is_the_clipped_rows_diameter() -> None:
    assert probe_sensitivity(8, None) == pytest.approx(math.sqrt(8) * math.sqrt(2))
    assert probe_sensitivity(4, 0.1) == pytest.approx(2 * 0.2)
    assert probe_sensitivity(1, 5.0) == pytest.approx(math.sqrt(2))  # no more than the simplex


def test_the_projection_onto_the_simplex() -> None:
    projected = project_to_simplex(np.array([[0.6, 0.6], [1.2, -0.1], [0.2, 0.8]]))
    assert np.allclose(projected, [[0.5, 0.5], [1.0, 0.0], [0.2, 0.8]])
    # worked by hand (Duchi et al. 2008): sorted 1.2, 0.3, -0.1; rho = 2, theta = 0.25
    assert np.allclose(project_to_simplex(np.array([[1.2, -0.1, 0.3]])), [[0.95, 0.0, 0.05]])


def test_the_noise_on_a_class_mean_has_sd_sigma_clip_over_count() -> None:
    rng = np.random.default_rng(20261127)
    draws = 20_000
    for count in (10, 40):
        sent = noised_per_class_loss(
            [5.0] * draws, [count] * draws, clip=10.0, noise_multiplier=0.5, rng=rng
        )
        values = np.asarray(sent, dtype=np.float64)
        expected_sd = 0.5 * 10.0 / count  # 0.5 and 0.125: the clamp to [0, 10] is 10 sd away
        assert values.std() == pytest.approx(expected_sd, rel=0.03)
        assert values.mean() == pytest.approx(5.0, abs=4 * expected_sd / math.sqrt(draws))


def test_a_noised_mean_stays_in_the_clip_range_and_none_stays_none() -> None:
    rng = np.random.default_rng(1)
    sent = noised_per_class_loss(
        [0.01, 1.99, None], [1, 1, 0], clip=2.0, noise_multiplier=5.0, rng=rng
    )
    assert sent[2] is None
    assert all(0.0 <= v <= 2.0 for v in sent[:2] if v is not None)


def test_the_noise_on_the_probe_has_the_sensitivitys_scale() -> None:
    # Two classes: the projection of (0.5 + e1, 0.5 + e2) is 0.5 + (e1 - e2) / 2 in the first
    # entry, so its sd is scale / sqrt(2), scale = sigma * sqrt(P) * min(2R, sqrt 2) = 0.1.
    rng = np.random.default_rng(7)
    firsts = [
        noised_probe([[0.5, 0.5]], radius=0.05, noise_multiplier=1.0, rng=rng)[0][0]
        for _ in range(5000)
    ]
    assert np.std(firsts) == pytest.approx(0.1 / math.sqrt(2), rel=0.04)
    rows = noised_probe([[0.7, 0.2, 0.1]] * 4, radius=None, noise_multiplier=0.3, rng=rng)
    assert all(abs(sum(row) - 1.0) < 1e-12 and min(row) >= 0.0 for row in rows)


def test_an_update_under_the_mechanism_sends_no_spread_and_no_error_counts() -> None:
    signals = {
        "class_counts": [30, 3, 0],
        "per_class_loss": [0.5, 1.0, None],
        "per_class_loss_sd": [0.1, 0.2, None],
        "per_class_errors": [3, 1, None],
        "per_class_confident_errors": [2, 0, None],
        "probe_softmax": [[0.2, 0.5, 0.3]],
        "train_loss": 0.4,
    }
    policy = SignalPolicy(
        min_class_count=5, dp_noise_multiplier=0.8, dp_clip_loss=2.0, dp_delta=1e-5
    )
    n, sent = private_signals(33, signals, policy, rng=np.random.default_rng(3))
    assert n == 33
    assert "per_class_loss_sd" not in sent
    assert "per_class_errors" not in sent
    assert "per_class_confident_errors" not in sent
    assert sent["class_counts"] == [30, None, 0]
    assert sent["per_class_loss"][1:] == [None, None]  # suppressed, not held
    assert sent["per_class_loss"][0] != 0.5  # noised
    assert sent["probe_softmax"] != signals["probe_softmax"]
    assert sent["train_loss"] == 0.4  # not covered by the mechanism
    # the same seed gives the same noise; the policy off leaves the values exact
    again = private_signals(33, signals, policy, rng=np.random.default_rng(3))[1]
    assert again == sent
    assert gaussian_signals(signals, [30, 3, 0], SignalPolicy()) == signals


def test_the_clip_bound_holds_the_mean_before_the_noise() -> None:
    # a mean above B (not what compute_signals(loss_clip=B) gives) is clamped to B first
    rng = np.random.default_rng(0)
    sent = noised_per_class_loss([9.0], [1000], clip=2.0, noise_multiplier=1e-9, rng=rng)
    assert sent[0] == pytest.approx(2.0)
    assert DP.dp_active
