"""FedProx: the proximal term (mu/2)||theta - theta_G||^2 and its effect on training."""

from __future__ import annotations

import pytest
import torch

from client_sdk.recipes import get_recipe, proximal_term
from client_sdk.recipes.errors import ModelContractError
from tests.client_sdk.recipes.helpers import frozen, make_context, make_data, tiny_mlp


def test_proximal_term_by_hand() -> None:
    # Prepare: theta = ([1, 2], [[3]]), theta_G = ([0, 0], [[1]]), mu = 0.1
    params = [
        torch.tensor([1.0, 2.0], requires_grad=True),
        torch.tensor([[3.0]], requires_grad=True),
    ]
    anchors = [torch.tensor([0.0, 0.0]), torch.tensor([[1.0]])]
    # Execute
    term = proximal_term(params, anchors, mu=0.1)
    torch.autograd.backward(term)
    # Assert: ||.||^2 = 1 + 4 + (3 - 1)^2 = 9, so (0.1 / 2) * 9 = 0.45;
    # the gradient is mu * (theta - theta_G) = [0.1, 0.2] and [[0.2]].
    assert term.item() == pytest.approx(0.45)
    assert params[0].grad is not None
    assert params[1].grad is not None
    assert params[0].grad.tolist() == pytest.approx([0.1, 0.2])
    assert params[1].grad.tolist() == [[pytest.approx(0.2)]]


def test_proximal_term_is_zero_at_the_anchor() -> None:
    p = [torch.tensor([1.5, -2.0])]
    assert proximal_term(p, [p[0].clone()], mu=5.0).item() == 0.0


def test_shape_mismatch_is_rejected() -> None:
    with pytest.raises(ModelContractError, match="anchors"):
        proximal_term([torch.zeros(2)], [torch.zeros(3)], mu=0.1)


def test_large_mu_keeps_the_model_closer_to_theta_g() -> None:
    data = make_data(48, flip=0.2)

    def distance(mu: float) -> float:
        model, global_model = tiny_mlp(), frozen(tiny_mlp())
        ctx = make_context(
            hyperparameters={"batch_size": 8, "lr": 0.1, "mu": mu, "local_epochs": 2}
        )
        get_recipe("fedprox").train(model, global_model, data, ctx)
        return sum(
            (p - g).pow(2).sum().item()
            for p, g in zip(model.parameters(), global_model.parameters(), strict=True)
        )

    assert distance(5.0) < 0.5 * distance(0.0)
