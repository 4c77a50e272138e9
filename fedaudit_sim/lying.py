"""Simulated sites that lie about their losses (issue 20, point 1: bounded influence).

A :class:`LossLyingParticipant` trains on its noisy labels like any other site, but reports the
losses a clean site would: ``per_class_loss`` and ``per_class_loss_sd`` of the global model
measured against its **true** labels (grouped by true class; a class the site declares but does
not truly hold gets the mean over all its samples), and ``train_loss`` the mean of those
per-sample losses. Its class counts, sample count, model update, accuracy and probe outputs stay
honest (the counts must match its join, the rest is what its training produced). Detectors that
read the reported losses cannot see such a site; only what the coordinator computes from the
update itself (Fed-NCL's divergence) and the probe outputs can.

The simulator knows every sample's true label; a real attacker would report, for instance, the
federation's typical losses. This is the simulator's stand-in for that attack, and a strong one:
the lie is the loss vector of the same site with clean labels.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from client_sdk import Participant
from client_sdk._responses import Instructions
from client_sdk.recipes import TrainReport
from client_sdk.signals import Signals, error_masks

__all__ = ["LossLyingParticipant", "true_label_errors", "true_label_losses"]


def true_label_losses(
    global_model: nn.Module,
    inputs: torch.Tensor,
    true_labels: torch.Tensor,
    declared_counts: list[int],
) -> tuple[list[float | None], list[float | None], float]:
    """(per_class_loss, per_class_loss_sd, mean loss) of ``global_model`` against the true labels.

    Classes are those of ``declared_counts`` (the site's noisy labels): a declared class gets the
    loss of the samples truly in it, or of all samples when none is; an undeclared class None.
    """
    with torch.no_grad():
        logits = global_model(inputs).float()
        losses = F.cross_entropy(logits, true_labels, reduction="none").double()
    overall_mean = float(losses.mean())
    overall_sd = float(losses.std(unbiased=False))
    means: list[float | None] = []
    sds: list[float | None] = []
    for c, count in enumerate(declared_counts):
        if count == 0:
            means.append(None)
            sds.append(None)
            continue
        chosen = losses[true_labels == c]
        if chosen.numel() == 0:
            means.append(overall_mean)
            sds.append(overall_sd)
        else:
            means.append(float(chosen.mean()))
            sds.append(float(chosen.std(unbiased=False)))
    return means, sds, overall_mean


def true_label_errors(
    global_model: nn.Module,
    inputs: torch.Tensor,
    true_labels: torch.Tensor,
    declared_counts: list[int],
) -> tuple[list[int | None], list[int | None]]:
    """per_class_errors and per_class_confident_errors as a clean site would report them: for
    each declared class, the global model's (confident) error rate on the samples truly in it
    (on all samples when none is) times the declared count, rounded; None for an undeclared
    class."""
    with torch.no_grad():
        wrong, sure = error_masks(global_model(inputs), true_labels)
    errors: list[int | None] = []
    confident: list[int | None] = []
    for c, count in enumerate(declared_counts):
        if count == 0:
            errors.append(None)
            confident.append(None)
            continue
        mask = true_labels == c
        for out, which in ((errors, wrong), (confident, sure)):
            chosen = which[mask] if bool(mask.any()) else which
            out.append(min(count, max(0, round(float(chosen.double().mean()) * count))))
    return errors, confident


class LossLyingParticipant(Participant):
    """A participant whose reported losses are those of its true labels (module docstring)."""

    def _compute_signals(
        self,
        global_model: nn.Module,
        model: nn.Module,
        report: TrainReport,
        instructions: Instructions,
    ) -> Signals:
        signals = super()._compute_signals(global_model, model, report, instructions)
        true_labels = self.data.true_labels
        if true_labels is None:
            raise ValueError("a lying site needs its true labels (LocalData.true_labels)")
        was_training = global_model.training
        global_model.eval()
        means, sds, mean = true_label_losses(
            global_model, self.data.inputs, true_labels, signals.class_counts
        )
        errors, confident = true_label_errors(
            global_model, self.data.inputs, true_labels, signals.class_counts
        )
        global_model.train(was_training)
        if signals.per_class_loss is not None:
            signals.per_class_loss = means
            signals.per_class_loss_sd = sds
        if signals.per_class_errors is not None:
            signals.per_class_errors = errors
        if signals.per_class_confident_errors is not None:
            signals.per_class_confident_errors = confident
        if signals.train_loss is not None and math.isfinite(mean):
            signals.train_loss = mean
        return signals
