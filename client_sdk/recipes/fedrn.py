"""FedRN local training: clean-sample selection ensembled over k-reliable neighbors.

FedRN (Kim et al., CIKM 2022):

- section 4.4 / Algorithm 1: plain FedAvg for the warm-up rounds, then FedRN;
- section 4.2, eq. 6: a 2-component GMM on the per-sample losses of a model; the clean
  probability is the posterior of the smaller-mean component;
- section 4.3, eq. 9: the auxiliary clean set of the client's own model (p > 0.5), on which each
  neighbor's classification head only is fine-tuned (Algorithm 1 line 11: one epoch);
- eq. 7: clean probability = sum over {c} and the neighbors of R'(c, n) x p_n;
- eq. 8 and Algorithm 1 lines 13-15: theta_G is trained for E epochs on {x : p(clean|x) > 0.5}.

"The client's model" is its own previous local model (the one it sent the last time it trained),
as in the authors' code; theta_G when it has none yet. That model is
kept in the LocalStateStore under ``fedrn/prev_model/`` so a restart does not lose it. Losses are
computed in eval mode on un-augmented inputs; the GMM uses tol 1e-2 and reg_covar 5e-4 (authors'
code) and ``random_state = ctx.seed`` (the authors leave it unseeded). Head fine-tuning keeps the
neighbor's body frozen and in eval mode. If no sample passes, the client trains on all samples
and says so in the report.
"""

from __future__ import annotations

import copy

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from client_sdk.recipes.base import LocalData, RoundContext, TrainReport
from client_sdk.recipes.errors import InvalidRoundContextError, ModelContractError
from client_sdk.recipes.hyperparameters import TrainingConfig, make_optimizer
from client_sdk.recipes.model_io import find_head, per_sample_cross_entropy
from client_sdk.recipes.sample_selection import GmmSelection, per_sample_loss_gmm, selection_metrics
from client_sdk.recipes.training import (
    cross_entropy_batch_loss,
    prepare_round,
    run_local_training,
    seeded_rng,
)

__all__ = ["PREVIOUS_MODEL_PREFIX", "FedRNRecipe", "ensemble_clean_probability"]

PREVIOUS_MODEL_PREFIX = "fedrn/prev_model/"


def ensemble_clean_probability(
    probabilities: list[npt.NDArray[np.float64]], weights: list[float]
) -> npt.NDArray[np.float64]:
    """Reliability-weighted clean probability (FedRN eq. 7).

    Parameters
    ----------
    probabilities : list of numpy.ndarray
        One ``(N,)`` clean probability per model: the client's own first, then its neighbors.
    weights : list of float
        R(c, n) or R'(c, n) for the same models; normalised here to sum to 1.

    Raises
    ------
    InvalidRoundContextError
        If the lengths differ, a weight is negative or they sum to zero.
    """
    if len(probabilities) != len(weights) or not probabilities:
        raise InvalidRoundContextError("weights: need one weight per model")
    w = np.asarray(weights, dtype=np.float64)
    if (w < 0).any() or not np.isfinite(w).all() or w.sum() <= 0:
        raise InvalidRoundContextError(f"weights: must be finite, >= 0, positive sum: {weights}")
    w = w / w.sum()
    total = np.zeros_like(probabilities[0], dtype=np.float64)
    for wi, p in zip(w, probabilities, strict=True):
        total += wi * p
    return total


class FedRNRecipe:
    """FedRN client training (``fedrn``).

    Hyper-parameters: ``warmup_rounds`` (100), ``gmm_tol`` (1e-2), ``gmm_reg_covar`` (5e-4),
    ``clean_threshold`` (0.5), ``head_epochs`` (1), ``head_lr`` (defaults to ``lr``),
    ``head_name`` (the last ``nn.Linear`` by default), plus the common ones.
    """

    name = "fedrn"

    def train(
        self, model: nn.Module, global_model: nn.Module, data: LocalData, ctx: RoundContext
    ) -> TrainReport:
        """Train ``model`` in place for one FedRN round and store it as the previous model.

        Parameters
        ----------
        model, global_model : nn.Module
            theta_G to train in place, and a frozen copy of it.
        data : LocalData
            The client's training set; ``true_labels`` (simulation) gives label precision and
            recall of the selection.
        ctx : RoundContext
            ``ctx.neighbors`` with their R'(c, n) and ``ctx.self_weight`` R'(c, c).

        Returns
        -------
        TrainReport
            Metrics: ``warmup`` (0/1), ``num_selected``, ``num_samples``, ``label_precision``,
            ``label_recall`` (when the truth is known), ``fallback_all_samples`` (0/1),
            ``used_previous_model`` (0/1), ``gmm_converged`` (0/1).
        """
        setup = prepare_round(data, ctx)
        hp = setup.hp
        warmup = hp.get_int("warmup_rounds", 100, minimum=0)
        tol = hp.get_float("gmm_tol", 1e-2, minimum=0.0, exclusive_minimum=True)
        reg_covar = hp.get_float("gmm_reg_covar", 5e-4, minimum=0.0)
        threshold = hp.get_float("clean_threshold", 0.5, minimum=0.0, maximum=1.0)
        head_epochs = hp.get_int("head_epochs", 1, minimum=0)
        head_lr = hp.get_float("head_lr", setup.config.lr, minimum=0.0, exclusive_minimum=True)
        head_name = hp.get_optional_str("head_name")
        d = setup.data
        notes: list[str] = []
        metrics: dict[str, float] = {}

        with seeded_rng(ctx.seed, ctx.device):
            if ctx.round_index < warmup:
                metrics["warmup"] = 1.0
                subset = None
            else:
                metrics["warmup"] = 0.0
                selected, info = self._select(
                    model,
                    global_model,
                    d,
                    ctx,
                    setup.config,
                    setup.generator,
                    tol=tol,
                    reg_covar=reg_covar,
                    threshold=threshold,
                    head_epochs=head_epochs,
                    head_lr=head_lr,
                    head_name=head_name,
                    notes=notes,
                )
                metrics.update(info)
                metrics.update(selection_metrics(selected, d.labels, d.true_labels))
                if bool(selected.any()):
                    subset = torch.nonzero(selected).reshape(-1)
                    metrics["fallback_all_samples"] = 0.0
                else:
                    subset = None
                    metrics["fallback_all_samples"] = 1.0
                    notes.append("no sample passed the GMM: trained on all samples")
            result = run_local_training(
                model,
                d,
                ctx,
                setup.config,
                cross_entropy_batch_loss(model, ctx.num_classes),
                setup.generator,
                subset=subset,
            )
        ctx.state.put_tensors(PREVIOUS_MODEL_PREFIX, model.state_dict())
        ctx.state.flush()
        return TrainReport(
            train_loss=result.mean_ce, num_steps=result.num_steps, metrics=metrics, notes=notes
        )

    def _select(
        self,
        model: nn.Module,
        global_model: nn.Module,
        data: LocalData,
        ctx: RoundContext,
        config: TrainingConfig,
        generator: torch.Generator,
        *,
        tol: float,
        reg_covar: float,
        threshold: float,
        head_epochs: int,
        head_lr: float,
        head_name: str | None,
        notes: list[str],
    ) -> tuple[torch.Tensor, dict[str, float]]:
        def gmm(m: nn.Module) -> GmmSelection:
            losses = per_sample_cross_entropy(m, data.inputs, data.labels)
            result = per_sample_loss_gmm(
                losses, tol=tol, reg_covar=reg_covar, random_state=ctx.seed
            )
            if result.fallback is not None:
                notes.append(f"GMM not fitted ({result.fallback}): every sample counted clean")
            return result

        info: dict[str, float] = {}
        own, used_previous = self._previous_model(model, global_model, ctx, notes)
        info["used_previous_model"] = 1.0 if used_previous else 0.0
        own_fit = gmm(own)
        fits = [own_fit]
        weights: list[float] = []
        if ctx.neighbors:
            if ctx.self_weight is None:
                raise InvalidRoundContextError("self_weight: required when neighbors are given")
            weights.append(ctx.self_weight)
            aux = torch.from_numpy(own_fit.clean_probability > threshold).to(data.device)
            aux_idx = torch.nonzero(aux).reshape(-1)
            if aux_idx.numel() == 0:
                notes.append("empty auxiliary clean set: neighbor heads fine-tuned on all samples")
                aux_idx = torch.arange(data.num_samples, device=data.device)
            for neighbor in ctx.neighbors:
                helper = self._neighbor_model(global_model, neighbor.state_dict, neighbor.client_id)
                if head_epochs > 0:
                    self._finetune_head(
                        helper,
                        data,
                        ctx,
                        config,
                        generator,
                        aux_idx,
                        head_epochs,
                        head_lr,
                        head_name,
                    )
                fits.append(gmm(helper))
                weights.append(neighbor.weight)
                del helper
            probability = ensemble_clean_probability([f.clean_probability for f in fits], weights)
        else:
            probability = own_fit.clean_probability
        info["gmm_converged"] = 1.0 if all(f.converged for f in fits) else 0.0
        if not all(f.converged for f in fits):
            notes.append("a GMM fit did not converge (ConvergenceWarning); its posterior was used")
        selected = torch.from_numpy(probability > threshold).to(data.device)
        return selected, info

    @staticmethod
    def _previous_model(
        model: nn.Module, global_model: nn.Module, ctx: RoundContext, notes: list[str]
    ) -> tuple[nn.Module, bool]:
        stored = ctx.state.get_tensors(PREVIOUS_MODEL_PREFIX)
        if not stored:
            return global_model, False
        previous = copy.deepcopy(global_model)
        try:
            previous.load_state_dict(stored, strict=True)
        except RuntimeError:
            notes.append("stored previous model does not fit this model: used theta_G")
            return global_model, False
        return previous, True

    @staticmethod
    def _neighbor_model(
        global_model: nn.Module, state_dict: dict[str, torch.Tensor], client_id: str
    ) -> nn.Module:
        helper = copy.deepcopy(global_model)
        try:
            helper.load_state_dict(state_dict, strict=True)
        except RuntimeError as exc:
            raise ModelContractError(
                f"neighbors: state of {client_id!r} does not fit the model: {exc}"
            ) from exc
        for p in helper.parameters():
            p.requires_grad_(False)
        helper.eval()
        return helper

    @staticmethod
    def _finetune_head(
        helper: nn.Module,
        data: LocalData,
        ctx: RoundContext,
        config: TrainingConfig,
        generator: torch.Generator,
        subset: torch.Tensor,
        epochs: int,
        lr: float,
        head_name: str | None,
    ) -> None:
        _, head = find_head(helper, head_name)
        head_params = list(head.parameters())
        if not head_params:
            raise ModelContractError("head_name: the head has no parameters to fine-tune")
        for p in head_params:
            p.requires_grad_(True)
        optimizer = make_optimizer(head_params, config, lr=lr)
        run_local_training(
            helper,
            data,
            ctx,
            config,
            cross_entropy_batch_loss(helper, ctx.num_classes),
            generator,
            subset=subset,
            epochs=epochs,
            optimizer=optimizer,
            train_mode=False,
        )
        for p in head_params:
            p.requires_grad_(False)
