"""FLR local training: label-mixture regularisation with per-sample running averages.

FLR (Kim, Kim, Yun 2024, "Revisiting Early-Learning Regularization When Federated Learning
Meets Noisy Labels"), section 3.2, eq. 1, Algorithm 1 and appendix E.4-E.5. There is no public
code; everything below is taken from the paper text:

- Algorithm 1, phase 1: warm-up rounds of FedAvg with plain cross-entropy. The paper's only
  warm-up length is R_w = 50 ("the epoch for warmup training", appendix E.5; section 3.2: "warm-up
  training ... during the first 50 epochs"), so ``warmup_rounds`` defaults to 50, like ``r_w``
  (both are scaled to the run length by the server).
- Algorithm 1 lines 15-17, per sample i, each time it is in a mini-batch (appendix E.4):
  s_i <- beta s_i + (1 - beta) p_i^server (global running average), m_i <- gamma m_i +
  (1 - gamma) p_i (local running average), t_i = alpha s_i + (1 - alpha) m_i (mixture). s_i and
  m_i start at the first predictions seen (section 3.2: "set to be equal to p^server and p").
- Eq. 1: L = CE + (lambda / n) sum_i log(1 - <p_i, t_i>), with t_i a constant (as in ELR, which
  FLR builds on) and p clamped to [1e-4, 1 - 1e-4] inside the logarithm (ELR's clamp).
- Appendix E.5 schedules: alpha(r) = alpha r / R, beta(r) = 0 for r < R/2 else beta,
  gamma(r) = 0 for r < R_w else gamma, (alpha, beta, gamma) = (0.9, 0.7, 0.5), R_w = 50;
  Table 6: lambda = 2.0 (CIFAR-10 symmetric noise; 3.0 asymmetric).

p_i^server is theta_G's softmax on the un-augmented input, computed once per round. s_i, m_i
(``(N, C)`` tensors) live on the client across rounds in the LocalStateStore under ``flr/`` and
are indexed by the position of the sample in LocalData; if the data change (size, classes or
labels, checked with a fingerprint) they are reset and the report says so.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from client_sdk.recipes.base import LocalData, RoundContext, TrainReport
from client_sdk.recipes.hyperparameters import Hyperparameters
from client_sdk.recipes.model_io import check_logits, predict_logits
from client_sdk.recipes.training import (
    BatchLoss,
    BatchLossFn,
    RoundSetup,
    cross_entropy_batch_loss,
    prepare_round,
    run_local_training,
    seeded_rng,
)

__all__ = [
    "STATE_PREFIX",
    "FLRRecipe",
    "flr_regulariser",
    "flr_schedule",
    "update_running_average",
]

STATE_PREFIX = "flr/"


def flr_regulariser(
    probabilities: torch.Tensor, targets: torch.Tensor, lam: float, clamp: float = 1e-4
) -> torch.Tensor:
    """``lam * mean_i log(1 - <clamp(p_i), t_i>)`` (FLR eq. 1); ``t`` is a constant.

    Parameters
    ----------
    probabilities : torch.Tensor
        ``(B, C)`` softmax of the local model (gradients flow into it).
    targets : torch.Tensor
        ``(B, C)`` mixture pseudo labels t_i.
    lam : float
        lambda.
    clamp : float
        p is clamped to ``[clamp, 1 - clamp]`` so the logarithm stays finite.
    """
    p = probabilities.float().clamp(clamp, 1.0 - clamp)
    inner = (p * targets.detach().float()).sum(dim=1)
    return lam * torch.log(1.0 - inner).mean()


def flr_schedule(
    round_index: int, total_rounds: int, alpha: float, beta: float, gamma: float, r_w: int
) -> tuple[float, float, float]:
    """alpha(r) = alpha r / R; beta(r) = 0 if r < R/2 else beta; gamma(r) = 0 if r < R_w."""
    alpha_r = alpha * round_index / total_rounds
    beta_r = 0.0 if round_index < total_rounds / 2 else beta
    gamma_r = 0.0 if round_index < r_w else gamma
    return alpha_r, beta_r, gamma_r


def update_running_average(
    previous: torch.Tensor, new: torch.Tensor, momentum: float, seen: torch.Tensor
) -> torch.Tensor:
    """``momentum * previous + (1 - momentum) * new`` where ``seen``, else ``new``."""
    return torch.where(seen.unsqueeze(1), momentum * previous + (1.0 - momentum) * new, new)


def _fingerprint(data: LocalData, num_classes: int) -> str:
    digest = hashlib.sha256(data.labels.detach().to("cpu").numpy().tobytes()).hexdigest()
    return f"{data.num_samples}:{num_classes}:{digest}"


@dataclass(frozen=True)
class _FLRSettings:
    """FLR's hyper-parameters as read for one round (defaults: appendix E.5 and Table 6)."""

    alpha: float
    beta: float
    gamma: float
    lam: float
    r_w: int
    warmup_rounds: int
    clamp: float

    @classmethod
    def read(cls, hp: Hyperparameters) -> _FLRSettings:
        """Read the FLR keys of ``hp``, checked, in a fixed order (the first bad key is named)."""
        return cls(
            alpha=hp.get_float("alpha", 0.9, minimum=0.0, maximum=1.0),
            beta=hp.get_float("beta", 0.7, minimum=0.0, maximum=1.0),
            gamma=hp.get_float("gamma", 0.5, minimum=0.0, maximum=1.0),
            lam=hp.get_float("lam", 2.0, minimum=0.0),
            r_w=hp.get_int("r_w", 50, minimum=0),
            warmup_rounds=hp.get_int("warmup_rounds", 50, minimum=0),
            clamp=hp.get_float("clamp", 1e-4, minimum=0.0, maximum=0.49, exclusive_minimum=True),
        )


@dataclass
class _RunningAverages:
    """The per-sample running averages of Algorithm 1 lines 15-16, updated in place.

    ``s`` (N, C): s_i, the average of p_i^server; ``m`` (N, C): m_i, the average of the local
    p_i; ``seen`` (N,): whether sample i was in a mini-batch yet (until then s_i and m_i start
    at the first predictions seen, section 3.2).
    """

    s: torch.Tensor
    m: torch.Tensor
    seen: torch.Tensor

    @classmethod
    def empty(cls, n: int, c: int) -> _RunningAverages:
        """No sample seen yet."""
        return cls(torch.zeros(n, c), torch.zeros(n, c), torch.zeros(n, dtype=torch.bool))

    def to(self, device: torch.device) -> _RunningAverages:
        """On ``device``, s and m in float32."""
        return _RunningAverages(
            self.s.to(device, torch.float32),
            self.m.to(device, torch.float32),
            self.seen.to(device, torch.bool),
        )


def _load_running_averages(
    ctx: RoundContext, n: int, c: int, fingerprint: str
) -> tuple[_RunningAverages, bool]:
    """s_i, m_i and seen as stored after the last round (module docstring), or empty ones:
    on the first FLR round, or reset when the stored ones do not fit the data (their shapes,
    or the data's fingerprint: size, classes or labels changed). (averages, reset)."""
    s = ctx.state.get_tensor(STATE_PREFIX + "s")
    m = ctx.state.get_tensor(STATE_PREFIX + "m")
    seen = ctx.state.get_tensor(STATE_PREFIX + "seen")
    meta = ctx.state.get_json(STATE_PREFIX + "meta", {})
    if s is None or m is None or seen is None:
        return _RunningAverages.empty(n, c), False
    if (
        s.shape != (n, c)
        or m.shape != (n, c)
        or seen.shape != (n,)
        or not isinstance(meta, dict)
        or meta.get("fingerprint") != fingerprint
    ):
        return _RunningAverages.empty(n, c), True
    return _RunningAverages(s, m, seen), False


def _store_running_averages(
    ctx: RoundContext, averages: _RunningAverages, fingerprint: str, round_index: int
) -> None:
    """Keep s_i, m_i and seen for the next round, with the fingerprint of the data they index."""
    ctx.state.put_tensor(STATE_PREFIX + "s", averages.s)
    ctx.state.put_tensor(STATE_PREFIX + "m", averages.m)
    ctx.state.put_tensor(STATE_PREFIX + "seen", averages.seen)
    ctx.state.put_json(
        STATE_PREFIX + "meta", {"fingerprint": fingerprint, "last_round": round_index}
    )
    ctx.state.flush()


def _flr_batch_loss(
    model: nn.Module,
    num_classes: int,
    p_server: torch.Tensor,
    averages: _RunningAverages,
    schedule: tuple[float, float, float],
    settings: _FLRSettings,
) -> BatchLossFn:
    """The loss of one mini-batch after the warm-up: update the running averages of its samples
    and their mixture (Algorithm 1 lines 15-17), then L = CE + the regulariser (eq. 1)."""
    alpha_r, beta_r, gamma_r = schedule
    s, m, seen = averages.s, averages.m, averages.seen

    def step(idx: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> BatchLoss:
        logits = model(x)
        check_logits(logits, num_classes)
        logits = logits.float()
        ce = F.cross_entropy(logits, y)
        p = F.softmax(logits, dim=1)
        with torch.no_grad():
            was_seen = seen[idx]
            s_i = update_running_average(s[idx], p_server[idx], beta_r, was_seen)
            m_i = update_running_average(m[idx], p.detach(), gamma_r, was_seen)
            s[idx] = s_i
            m[idx] = m_i
            seen[idx] = True
            t_i = alpha_r * s_i + (1.0 - alpha_r) * m_i
        reg = flr_regulariser(p, t_i, settings.lam, settings.clamp)
        return BatchLoss(loss=ce + reg, ce=ce.detach(), count=int(y.shape[0]))

    return step


class FLRRecipe:
    """FLR client training (``flr``).

    Hyper-parameters: ``alpha`` (0.9), ``beta`` (0.7), ``gamma`` (0.5), ``lam`` (2.0),
    ``r_w`` (50), ``warmup_rounds`` (50), ``clamp`` (1e-4), plus the common ones.
    """

    name = "flr"

    def train(
        self, model: nn.Module, global_model: nn.Module, data: LocalData, ctx: RoundContext
    ) -> TrainReport:
        """Train ``model`` in place for one FLR round, updating the stored running averages.

        Parameters
        ----------
        model, global_model : nn.Module
            theta_G to train in place; the frozen theta_G that gives p^server.
        data : LocalData
            The client's training set, in the same order every round.
        ctx : RoundContext
            ``total_rounds`` R drives the alpha and beta schedules.

        Returns
        -------
        TrainReport
            train_loss = the cross-entropy part. Metrics: ``warmup`` (0/1), ``alpha``, ``beta``,
            ``gamma`` (this round's values), ``state_reset`` (0/1).
        """
        setup = prepare_round(data, ctx)
        settings = _FLRSettings.read(setup.hp)
        if ctx.round_index < settings.warmup_rounds:
            return self._warmup_round(model, setup, ctx)
        return self._regularised_round(model, global_model, setup, ctx, settings)

    @staticmethod
    def _warmup_round(model: nn.Module, setup: RoundSetup, ctx: RoundContext) -> TrainReport:
        """Algorithm 1, phase 1: a FedAvg round with plain cross-entropy (no state kept)."""
        with seeded_rng(ctx.seed, ctx.device):
            result = run_local_training(
                model,
                setup.data,
                ctx,
                setup.config,
                cross_entropy_batch_loss(model, ctx.num_classes),
                setup.generator,
            )
        return TrainReport(
            train_loss=result.mean_ce, num_steps=result.num_steps, metrics={"warmup": 1.0}
        )

    @staticmethod
    def _regularised_round(
        model: nn.Module,
        global_model: nn.Module,
        setup: RoundSetup,
        ctx: RoundContext,
        settings: _FLRSettings,
    ) -> TrainReport:
        """Algorithm 1, phase 2: this round's schedules (appendix E.5), p_i^server once, then
        local training with eq. 1 while the running averages move (lines 15-17); they are
        stored for the next round."""
        d = setup.data
        r = ctx.round_index
        schedule = flr_schedule(
            r, ctx.total_rounds, settings.alpha, settings.beta, settings.gamma, settings.r_w
        )
        fingerprint = _fingerprint(d, ctx.num_classes)
        stored, reset = _load_running_averages(ctx, d.num_samples, ctx.num_classes, fingerprint)
        notes: list[str] = []
        if reset:
            notes.append(
                "FLR running averages reset: the local data changed (size, classes or labels)"
            )
        averages = stored.to(d.device)
        p_server = F.softmax(predict_logits(global_model, d.inputs)[0], dim=1)
        step = _flr_batch_loss(model, ctx.num_classes, p_server, averages, schedule, settings)
        with seeded_rng(ctx.seed, ctx.device):
            result = run_local_training(model, d, ctx, setup.config, step, setup.generator)
        _store_running_averages(ctx, averages, fingerprint, r)
        alpha_r, beta_r, gamma_r = schedule
        return TrainReport(
            train_loss=result.mean_ce,
            num_steps=result.num_steps,
            metrics={
                "warmup": 0.0,
                "alpha": alpha_r,
                "beta": beta_r,
                "gamma": gamma_r,
                "state_reset": 1.0 if reset else 0.0,
            },
            notes=notes,
        )
