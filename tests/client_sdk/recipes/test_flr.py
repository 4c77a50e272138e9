"""FLR: the regulariser, the schedules, the running averages and their persistence."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from client_sdk.local_state import LocalStateStore
from client_sdk.recipes import flr_regulariser, flr_schedule, get_recipe
from client_sdk.recipes.flr import STATE_PREFIX, update_running_average
from tests.client_sdk.recipes.helpers import frozen, make_context, make_data, tiny_mlp


def test_regulariser_by_hand() -> None:
    # Row 1: <p, t> = 0.7*0.5 + 0.2*0.25 + 0.1*0.25 = 0.425 -> log(0.575) = -0.553385
    # Row 2: p = [1, 0, 0] clamps to [0.9999, 1e-4, 1e-4]; t = [1, 0, 0] -> <p, t> = 0.9999
    #        -> log(1e-4) = -9.210340 (finite thanks to the clamp)
    # lambda * mean = 2 * (-0.553385 - 9.210340) / 2 = -9.763726
    p = torch.tensor([[0.7, 0.2, 0.1], [1.0, 0.0, 0.0]], requires_grad=True)
    t = torch.tensor([[0.5, 0.25, 0.25], [1.0, 0.0, 0.0]])
    reg = flr_regulariser(p, t, lam=2.0, clamp=1e-4)
    assert reg.item() == pytest.approx(-9.763726, abs=2e-3)  # float32: 1 - 0.9999 rounds
    one = flr_regulariser(p[:1], t[:1], lam=2.0)
    assert one.item() == pytest.approx(2 * -0.553385, abs=1e-5)
    torch.autograd.backward(reg)
    assert p.grad is not None
    assert torch.isfinite(p.grad).all()
    # d/dp of 2 * 0.5 * log(1 - <p, t>) for row 1 = -t / (1 - 0.425) = -t / 0.575
    assert p.grad[0].tolist() == pytest.approx([-0.5 / 0.575, -0.25 / 0.575, -0.25 / 0.575])


def test_targets_are_constants() -> None:
    p = torch.tensor([[0.6, 0.4]], requires_grad=True)
    t = torch.tensor([[0.5, 0.5]], requires_grad=True)
    torch.autograd.backward(flr_regulariser(p, t, lam=1.0))
    assert t.grad is None
    assert p.grad is not None


def test_schedules_by_hand() -> None:
    # R = 300, R_w = 50: alpha(r) = 0.9 r / 300; beta = 0 before r = 150; gamma = 0 before 50
    assert flr_schedule(0, 300, 0.9, 0.7, 0.5, 50) == (0.0, 0.0, 0.0)
    a, b, g = flr_schedule(49, 300, 0.9, 0.7, 0.5, 50)
    assert a == pytest.approx(0.147)
    assert (b, g) == (0.0, 0.0)
    a, b, g = flr_schedule(150, 300, 0.9, 0.7, 0.5, 50)
    assert a == pytest.approx(0.45)
    assert (b, g) == (0.7, 0.5)


def test_running_average_by_hand() -> None:
    # seen: 0.7 [0.2, 0.8] + 0.3 [0.6, 0.4] = [0.32, 0.68]; unseen: starts at the new value
    prev = torch.tensor([[0.2, 0.8], [0.0, 0.0]])
    new = torch.tensor([[0.6, 0.4], [0.1, 0.9]])
    out = update_running_average(prev, new, 0.7, torch.tensor([True, False]))
    assert out.tolist() == [
        [pytest.approx(0.32), pytest.approx(0.68)],
        [pytest.approx(0.1), pytest.approx(0.9)],
    ]


def test_warmup_round_is_plain_ce_and_keeps_no_state() -> None:
    state = LocalStateStore(None)
    ctx = make_context(round_index=1, hyperparameters={"batch_size": 8}, state=state)
    report = get_recipe("flr").train(tiny_mlp(), frozen(tiny_mlp()), make_data(24), ctx)
    assert report.metrics["warmup"] == 1.0
    assert list(state.keys()) == []


def test_running_averages_persist_across_a_restart(tmp_path: Path) -> None:
    # Round 6 of R = 10 (beta(6) = 0.7 since 6 >= 5), one local epoch: every sample is seen
    # once, so s_i starts at p_server of theta_G^(1). Round 7 runs on a new store over the same
    # directory with another theta_G^(2): s_i = 0.7 p1_i + 0.3 p2_i.
    data = make_data(24)
    hp = {"batch_size": 8, "warmup_rounds": 2, "r_w": 1, "local_epochs": 1}
    g1, g2 = frozen(tiny_mlp(1)), frozen(tiny_mlp(2))
    ctx = make_context(round_index=6, hyperparameters=hp, state=LocalStateStore(tmp_path))
    report = get_recipe("flr").train(tiny_mlp(), g1, data, ctx)
    assert report.metrics["warmup"] == 0.0
    restarted = LocalStateStore(tmp_path)
    p1 = torch.softmax(g1(data.inputs), dim=1)
    s1 = restarted.get_tensor(STATE_PREFIX + "s")
    assert s1 is not None
    assert torch.allclose(s1, p1, atol=1e-6)
    seen = restarted.get_tensor(STATE_PREFIX + "seen")
    assert seen is not None
    assert bool(seen.all())

    ctx = make_context(round_index=7, hyperparameters=hp, state=restarted)
    report = get_recipe("flr").train(tiny_mlp(), g2, data, ctx)
    assert report.metrics["beta"] == 0.7
    assert report.metrics["alpha"] == pytest.approx(0.9 * 7 / 10)
    p2 = torch.softmax(g2(data.inputs), dim=1)
    s2 = LocalStateStore(tmp_path).get_tensor(STATE_PREFIX + "s")
    assert s2 is not None
    assert torch.allclose(s2, 0.7 * p1 + 0.3 * p2, atol=1e-6)
    m2 = LocalStateStore(tmp_path).get_tensor(STATE_PREFIX + "m")
    assert m2 is not None
    assert m2.shape == (24, 3)
    assert torch.allclose(m2.sum(dim=1), torch.ones(24), atol=1e-5)


def test_changed_data_resets_the_state_and_says_so() -> None:
    state = LocalStateStore(None)
    hp = {"batch_size": 8, "warmup_rounds": 0}
    get_recipe("flr").train(
        tiny_mlp(),
        frozen(tiny_mlp()),
        make_data(24),
        make_context(round_index=1, hyperparameters=hp, state=state),
    )
    other = make_data(24, flip=0.25)  # same size, different labels
    report = get_recipe("flr").train(
        tiny_mlp(),
        frozen(tiny_mlp()),
        other,
        make_context(round_index=2, hyperparameters=hp, state=state),
    )
    assert report.metrics["state_reset"] == 1.0
    assert report.notes
    assert math.isfinite(report.train_loss)
