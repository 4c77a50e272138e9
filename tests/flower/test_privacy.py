"""The Flower path under a privacy policy: signals_record applies it with the SDK's functions,
the strategy sends it in the round's config, checks each reply against it, and audits the replies
as the coordinator audits updates under it (no error counts under a count bucket, the Gaussian
mechanism's noise as the per-class spread)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

pytest.importorskip(
    "flwr", reason="flwr is not installed here (the flower extra); scripts/test-flower runs these"
)

import torch  # noqa: E402
from flwr.app import (  # noqa: E402
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    Metadata,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from torch import nn  # noqa: E402

from client_sdk._responses import SignalPolicy  # noqa: E402
from client_sdk.recipes.base import LocalData  # noqa: E402
from fedaudit_flower import (  # noqa: E402
    SIGNALS_KEY,
    FedAuditStrategy,
    WireSignals,
    decode_signals,
    encode_signals,
    privacy_policy,
    signals_record,
)
from fedaudit_flower._records import policy_entries  # noqa: E402
from fedaudit_flower.auditing import SiteReply, audit_inputs  # noqa: E402
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


# -- the in-process audit under the policy ------------------------------------------------------

GAUSSIAN = SignalPolicy(dp_noise_multiplier=1.0, dp_clip_loss=5.0, dp_delta=1e-5)
"""sigma 1, B 5: a class mean of n_c samples carries noise of sd 5 / n_c."""


def site(node_id: int, signals: WireSignals) -> SiteReply:
    return SiteReply(node_id, signals, ArrayRecord({"w": Array(np.ones(2, dtype=np.float32))}))


def test_the_audit_reads_a_reply_as_the_coordinator_reads_an_update() -> None:
    bucketed = WireSignals(
        num_samples=60,
        class_counts=[10, 40, None, 0],
        per_class_loss=[0.5, 0.4, None, None],
        per_class_loss_sd=[0.2, 0.3, None, None],
        per_class_errors=[3, 4, None, None],
    )
    # a suppressed count is a class the site does not hold; a bucket drops the error counts
    read = audit_inputs(site(1, bucketed), SignalPolicy(min_class_count=5, count_bucket=10))
    assert list(read.class_counts) == [10, 40, 0, 0]
    assert read.per_class_errors is None
    assert read.per_class_loss_sd == [0.2, 0.3, None, None]
    # exact counts (suppression alone, or no policy): the error counts are read
    assert audit_inputs(site(1, bucketed), SignalPolicy(min_class_count=5)).per_class_errors == [
        3,
        4,
        None,
        None,
    ]
    assert audit_inputs(site(1, bucketed)).per_class_errors == [3, 4, None, None]

    noised = WireSignals(
        num_samples=50, class_counts=[10, 40, None, 0], per_class_loss=[0.5, 0.4, None, None]
    )
    # sigma 2, B 3: the spread whose mean over n_c samples has sd 6 / n_c is 6 / sqrt(n_c):
    # 6 / sqrt(10) = 1.8973666, 6 / sqrt(40) = 0.9486833; none for the classes not held
    policy = SignalPolicy(dp_noise_multiplier=2.0, dp_clip_loss=3.0, dp_delta=1e-5)
    spread = audit_inputs(site(1, noised), policy).per_class_loss_sd
    assert spread is not None
    assert list(spread[:2]) == pytest.approx([1.8973666, 0.9486833])
    assert np.isnan(np.asarray(spread[2:], dtype=np.float64)).all()
    assert audit_inputs(site(1, noised)).per_class_loss_sd is None


def reply(node_id: int, signals: WireSignals) -> Message:
    """A training reply as the ServerApp receives it (as in test_strategy)."""
    content = RecordDict(
        {
            "arrays": ArrayRecord({"w": Array(np.ones(2, dtype=np.float32))}),
            "metrics": MetricRecord({"num-examples": signals.num_samples}),
            SIGNALS_KEY: encode_signals(signals),
        }
    )
    metadata = Metadata(
        run_id=1,
        message_id=f"reply-{node_id}",
        src_node_id=node_id,
        dst_node_id=0,
        reply_to_message_id=f"ins-{node_id}",
        group_id="1",
        created_at=time.time(),
        ttl=600.0,
        message_type=MessageType.TRAIN,
    )
    return Message(content=content, metadata=metadata)  # type: ignore[call-overload]


def audited(policy: SignalPolicy | None, replies: list[Message]) -> dict:
    """The round's report entry of an in-process strategy under ``policy``."""
    s = FedAuditStrategy(FedAvg(), privacy=policy)
    s.set_global_arrays(ArrayRecord({"w": Array(np.zeros(2, dtype=np.float32))}))
    s.aggregate_train(1, replies)
    entry = s.rounds[-1]
    assert entry["audited"] is True, entry.get("reason")
    return entry


def test_under_a_count_bucket_the_audit_reads_no_error_counts() -> None:
    # Eight sites of 50 + 50 samples with the same losses; site 107 makes 30 errors in each
    # class, the others 5: only its error counts set it apart.
    losses = [0.30, 0.32, 0.28, 0.31, 0.29, 0.30, 0.31, 0.30]
    replies = [
        reply(
            100 + k,
            WireSignals(
                num_samples=100,
                class_counts=[50, 50],
                per_class_loss=[loss, loss],
                per_class_loss_sd=[0.5, 0.5],
                per_class_errors=[30, 30] if k == 7 else [5, 5],
            ),
        )
        for k, loss in enumerate(losses)
    ]
    # exact counts: the 60 errors are read, and flag the site
    exact = audited(SignalPolicy(min_class_count=5), replies)
    assert [row["flag"] for row in exact["clients"]] == [False] * 7 + [True]
    assert exact["clients"][7]["verdict"]["evidence"]["errors"] == 60
    # under a bucket of 10 the same replies (their counts are multiples of 10) are judged on
    # their losses alone, as on the coordinator
    bucketed = audited(SignalPolicy(min_class_count=5, count_bucket=10), replies)
    assert [row["flag"] for row in bucketed["clients"]] == [False] * 8
    assert all("errors" not in row["verdict"]["evidence"] for row in bucketed["clients"])


def gaussian_federation(small_site_loss: list[float | None]) -> list[Message]:
    """Seven sites of 500 + 500 samples (noise sd 5 / 500 = 0.01 on a class mean) with losses
    about 0.30, and one of 10 + 10 (noise sd 5 / 10 = 0.5) with ``small_site_loss``."""
    large: dict[int, list[float | None]] = {
        100: [0.30, 0.31],
        101: [0.29, 0.30],
        102: [0.31, 0.29],
        103: [0.30, 0.32],
        104: [0.32, 0.30],
        105: [0.28, 0.31],
        106: [0.31, 0.30],
    }
    replies = [
        reply(node, WireSignals(num_samples=1000, class_counts=[500, 500], per_class_loss=loss))
        for node, loss in large.items()
    ]
    small = WireSignals(num_samples=20, class_counts=[10, 10], per_class_loss=small_site_loss)
    return [*replies, reply(107, small)]


def test_under_the_gaussian_mechanism_the_audit_counts_the_noise_as_sampling_error() -> None:
    # a strategy under the mechanism needs the accountant (ImportError without it)
    pytest.importorskip("dp_accounting", reason="the dp extra (fedaudit[dp]) is not installed")
    # The small site's class means 1.0 and 0.9 are 0.7 and 0.6 above the others': 1.4 and 1.2
    # times the noise's sd (0.5), what the mechanism adds to a clean site's means. Without the
    # noise's spread the audit flagged it.
    plausible = audited(GAUSSIAN, gaussian_federation([1.0, 0.9]))
    assert plausible["decided"] is True
    assert [row["flag"] for row in plausible["clients"]] == [False] * 8
    # 2.5 and 2.4: 4.4 and 4.2 times the noise's sd, beyond what the noise explains
    beyond = audited(GAUSSIAN, gaussian_federation([2.5, 2.4]))
    assert [row["flag"] for row in beyond["clients"]] == [False] * 7 + [True]


def test_the_privacy_argument_must_be_a_policy() -> None:
    with pytest.raises(TypeError, match="privacy"):
        FedAuditStrategy(FedAvg(), privacy={"count_bucket": 10})  # type: ignore[arg-type]


def test_the_in_process_audit_accounts_epsilon_as_the_coordinator() -> None:
    dp_accounting = pytest.importorskip("dp_accounting")

    def expected(releases: int) -> float:  # the accountant itself, not fedaudit's wrapper
        rdp = dp_accounting.rdp.RdpAccountant()
        rdp.compose(dp_accounting.GaussianDpEvent(1.0), releases)
        return float(rdp.get_epsilon(1e-5))

    s = FedAuditStrategy(FedAvg(), privacy=GAUSSIAN)
    s.set_global_arrays(ArrayRecord({"w": Array(np.zeros(2, dtype=np.float32))}))
    replies = gaussian_federation([1.0, 0.9])
    s.aggregate_train(1, replies)
    s.aggregate_train(2, replies)
    first, second = s.rounds[-2]["privacy"], s.rounds[-1]["privacy"]
    # each reply carries one noised signal (per_class_loss, no probe): one release per update
    assert first["releases_per_update"] == 1
    assert first["epsilon_round"] == pytest.approx(expected(1))
    assert first["releases_total"] == [1] * 8
    # the second round: two releases per site so far
    assert second["node_ids"] == [100, 101, 102, 103, 104, 105, 106, 107]
    assert second["releases_total"] == [2] * 8
    assert second["epsilon_total"] == pytest.approx([expected(2)] * 8)
    # without the mechanism, no account
    plain = audited(SignalPolicy(min_class_count=5), replies)
    assert "privacy" not in plain
