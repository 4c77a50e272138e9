"""The SDK applies the federation's signal privacy policy before anything leaves the site."""

from __future__ import annotations

import pytest

from client_sdk import SignalPolicy, SignalPolicyError
from client_sdk.privacy import private_counts, private_signals

OFF = SignalPolicy()
MIN_5 = SignalPolicy(min_class_count=5)
BUCKET_10 = SignalPolicy(count_bucket=10)
BOTH = SignalPolicy(min_class_count=5, count_bucket=10)


@pytest.mark.parametrize(
    ("policy", "counts", "expected"),
    [
        (OFF, [30, 3, 4, 0], (37, [30, 3, 4, 0])),
        (MIN_5, [30, 3, 4, 0], (37, [30, None, None, 0])),
        (MIN_5, [30, 5, 1, 1], (37, [30, 5, None, None])),
        (BUCKET_10, [30, 3, 4, 0], (40, [30, 10, 10, 0])),
        (BUCKET_10, [21, 10, 0, 6], (40, [30, 10, 0, 10])),
        (BOTH, [30, 3, 4, 0], (40, [30, None, None, 0])),
        (BOTH, [12, 5, 4, 0], (30, [20, 10, None, 0])),
        # min_class_count 1 suppresses nothing: no class has fewer than 1 sample and more than 0
        (SignalPolicy(min_class_count=1), [1, 0], (1, [1, 0])),
    ],
)
def test_counts_leave_the_site_as_coarse_as_the_policy_asks(policy, counts, expected) -> None:
    assert private_counts(sum(counts), counts, policy) == expected


def test_a_site_with_every_class_suppressed_sends_nothing() -> None:
    with pytest.raises(SignalPolicyError, match="min_class_count \\(5\\)"):
        private_counts(7, [3, 4, 0], MIN_5)


def test_a_suppressed_class_sends_no_per_class_signal() -> None:
    exact = {
        "class_counts": [30, 3, 0],
        "per_class_loss": [0.5, 2.25, None],
        "per_class_loss_sd": [0.1, 0.75, None],
        "per_class_errors": [4, 3, None],
        "per_class_confident_errors": [2, 1, None],
        "train_loss": 0.4,
        "probe_softmax": [[0.2, 0.3, 0.5]],
    }
    num_samples, sent = private_signals(33, exact, BOTH)
    assert num_samples == 40
    assert sent == {
        "class_counts": [30, None, 0],
        "per_class_loss": [0.5, None, None],
        "per_class_loss_sd": [0.1, None, None],
        "per_class_errors": [4, None, None],
        "per_class_confident_errors": [2, None, None],
        "train_loss": 0.4,
        "probe_softmax": [[0.2, 0.3, 0.5]],
    }
    assert exact["per_class_loss"] == [0.5, 2.25, None], "the site's own values are left alone"


def test_without_a_policy_the_signals_are_sent_as_computed() -> None:
    exact = {"class_counts": [2, 1], "per_class_loss": [0.5, 2.0], "train_loss": 0.4}
    assert private_signals(3, exact, OFF) == (3, exact)


def test_signals_without_per_class_losses_get_only_coarse_counts() -> None:
    num_samples, sent = private_signals(13, {"class_counts": [10, 3], "train_loss": 0.4}, BOTH)
    assert (num_samples, sent) == (20, {"class_counts": [10, None], "train_loss": 0.4})


def test_a_suppressed_class_sends_back_the_global_centroid() -> None:
    exact = {"class_counts": [30, 3], "centroids": [[1.0, 2.0], [3.0, 4.0]]}
    _, sent = private_signals(33, exact, MIN_5, global_centroids=[[0.5, 0.5], [0.25, 0.75]])
    assert sent["centroids"] == [[1.0, 2.0], [0.25, 0.75]]
    _, first_round = private_signals(33, exact, MIN_5)
    assert first_round["centroids"] == [[1.0, 2.0], [0.0, 0.0]]
