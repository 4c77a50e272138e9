"""signals_record: the SDK's signals as a flwr ConfigRecord, read back by the strategy."""

from __future__ import annotations

import math

import pytest

pytest.importorskip(
    "flwr", reason="flwr is not installed here (the flower extra); scripts/test-flower runs these"
)

import torch  # noqa: E402
from flwr.app import ConfigRecord  # noqa: E402
from torch import nn  # noqa: E402

from client_sdk.recipes.base import LocalData  # noqa: E402
from client_sdk.recipes.errors import SignalError  # noqa: E402
from fedaudit_flower import SIGNALS_FORMAT, decode_signals, signals_record  # noqa: E402


def zero_model() -> nn.Module:
    """Logits 0 for every input: every sample's cross-entropy is ln 2, argmax is class 0."""
    model = nn.Linear(3, 2)
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)
    return model


def test_a_zero_model_gives_ln2_per_class_and_the_share_of_class_0_as_accuracy():
    # labels 0, 0, 0, 1 (class 2 of 3 absent is not possible with 2 outputs: C = 2 here)
    data = LocalData(torch.randn(4, 3), torch.tensor([0, 0, 0, 1]))
    record = signals_record(
        global_model=zero_model(),
        local_model=zero_model(),
        data=data,
        num_classes=2,
        train_loss=0.25,
    )
    assert isinstance(record, ConfigRecord)
    assert record["format"] == SIGNALS_FORMAT
    assert record["num_samples"] == 4
    assert record["class_counts"] == [3, 1]
    assert record["per_class_loss"] == pytest.approx([math.log(2)] * 2)
    assert record["per_class_loss_sd"] == pytest.approx([0.0, 0.0], abs=1e-7)
    assert record["train_loss"] == 0.25
    assert record["train_accuracy"] == 0.75  # argmax of equal logits is class 0: 3 of 4
    assert "probe_softmax" not in record
    decoded = decode_signals(record)
    assert decoded.per_class_loss == pytest.approx([math.log(2)] * 2)


def test_an_absent_class_travels_as_nan_and_comes_back_as_none():
    data = LocalData(torch.randn(2, 3), torch.tensor([1, 1]))
    record = signals_record(
        global_model=zero_model(),
        local_model=zero_model(),
        data=data,
        num_classes=2,
        required=("per_class_loss",),
    )
    assert math.isnan(float(record["per_class_loss"][0]))
    decoded = decode_signals(record)
    assert decoded.class_counts == [0, 2]
    assert decoded.per_class_loss == [None, pytest.approx(math.log(2))]
    assert decoded.train_loss is None


def test_the_probe_softmax_is_sent_row_major_with_its_shape():
    data = LocalData(torch.randn(2, 3), torch.tensor([0, 1]))
    record = signals_record(
        global_model=zero_model(),
        local_model=zero_model(),
        data=data,
        num_classes=2,
        required=("probe_softmax",),
        probe_seed=7,
        probe_size=3,
    )
    assert record["probe_softmax_shape"] == [3, 2]
    assert record["probe_softmax"] == pytest.approx([0.5] * 6)
    assert decode_signals(record).probe_softmax == [[0.5, 0.5]] * 3


def test_train_loss_must_be_given_when_required():
    data = LocalData(torch.randn(2, 3), torch.tensor([0, 1]))
    with pytest.raises(SignalError, match="train_loss"):
        signals_record(
            global_model=zero_model(), local_model=zero_model(), data=data, num_classes=2
        )
