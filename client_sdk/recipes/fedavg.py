"""FedAvg local training: cross-entropy with SGD (FedRN eq. 1).

The server averages the returned models weighted by n_k; on the client this is plain
cross-entropy over every local sample for ``local_epochs`` epochs.
"""

from __future__ import annotations

from torch import nn

from client_sdk.recipes.base import LocalData, RoundContext, TrainReport
from client_sdk.recipes.training import (
    cross_entropy_batch_loss,
    prepare_round,
    run_local_training,
    seeded_rng,
)

__all__ = ["FedAvgRecipe"]


class FedAvgRecipe:
    """Plain cross-entropy local training (``fedavg``)."""

    name = "fedavg"

    def train(
        self, model: nn.Module, global_model: nn.Module, data: LocalData, ctx: RoundContext
    ) -> TrainReport:
        """Train ``model`` in place with cross-entropy on all local samples.

        Parameters
        ----------
        model : nn.Module
            Holds theta_G on ``ctx.device``; trained in place.
        global_model : nn.Module
            Frozen theta_G (unused by FedAvg).
        data : LocalData
            The client's training set.
        ctx : RoundContext
            Round information and hyper-parameters (``lr``, ``momentum``, ``weight_decay``,
            ``optimizer``, ``local_epochs``, ``batch_size``).

        Returns
        -------
        TrainReport
            Mean training cross-entropy and the number of steps.
        """
        setup = prepare_round(data, ctx)
        with seeded_rng(ctx.seed, ctx.device):
            result = run_local_training(
                model,
                setup.data,
                ctx,
                setup.config,
                cross_entropy_batch_loss(model, ctx.num_classes),
                setup.generator,
            )
        return TrainReport(train_loss=result.mean_ce, num_steps=result.num_steps)
