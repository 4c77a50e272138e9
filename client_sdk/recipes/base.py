"""The types of the seam between the Participant and the training recipes.

The seam is fixed in ``docs/design/recipes-api.md``: the Participant builds a
:class:`RoundContext`, calls ``recipe.train(model, global_model, data, ctx)`` and then
``client_sdk.signals.compute_signals``. This module holds those types (:class:`LocalData`,
:class:`RoundContext`, :class:`NeighborModel`, :class:`TrainReport`, the :class:`Recipe`
protocol). What the recipes share to train lives beside it:

* :mod:`client_sdk.recipes.hyperparameters` -- reading the hyper-parameters, the common training
  configuration and the optimiser;
* :mod:`client_sdk.recipes.training` -- the local-training loop (seeded mini-batches over
  in-memory tensors, optional mixed precision on CUDA) and the randomness it uses;
* :mod:`client_sdk.recipes.model_io` -- feature capture at the classification head (RoFL, FedRN
  head fine-tuning), logits, per-sample losses and label checks;
* :mod:`client_sdk.recipes.sample_selection` -- the per-sample-loss Gaussian mixture used for
  FedRN sample selection (FedRN section 4.2, eq. 6).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch
from torch import nn

from client_sdk.recipes.errors import (
    InvalidLocalDataError,
    InvalidRoundContextError,
)

if TYPE_CHECKING:
    from client_sdk.local_state import LocalStateStore

__all__ = [
    "DeviceLike",
    "LocalData",
    "NeighborModel",
    "Recipe",
    "RoundContext",
    "TrainReport",
    "normalize_device",
]

DeviceLike = torch.device | str


def normalize_device(device: DeviceLike) -> torch.device:
    """Return ``device`` as a ``torch.device`` with an explicit CUDA index."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


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
    distil_classes : Sequence[int] or None
        For a site in the "noisy" role, the classes whose samples FedNoRo's
        ``kd_scope: "classes"`` distils, as the coordinator chose them (None: every class).
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
    distil_classes: Sequence[int] | None = None

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
        for index in self.distil_classes or ():
            if not isinstance(index, int) or isinstance(index, bool):
                raise InvalidRoundContextError(f"distil_classes: {index!r} is not a class index")
            if not 0 <= index < self.num_classes:
                raise InvalidRoundContextError(
                    f"distil_classes: class {index} outside [0, {self.num_classes})"
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
    logit_offset : torch.Tensor or None
        (C,) offsets the recipe added to the logits when it trained (FedNoRo's logit
        adjustment): the site's decision rule is ``argmax(logits + logit_offset)``, and its
        ``train_accuracy`` signal is measured with it. None: plain logits.
    """

    train_loss: float
    num_steps: int
    centroids: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    logit_offset: torch.Tensor | None = None


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
