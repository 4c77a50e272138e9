"""Signals: per-class loss with theta_G, accuracy, probe bytes, only what the server needs."""

from __future__ import annotations

import copy
import hashlib
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from client_sdk.recipes import LocalData, TrainReport
from client_sdk.recipes.errors import SignalError
from client_sdk.signals import Signals, compute_signals, make_probe
from tests.client_sdk.recipes.helpers import scaled_identity, tiny_cnn

REPO = Path(__file__).resolve().parents[2]
VENV_PYTHON = REPO / ".venv" / "bin" / "python"
REPORT = TrainReport(train_loss=0.25, num_steps=3)


class Exploding(nn.Module):
    """A model that fails if anything evaluates it (proves a signal was not computed)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("this model must not be evaluated")


def signals_for(required: set[str], **kwargs: object) -> Signals:
    values: dict[str, object] = {
        "global_model": scaled_identity(1.0),
        "local_model": scaled_identity(1.0),
        "data": LocalData(torch.eye(3), torch.tensor([0, 1, 2])),
        "num_classes": 3,
        "required": required,
        "train_report": REPORT,
        "probe_seed": 5,
        "probe_size": 4,
        "input_shape": (3,),
        "device": "cpu",
    }
    values.update(kwargs)
    return compute_signals(**values)  # type: ignore[arg-type]


def test_per_class_loss_by_hand_with_the_global_model() -> None:
    # theta_G = identity, so logits = x.
    # x1 = [ln 2, 0, 0], label 0: softmax [2, 1, 1] / 4 -> CE = -ln 0.5 = 0.693147
    # x2 = [0, 0, 0],    label 0: uniform                -> CE = ln 3     = 1.098612
    # x3 = [0, ln 3, 0], label 1: softmax [1, 3, 1] / 5 -> CE = -ln 0.6 = 0.510826
    # class 0: (0.693147 + 1.098612) / 2 = 0.895880; class 1: 0.510826; class 2: no sample
    x = torch.tensor([[math.log(2.0), 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, math.log(3.0), 0.0]])
    data = LocalData(x, torch.tensor([0, 0, 1]))
    out = signals_for(
        {"per_class_loss"},
        data=data,
        global_model=scaled_identity(1.0),
        local_model=Exploding(),
    )
    assert out.class_counts == [2, 1, 0]
    assert out.per_class_loss is not None
    assert out.per_class_loss[0] == pytest.approx(0.895880, abs=1e-5)
    assert out.per_class_loss[1] == pytest.approx(0.510826, abs=1e-5)
    assert out.per_class_loss[2] is None


def test_per_class_errors_by_hand_with_the_global_model() -> None:
    # theta_G = identity: predictions = argmax x = [0, 1, 2, 1, 0]; labels [0, 0, 0, 1, 1]
    # -> class 0: samples 2 and 3 wrong (2 errors); class 1: sample 5 wrong (1); class 2: none.
    x = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [0, 1.0, 0], [1.0, 0, 0]])
    data = LocalData(x, torch.tensor([0, 0, 0, 1, 1]))
    out = signals_for({"per_class_loss"}, data=data, local_model=Exploding())
    assert out.per_class_errors == [2, 1, None]
    assert out.to_json()["per_class_errors"] == [2, 1, None]


def test_confident_errors_by_hand_with_the_global_model() -> None:
    # theta_G = identity, labels all 0. Softmax of [0, a, 0] gives label 0 the probability
    # 1 / (2 + e^a): a = 2.5 -> 0.070 (an error, confident: <= 0.1); a = 2.0 -> 0.106 (an
    # error, not confident); a = 10 -> 4.5e-5 (confident). [1, 0, 0]: right. [0, 0, 0]: argmax 0.
    a = [2.5, 2.0, 10.0]
    x = torch.tensor([[0.0, v, 0.0] for v in a] + [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    data = LocalData(x, torch.tensor([0, 0, 0, 0, 0]))
    out = signals_for({"per_class_loss"}, data=data, local_model=Exploding())
    assert out.per_class_errors == [3, None, None]
    assert out.per_class_confident_errors == [2, None, None]
    assert out.to_json()["per_class_confident_errors"] == [2, None, None]


def test_the_confident_errors_do_not_depend_on_the_loss_clip() -> None:
    # Clipping the losses (the Gaussian mechanism's bound) must not hide a confident error.
    x = torch.tensor([[0.0, 10.0, 0.0], [0.0, 2.0, 0.0]])
    data = LocalData(x, torch.tensor([0, 0]))
    out = signals_for({"per_class_loss"}, data=data, local_model=Exploding(), loss_clip=1.0)
    assert out.per_class_confident_errors == [1, None, None]


def test_train_accuracy_by_hand_with_the_local_model() -> None:
    # theta_k = identity: predictions = argmax x = [0, 1, 2, 0]; labels [0, 1, 0, 2]
    # -> correct, correct, wrong, wrong = 2 / 4 = 0.5
    x = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [1.0, 0, 0]])
    data = LocalData(x, torch.tensor([0, 1, 0, 2]))
    out = signals_for({"train_accuracy"}, data=data, global_model=Exploding())
    assert out.train_accuracy == 0.5


def test_train_accuracy_uses_the_recipes_logit_offset() -> None:
    # Same inputs and labels as above, offsets [0, 0, 2] (a logit-adjusted recipe): adjusted
    # logits [1,0,2], [0,1,2], [0,0,3], [1,0,2] -> predictions 2, 2, 2, 2; labels [0, 1, 0, 2]
    # -> only the last is right: 1 / 4.
    x = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [1.0, 0, 0]])
    data = LocalData(x, torch.tensor([0, 1, 0, 2]))
    report = TrainReport(train_loss=0.25, num_steps=3, logit_offset=torch.tensor([0.0, 0, 2]))
    out = signals_for({"train_accuracy"}, data=data, global_model=Exploding(), train_report=report)
    assert out.train_accuracy == 0.25


def test_only_required_signals_are_computed_and_sent() -> None:
    out = signals_for({"train_loss"}, global_model=Exploding(), local_model=Exploding())
    assert out.to_json() == {"num_samples": 3, "class_counts": [1, 1, 1], "train_loss": 0.25}


def test_probe_softmax_shape_and_rows() -> None:
    out = signals_for({"probe_softmax"}, global_model=Exploding())
    assert out.probe_softmax is not None
    assert len(out.probe_softmax) == 4
    assert all(len(row) == 3 for row in out.probe_softmax)
    assert all(sum(row) == pytest.approx(1.0, abs=1e-6) for row in out.probe_softmax)
    # softmax of the probe itself (identity model), computed independently here
    probe = make_probe(5, 4, (3,))
    expected = torch.softmax(probe.double(), dim=1)
    assert torch.allclose(torch.tensor(out.probe_softmax, dtype=torch.float64), expected, atol=1e-6)


def test_evaluation_restores_mode_and_leaves_batchnorm_statistics() -> None:
    model = tiny_cnn()
    model.train()
    norm = model[1]
    assert isinstance(norm, nn.BatchNorm2d)
    assert norm.running_mean is not None
    before = norm.running_mean.clone()
    data = LocalData(torch.randn(10, 1, 4, 4), torch.arange(10) % 3)
    signals_for(
        {"per_class_loss", "train_accuracy", "probe_softmax"},
        data=data,
        global_model=model,
        local_model=model,
        input_shape=(1, 4, 4),
    )
    assert model.training
    assert torch.equal(norm.running_mean, before)  # eval mode: no statistics update


def _reference_per_class_loss(model: nn.Module, data: LocalData, num_classes: int) -> list:
    """Per-class mean cross-entropy in the default (NCHW) layout, computed independently."""
    model.eval()
    with torch.no_grad():
        losses = F.cross_entropy(model(data.inputs), data.labels, reduction="none")
    return [
        float(losses[data.labels == c].mean()) if bool((data.labels == c).any()) else None
        for c in range(num_classes)
    ]


def test_convolution_models_on_cpu_give_the_default_layout_results_and_stay_unchanged() -> None:
    # The CPU path evaluates convolution weights channels-last; the losses must equal an
    # independent NCHW computation, and the model must come back with the same parameter
    # objects, the same values and the default (contiguous) layout.
    model = tiny_cnn(seed=3)
    data = LocalData(
        torch.randn(40, 1, 4, 4, generator=torch.Generator().manual_seed(1)), torch.arange(40) % 3
    )
    expected = _reference_per_class_loss(copy.deepcopy(model), data, 3)
    params = list(model.parameters())
    values = [p.detach().clone() for p in params]
    out = signals_for(
        {"per_class_loss", "train_accuracy"},
        data=data,
        global_model=model,
        local_model=model,
        input_shape=(1, 4, 4),
        batch_size=16,
    )
    assert out.per_class_loss == pytest.approx(expected, abs=1e-5)
    assert list(model.parameters()) == params
    for p, v in zip(params, values, strict=True):
        assert p.is_contiguous()
        assert torch.equal(p, v)


class ViewsActivations(nn.Module):
    """A conv model whose forward needs the default layout (``.view`` on an activation)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.head = nn.Linear(2 * 4 * 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        return self.head(h.view(h.shape[0], -1))


def test_a_model_that_needs_the_default_layout_still_gets_its_signals() -> None:
    model = ViewsActivations()
    data = LocalData(
        torch.randn(9, 1, 4, 4, generator=torch.Generator().manual_seed(2)), torch.arange(9) % 3
    )
    expected = _reference_per_class_loss(copy.deepcopy(model), data, 3)
    out = signals_for(
        {"per_class_loss"},
        data=data,
        global_model=model,
        local_model=model,
        input_shape=(1, 4, 4),
    )
    assert out.per_class_loss == pytest.approx(expected, abs=1e-5)
    assert all(p.is_contiguous() for p in model.parameters())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"required": {"probe_softmax"}, "probe_seed": None}, "probe_seed"),
        ({"required": {"centroids"}}, "centroids"),
        ({"required": {"gradients"}}, "required"),
        ({"required": {"probe_softmax"}, "input_shape": (4,)}, "input_shape"),
    ],
)
def test_missing_inputs_raise(kwargs: dict[str, object], match: str) -> None:
    required = kwargs.pop("required")
    with pytest.raises(SignalError, match=match):
        signals_for(required, **kwargs)  # type: ignore[arg-type]


def test_centroids_are_passed_through() -> None:
    report = TrainReport(train_loss=0.1, num_steps=1, centroids=torch.tensor([[1.0], [2.0], [3.0]]))
    out = signals_for({"centroids"}, train_report=report)
    assert out.centroids == [[1.0], [2.0], [3.0]]


def test_non_finite_train_loss_is_refused() -> None:
    report = TrainReport(train_loss=float("nan"), num_steps=1)
    with pytest.raises(SignalError, match="train_loss"):
        signals_for({"train_loss"}, train_report=report)


class TestProbe:
    def test_seeded_standard_normal(self) -> None:
        probe = make_probe(1234, 200, (1, 8, 8))
        assert probe.shape == (200, 1, 8, 8)
        assert probe.dtype == torch.float32
        assert torch.equal(probe, make_probe(1234, 200, (1, 8, 8)))
        assert not torch.equal(probe, make_probe(1235, 200, (1, 8, 8)))
        # 12 800 draws: mean within 0.05 of 0, std within 0.05 of 1
        assert abs(probe.mean().item()) < 0.05
        assert abs(probe.std().item() - 1.0) < 0.05

    def test_does_not_touch_the_global_rng(self) -> None:
        torch.manual_seed(0)
        expected = torch.rand(2)
        torch.manual_seed(0)
        make_probe(9, 3, (2,))
        assert torch.equal(torch.rand(2), expected)

    def test_identical_bytes_in_another_process_and_cpu_kernel(self) -> None:
        # The child runs with ATEN_CPU_CAPABILITY=default (no AVX2 kernels). float32 randn gives
        # different values there for the same seed; the probe must not.
        code = (
            "import hashlib\n"
            "from client_sdk.signals import make_probe\n"
            "p = make_probe(20240601, 16, (1, 28, 28))\n"
            "print(hashlib.sha256(p.numpy().tobytes()).hexdigest())\n"
        )
        python = str(VENV_PYTHON) if VENV_PYTHON.exists() else sys.executable
        env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
        child = subprocess.run(
            [python, "-c", code],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        here = hashlib.sha256(make_probe(20240601, 16, (1, 28, 28)).numpy().tobytes()).hexdigest()
        assert child.stdout.strip() == here

    @pytest.mark.parametrize(
        ("seed", "num", "shape", "match"),
        [
            (-1, 2, (3,), "seed"),
            (2**63, 2, (3,), "seed"),
            (1, 0, (3,), "num_inputs"),
            (1, 2, (), "input_shape"),
            (1, 2, (3, 0), "input_shape"),
        ],
    )
    def test_bad_arguments(self, seed: int, num: int, shape: tuple[int, ...], match: str) -> None:
        with pytest.raises(SignalError, match=match):
            make_probe(seed, num, shape)

    @pytest.mark.gpu
    def test_same_bytes_on_cuda(self) -> None:
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")
        probe = make_probe(77, 8, (1, 28, 28))
        assert torch.equal(probe.to("cuda").cpu(), probe)
