"""The local-training loop every recipe runs, and the randomness and precision it uses.

* :func:`prepare_round` -- validate the labels, move the data to the device, read the common
  hyper-parameters and seed the batch order (:class:`RoundSetup`);
* :func:`run_local_training` -- the local epochs: seeded mini-batches over in-memory tensors,
  optimiser steps, optional mixed precision (AMP + GradScaler) on CUDA; a recipe supplies the
  per-batch loss (:class:`BatchLoss`, :func:`cross_entropy_batch_loss` for plain FedAvg).

Determinism: every random choice comes from a ``torch.Generator`` seeded with ``ctx.seed`` (batch
order) or from ``ctx.seed`` itself (GMM ``random_state``); layers that draw from the global RNG
(dropout) run inside :func:`seeded_rng`, which forks the global RNG so the caller's state is left
as it was. On CPU the same seed gives bit-identical models.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from client_sdk.recipes.base import LocalData, RoundContext, normalize_device
from client_sdk.recipes.errors import (
    InvalidRoundContextError,
    RecipeError,
    TrainingDivergedError,
)
from client_sdk.recipes.hyperparameters import Hyperparameters, TrainingConfig, make_optimizer
from client_sdk.recipes.model_io import check_logits, validate_labels

__all__ = [
    "BatchLoss",
    "BatchLossFn",
    "LoopResult",
    "RoundSetup",
    "accumulator_dtype",
    "amp_active",
    "autocast",
    "cross_entropy_batch_loss",
    "make_generator",
    "minibatch_indices",
    "prepare_round",
    "run_local_training",
    "seeded_rng",
]


def make_generator(seed: int) -> torch.Generator:
    """Return a CPU generator seeded with ``seed`` (batch order never depends on the device)."""
    return torch.Generator(device="cpu").manual_seed(seed)


@contextlib.contextmanager
def seeded_rng(seed: int, device: torch.device) -> Iterator[None]:
    """Seed the global RNGs used by layers such as dropout, restoring them afterwards."""
    dev = normalize_device(device)
    devices = [dev.index] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.default_generator.manual_seed(seed)
        if dev.type == "cuda":
            # seed the generator of the training device, not whichever device is current
            with torch.cuda.device(dev):
                torch.cuda.manual_seed(seed)
        yield


def minibatch_indices(
    num: int,
    batch_size: int,
    generator: torch.Generator,
    device: torch.device,
    *,
    subset: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Shuffle ``range(num)`` (or ``subset``) with ``generator`` and cut it into batches.

    A trailing batch of a single sample is merged into the previous one, because BatchNorm in
    train mode cannot normalise one sample.
    """
    order = torch.randperm(num, generator=generator)
    if subset is not None:
        order = subset.to("cpu")[order]
    order = order.to(device)
    batches = list(torch.split(order, batch_size))
    if len(batches) > 1 and batches[-1].numel() == 1:
        batches[-2] = torch.cat([batches[-2], batches[-1]])
        batches.pop()
    return batches


def accumulator_dtype(device: torch.device) -> torch.dtype:
    """float64 for running sums, except on backends without it (Apple MPS): float32."""
    return torch.float64 if device.type in ("cpu", "cuda") else torch.float32


def amp_active(ctx: RoundContext) -> bool:
    """Mixed precision is used only when asked for and training on CUDA."""
    return ctx.amp and ctx.device.type == "cuda"


def autocast(ctx: RoundContext) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` (float16) on CUDA when ``ctx.amp``; otherwise a no-op context."""
    if amp_active(ctx):
        return torch.autocast(device_type="cuda", dtype=torch.float16)
    return contextlib.nullcontext()


@dataclass
class BatchLoss:
    """What a recipe's per-batch function returns to :func:`run_local_training`.

    Attributes
    ----------
    loss : torch.Tensor
        Scalar to minimise.
    ce : torch.Tensor
        Detached scalar: the mean cross-entropy part of ``loss`` (reported as train_loss).
    count : int
        Samples the cross-entropy was averaged over (weights the running mean).
    after_step : callable or None
        Called after the optimiser step (RoFL's centroid update).
    """

    loss: torch.Tensor
    ce: torch.Tensor
    count: int
    after_step: Callable[[], None] | None = None


BatchLossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], BatchLoss]


@dataclass(frozen=True)
class LoopResult:
    """Result of :func:`run_local_training`."""

    num_steps: int
    mean_ce: float


def run_local_training(
    model: nn.Module,
    data: LocalData,
    ctx: RoundContext,
    config: TrainingConfig,
    batch_loss: BatchLossFn,
    generator: torch.Generator,
    *,
    labels: torch.Tensor | None = None,
    subset: torch.Tensor | None = None,
    epochs: int | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    train_mode: bool = True,
) -> LoopResult:
    """Run the local epochs: seeded mini-batches, optimiser steps, AMP + GradScaler on CUDA.

    Parameters
    ----------
    model : nn.Module
        Trained in place, in train mode.
    data : LocalData
        On ``ctx.device``.
    ctx : RoundContext
        Device, AMP flag.
    config : TrainingConfig
        Optimiser, epochs and batch size.
    batch_loss : callable
        ``(indices, inputs, labels) -> BatchLoss`` for one mini-batch.
    generator : torch.Generator
        Batch order.
    labels : torch.Tensor, optional
        Labels to train on instead of ``data.labels`` (Fed-NCL relabelling).
    subset : torch.Tensor, optional
        Indices of the samples to train on (FedRN's clean set); all samples by default.
    epochs : int, optional
        Defaults to ``config.local_epochs``.
    optimizer : torch.optim.Optimizer, optional
        Defaults to :func:`make_optimizer` over ``model.parameters()``.
    train_mode : bool
        Put the model in train mode (default). FedRN's head fine-tuning passes False so the
        frozen body keeps its BatchNorm statistics and no dropout.

    Returns
    -------
    LoopResult
        Number of steps and the per-sample mean cross-entropy.

    Raises
    ------
    TrainingDivergedError
        If the mean cross-entropy or the loss is not finite at the end.
    """
    targets = data.labels if labels is None else labels
    opt = make_optimizer(model.parameters(), config) if optimizer is None else optimizer
    scaler = torch.amp.GradScaler("cuda", enabled=amp_active(ctx))
    num = data.num_samples if subset is None else int(subset.numel())
    if num == 0:
        raise RecipeError("subset: no sample to train on")
    acc = accumulator_dtype(data.device)
    ce_sum = torch.zeros((), dtype=acc, device=data.device)
    loss_sum = torch.zeros((), dtype=acc, device=data.device)
    seen = 0
    steps = 0
    model.train(train_mode)
    for _ in range(config.local_epochs if epochs is None else epochs):
        # num is data.num_samples when there is no subset.
        for idx in minibatch_indices(num, config.batch_size, generator, data.device, subset=subset):
            opt.zero_grad(set_to_none=True)
            with autocast(ctx):
                out = batch_loss(idx, data.inputs[idx], targets[idx])
            _optimiser_step(opt, scaler, out.loss, config.max_grad_norm)
            ce_sum += out.ce.detach().to(acc) * out.count
            loss_sum += out.loss.detach().to(acc)
            seen += out.count
            steps += 1
            if out.after_step is not None:
                out.after_step()
    mean_ce = float(ce_sum.item()) / max(seen, 1)
    _check_finite(mean_ce, loss_sum, ctx)
    return LoopResult(num_steps=steps, mean_ce=mean_ce)


def _check_finite(mean_ce: float, loss_sum: torch.Tensor, ctx: RoundContext) -> None:
    """Raise :class:`TrainingDivergedError` when the loss became non-finite (the summed loss is
    not checked under AMP, where GradScaler skips the steps whose loss overflowed)."""
    if not math.isfinite(mean_ce) or (not amp_active(ctx) and not math.isfinite(loss_sum.item())):
        raise TrainingDivergedError(
            "training: the loss became non-finite (lower lr or set max_grad_norm; check inputs "
            "and labels)"
        )


def _optimiser_step(
    opt: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    loss: torch.Tensor,
    max_grad_norm: float | None,
) -> None:
    """Back-propagate ``loss`` (scaled under AMP), clip the gradients if asked, and step."""
    scaled: torch.Tensor = scaler.scale(loss)
    scaled.backward()  # type: ignore[no-untyped-call]
    if max_grad_norm is not None:
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(
            [p for group in opt.param_groups for p in group["params"]],
            max_grad_norm,
        )
    scaler.step(opt)
    scaler.update()


@dataclass(frozen=True)
class RoundSetup:
    """What every recipe derives from its arguments before training."""

    hp: Hyperparameters
    config: TrainingConfig
    data: LocalData
    generator: torch.Generator


def prepare_round(data: LocalData, ctx: RoundContext) -> RoundSetup:
    """Validate the labels, move the data to ``ctx.device`` (cached) and read the common keys."""
    if not isinstance(ctx, RoundContext):
        raise InvalidRoundContextError(f"ctx: expected a RoundContext, got {type(ctx)}")
    validate_labels(data, ctx.num_classes)
    hp = Hyperparameters(ctx.hyperparameters)
    return RoundSetup(
        hp=hp,
        config=TrainingConfig.from_hyperparameters(hp),
        data=data.to(ctx.device),
        generator=make_generator(ctx.seed),
    )


def cross_entropy_batch_loss(model: nn.Module, num_classes: int) -> BatchLossFn:
    """Plain cross-entropy on the batch (FedAvg as FedRN section 3 states it)."""

    def step(_idx: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> BatchLoss:
        logits = model(x)
        check_logits(logits, num_classes)
        loss = F.cross_entropy(logits.float(), y)
        return BatchLoss(loss=loss, ce=loss.detach(), count=int(y.shape[0]))

    return step
