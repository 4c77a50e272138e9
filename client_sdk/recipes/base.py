"""Types shared by the training recipes and the local-training machinery they all use.

The seam with the Participant is fixed in ``docs/design/recipes-api.md``: the Participant builds a
:class:`RoundContext`, calls ``recipe.train(model, global_model, data, ctx)`` and then
``client_sdk.signals.compute_signals``. This module holds those types, the local-training loop
(optimizer from the hyper-parameters, seeded mini-batches over in-memory tensors, optional mixed
precision on CUDA), feature capture at the classification head (RoFL, FedRN head fine-tuning) and
the per-sample-loss Gaussian mixture used for FedRN sample selection (FedRN section 4.2, eq. 6,
with the fit settings of its authors' code: tol 1e-2, reg_covar 5e-4).

Determinism: every random choice comes from a ``torch.Generator`` seeded with ``ctx.seed`` (batch
order) or from ``ctx.seed`` itself (GMM ``random_state``); layers that draw from the global RNG
(dropout) run inside :func:`seeded_rng`, which forks the global RNG so the caller's state is left
as it was. On CPU the same seed gives bit-identical models.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture
from torch import nn

from client_sdk.recipes.errors import (
    InvalidHyperparameterError,
    InvalidLocalDataError,
    InvalidRoundContextError,
    ModelContractError,
    RecipeError,
    TrainingDivergedError,
)

if TYPE_CHECKING:
    from client_sdk.local_state import LocalStateStore

__all__ = [
    "BatchLoss",
    "GmmSelection",
    "Hyperparameters",
    "LocalData",
    "LoopResult",
    "NeighborModel",
    "Recipe",
    "RoundContext",
    "RoundSetup",
    "TrainReport",
    "TrainingConfig",
    "accumulator_dtype",
    "amp_active",
    "autocast",
    "check_logits",
    "class_counts",
    "cross_entropy_batch_loss",
    "find_head",
    "forward_with_features",
    "make_generator",
    "make_optimizer",
    "minibatch_indices",
    "per_sample_cross_entropy",
    "per_sample_loss_gmm",
    "predict_logits",
    "prepare_round",
    "run_local_training",
    "seeded_rng",
    "selection_metrics",
    "validate_labels",
]

DeviceLike = torch.device | str


def normalize_device(device: DeviceLike) -> torch.device:
    """Return ``device`` as a ``torch.device`` with an explicit CUDA index."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


# --------------------------------------------------------------------------------------------
# Types of the seam
# --------------------------------------------------------------------------------------------
@dataclass
class LocalData:
    """A client's training set, materialised once as tensors (never re-read from disk per round).

    Parameters
    ----------
    inputs : torch.Tensor
        ``(N, *input_shape)`` float32 inputs, already transformed (no augmentation is applied).
    labels : torch.Tensor
        ``(N,)`` int64 given labels (possibly noisy).
    true_labels : torch.Tensor or None
        ``(N,)`` int64 true labels, known only in simulation; used to report label precision and
        recall of sample selection and relabelling. Never used for training.

    Raises
    ------
    InvalidLocalDataError
        On wrong dtypes, shapes, an empty set or negative labels.
    """

    inputs: torch.Tensor
    labels: torch.Tensor
    true_labels: torch.Tensor | None = None
    _moved: dict[str, LocalData] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        """Validate dtypes, shapes and devices."""
        if not isinstance(self.inputs, torch.Tensor) or self.inputs.dtype != torch.float32:
            raise InvalidLocalDataError("inputs: expected a float32 torch.Tensor")
        if self.inputs.dim() < 2 or self.inputs.shape[0] < 1:
            raise InvalidLocalDataError(
                f"inputs: expected shape (N >= 1, *input_shape), got {tuple(self.inputs.shape)}"
            )
        n = self.inputs.shape[0]
        for name in ("labels", "true_labels"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, torch.Tensor) or value.dtype != torch.int64:
                raise InvalidLocalDataError(f"{name}: expected an int64 torch.Tensor")
            if value.shape != (n,):
                raise InvalidLocalDataError(
                    f"{name}: expected shape ({n},), got {tuple(value.shape)}"
                )
            if value.device != self.inputs.device:
                raise InvalidLocalDataError(
                    f"{name}: on {value.device}, inputs on {self.inputs.device}"
                )
            if bool((value < 0).any()):
                raise InvalidLocalDataError(f"{name}: negative label")

    @property
    def num_samples(self) -> int:
        """Number of samples N."""
        return int(self.inputs.shape[0])

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input (without the batch dimension)."""
        return tuple(int(s) for s in self.inputs.shape[1:])

    @property
    def device(self) -> torch.device:
        """Device holding the tensors."""
        return self.inputs.device

    @classmethod
    def from_dataset(
        cls,
        dataset: torch.utils.data.Dataset[Any],
        *,
        true_labels: torch.Tensor | Sequence[int] | None = None,
        batch_size: int = 1024,
    ) -> LocalData:
        """Materialise a map-style dataset of ``(input, label)`` pairs into tensors, once.

        Parameters
        ----------
        dataset : torch.utils.data.Dataset
            Yields ``(input tensor, int label)``; inputs must be floating point.
        true_labels : tensor or sequence of int, optional
            Simulation only: the true labels, same order as the dataset.
        batch_size : int
            How many items are collated at a time while reading.

        Returns
        -------
        LocalData
            On the CPU; move it once with :meth:`to`.
        """
        if isinstance(dataset, torch.utils.data.TensorDataset) and len(dataset.tensors) >= 2:
            inputs, labels = dataset.tensors[0], dataset.tensors[1]
        else:
            loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False)
            xs: list[torch.Tensor] = []
            ys: list[torch.Tensor] = []
            for batch in loader:
                if not isinstance(batch, list | tuple) or len(batch) < 2:
                    raise InvalidLocalDataError("dataset: items must be (input, label) pairs")
                xs.append(torch.as_tensor(batch[0]))
                ys.append(torch.as_tensor(batch[1]))
            if not xs:
                raise InvalidLocalDataError("dataset: is empty")
            inputs, labels = torch.cat(xs), torch.cat(ys)
        if not inputs.is_floating_point():
            raise InvalidLocalDataError(
                f"dataset: inputs must be floating point, got {inputs.dtype}"
            )
        if labels.is_floating_point() or labels.dtype == torch.bool:
            raise InvalidLocalDataError(f"dataset: labels must be integers, got {labels.dtype}")
        truth = None if true_labels is None else torch.as_tensor(true_labels).to(torch.int64).cpu()
        return cls(
            inputs=inputs.to(device="cpu", dtype=torch.float32).contiguous(),
            labels=labels.to(device="cpu", dtype=torch.int64).reshape(-1).contiguous(),
            true_labels=truth,
        )

    def to(self, device: DeviceLike) -> LocalData:
        """Return the data on ``device``; the moved copy is cached, so it is moved only once."""
        dev = normalize_device(device)
        if self.inputs.device == dev:
            return self
        key = str(dev)
        if key not in self._moved:
            self._moved[key] = LocalData(
                inputs=self.inputs.to(dev),
                labels=self.labels.to(dev),
                true_labels=None if self.true_labels is None else self.true_labels.to(dev),
            )
        return self._moved[key]


@dataclass(frozen=True)
class NeighborModel:
    """A k-reliable neighbor's latest local model theta_n with its ensemble weight R'(c, n)."""

    client_id: str
    state_dict: dict[str, torch.Tensor]
    weight: float


@dataclass
class RoundContext:
    """Everything a recipe needs to know about this round (built by the Participant).

    Attributes
    ----------
    round_index : int
        0-based index of this round.
    total_rounds : int
        Planned number of rounds R (FLR's schedules use it).
    num_classes : int
        Number of classes C.
    hyperparameters : Mapping[str, Any]
        From the server's instructions; every recipe uses the spec default for a missing key.
    role : {"clean", "noisy"} or None
        FedNoRo stage-2 role (None = unknown, treated as clean).
    label_correction : bool
        Fed-NCL: the server made this client a label-correction candidate.
    neighbors : Sequence[NeighborModel]
        FedRN k-reliable neighbors (empty otherwise).
    self_weight : float or None
        FedRN R'(c, c).
    global_centroids : torch.Tensor or None
        RoFL (C, d) global centroids; None in the first round.
    device : torch.device
        Where to train.
    amp : bool
        Mixed precision; honoured only on CUDA.
    seed : int
        Per client per round; the source of all randomness.
    state : LocalStateStore
        Persistent per-client state.
    """

    round_index: int
    total_rounds: int
    num_classes: int
    hyperparameters: Mapping[str, Any]
    role: Literal["clean", "noisy"] | None
    label_correction: bool
    neighbors: Sequence[NeighborModel]
    self_weight: float | None
    global_centroids: torch.Tensor | None
    device: torch.device
    amp: bool
    seed: int
    state: LocalStateStore

    def __post_init__(self) -> None:
        """Validate the context and normalise the device."""

        def _int(name: str, minimum: int) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise InvalidRoundContextError(
                    f"{name}: expected an int >= {minimum}, got {value!r}"
                )

        _int("round_index", 0)
        _int("total_rounds", 1)
        _int("num_classes", 2)
        _int("seed", 0)
        if self.role not in ("clean", "noisy", None):
            raise InvalidRoundContextError(
                f"role: expected 'clean', 'noisy' or None, got {self.role!r}"
            )
        self.device = normalize_device(self.device)
        if self.self_weight is not None and not (
            math.isfinite(self.self_weight) and self.self_weight >= 0
        ):
            raise InvalidRoundContextError(
                f"self_weight: must be finite and >= 0, got {self.self_weight}"
            )
        for neighbor in self.neighbors:
            if not (math.isfinite(neighbor.weight) and neighbor.weight >= 0):
                raise InvalidRoundContextError(
                    f"neighbors: weight of {neighbor.client_id!r} must be finite and >= 0"
                )
        if self.global_centroids is not None:
            c = self.global_centroids
            if c.dim() != 2 or c.shape[0] != self.num_classes or not bool(torch.isfinite(c).all()):
                raise InvalidRoundContextError(
                    f"global_centroids: expected finite ({self.num_classes}, d), "
                    f"got {tuple(c.shape)}"
                )
        if not isinstance(self.hyperparameters, Mapping):
            raise InvalidRoundContextError("hyperparameters: expected a mapping")


@dataclass
class TrainReport:
    """What a recipe reports about its local training.

    Attributes
    ----------
    train_loss : float
        Mean cross-entropy the optimiser saw over the local epochs, per sample (Fed-NCL h_k):
        against the targets actually trained on (relabelled, selected, logit-adjusted).
    num_steps : int
        Optimiser steps taken.
    centroids : torch.Tensor or None
        RoFL local centroids (C, d), float32, CPU.
    metrics : dict[str, float]
        JSON numbers: label_precision, label_recall, num_selected, 0/1 fallback flags, ...
    notes : list[str]
        Human-readable notes (fallbacks taken, state reset, ...).
    """

    train_loss: float
    num_steps: int
    centroids: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class Recipe(Protocol):
    """A local-training recipe: trains ``model`` (holding theta_G) in place on ``data``."""

    name: str

    def train(
        self,
        model: nn.Module,
        global_model: nn.Module,
        data: LocalData,
        ctx: RoundContext,
    ) -> TrainReport:
        """Train ``model`` in place for this round and report what happened."""
        ...


# --------------------------------------------------------------------------------------------
# Hyper-parameters
# --------------------------------------------------------------------------------------------
class Hyperparameters:
    """Typed, validated reads of the server's hyper-parameters with the spec defaults.

    Unknown keys are ignored (the server's instructions carry keys for other parts of the system);
    a known key with the wrong type or out of range raises :class:`InvalidHyperparameterError`.
    """

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = values

    def _raw(self, key: str, default: Any) -> Any:
        value = self._values.get(key, default)
        return default if value is None else value

    def get_float(
        self,
        key: str,
        default: float,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        exclusive_minimum: bool = False,
    ) -> float:
        """Read a finite float in ``[minimum, maximum]`` (``(minimum, ...`` when exclusive)."""
        value = self._raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidHyperparameterError(f"{key}: expected a number, got {value!r}")
        result = float(value)
        if not math.isfinite(result):
            raise InvalidHyperparameterError(f"{key}: must be finite, got {value!r}")
        if minimum is not None and (result < minimum or (exclusive_minimum and result == minimum)):
            bound = ">" if exclusive_minimum else ">="
            raise InvalidHyperparameterError(f"{key}: must be {bound} {minimum}, got {result}")
        if maximum is not None and result > maximum:
            raise InvalidHyperparameterError(f"{key}: must be <= {maximum}, got {result}")
        return result

    def get_int(self, key: str, default: int, *, minimum: int | None = None) -> int:
        """Read an integer (an integral float such as ``10.0`` is accepted) ``>= minimum``."""
        value = self._raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidHyperparameterError(f"{key}: expected an integer, got {value!r}")
        if isinstance(value, float) and not value.is_integer():
            raise InvalidHyperparameterError(f"{key}: expected an integer, got {value!r}")
        result = int(value)
        if minimum is not None and result < minimum:
            raise InvalidHyperparameterError(f"{key}: must be >= {minimum}, got {result}")
        return result

    def get_choice(self, key: str, default: str, choices: Sequence[str]) -> str:
        """Read a string that must be one of ``choices``."""
        value = self._raw(key, default)
        if not isinstance(value, str) or value not in choices:
            raise InvalidHyperparameterError(
                f"{key}: expected one of {list(choices)}, got {value!r}"
            )
        return value

    def get_bool(self, key: str, default: bool) -> bool:
        """Read a boolean (JSON true/false only)."""
        value = self._raw(key, default)
        if not isinstance(value, bool):
            raise InvalidHyperparameterError(f"{key}: expected true or false, got {value!r}")
        return value

    def get_optional_float(
        self, key: str, *, minimum: float | None = None, exclusive_minimum: bool = False
    ) -> float | None:
        """Read an optional finite float (absent or null: None), checked as :meth:`get_float`."""
        if self._values.get(key) is None:
            return None
        return self.get_float(key, 0.0, minimum=minimum, exclusive_minimum=exclusive_minimum)

    def get_optional_str(self, key: str) -> str | None:
        """Read an optional non-empty string."""
        value = self._values.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise InvalidHyperparameterError(f"{key}: expected a non-empty string, got {value!r}")
        return value


@dataclass(frozen=True)
class TrainingConfig:
    """The hyper-parameters every recipe shares (recipes-api.md, "Common")."""

    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0
    optimizer: str = "sgd"
    local_epochs: int = 1
    batch_size: int = 32
    max_grad_norm: float | None = None

    @classmethod
    def from_hyperparameters(cls, hp: Hyperparameters) -> TrainingConfig:
        """Read the common keys with their defaults."""
        return cls(
            lr=hp.get_float("lr", cls.lr, minimum=0.0, exclusive_minimum=True),
            momentum=hp.get_float("momentum", cls.momentum, minimum=0.0, maximum=1.0),
            weight_decay=hp.get_float("weight_decay", cls.weight_decay, minimum=0.0),
            optimizer=hp.get_choice("optimizer", cls.optimizer, ("sgd", "adam")),
            local_epochs=hp.get_int("local_epochs", cls.local_epochs, minimum=1),
            batch_size=hp.get_int("batch_size", cls.batch_size, minimum=1),
            max_grad_norm=hp.get_optional_float(
                "max_grad_norm", minimum=0.0, exclusive_minimum=True
            ),
        )


def make_optimizer(
    params: Iterable[nn.Parameter], config: TrainingConfig, *, lr: float | None = None
) -> torch.optim.Optimizer:
    """SGD (lr, momentum, weight decay) or Adam (lr, weight decay) over ``params``."""
    rate = config.lr if lr is None else lr
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        raise ModelContractError("model: has no trainable parameters")
    if config.optimizer == "adam":
        return torch.optim.Adam(trainable, lr=rate, weight_decay=config.weight_decay)
    return torch.optim.SGD(
        trainable, lr=rate, momentum=config.momentum, weight_decay=config.weight_decay
    )


# --------------------------------------------------------------------------------------------
# Randomness, batches, precision
# --------------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------------
# The local-training loop
# --------------------------------------------------------------------------------------------
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
        for idx in minibatch_indices(
            data.num_samples if subset is None else num,
            config.batch_size,
            generator,
            data.device,
            subset=subset,
        ):
            opt.zero_grad(set_to_none=True)
            with autocast(ctx):
                out = batch_loss(idx, data.inputs[idx], targets[idx])
            scaled: torch.Tensor = scaler.scale(out.loss)
            scaled.backward()  # type: ignore[no-untyped-call]
            if config.max_grad_norm is not None:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(
                    [p for group in opt.param_groups for p in group["params"]],
                    config.max_grad_norm,
                )
            scaler.step(opt)
            scaler.update()
            ce_sum += out.ce.detach().to(acc) * out.count
            loss_sum += out.loss.detach().to(acc)
            seen += out.count
            steps += 1
            if out.after_step is not None:
                out.after_step()
    mean_ce = float(ce_sum.item()) / max(seen, 1)
    if not math.isfinite(mean_ce) or (not amp_active(ctx) and not math.isfinite(loss_sum.item())):
        raise TrainingDivergedError(
            "training: the loss became non-finite (lower lr or set max_grad_norm; check inputs "
            "and labels)"
        )
    return LoopResult(num_steps=steps, mean_ce=mean_ce)


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


# --------------------------------------------------------------------------------------------
# Model helpers
# --------------------------------------------------------------------------------------------
def find_head(model: nn.Module, head_name: str | None = None) -> tuple[str, nn.Module]:
    """Return the classification head: the module named ``head_name``, else the last Linear.

    Raises
    ------
    ModelContractError
        If ``head_name`` names no module, or the model has no ``nn.Linear``.
    """
    modules = dict(model.named_modules())
    if head_name is not None:
        if head_name not in modules:
            raise ModelContractError(f"head_name: the model has no module named {head_name!r}")
        return head_name, modules[head_name]
    last: tuple[str, nn.Module] | None = None
    for name, module in modules.items():
        if isinstance(module, nn.Linear):
            last = (name, module)
    if last is None:
        raise ModelContractError("model: has no nn.Linear classification head (set head_name)")
    return last


def forward_with_features(
    model: nn.Module, x: torch.Tensor, head: nn.Module | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``model(x)`` and also return the input of its head, flattened to ``(B, d)``.

    The features keep their autograd graph (RoFL's centroid loss must reach the body).
    """
    module = find_head(model)[1] if head is None else head
    captured: list[torch.Tensor] = []

    def hook(_module: nn.Module, args: tuple[Any, ...]) -> None:
        captured.append(args[0])

    handle = module.register_forward_pre_hook(hook)
    try:
        logits = model(x)
    finally:
        handle.remove()
    if not captured:
        raise ModelContractError("model: the head was not called during forward")
    features = captured[-1]
    return logits, features.reshape(features.shape[0], -1)


def check_logits(logits: torch.Tensor, num_classes: int) -> None:
    """Raise :class:`ModelContractError` unless ``logits`` has shape ``(B, num_classes)``."""
    if logits.dim() != 2 or logits.shape[1] != num_classes:
        raise ModelContractError(
            f"model: expected logits of shape (B, {num_classes}), got {tuple(logits.shape)}"
        )


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def predict_logits(
    model: nn.Module,
    inputs: torch.Tensor,
    *,
    batch_size: int = 512,
    inference: bool = False,
    with_features: bool = False,
    head: nn.Module | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Float32 logits (and optionally head features) of ``model`` on ``inputs`` in eval mode.

    Runs batched without gradients and restores the model's train/eval mode. With
    ``inference=True`` it runs under ``torch.inference_mode`` (results must not enter autograd).
    """
    grad_off = torch.inference_mode() if inference else torch.no_grad()
    outs: list[torch.Tensor] = []
    feats: list[torch.Tensor] = []
    with _eval_mode(model), grad_off:
        for start in range(0, inputs.shape[0], batch_size):
            x = inputs[start : start + batch_size]
            if with_features:
                logits, f = forward_with_features(model, x, head)
                feats.append(f.float())
            else:
                logits = model(x)
            outs.append(logits.float())
    return torch.cat(outs), (torch.cat(feats) if with_features else None)


def per_sample_cross_entropy(
    model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, *, batch_size: int = 512
) -> torch.Tensor:
    """Per-sample cross-entropy (float32, ``(N,)``) of ``model`` in eval mode, no gradients."""
    logits, _ = predict_logits(model, inputs, batch_size=batch_size)
    return F.cross_entropy(logits, labels, reduction="none")


def class_counts(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Histogram of ``labels`` over ``num_classes`` classes (int64, same device)."""
    return torch.bincount(labels, minlength=num_classes)[:num_classes]


def validate_labels(data: LocalData, num_classes: int) -> None:
    """Raise :class:`InvalidLocalDataError` when a label is ``>= num_classes``."""
    if int(data.labels.max().item()) >= num_classes:
        raise InvalidLocalDataError(
            f"labels: maximum {int(data.labels.max().item())} outside [0, {num_classes})"
        )
    if data.true_labels is not None and int(data.true_labels.max().item()) >= num_classes:
        raise InvalidLocalDataError(f"true_labels: a label is outside [0, {num_classes})")
    if data.inputs.device != data.labels.device:
        raise InvalidLocalDataError("labels: not on the same device as inputs")


# --------------------------------------------------------------------------------------------
# Per-sample-loss GMM (FedRN section 4.2, eq. 6)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GmmSelection:
    """Clean probabilities from a 2-component GMM on per-sample losses.

    Attributes
    ----------
    clean_probability : numpy.ndarray
        ``(N,)`` posterior of the lower-mean component, float64.
    converged : bool
        False when scikit-learn reported that EM did not converge (the result is still used).
    fallback : str or None
        Why no GMM was fitted (every probability is then 1.0: no evidence of noise).
    """

    clean_probability: npt.NDArray[np.float64]
    converged: bool
    fallback: str | None = None


def per_sample_loss_gmm(
    losses: torch.Tensor | npt.ArrayLike,
    *,
    tol: float = 1e-2,
    reg_covar: float = 5e-4,
    max_iter: int = 100,
    random_state: int = 0,
) -> GmmSelection:
    """Fit a 2-component GMM to min-max normalised per-sample losses (FedRN eq. 6).

    Parameters
    ----------
    losses : tensor or array-like
        ``(N,)`` per-sample losses.
    tol, reg_covar, max_iter : float, float, int
        ``GaussianMixture`` settings (FedRN's authors use tol 1e-2, reg_covar 5e-4).
    random_state : int
        Seed of the k-means initialisation (the authors leave it unseeded).

    Returns
    -------
    GmmSelection
        Clean probability = posterior of the component with the smaller mean. With fewer than
        2 samples, or all losses equal (max - min < 1e-12), no GMM is fitted: every probability
        is 1.0 and ``fallback`` says why. A ``ConvergenceWarning`` is caught and reported as
        ``converged=False``.

    Raises
    ------
    RecipeError
        If ``losses`` is not 1-D or holds a non-finite value.
    """
    if isinstance(losses, torch.Tensor):
        values = losses.detach().to("cpu", torch.float64).numpy()
    else:
        values = np.asarray(losses, dtype=np.float64)
    if values.ndim != 1:
        raise RecipeError(f"losses: expected a 1-D array, got shape {values.shape}")
    if not np.isfinite(values).all():
        raise RecipeError("losses: contains a non-finite value")
    n = values.shape[0]
    if n < 2:
        return GmmSelection(np.ones(n), converged=True, fallback="fewer than 2 samples")
    low, high = float(values.min()), float(values.max())
    if high - low < 1e-12:
        return GmmSelection(np.ones(n), converged=True, fallback="all losses are equal")
    scaled = ((values - low) / (high - low)).reshape(-1, 1)
    gmm = GaussianMixture(
        n_components=2,
        max_iter=max_iter,
        tol=tol,
        reg_covar=reg_covar,
        random_state=random_state % (2**32),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        gmm.fit(scaled)
        posterior = gmm.predict_proba(scaled)
    converged = bool(gmm.converged_) and not any(
        issubclass(w.category, ConvergenceWarning) for w in caught
    )
    for w in caught:
        if not issubclass(w.category, ConvergenceWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    clean = int(np.argmin(gmm.means_.reshape(-1)))
    return GmmSelection(posterior[:, clean].astype(np.float64), converged=converged)


def selection_metrics(
    selected: torch.Tensor, labels: torch.Tensor, true_labels: torch.Tensor | None
) -> dict[str, float]:
    """Label precision/recall of a clean-sample selection against the true labels.

    Precision = |selected and correctly labelled| / |selected|; recall = |selected and correctly
    labelled| / |correctly labelled|. Only the counts are returned when the truth is unknown,
    and recall is left out when no label is correct.
    """
    sel = selected.to(torch.bool)
    out = {"num_selected": float(int(sel.sum().item())), "num_samples": float(sel.numel())}
    if true_labels is None:
        return out
    correct = labels == true_labels
    hit = int((sel & correct).sum().item())
    n_sel = int(sel.sum().item())
    n_correct = int(correct.sum().item())
    if n_sel > 0:
        out["label_precision"] = hit / n_sel
    if n_correct > 0:
        out["label_recall"] = hit / n_correct
    return out
