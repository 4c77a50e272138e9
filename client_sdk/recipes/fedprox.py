"""FedProx local training: cross-entropy plus the proximal term (mu/2) ||theta - theta_G||^2.

(``fedprox``, mu = 0.01); Li et al., "Federated Optimization in
Heterogeneous Networks" (MLSys 2020), the FedProx baseline of Fed-NCL and FedNoRo. The term is taken
over the trainable parameters (not BatchNorm buffers), as in FedProx's definition over the weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from client_sdk.recipes.base import LocalData, RoundContext, TrainReport
from client_sdk.recipes.errors import ModelContractError
from client_sdk.recipes.model_io import check_logits
from client_sdk.recipes.training import BatchLoss, prepare_round, run_local_training, seeded_rng

__all__ = ["FedProxRecipe", "proximal_term"]


def proximal_term(
    params: Sequence[torch.Tensor], anchors: Sequence[torch.Tensor], mu: float
) -> torch.Tensor:
    """Return ``(mu / 2) * sum_j ||params[j] - anchors[j]||^2`` as a float32 scalar.

    Parameters
    ----------
    params : sequence of torch.Tensor
        The local parameters theta (gradients flow into them).
    anchors : sequence of torch.Tensor
        theta_G, same shapes, treated as constants.
    mu : float
        Proximal coefficient.

    Raises
    ------
    ModelContractError
        If the two sequences differ in length or shapes.
    """
    if len(params) != len(anchors):
        raise ModelContractError(f"anchors: {len(anchors)} tensors for {len(params)} parameters")
    total = torch.zeros((), dtype=torch.float32, device=params[0].device if params else "cpu")
    for p, a in zip(params, anchors, strict=True):
        if p.shape != a.shape:
            raise ModelContractError(f"anchors: shape {tuple(a.shape)} != {tuple(p.shape)}")
        total = total + (p.float() - a.detach().float()).pow(2).sum()
    return 0.5 * mu * total


class FedProxRecipe:
    """Cross-entropy plus the FedProx proximal term (``fedprox``; hyper-parameter ``mu``)."""

    name = "fedprox"

    def train(
        self, model: nn.Module, global_model: nn.Module, data: LocalData, ctx: RoundContext
    ) -> TrainReport:
        """Train ``model`` in place with CE + (mu/2)||theta - theta_G||^2.

        Parameters
        ----------
        model, global_model : nn.Module
            theta (trained in place) and the frozen theta_G it is pulled towards.
        data : LocalData
            The client's training set.
        ctx : RoundContext
            ``mu`` (default 0.01) plus the common hyper-parameters.

        Returns
        -------
        TrainReport
            train_loss is the cross-entropy part; ``metrics["proximal_term"]`` is its last value.
        """
        setup = prepare_round(data, ctx)
        mu = setup.hp.get_float("mu", 0.01, minimum=0.0)
        anchors_by_name = dict(global_model.named_parameters())
        names = [name for name, p in model.named_parameters() if p.requires_grad]
        missing = [name for name in names if name not in anchors_by_name]
        if missing:
            raise ModelContractError(f"global_model: lacks parameters {missing[:3]}")
        params = [dict(model.named_parameters())[name] for name in names]
        anchors = [anchors_by_name[name].detach() for name in names]
        last_prox: list[torch.Tensor] = []

        def step(_idx: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> BatchLoss:
            logits = model(x)
            check_logits(logits, ctx.num_classes)
            ce = F.cross_entropy(logits.float(), y)
            prox = proximal_term(params, anchors, mu)
            last_prox[:] = [prox.detach()]
            return BatchLoss(loss=ce + prox, ce=ce.detach(), count=int(y.shape[0]))

        with seeded_rng(ctx.seed, ctx.device):
            result = run_local_training(model, setup.data, ctx, setup.config, step, setup.generator)
        return TrainReport(
            train_loss=result.mean_ce,
            num_steps=result.num_steps,
            metrics={"mu": mu, "proximal_term": float(last_prox[0].item())},
        )
