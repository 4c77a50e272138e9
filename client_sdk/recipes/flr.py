"""FLR local training: label-mixture regularisation with per-sample running averages.

Seed 003 (Kim, Kim, Yun 2024, "Revisiting Early-Learning Regularization When Federated Learning
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

import torch
import torch.nn.functional as F
from torch import nn

from client_sdk.recipes.base import LocalData, RoundContext, TrainReport
from client_sdk.recipes.model_io import check_logits, predict_logits
from client_sdk.recipes.training import (
    BatchLoss,
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
        hp = setup.hp
        alpha = hp.get_float("alpha", 0.9, minimum=0.0, maximum=1.0)
        beta = hp.get_float("beta", 0.7, minimum=0.0, maximum=1.0)
        gamma = hp.get_float("gamma", 0.5, minimum=0.0, maximum=1.0)
        lam = hp.get_float("lam", 2.0, minimum=0.0)
        r_w = hp.get_int("r_w", 50, minimum=0)
        warmup = hp.get_int("warmup_rounds", 50, minimum=0)
        clamp = hp.get_float("clamp", 1e-4, minimum=0.0, maximum=0.49, exclusive_minimum=True)
        d = setup.data
        r = ctx.round_index
        if r < warmup:
            with seeded_rng(ctx.seed, ctx.device):
                result = run_local_training(
                    model,
                    d,
                    ctx,
                    setup.config,
                    cross_entropy_batch_loss(model, ctx.num_classes),
                    setup.generator,
                )
            return TrainReport(
                train_loss=result.mean_ce, num_steps=result.num_steps, metrics={"warmup": 1.0}
            )

        alpha_r, beta_r, gamma_r = flr_schedule(r, ctx.total_rounds, alpha, beta, gamma, r_w)
        n, c = d.num_samples, ctx.num_classes
        notes: list[str] = []
        fingerprint = _fingerprint(d, c)
        s = ctx.state.get_tensor(STATE_PREFIX + "s")
        m = ctx.state.get_tensor(STATE_PREFIX + "m")
        seen = ctx.state.get_tensor(STATE_PREFIX + "seen")
        meta = ctx.state.get_json(STATE_PREFIX + "meta", {})
        reset = False
        if s is None or m is None or seen is None:
            s, m = torch.zeros(n, c), torch.zeros(n, c)
            seen = torch.zeros(n, dtype=torch.bool)
        elif (
            s.shape != (n, c)
            or m.shape != (n, c)
            or seen.shape != (n,)
            or not isinstance(meta, dict)
            or meta.get("fingerprint") != fingerprint
        ):
            reset = True
            notes.append(
                "FLR running averages reset: the local data changed (size, classes or labels)"
            )
            s, m = torch.zeros(n, c), torch.zeros(n, c)
            seen = torch.zeros(n, dtype=torch.bool)
        s = s.to(d.device, torch.float32)
        m = m.to(d.device, torch.float32)
        seen = seen.to(d.device, torch.bool)
        p_server = F.softmax(predict_logits(global_model, d.inputs)[0], dim=1)

        def step(idx: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> BatchLoss:
            logits = model(x)
            check_logits(logits, c)
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
            reg = flr_regulariser(p, t_i, lam, clamp)
            return BatchLoss(loss=ce + reg, ce=ce.detach(), count=int(y.shape[0]))

        with seeded_rng(ctx.seed, ctx.device):
            result = run_local_training(model, d, ctx, setup.config, step, setup.generator)
        ctx.state.put_tensor(STATE_PREFIX + "s", s)
        ctx.state.put_tensor(STATE_PREFIX + "m", m)
        ctx.state.put_tensor(STATE_PREFIX + "seen", seen)
        ctx.state.put_json(STATE_PREFIX + "meta", {"fingerprint": fingerprint, "last_round": r})
        ctx.state.flush()
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
