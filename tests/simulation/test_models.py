"""Tests of fedaudit_sim.models: shapes, heads, seeding, training, the torchvision path."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from fedaudit_sim.models import (
    MLP,
    ModelConfigError,
    SmallCNN,
    TorchvisionNotInstalledError,
    build_model,
    classifier_head,
)


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    # On a shared 2-core machine, two intra-op threads make these tiny models 5-10x slower than
    # one (measured); the tests check behaviour, not parallelism.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


_CASES = [
    ("mlp", (30,), 2),
    ("mlp", (13,), 3),
    ("cnn", (1, 8, 8), 10),
    ("cnn", (1, 28, 28), 10),
    ("cnn", (3, 32, 32), 5),
]


@pytest.mark.parametrize(("name", "shape", "classes"), _CASES)
def test_forward_shape_and_linear_head(name, shape, classes):
    model = build_model(name, shape, classes)
    out = model(torch.zeros(4, *shape))
    assert out.shape == (4, classes)
    last_name, last = list(model.named_modules())[-1]
    assert isinstance(last, nn.Linear)
    assert last_name == "head"
    assert last.out_features == classes
    assert classifier_head(model) == ("head", last)
    assert model.training


@pytest.mark.parametrize(("name", "shape", "classes"), _CASES)
def test_features_are_the_head_input(name, shape, classes):
    model = build_model(name, shape, classes)
    assert isinstance(model, MLP | SmallCNN)
    x = torch.randn(3, *shape)
    feats = model.features(x)
    assert feats.shape == (3, 64)
    torch.testing.assert_close(model.head(feats), model(x))


@pytest.mark.parametrize("norm", ["none", "group"])
def test_cnn_state_is_float_parameters_only(norm):
    # No BatchNorm: no running statistics, no integer num_batches_tracked buffer.
    model = build_model("cnn", (1, 28, 28), 10, norm=norm)
    state = model.state_dict()
    assert all(t.is_floating_point() for t in state.values())
    assert set(state) == {name for name, _ in model.named_parameters()}
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def test_cnn_sizes_by_hand():
    # 28x28: 3x3 stride-2 pad-1 convs give 14x14 then 7x7; 32 channels -> 32*7*7 = 1568 inputs to
    # the hidden Linear. 8x8 -> 4x4 -> 2x2: 32*2*2 = 128.
    # Parameters (28x28, 10 classes): conv1 1*16*9+16 = 160; conv2 16*32*9+32 = 4640;
    # hidden 1568*64+64 = 100416; head 64*10+10 = 650; total 105866.
    big = build_model("cnn", (1, 28, 28), 10)
    small = build_model("cnn", (1, 8, 8), 10)
    assert isinstance(big, SmallCNN)
    assert isinstance(small, SmallCNN)
    assert big.body[1].in_features == 1568
    assert small.body[1].in_features == 128
    assert sum(p.numel() for p in big.parameters()) == 105866


def test_mlp_layout_and_dropout():
    # Linear(30, 64) - ReLU - Dropout - Linear(64, 64) - ReLU - head Linear(64, 2).
    model = build_model("mlp", (30,), 2, dropout=0.2)
    kinds = [type(m) for m in model.modules() if not isinstance(m, MLP | nn.Sequential)]
    assert kinds == [nn.Flatten, nn.Linear, nn.ReLU, nn.Dropout, nn.Linear, nn.ReLU, nn.Linear]
    # 30*64+64 + 64*64+64 + 64*2+2 = 1984 + 4160 + 130 = 6274 parameters.
    assert sum(p.numel() for p in model.parameters()) == 6274


def test_seed_controls_initialisation_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = build_model("cnn", (1, 8, 8), 10, seed=1)
    after = torch.random.get_rng_state()
    assert torch.equal(before, after)
    b = build_model("cnn", (1, 8, 8), 10, seed=1)
    c = build_model("cnn", (1, 8, 8), 10, seed=2)
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key])
    assert not torch.equal(a.state_dict()["head.weight"], c.state_dict()["head.weight"])


@pytest.mark.parametrize(("name", "shape", "classes"), [_CASES[0], _CASES[2], _CASES[3]])
def test_tiny_training_reduces_loss(name, shape, classes):
    # A learnable rule: the label is the index of the largest of the first C input values.
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, *shape, generator=gen)
    y = x.flatten(1)[:, :classes].argmax(dim=1)
    model = build_model(name, shape, classes, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with torch.no_grad():
        start = nn.functional.cross_entropy(model(x), y).item()
    for _ in range(30):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    with torch.no_grad():
        end = nn.functional.cross_entropy(model(x), y).item()
    # Near chance at the start (ln 10 = 2.30 for 10 classes, ln 2 = 0.69 for 2); 30 full-batch
    # steps must at least halve it.
    assert end < 0.5 * start


def test_bad_arguments():
    with pytest.raises(ModelConfigError, match="not a model"):
        build_model("resnet", (1, 8, 8), 10)
    with pytest.raises(ModelConfigError, match="image input_shape"):
        build_model("cnn", (64,), 10)
    with pytest.raises(ModelConfigError, match="num_classes"):
        build_model("mlp", (4,), 0)
    with pytest.raises(ModelConfigError, match="input_shape"):
        build_model("mlp", (), 2)
    with pytest.raises(ModelConfigError, match="option"):
        build_model("mlp", (4,), 2, channels=(8, 8))
    with pytest.raises(ModelConfigError, match="norm"):
        build_model("cnn", (1, 8, 8), 2, norm="batch")
    with pytest.raises(ModelConfigError, match="dropout"):
        build_model("mlp", (4,), 2, dropout=1.0)
    assert issubclass(ModelConfigError, ValueError)


# ------------------------------------------------------------------------------------------
# torchvision path


def test_torchvision_missing_gives_a_clear_error(monkeypatch):
    # None in sys.modules makes "import torchvision" fail, whether or not it is installed.
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.delitem(sys.modules, "torchvision.models", raising=False)
    with pytest.raises(TorchvisionNotInstalledError, match=r"torchvision.*vision") as info:
        build_model("tv:resnet18", (1, 28, 28), 10)
    assert isinstance(info.value, ImportError)


class _FakeNet(nn.Module):
    """Stands in for a torchvision classifier: RGB stem conv, pooling, fc head."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1, bias=False), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(torch.flatten(self.pool(self.stem(x)), 1))
        return out


class _PickyNet(_FakeNet):
    """Like ViT: asserts a fixed input size (torchvision raises AssertionError)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.shape[-1] == 224, "Wrong image width! Expected 224"
        return super().forward(x)


class _NoLinearNet(_FakeNet):
    def __init__(self, num_classes: int) -> None:
        super().__init__(num_classes)
        del self.fc
        self.fc = nn.Conv2d(4, num_classes, 1)  # type: ignore[assignment]


def _install_fake_torchvision(monkeypatch) -> list[dict[str, object]]:
    calls: list[dict[str, object]] = []

    def get_model(name: str, **kwargs: object) -> nn.Module:
        calls.append({"name": name, **kwargs})
        builders = {"fakenet": _FakeNet, "nolinear": _NoLinearNet, "picky": _PickyNet}
        if name not in builders:
            raise ValueError(f"Unknown model {name}")
        return builders[name](int(kwargs["num_classes"]))  # type: ignore[call-overload]

    package = types.ModuleType("torchvision")
    models = types.ModuleType("torchvision.models")
    models.get_model = get_model  # type: ignore[attr-defined]
    package.models = models  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torchvision", package)
    monkeypatch.setitem(sys.modules, "torchvision.models", models)
    return calls


def test_torchvision_path_adapts_first_conv_and_checks_head(monkeypatch):
    # The real torchvision is not installed here; a stand-in module exercises our adaptation code
    # (first conv -> 1 channel, no weights, num_classes passed through, head check, dry forward).
    calls = _install_fake_torchvision(monkeypatch)
    model = build_model("tv:fakenet", (1, 28, 28), 7, seed=3)
    assert calls == [{"name": "fakenet", "weights": None, "num_classes": 7}]
    stem = model.get_submodule("stem.0")
    assert isinstance(stem, nn.Conv2d)
    assert stem.in_channels == 1
    assert (stem.out_channels, stem.kernel_size, stem.stride, stem.padding) == (
        4,
        (3, 3),
        (2, 2),
        (1, 1),
    )
    assert stem.bias is None
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 7)
    assert classifier_head(model)[0] == "fc"
    assert model.training


def test_torchvision_path_errors(monkeypatch):
    _install_fake_torchvision(monkeypatch)
    with pytest.raises(ModelConfigError, match="Unknown model"):
        build_model("tv:nosuchnet", (1, 28, 28), 7)
    with pytest.raises(ModelConfigError, match=r"not an nn\.Linear"):
        build_model("tv:nolinear", (1, 28, 28), 7)
    with pytest.raises(ModelConfigError, match="image input_shape"):
        build_model("tv:fakenet", (30,), 7)
    with pytest.raises(ModelConfigError, match="does not accept inputs"):
        build_model("tv:picky", (1, 28, 28), 7)


def test_real_torchvision_resnet18_when_installed():
    pytest.importorskip(
        "torchvision", reason="torchvision is not installed (optional 'vision' extra)"
    )
    model = build_model("tv:resnet18", (1, 28, 28), 10)
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    name, head = classifier_head(model)
    assert name == "fc"
    assert head.out_features == 10
