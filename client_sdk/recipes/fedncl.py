"""Fed-NCL label correction on the client (``fedncl_correction``).

Fed-NCL (Tam et al.), section V-C: a client the server made a label-correction candidate
(eq. 17, decided on the server) relabels, once the global model has trained for T_corr rounds,
every local sample whose global-model confidence exceeds eta to the global model's prediction
(eq. 18), and trains on the relabelled set. As in the authors' code the relabelling starts from
the given labels every round (it is not cumulative) and is used for that round's training only;
round T_corr itself does no correction (``round_index > t_corr``).

Eq. 18 says "confidence exceeding the threshold", so the default test is ``max softmax > eta``;
the authors' code uses ``>=`` (``confidence_inclusive=True`` selects it). Otherwise the local
training is FedAvg's cross-entropy. The correction status of the last round is kept as JSON in the
LocalStateStore under ``fedncl/correction``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from client_sdk.recipes.base import LocalData, RoundContext, TrainReport
from client_sdk.recipes.errors import RecipeError
from client_sdk.recipes.model_io import predict_logits
from client_sdk.recipes.training import (
    cross_entropy_batch_loss,
    prepare_round,
    run_local_training,
    seeded_rng,
)

__all__ = ["CORRECTION_STATUS_KEY", "FedNCLCorrectionRecipe", "relabel"]

CORRECTION_STATUS_KEY = "fedncl/correction"


def relabel(
    probabilities: torch.Tensor,
    labels: torch.Tensor,
    threshold: float,
    *,
    inclusive: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Replace each label whose global max probability passes ``threshold`` by the argmax.

    Parameters
    ----------
    probabilities : torch.Tensor
        ``(N, C)`` softmax of theta_G.
    labels : torch.Tensor
        ``(N,)`` given labels (not modified).
    threshold : float
        eta.
    inclusive : bool
        ``max p >= eta`` instead of the paper's ``max p > eta``.

    Returns
    -------
    new_labels, confident : torch.Tensor, torch.Tensor
        The labels to train on, and the mask of samples that passed the threshold.
    """
    if probabilities.dim() != 2 or probabilities.shape[0] != labels.shape[0]:
        raise RecipeError(
            f"probabilities: expected ({labels.shape[0]}, C), got {tuple(probabilities.shape)}"
        )
    confidence, prediction = probabilities.max(dim=1)
    confident = confidence >= threshold if inclusive else confidence > threshold
    return torch.where(confident, prediction, labels), confident


class FedNCLCorrectionRecipe:
    """Fed-NCL client training with label correction (``fedncl_correction``).

    Hyper-parameters: ``t_corr`` (60), ``confidence_threshold`` eta (0.9),
    ``confidence_inclusive`` (false), plus the common ones.
    """

    name = "fedncl_correction"

    def train(
        self, model: nn.Module, global_model: nn.Module, data: LocalData, ctx: RoundContext
    ) -> TrainReport:
        """Relabel (when the server says so and round > t_corr), then train with cross-entropy.

        Parameters
        ----------
        model, global_model : nn.Module
            theta_G to train in place; the frozen theta_G that relabels.
        data : LocalData
            The client's training set (its labels are never modified).
        ctx : RoundContext
            ``ctx.label_correction``: the server's candidate flag.

        Returns
        -------
        TrainReport
            train_loss is the cross-entropy against the labels trained on. Metrics:
            ``correction_active`` (0/1), ``num_confident``, ``num_relabelled``, and with the truth
            known ``label_accuracy_before``, ``label_accuracy_after``.
        """
        setup = prepare_round(data, ctx)
        t_corr = setup.hp.get_int("t_corr", 60, minimum=0)
        eta = setup.hp.get_float("confidence_threshold", 0.9, minimum=0.0, maximum=1.0)
        inclusive = setup.hp.get_bool("confidence_inclusive", False)
        d = setup.data
        active = ctx.label_correction and ctx.round_index > t_corr
        metrics: dict[str, float] = {"correction_active": 1.0 if active else 0.0}
        labels = d.labels
        if active:
            probabilities = F.softmax(predict_logits(global_model, d.inputs)[0], dim=1)
            labels, confident = relabel(probabilities, d.labels, eta, inclusive=inclusive)
            metrics["num_confident"] = float(int(confident.sum().item()))
            metrics["num_relabelled"] = float(int((labels != d.labels).sum().item()))
            if d.true_labels is not None:
                n = float(d.num_samples)
                metrics["label_accuracy_before"] = (
                    float(int((d.labels == d.true_labels).sum().item())) / n
                )
                metrics["label_accuracy_after"] = (
                    float(int((labels == d.true_labels).sum().item())) / n
                )
        with seeded_rng(ctx.seed, ctx.device):
            result = run_local_training(
                model,
                d,
                ctx,
                setup.config,
                cross_entropy_batch_loss(model, ctx.num_classes),
                setup.generator,
                labels=labels,
            )
        previous = ctx.state.get_json(CORRECTION_STATUS_KEY, {})
        first = previous.get("first_active_round") if isinstance(previous, dict) else None
        if active and first is None:
            first = ctx.round_index
        ctx.state.put_json(
            CORRECTION_STATUS_KEY,
            {
                "active": active,
                "candidate": ctx.label_correction,
                "round_index": ctx.round_index,
                "first_active_round": first,
                "num_relabelled": int(metrics.get("num_relabelled", 0.0)),
            },
        )
        ctx.state.flush()
        return TrainReport(train_loss=result.mean_ce, num_steps=result.num_steps, metrics=metrics)
