"""RoFL local training: small-loss samples, class centroids, global-guided pseudo-labels.

Seed 002 (Yang et al., "Robust Federated Learning with Noisy Labels"), section "Local updates"
and the supplementary "Algorithm details" / Algorithm 1:

- eq. 2 with the schedule of Algorithm 1: each mini-batch keeps its (1 - R(t)) lowest-loss
  fraction, R(t) = forget_rate * min(t / T_k, 1) (forget_rate 0.2, T_k = 10 rounds);
- eq. 3 and eq. 13: after every optimiser step each class centroid f_k[c] moves towards the mean
  feature f_hat_c of that batch's small-loss samples labelled c,
  f_k[c] <- (1 - s^2) f_k[c] + s^2 f_hat_c with s = cos(f_k[c], f_hat_c);
  the round starts from the global centroids f_G, or (first round, f_G unknown) from the naive
  class means of the features under the given labels with the received model (supplementary,
  "Initialization of global centroids");
- eq. 6-7: confident mask m = 1[argmax_c cos(f_k[c], F(x)) = y];
- eq. 8 and Algorithm 1: pseudo labels y_hat = argmax theta_G(x) computed at the start of the
  round; before T_pl rounds they are replaced by the given labels;
- eq. 1, 5, 9: L = L_c + lambda_cen L_cen + lambda_e L_e with L_c the cross-entropy against y
  where confident and y_hat elsewhere, L_cen = (1/B) sum_i m_i ||F(x_i) - f_k[y_i]||^2 and L_e
  the mean prediction entropy; lambda_cen ramps linearly from 0 over T_pl rounds
  (supplementary, "Scheduling for lambda_cen"), lambda_e = 0.8.

L_cen is averaged over the batch's selected samples by default, although eq. 5 writes a sum
(``centroid_reduction="sum"`` keeps it): in the authors' code the features are detached, so the
scale of L_cen never reached the gradient in the paper's experiments. With a live gradient the sum
weighs the centroid term B times more than the mean cross-entropy L_c, and on scenario V1 (batch
32, SGD lr 0.05, momentum 0.9) that diverged in the second round of one seed in three, while the
mean did not.

The loss is taken over the small-loss samples of the batch, as in the
code the literature uses (the supplementary: R(t) is reduced "to prevent local models from fitting
to noise samples"). Unlike that code, the features are **not** detached in L_cen, so the centroid
loss trains the feature extractor (the detached version makes it inert). Features are the input
of the classification head (``find_head``). When a centroid is the zero vector (a class nobody has
seen yet) its cosine is undefined, and the first batch mean replaces it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from client_sdk.recipes.base import LocalData, RoundContext, TrainReport
from client_sdk.recipes.errors import ModelContractError, RecipeError
from client_sdk.recipes.model_io import (
    check_logits,
    find_head,
    forward_with_features,
    predict_logits,
)
from client_sdk.recipes.training import (
    BatchLoss,
    accumulator_dtype,
    prepare_round,
    run_local_training,
    seeded_rng,
)

__all__ = [
    "RoFLLoss",
    "RoFLRecipe",
    "centroid_weight",
    "confident_mask",
    "forget_fraction",
    "initial_centroids",
    "rofl_loss",
    "small_loss_indices",
    "update_centroids",
]


def forget_fraction(round_index: int, forget_rate: float, forget_rounds: int) -> float:
    """R(t) = forget_rate * min(t / T_k, 1): the fraction of each batch dropped as large-loss."""
    if forget_rounds <= 0:
        return forget_rate
    return forget_rate * min(round_index / forget_rounds, 1.0)


def centroid_weight(round_index: int, lambda_cen: float, t_pl: int) -> float:
    """lambda_cen(t) = lambda_cen * min(t / T_pl, 1) (0 in the first round)."""
    if t_pl <= 0:
        return lambda_cen
    return lambda_cen * min(round_index / t_pl, 1.0)


def small_loss_indices(losses: torch.Tensor, forget: float) -> torch.Tensor:
    """Return the indices of the ceil((1 - forget) * B) smallest losses (>= 1), ties by position."""
    if not 0.0 <= forget < 1.0:
        raise RecipeError(f"forget: must be in [0, 1), got {forget}")
    keep = max(1, math.ceil((1.0 - forget) * losses.shape[0] - 1e-9))
    return torch.argsort(losses, stable=True)[:keep]


def confident_mask(
    features: torch.Tensor, centroids: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """m_i = 1[argmax_c cos(f[c], F(x_i)) == y_i] (eq. 6-7), computed without gradients."""
    with torch.no_grad():
        sim = F.normalize(features.float(), dim=1) @ F.normalize(centroids.float(), dim=1).T
        return sim.argmax(dim=1) == labels


def update_centroids(
    centroids: torch.Tensor, features: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """One mini-batch centroid update (eq. 13); classes absent from the batch are unchanged.

    Parameters
    ----------
    centroids : torch.Tensor
        ``(C, d)`` current local centroids.
    features : torch.Tensor
        ``(B, d)`` features of the batch's small-loss samples (treated as constants).
    labels : torch.Tensor
        ``(B,)`` their given labels.

    Returns
    -------
    torch.Tensor
        New ``(C, d)`` centroids.
    """
    feats = features.detach().float()
    num_classes = centroids.shape[0]
    sums = torch.zeros_like(centroids).index_add_(0, labels, feats)
    counts = torch.bincount(labels, minlength=num_classes)[:num_classes]
    present = counts > 0
    means = sums / counts.clamp(min=1).unsqueeze(1).to(sums.dtype)
    s = F.cosine_similarity(centroids, means, dim=1, eps=1e-8)
    s2 = (s * s).unsqueeze(1)
    moved = (1.0 - s2) * centroids + s2 * means
    unset = centroids.norm(dim=1) == 0
    moved = torch.where(unset.unsqueeze(1), means, moved)
    return torch.where(present.unsqueeze(1), moved, centroids)


def initial_centroids(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> torch.Tensor:
    """Class means of ``features`` under ``labels``; zeros for a class with no sample."""
    feats = features.detach().float()
    sums = torch.zeros(num_classes, feats.shape[1], dtype=feats.dtype, device=feats.device)
    sums.index_add_(0, labels, feats)
    counts = torch.bincount(labels, minlength=num_classes)[:num_classes]
    return sums / counts.clamp(min=1).unsqueeze(1).to(sums.dtype)


@dataclass(frozen=True)
class RoFLLoss:
    """The terms of eq. 9 (each a scalar tensor; ``total`` carries the gradient)."""

    total: torch.Tensor
    ce: torch.Tensor
    centroid: torch.Tensor
    entropy: torch.Tensor


def rofl_loss(
    logits: torch.Tensor,
    features: torch.Tensor,
    targets: torch.Tensor,
    labels: torch.Tensor,
    mask: torch.Tensor,
    centroids: torch.Tensor,
    lambda_cen: float,
    lambda_e: float,
    *,
    centroid_reduction: str = "mean",
) -> RoFLLoss:
    """L = L_c + lambda_cen L_cen + lambda_e L_e (RoFL eq. 1, 5, 9).

    Parameters
    ----------
    logits : torch.Tensor
        ``(B, C)`` logits of the selected (small-loss) samples.
    features : torch.Tensor
        ``(B, d)`` their head-input features; **not detached**, so L_cen trains the body.
    targets : torch.Tensor
        ``(B,)`` y where confident, else the pseudo label (eq. 1).
    labels : torch.Tensor
        ``(B,)`` given labels, selecting the centroid f_k[y_i] in eq. 5.
    mask : torch.Tensor
        ``(B,)`` confident mask m_i.
    centroids : torch.Tensor
        ``(C, d)`` local centroids (constants).
    lambda_cen, lambda_e : float
        Weights of L_cen and L_e.
    centroid_reduction : {"mean", "sum"}
        "mean" divides by the number of selected samples B (the default, module docstring);
        "sum" is eq. 5 as printed.

    Returns
    -------
    RoFLLoss
        ``ce`` = mean cross-entropy L_c, ``centroid`` = L_cen, ``entropy`` = mean entropy L_e.
    """
    if centroid_reduction not in ("sum", "mean"):
        raise RecipeError(
            f"centroid_reduction: expected 'sum' or 'mean', got {centroid_reduction!r}"
        )
    logits = logits.float()
    ce = F.cross_entropy(logits, targets)
    diff = features.float() - centroids.detach().float()[labels]
    per_sample = diff.pow(2).sum(dim=1) * mask.to(diff.dtype)
    cen = per_sample.sum()
    if centroid_reduction == "mean":
        cen = cen / max(int(labels.shape[0]), 1)
    log_p = F.log_softmax(logits, dim=1)
    entropy = -(log_p.exp() * log_p).sum(dim=1).mean()
    total = ce + lambda_cen * cen + lambda_e * entropy
    return RoFLLoss(total=total, ce=ce, centroid=cen, entropy=entropy)


class RoFLRecipe:
    """RoFL client training (``rofl``).

    Hyper-parameters: ``forget_rate`` (0.2), ``forget_rounds`` T_k (10), ``t_pl`` (100),
    ``lambda_cen`` (1.0), ``lambda_e`` (0.8), ``centroid_reduction`` ("mean"), ``head_name``,
    plus the common ones.
    """

    name = "rofl"

    def train(
        self, model: nn.Module, global_model: nn.Module, data: LocalData, ctx: RoundContext
    ) -> TrainReport:
        """Train ``model`` in place for one RoFL round and return its local centroids.

        Parameters
        ----------
        model, global_model : nn.Module
            theta_G to train in place; the frozen theta_G for pseudo labels.
        data : LocalData
            The client's training set.
        ctx : RoundContext
            ``ctx.global_centroids`` (None in the first round).

        Returns
        -------
        TrainReport
            ``centroids`` = the local centroids after the last batch, (C, d) float32 on CPU;
            train_loss = mean L_c. Metrics: ``forget_fraction``, ``lambda_cen``,
            ``pseudo_labels`` (0/1), ``confident_fraction``.
        """
        setup = prepare_round(data, ctx)
        hp = setup.hp
        forget_rate = hp.get_float("forget_rate", 0.2, minimum=0.0, maximum=0.99)
        forget_rounds = hp.get_int("forget_rounds", 10, minimum=0)
        t_pl = hp.get_int("t_pl", 100, minimum=0)
        lambda_cen = hp.get_float("lambda_cen", 1.0, minimum=0.0)
        lambda_e = hp.get_float("lambda_e", 0.8, minimum=0.0)
        reduction = hp.get_choice("centroid_reduction", "mean", ("mean", "sum"))
        _, head = find_head(model, hp.get_optional_str("head_name"))
        d = setup.data
        t = ctx.round_index
        forget = forget_fraction(t, forget_rate, forget_rounds)
        lam_cen = centroid_weight(t, lambda_cen, t_pl)

        if ctx.global_centroids is None:
            _, feats = predict_logits(model, d.inputs, with_features=True, head=head)
            assert feats is not None
            centroids = initial_centroids(feats, d.labels, ctx.num_classes)
        else:
            centroids = ctx.global_centroids.detach().to(d.device, torch.float32).clone()
        pseudo = None
        if t >= t_pl:
            pseudo = predict_logits(global_model, d.inputs)[0].argmax(dim=1)
        holder = [centroids]
        confident_sum = torch.zeros((), dtype=accumulator_dtype(d.device), device=d.device)
        selected_total = [0]

        def step(idx: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> BatchLoss:
            nonlocal confident_sum
            logits, feats = forward_with_features(model, x, head)
            check_logits(logits, ctx.num_classes)
            current = holder[0]
            if feats.shape[1] != current.shape[1]:
                raise ModelContractError(
                    f"global_centroids: dimension {current.shape[1]} != feature dimension "
                    f"{feats.shape[1]}"
                )
            with torch.no_grad():
                per_sample = F.cross_entropy(logits.float(), y, reduction="none")
            keep = small_loss_indices(per_sample, forget)
            feats_kept, labels_kept = feats[keep], y[keep]
            mask = confident_mask(feats_kept, current, labels_kept)
            targets = labels_kept
            if pseudo is not None:
                targets = torch.where(mask, labels_kept, pseudo[idx[keep]])
            parts = rofl_loss(
                logits[keep],
                feats_kept,
                targets,
                labels_kept,
                mask,
                current,
                lam_cen,
                lambda_e,
                centroid_reduction=reduction,
            )
            confident_sum += mask.sum()
            selected_total[0] += int(keep.shape[0])
            frozen = feats_kept.detach().float()

            def after() -> None:
                holder[0] = update_centroids(holder[0], frozen, labels_kept)

            return BatchLoss(
                loss=parts.total, ce=parts.ce.detach(), count=int(keep.shape[0]), after_step=after
            )

        with seeded_rng(ctx.seed, ctx.device):
            result = run_local_training(model, d, ctx, setup.config, step, setup.generator)
        return TrainReport(
            train_loss=result.mean_ce,
            num_steps=result.num_steps,
            centroids=holder[0].detach().to("cpu", torch.float32).clone(),
            metrics={
                "forget_fraction": forget,
                "lambda_cen": lam_cen,
                "pseudo_labels": 1.0 if pseudo is not None else 0.0,
                "confident_fraction": float(confident_sum.item()) / max(selected_total[0], 1),
            },
        )
