"""RoFL local training: small-loss samples, class centroids, global-guided pseudo-labels.

RoFL (Yang et al., "Robust Federated Learning with Noisy Labels"), section "Local updates"
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
from client_sdk.recipes.hyperparameters import Hyperparameters
from client_sdk.recipes.model_io import (
    check_logits,
    find_head,
    forward_with_features,
    predict_logits,
)
from client_sdk.recipes.training import (
    BatchLoss,
    BatchLossFn,
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


@dataclass(frozen=True)
class _RoFLSettings:
    """RoFL's hyper-parameters as read for one round (defaults: the supplementary)."""

    forget_rate: float
    forget_rounds: int
    t_pl: int
    lambda_cen: float
    lambda_e: float
    centroid_reduction: str
    head_name: str | None

    @classmethod
    def read(cls, hp: Hyperparameters) -> _RoFLSettings:
        """Read the RoFL keys of ``hp``, checked, in a fixed order (the first bad key is named)."""
        return cls(
            forget_rate=hp.get_float("forget_rate", 0.2, minimum=0.0, maximum=0.99),
            forget_rounds=hp.get_int("forget_rounds", 10, minimum=0),
            t_pl=hp.get_int("t_pl", 100, minimum=0),
            lambda_cen=hp.get_float("lambda_cen", 1.0, minimum=0.0),
            lambda_e=hp.get_float("lambda_e", 0.8, minimum=0.0),
            centroid_reduction=hp.get_choice("centroid_reduction", "mean", ("mean", "sum")),
            head_name=hp.get_optional_str("head_name"),
        )


@dataclass
class _LocalCentroids:
    """The local centroids f_k as they move during the round (eq. 13), and the tally behind
    the ``confident_fraction`` metric (confident samples among the selected ones)."""

    centroids: torch.Tensor
    confident: torch.Tensor
    selected: int = 0


def _starting_centroids(
    model: nn.Module, head: nn.Module, data: LocalData, ctx: RoundContext
) -> torch.Tensor:
    """f_k at the start of the round: the global centroids f_G, or (first round, f_G unknown)
    the naive class means of the features under the given labels with the received model
    (supplementary, "Initialization of global centroids")."""
    if ctx.global_centroids is None:
        _, feats = predict_logits(model, data.inputs, with_features=True, head=head)
        assert feats is not None
        return initial_centroids(feats, data.labels, ctx.num_classes)
    return ctx.global_centroids.detach().to(data.device, torch.float32).clone()


def _pseudo_labels(
    global_model: nn.Module, data: LocalData, round_index: int, t_pl: int
) -> torch.Tensor | None:
    """y_hat = argmax theta_G(x) from round T_pl on (eq. 8, Algorithm 1), computed once at the
    start of the round; None before, when the given labels are used instead."""
    if round_index < t_pl:
        return None
    return predict_logits(global_model, data.inputs)[0].argmax(dim=1)


def _rofl_batch_loss(
    model: nn.Module,
    head: nn.Module,
    num_classes: int,
    pseudo: torch.Tensor | None,
    local: _LocalCentroids,
    forget: float,
    lam_cen: float,
    settings: _RoFLSettings,
) -> BatchLossFn:
    """The loss of one mini-batch: keep its small-loss samples (eq. 2), mark the confident ones
    (eq. 6-7), take y there and y_hat elsewhere (eq. 1), L = L_c + lambda_cen L_cen +
    lambda_e L_e (eq. 9); after the optimiser step the centroids move (eq. 13)."""

    def step(idx: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> BatchLoss:
        logits, feats = forward_with_features(model, x, head)
        check_logits(logits, num_classes)
        current = local.centroids
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
            settings.lambda_e,
            centroid_reduction=settings.centroid_reduction,
        )
        local.confident += mask.sum()
        local.selected += int(keep.shape[0])
        frozen = feats_kept.detach().float()

        def after() -> None:
            local.centroids = update_centroids(local.centroids, frozen, labels_kept)

        return BatchLoss(
            loss=parts.total, ce=parts.ce.detach(), count=int(keep.shape[0]), after_step=after
        )

    return step


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
        settings = _RoFLSettings.read(setup.hp)
        _, head = find_head(model, settings.head_name)
        d = setup.data
        t = ctx.round_index
        # The schedules of Algorithm 1: R(t) for eq. 2, lambda_cen(t) for eq. 9.
        forget = forget_fraction(t, settings.forget_rate, settings.forget_rounds)
        lam_cen = centroid_weight(t, settings.lambda_cen, settings.t_pl)
        centroids = _starting_centroids(model, head, d, ctx)
        pseudo = _pseudo_labels(global_model, d, t, settings.t_pl)
        local = _LocalCentroids(
            centroids, torch.zeros((), dtype=accumulator_dtype(d.device), device=d.device)
        )
        step = _rofl_batch_loss(
            model, head, ctx.num_classes, pseudo, local, forget, lam_cen, settings
        )
        with seeded_rng(ctx.seed, ctx.device):
            result = run_local_training(model, d, ctx, setup.config, step, setup.generator)
        return TrainReport(
            train_loss=result.mean_ce,
            num_steps=result.num_steps,
            centroids=local.centroids.detach().to("cpu", torch.float32).clone(),
            metrics={
                "forget_fraction": forget,
                "lambda_cen": lam_cen,
                "pseudo_labels": 1.0 if pseudo is not None else 0.0,
                "confident_fraction": float(local.confident.item()) / max(local.selected, 1),
            },
        )
