"""Signals a client reports every round (docs/algorithms.md, "Signals").

- ``num_samples`` and ``class_counts``: always sent (every weighting; FedNoRo's fill-in and prior).
- ``per_class_loss``: mean cross-entropy per given label with **theta_G** (the model received this
  round, before local training), eval mode, no augmentation; ``None`` for a class with no sample
  (FedNoRo detection, FedNoRo section 4.1, eq. 3's input).
- ``per_class_loss_sd``: sent with ``per_class_loss``: the standard deviation (population, ddof 0)
  of the same per-sample losses, per given label; ``None`` for a class with no sample. It gives
  the audit's calibrated evidence its within-site standard error, sd / sqrt(n - 1)
  (``service/audit/evidence.py``).
- ``per_class_errors``: sent with ``per_class_loss``: per given label, how many of the samples the
  same model (theta_G) assigns to another class (argmax of its logits); ``None`` for a class with
  no sample. The audit's error-count evidence (``service/audit/error_evidence.py``) counts them.
- ``per_class_confident_errors``: sent with ``per_class_errors``: of those errors, the ones the
  same model makes confidently, giving the given label a probability of at most
  :data:`CONFIDENT_ERROR_PROBABILITY` (0.1). A clean site's hard samples are mostly errors of low
  confidence; a wrong label the model has learned to contradict is a confident one. The audit
  counts them beside the errors (``service/audit/evidence.py``, "Error counts").
- ``train_loss``: the mean training cross-entropy reported by the recipe (Fed-NCL h_k,
  eq. 8).
- ``train_accuracy``: accuracy of theta_k on its own training set against the given labels, eval
  mode (FedRN expertise, eq. 4), with the recipe's decision rule: a recipe that trained adjusted
  logits (FedNoRo's logit adjustment) reports its offsets and they are added first.
- ``probe_softmax``: softmax of theta_k on P Gaussian inputs drawn from the server's seed (FedRN
  similarity, FedRN eq. 5).
- ``centroids``: RoFL local centroids (RoFL eq. 11).

Only the signals the server lists in ``required`` are computed. Evaluation passes are batched on the
device under ``torch.inference_mode()`` in eval mode, in float32, and restore each model's mode.
On the CPU a convolutional model is evaluated with its 4-D weights in channels-last layout
(oneDNN's fast path): the small CNN of ``benchmarks/bench_signals.py`` runs a pass about 2 x faster
than in the default layout (max-pooling in NCHW alone was 40 % of the pass), with logits equal to
about 1e-7. The layout is restored afterwards (same parameter objects, same values, contiguous
again, so the state serialises as before), and a model whose forward cannot run channels-last
(e.g. ``x.view(...)`` on an activation) is evaluated in the default layout instead.

The probe must be the same bytes on every client. ``torch.randn`` in float32 on the CPU is **not**:
its vectorised kernel (used from 16 elements on) depends on the CPU's instruction set (AVX2 vs the
default kernel give different float32 values for the same seed, measured with
``ATEN_CPU_CAPABILITY``). The float64 path does not, so :func:`make_probe` draws float64
normals from a seeded CPU ``torch.Generator`` and rounds them to float32; only then is the probe
moved to the device.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from client_sdk.recipes.base import DeviceLike, LocalData, TrainReport, normalize_device
from client_sdk.recipes.errors import InvalidLocalDataError, SignalError
from client_sdk.recipes.model_io import check_logits, class_counts
from client_sdk.recipes.training import accumulator_dtype

__all__ = [
    "CONFIDENT_ERROR_PROBABILITY",
    "OPTIONAL_SIGNALS",
    "Signals",
    "compute_signals",
    "error_masks",
    "make_probe",
]

OPTIONAL_SIGNALS = frozenset(
    {"per_class_loss", "train_loss", "train_accuracy", "probe_softmax", "centroids"}
)
"""Signal names a server may require (num_samples and class_counts are always sent)."""

CONFIDENT_ERROR_PROBABILITY = 0.1
"""An error is confident when the global model gives the given label at most this probability
(``per_class_confident_errors``). On a binary task: the other class at 0.9 or more. Chosen on
simulated digit and breast-cancer federations (docs/algorithms.md, "Error counts"): at 0.2 the
clean sites' hard samples entered and clean rounds saw false flags, at 0.05 the errors of a
model that has partly learned a pair flip dropped out."""


def make_probe(seed: int, num_inputs: int, input_shape: Sequence[int]) -> torch.Tensor:
    """Return the round's probe: ``num_inputs`` N(0, 1) inputs, identical bytes everywhere.

    Parameters
    ----------
    seed : int
        The server's probe seed, ``0 <= seed < 2**63``.
    num_inputs : int
        P >= 1.
    input_shape : sequence of int
        Shape of one model input (positive ints).

    Returns
    -------
    torch.Tensor
        ``(P, *input_shape)`` float32 on the CPU: float64 normals from
        ``torch.Generator(device="cpu").manual_seed(seed)``, rounded to float32.

    Raises
    ------
    SignalError
        On a negative or too large seed, ``num_inputs < 1`` or a bad shape.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise SignalError(f"seed: expected an int in [0, 2**63), got {seed!r}")
    if isinstance(num_inputs, bool) or not isinstance(num_inputs, int) or num_inputs < 1:
        raise SignalError(f"num_inputs: expected an int >= 1, got {num_inputs!r}")
    shape = tuple(input_shape)
    if not shape or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape):
        raise SignalError(f"input_shape: expected positive ints, got {input_shape!r}")
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn((num_inputs, *shape), generator=generator, dtype=torch.float64).to(
        torch.float32
    )


@dataclass
class Signals:
    """The signals of one client for one round (docs/algorithms.md, "Signals").

    Attributes
    ----------
    num_samples : int
        n_k.
    class_counts : list of int
        Histogram of the given labels (C ints).
    per_class_loss : list of (float or None) or None
        theta_G's mean cross-entropy per given label; None where the count is 0.
    per_class_loss_sd : list of (float or None) or None
        Standard deviation (ddof 0) of the same per-sample losses; None where the count is 0.
    per_class_errors : list of (int or None) or None
        Samples per given label that theta_G assigns to another class; None where the count is 0.
    per_class_confident_errors : list of (int or None) or None
        Of those, the ones theta_G gives the label a probability of at most
        :data:`CONFIDENT_ERROR_PROBABILITY`; None where the count is 0.
    train_loss : float or None
        Mean training cross-entropy of the recipe.
    train_accuracy : float or None
        theta_k's accuracy on its own data against the given labels.
    probe_softmax : list of list of float or None
        ``(P, C)`` softmax of theta_k on the probe.
    centroids : list of list of float or None
        ``(C, d)`` RoFL local centroids.
    """

    num_samples: int
    class_counts: list[int]
    per_class_loss: list[float | None] | None = None
    per_class_loss_sd: list[float | None] | None = None
    per_class_errors: list[int | None] | None = None
    per_class_confident_errors: list[int | None] | None = None
    train_loss: float | None = None
    train_accuracy: float | None = None
    probe_softmax: list[list[float]] | None = None
    centroids: list[list[float]] | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the signals as a JSON object, leaving out those that were not computed."""
        out: dict[str, Any] = {"num_samples": self.num_samples, "class_counts": self.class_counts}
        for name in sorted(OPTIONAL_SIGNALS | _SENT_WITH_LOSS):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


_SENT_WITH_LOSS = frozenset({"per_class_loss_sd", "per_class_errors", "per_class_confident_errors"})
"""The signals computed with (and only with) ``per_class_loss``."""


def _channels_last_helps(model: nn.Module, inputs: torch.Tensor) -> bool:
    """A CPU pass over image batches through a model with convolution (4-D) weights."""
    if inputs.dim() != 4 or inputs.device.type != "cpu":
        return False
    return any(p.dim() == 4 and p.is_floating_point() for p in model.parameters())


def _set_layout(model: nn.Module, layout: torch.memory_format) -> None:
    """Re-lay the 4-D parameters and buffers in place (same objects; what ``Module.to`` does)."""
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.dim() == 4:
                tensor.data = tensor.data.to(memory_format=layout)


def _logits_pass(
    model: nn.Module, inputs: torch.Tensor, batch_size: int, num_classes: int
) -> torch.Tensor:
    with torch.inference_mode():
        outs = []
        for start in range(0, inputs.shape[0], batch_size):
            logits = model(inputs[start : start + batch_size])
            check_logits(logits, num_classes)
            outs.append(logits.float())
        return torch.cat(outs)


def _batched_logits(
    model: nn.Module, inputs: torch.Tensor, batch_size: int, num_classes: int
) -> torch.Tensor:
    was_training = model.training
    model.eval()
    try:
        if _channels_last_helps(model, inputs):
            _set_layout(model, torch.channels_last)
            try:
                return _logits_pass(model, inputs, batch_size, num_classes)
            except RuntimeError:
                # The model's own code needs the default layout (a .view on an activation);
                # the pass below either works in it or raises the model's real error.
                pass
            finally:
                _set_layout(model, torch.contiguous_format)
        return _logits_pass(model, inputs, batch_size, num_classes)
    finally:
        model.train(was_training)


def _finite(name: str, value: float) -> float:
    if not math.isfinite(value):
        raise SignalError(f"{name}: is not finite ({value}); the model diverged")
    return value


def compute_signals(
    *,
    global_model: nn.Module,
    local_model: nn.Module,
    data: LocalData,
    num_classes: int,
    required: Collection[str],
    train_report: TrainReport,
    probe_seed: int | None,
    probe_size: int,
    input_shape: Sequence[int],
    device: DeviceLike,
    batch_size: int = 256,
    loss_clip: float | None = None,
) -> Signals:
    """Compute the signals the server requires for this round.

    Parameters
    ----------
    global_model : nn.Module
        theta_G as received this round (before local training).
    local_model : nn.Module
        theta_k after local training.
    data : LocalData
        The client's training set (moved to ``device`` once, cached).
    num_classes : int
        C.
    required : collection of str
        Subset of ``OPTIONAL_SIGNALS``; only these are computed.
    train_report : TrainReport
        What the recipe returned (train_loss, centroids).
    probe_seed : int or None
        The server's probe seed (needed for ``probe_softmax``).
    probe_size : int
        P.
    input_shape : sequence of int
        Shape of one model input, for the probe.
    device : torch.device or str
        Where the models are.
    batch_size : int
        Evaluation batch size.
    loss_clip : float or None
        B of the federation's Gaussian mechanism: each per-sample loss is clipped to [0, B]
        before the per-class mean (and its spread); None: not clipped
        (:mod:`client_sdk.privacy` adds the noise).

    Returns
    -------
    Signals

    Raises
    ------
    SignalError
        On an unknown signal name, a required signal whose input is missing (probe seed,
        centroids), input shape mismatch or a non-finite value.
    """
    _check_arguments(required, num_classes, batch_size)
    dev = normalize_device(device)
    d = data.to(dev)
    if int(d.labels.max().item()) >= num_classes:
        raise InvalidLocalDataError(f"labels: a label is outside [0, {num_classes})")
    counts = class_counts(d.labels, num_classes)
    signals = Signals(num_samples=d.num_samples, class_counts=[int(c) for c in counts.tolist()])

    if "per_class_loss" in required:
        logits = _batched_logits(global_model, d.inputs, batch_size, num_classes)
        (
            signals.per_class_loss,
            signals.per_class_loss_sd,
            signals.per_class_errors,
            signals.per_class_confident_errors,
        ) = _per_class_loss_signals(logits, d.labels, counts, num_classes, dev, loss_clip)

    if "train_loss" in required:
        signals.train_loss = _finite("train_loss", float(train_report.train_loss))

    if "train_accuracy" in required:
        logits = _batched_logits(local_model, d.inputs, batch_size, num_classes)
        signals.train_accuracy = _train_accuracy(logits, d, train_report)

    if "probe_softmax" in required:
        signals.probe_softmax = _probe_softmax(
            local_model, d, dev, probe_seed, probe_size, input_shape, batch_size, num_classes
        )

    if "centroids" in required:
        signals.centroids = _centroids(train_report, num_classes)
    return signals


def _check_arguments(required: Collection[str], num_classes: int, batch_size: int) -> None:
    """``SignalError`` on an unknown signal name, fewer than 2 classes or a batch size < 1."""
    unknown = set(required) - OPTIONAL_SIGNALS
    if unknown:
        raise SignalError(
            f"required: unknown signals {sorted(unknown)}; known {sorted(OPTIONAL_SIGNALS)}"
        )
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise SignalError(f"num_classes: expected an int >= 2, got {num_classes!r}")
    if batch_size < 1:
        raise SignalError(f"batch_size: expected >= 1, got {batch_size}")


def _per_class_loss_signals(
    logits: torch.Tensor,
    labels: torch.Tensor,
    counts: torch.Tensor,
    num_classes: int,
    dev: torch.device,
    loss_clip: float | None = None,
) -> tuple[list[float | None], list[float | None], list[int | None], list[int | None]]:
    """theta_G's per-class mean loss (FedNoRo section 4.1, eq. 3's input), its standard
    deviation (ddof 0), its error count and its confident error count per given label, from
    theta_G's ``logits`` (module docstring); None for a class with no sample. (per_class_loss,
    per_class_loss_sd, per_class_errors, per_class_confident_errors)."""
    losses = F.cross_entropy(logits, labels, reduction="none")
    is_error, confident = error_masks(logits, labels, losses)  # before the clip
    if loss_clip is not None:
        losses = losses.clamp(max=float(loss_clip))  # cross-entropy is >= 0 already
    acc = accumulator_dtype(dev)
    sums = torch.zeros(num_classes, dtype=acc, device=dev)
    sums.index_add_(0, labels, losses.to(acc))
    per_class: list[float | None] = []
    for total, count in zip(sums.tolist(), counts.tolist(), strict=True):
        per_class.append(None if count == 0 else _finite("per_class_loss", total / count))
    # Second pass around each class's mean (not sum of squares minus squared mean, which
    # cancels badly in float32 when the losses are nearly equal).
    means = torch.tensor([0.0 if m is None else m for m in per_class], dtype=acc, device=dev)
    squares = torch.zeros(num_classes, dtype=acc, device=dev)
    squares.index_add_(0, labels, torch.square(losses.to(acc) - means[labels]))
    per_class_sd: list[float | None] = [
        None if count == 0 else _finite("per_class_loss_sd", math.sqrt(total / count))
        for total, count in zip(squares.tolist(), counts.tolist(), strict=True)
    ]
    return (
        per_class,
        per_class_sd,
        _count_per_class(is_error, labels, counts, num_classes, dev),
        _count_per_class(confident, labels, counts, num_classes, dev),
    )


def error_masks(
    logits: torch.Tensor, labels: torch.Tensor, losses: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(errors, confident errors) as boolean masks over the samples: the argmax is not the
    label; and of those, the label's probability is at most :data:`CONFIDENT_ERROR_PROBABILITY`
    (the cross-entropy at least -log of it; ``losses``: the unclipped per-sample cross-entropy
    when already computed). Beyond 10 classes the predicted class itself may have p <= 0.1: not
    an error."""
    if losses is None:
        losses = F.cross_entropy(logits.float(), labels, reduction="none")
    is_error = logits.argmax(dim=1) != labels
    return is_error, is_error & (losses >= -math.log(CONFIDENT_ERROR_PROBABILITY))


def _count_per_class(
    which: torch.Tensor,
    labels: torch.Tensor,
    counts: torch.Tensor,
    num_classes: int,
    dev: torch.device,
) -> list[int | None]:
    """How many of the samples ``which`` marks each given label has; None for a class with no
    sample."""
    per_class = torch.zeros(num_classes, dtype=torch.int64, device=dev)
    per_class.index_add_(0, labels, which.to(torch.int64))
    return [
        None if count == 0 else int(e)
        for e, count in zip(per_class.tolist(), counts.tolist(), strict=True)
    ]


def _train_accuracy(logits: torch.Tensor, data: LocalData, train_report: TrainReport) -> float:
    """theta_k's accuracy on its own data against the given labels (FedRN expertise, eq. 4),
    from its ``logits``, with the recipe's decision rule (its logit offsets added first, when it
    reports any)."""
    if train_report.logit_offset is not None:
        # The rule the recipe trained (FedNoRo: logits + tau log pi): a logit-adjusted model
        # judged on its plain logits looks worse on a skewed site than it fits.
        logits = logits.float() + train_report.logit_offset.to(logits.device, torch.float32)
    correct = int((logits.argmax(dim=1) == data.labels).sum().item())
    return correct / data.num_samples


def _probe_softmax(
    local_model: nn.Module,
    data: LocalData,
    dev: torch.device,
    probe_seed: int | None,
    probe_size: int,
    input_shape: Sequence[int],
    batch_size: int,
    num_classes: int,
) -> list[list[float]]:
    """theta_k's softmax on the round's probe (FedRN eq. 5; :func:`make_probe`), as float64
    lists; ``SignalError`` without a probe seed, on a shape unlike the data's, or when not
    finite."""
    if probe_seed is None:
        raise SignalError("probe_seed: required for probe_softmax")
    probe = make_probe(probe_seed, probe_size, input_shape)
    if tuple(probe.shape[1:]) != data.input_shape:
        raise SignalError(
            f"input_shape: {tuple(input_shape)} differs from the data's {data.input_shape}"
        )
    logits = _batched_logits(local_model, probe.to(dev), batch_size, num_classes)
    probs = F.softmax(logits, dim=1).to("cpu", torch.float64)
    if not bool(torch.isfinite(probs).all()):
        raise SignalError("probe_softmax: is not finite; the model diverged")
    result: list[list[float]] = probs.tolist()
    return result


def _centroids(train_report: TrainReport, num_classes: int) -> list[list[float]]:
    """The recipe's local centroids (RoFL eq. 11) as float64 lists; ``SignalError`` when the
    recipe produced none or they are not finite ``(C, d)``."""
    if train_report.centroids is None:
        raise SignalError("centroids: required, but the recipe produced none (use 'rofl')")
    cent = train_report.centroids.detach().to("cpu", torch.float64)
    if cent.dim() != 2 or cent.shape[0] != num_classes or not bool(torch.isfinite(cent).all()):
        raise SignalError(f"centroids: expected finite ({num_classes}, d), got {tuple(cent.shape)}")
    result: list[list[float]] = cent.tolist()
    return result
