"""The Flower path under a privacy policy: signals_record applies it with the SDK's functions,
the strategy sends it in the round's config and checks each reply against it."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip(
    "flwr", reason="flwr is not installed here (the flower extra); scripts/test-flower runs these"
)

import torch  # noqa: E402
from flwr.app import ConfigRecord  # noqa: E402
from torch import nn  # noqa: E402

from client_sdk._responses import SignalPolicy  # noqa: E402
from client_sdk.recipes.base import LocalData  # noqa: E402
from fedaudit_flower import WireSignals, decode_signals, privacy_policy, signals_record  # noqa: E402
from fedaudit_flower._records import policy_entries  # noqa: E402
from fedaudit_flower.strategy import policy_problems  # noqa: E402

LN2 = math.log(2.0)


def zero_model() -> nn.Module:
    """Logits 0 for every input: every sample's cross-entropy is ln 2."""
    model = nn.Linear(3, 2)
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)
    return model


def data() -> LocalData:
    # 6 samples of class 0, 2 of class 1
    return LocalData(torch.randn(8, 3), torch.tensor([0] * 6 + [1] * 2))


def record(policy: SignalPolicy | None, **kwargs) -> WireSignals:
    built = signals_record(
        global_model=zero_model(),
        local_model=zero_model(),
        data=data(),
        num_classes=2,
        train_loss=0.5,
        policy=policy,
        **kwargs,
    )
    return decode_signals(built)


def test_the_counts_leave_as_coarse_as_the_policy_asks() -> None:
    sent = record(SignalPolicy(min_class_count=3, count_bucket=5))
    # 8 samples -> 10; class 0: 6 -> 10; class 1: 2 < 3 -> suppressed, with no per-class loss
    assert sent.num_samples == 10
    assert sent.class_counts == [10, None]
    assert sent.per_class_loss is not None
    assert sent.per_class_loss[0] == pytest.approx(LN2)
    assert sent.per_class_loss[1] is None
    assert sent.per_class_loss_sd == [0.0, None]
    assert sent.per_class_errors is not None
    assert sent.per_class_errors[1] is None
    assert policy_problems(sent, SignalPolicy(min_class_count=3, count_bucket=5)) == []
    # without a policy the same site sends its exact counts
    plain = record(None)
    assert (plain.num_samples, plain.class_counts) == (8, [6, 2])


def test_under_the_gaussian_mechanism_no_spread_and_no_error_counts_are_sent() -> None:
    policy = SignalPolicy(dp_noise_multiplier=1e-6, dp_clip_loss=1.0, dp_delta=1e-5)
    sent = record(policy, rng=np.random.default_rng(0))
    assert sent.per_class_loss_sd is None
    assert sent.per_class_errors is None
    # every loss is ln 2 (below the clip 1): the mean is ln 2, plus noise of sd 1e-6 / n_c
    assert sent.per_class_loss is not None
    assert [float(v or 0.0) for v in sent.per_class_loss] == pytest.approx([LN2, LN2], abs=1e-4)
    assert policy_problems(sent, policy) == []


def test_the_policy_travels_in_the_rounds_config() -> None:
    policy = SignalPolicy(
        min_class_count=3, count_bucket=5, dp_noise_multiplier=2.0, dp_clip_loss=3.0, dp_delta=1e-5
    )
    config = ConfigRecord({"lr": 0.1, **policy_entries(policy)})
    assert privacy_policy(config) == policy
    assert privacy_policy(ConfigRecord({"lr": 0.1})) is None


def test_the_strategy_names_what_breaks_the_policy() -> None:
    policy = SignalPolicy(
        min_class_count=3, count_bucket=5, dp_noise_multiplier=1.0, dp_clip_loss=2.0, dp_delta=1e-5
    )
    bad = WireSignals(
        num_samples=8,
        class_counts=[6, 2],
        per_class_loss=[2.5, 0.5],
        per_class_loss_sd=[0.1, 0.1],
    )
    assert policy_problems(bad, policy) == [
        "class_counts[0]: not a multiple of count_bucket 5",
        "class_counts[1]: below min_class_count 3, must be suppressed",
        "num_samples: not a multiple of count_bucket 5",
        "per_class_loss_sd: not sent under the Gaussian mechanism",
        "per_class_loss[0]: outside [0, dp_clip_loss 2.0]",
    ]
    leaky = WireSignals(num_samples=10, class_counts=[10, None], per_class_loss=[0.5, 0.7])
    assert policy_problems(leaky, SignalPolicy(min_class_count=3, count_bucket=5)) == [
        "per_class_loss[1]: sent for a suppressed class"
    ]
    assert policy_problems(leaky, SignalPolicy()) == [
        "class_counts[1]: suppressed, but the policy suppresses no class",
        "per_class_loss[1]: sent for a suppressed class",
    ]
