"""The data of one seed of a simulation, and how a global model is scored on it.

:func:`prepare_data` loads the data set, partitions it and injects label noise (the papers'
protocols), and builds the initial model, all from the run's seed:
``numpy.random.SeedSequence(seed)`` is split into independent streams for the partition, the
noise and the model initialisation, and the federation's seed (batch order, probes) is derived
from it too. Every method configuration of a seed gets the *same* :class:`PreparedData`:
identical partition, noisy labels and initial model.

:func:`evaluate_state` scores a global model on the clean test split; :func:`per_class_losses`
gives each client's per-class loss under it (the heat map's fallback input).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final, NamedTuple

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from client_sdk.participant import load_state_bytes, state_to_bytes
from client_sdk.recipes import LocalData
from fedaudit_sim.custom_data import load_callable, load_npz
from fedaudit_sim.data_splits import DatasetError, DataSplit
from fedaudit_sim.datasets import load_dataset
from fedaudit_sim.metrics import accuracy, balanced_accuracy, class_recall
from fedaudit_sim.models import ModelConfigError, TorchvisionNotInstalledError, build_model
from fedaudit_sim.noise import NoiseReport, inject_noise
from fedaudit_sim.noise_protocols import NoiseError, noise_levels
from fedaudit_sim.partition import PartitionError, partition
from fedaudit_sim.scenario import Scenario, ScenarioError

__all__ = [
    "ModelScores",
    "PreparedData",
    "client_names",
    "evaluate_state",
    "per_class_losses",
    "prepare_data",
]

_EVAL_BATCH: Final = 2048

IntArray = npt.NDArray[np.int64]


# eq=False: the fields hold numpy arrays, whose == is elementwise.
@dataclass(frozen=True, eq=False)
class PreparedData:
    """Everything that must be identical across the method configurations of one seed.

    Attributes
    ----------
    scenario : Scenario
    seed : int
    split : DataSplit
        Training split (true labels) and the clean test split.
    client_indices : list of numpy.ndarray
        Each client's training-sample indices.
    noise : NoiseReport
        Noisy labels and per-client ground truth.
    model_name : str
        The resolved model name (``cnn`` for images, ``mlp`` otherwise, unless set).
    initial_state : bytes
        safetensors bytes of the initial global model.
    federation_seed : int
        The coordinator-side seed (batch order, probes), derived from ``seed``.
    """

    scenario: Scenario
    seed: int
    split: DataSplit
    client_indices: list[IntArray]
    noise: NoiseReport
    model_name: str
    initial_state: bytes
    federation_seed: int

    def build_model(self) -> nn.Module:
        """A fresh model of the scenario's architecture holding the initial weights."""
        model = build_model(
            self.model_name,
            self.split.train.input_shape,
            self.split.train.num_classes,
            **self.scenario.model.params,
        )
        load_state_bytes(model, self.initial_state)
        return model

    def local_data(self, k: int) -> LocalData:
        """Client ``k``'s training set: its inputs, noisy labels and (for metrics) true labels."""
        idx = self.client_indices[k]
        return LocalData(
            inputs=torch.from_numpy(np.ascontiguousarray(self.split.train.x[idx])),
            labels=torch.from_numpy(np.ascontiguousarray(self.noise.noisy_labels[idx])),
            true_labels=torch.from_numpy(np.ascontiguousarray(self.split.train.y[idx])),
        )

    def lying_sites(self) -> list[int]:
        """Indices of the clients that report their true labels' losses (``scenario.lying``)."""
        spec = self.scenario.lying
        if spec is None:
            return []
        noisy = [k for k, is_noisy in enumerate(self.noise.noisy_clients) if is_noisy]
        return noisy if spec.sites == "noisy" else noisy[: int(spec.sites)]

    def class_counts(self, k: int) -> list[int]:
        """Histogram of client ``k``'s (noisy) labels."""
        labels = self.noise.noisy_labels[self.client_indices[k]]
        return [int(c) for c in np.bincount(labels, minlength=self.split.train.num_classes)]


def client_names(num_clients: int) -> list[str]:
    """``client-00``, ``client-01``, ... (zero-padded so they sort in index order)."""
    width = max(2, len(str(num_clients - 1)))
    return [f"client-{k:0{width}d}" for k in range(num_clients)]


def _derive_int(sequence: np.random.SeedSequence) -> int:
    """A non-negative 31-bit int drawn from ``sequence`` (a seed for torch or the coordinator)."""
    return int(sequence.generate_state(1, dtype=np.uint32)[0] & 0x7FFFFFFF)


def _load_data(scenario: Scenario, seed: int) -> DataSplit:
    """The scenario's data set: a built-in one, or the custom arrays (``custom_data``)."""
    custom = scenario.custom_data
    if custom is None:
        return load_dataset(
            scenario.dataset,
            data_dir=scenario.data_dir,
            test_fraction=scenario.test_fraction,
            seed=seed,
        )
    options: dict[str, Any] = {
        "test_fraction": scenario.test_fraction,
        "seed": seed,
        "num_classes": custom.num_classes,
        "class_names": custom.class_names,
        "standardize": custom.standardize,
    }
    if custom.npz is not None:
        return load_npz(custom.npz, name=custom.name, **options)
    assert custom.function is not None  # CustomDataSpec: exactly one source
    return load_callable(custom.function, custom.params, name=custom.name, **options)


def prepare_data(scenario: Scenario, seed: int) -> PreparedData:
    """Load, partition and noise the data and build the initial model, all from ``seed``.

    Raises
    ------
    ScenarioError
        The data set cannot be loaded, or the partition, noise or model settings do not fit
        it (the message names the scenario field).
    """
    try:
        split = _load_data(scenario, seed)
    except DatasetError as exc:
        raise ScenarioError(f"dataset {scenario.dataset!r}: {exc}") from exc
    train = split.train
    part_seq, noise_seq, model_seq, federation_seq = np.random.SeedSequence(seed).spawn(4)
    try:
        indices = partition(
            train.y,
            scenario.clients,
            scenario.partition.method,
            np.random.default_rng(part_seq),
            **scenario.partition.params,
        )
    except PartitionError as exc:
        raise ScenarioError(f"partition: {exc}") from exc
    noise_rng = np.random.default_rng(noise_seq)
    spec = scenario.noise
    try:
        levels = noise_levels(scenario.clients, spec.protocol, noise_rng, **spec.params)
        report = inject_noise(
            train.y,
            indices,
            levels,
            train.num_classes,
            spec.flip,
            noise_rng,
            protocol=spec.protocol,
            threshold=spec.threshold,
            class_map=spec.class_map,
            x=train.x if spec.flip == "instance" else None,
        )
    except NoiseError as exc:
        raise ScenarioError(f"noise: {exc}") from exc
    report = curated(report, train.y, indices, scenario.anchors)
    model_name = scenario.model.name or ("cnn" if train.kind == "image" else "mlp")
    try:
        model = build_model(
            model_name,
            train.input_shape,
            train.num_classes,
            seed=_derive_int(model_seq),
            **scenario.model.params,
        )
    except (ModelConfigError, TorchvisionNotInstalledError) as exc:
        raise ScenarioError(f"model: {exc}") from exc
    return PreparedData(
        scenario=scenario,
        seed=seed,
        split=split,
        client_indices=indices,
        noise=report,
        model_name=model_name,
        initial_state=state_to_bytes(model),
        federation_seed=_derive_int(federation_seq),
    )


def curated(
    report: NoiseReport, labels: IntArray, indices: list[IntArray], anchors: int
) -> NoiseReport:
    """The noise with the first ``anchors`` sites' labels restored (trust anchors hold curated
    labels): their flips undone, their realised rate 0, not noisy in the ground truth. The
    other sites' noise is untouched (it was drawn as without anchors)."""
    if anchors == 0:
        return report
    noisy_labels = report.noisy_labels.copy()
    flipped = report.flipped.copy()
    realised = report.realised_rates.copy()
    targets = report.target_rates.copy()
    noisy_clients = report.noisy_clients.copy()
    client_flipped = list(report.client_flipped)
    for k in range(anchors):
        idx = indices[k]
        noisy_labels[idx] = labels[idx]
        flipped[idx] = False
        realised[k] = targets[k] = 0.0
        noisy_clients[k] = False
        client_flipped[k] = np.zeros(idx.size, dtype=bool)
    return replace(
        report,
        noisy_labels=noisy_labels,
        flipped=flipped,
        realised_rates=realised,
        target_rates=targets,
        noisy_clients=noisy_clients,
        client_flipped=tuple(client_flipped),
        notes=(*report.notes, f"sites 0-{anchors - 1} are trust anchors: their labels are curated"),
    )


class ModelScores(NamedTuple):
    """A global model's scores on the clean test split."""

    accuracy: float
    balanced_accuracy: float
    class_recall: list[float | None]
    """Per class, the fraction of its test samples predicted as it (None: not in the split)."""


def evaluate_state(model: nn.Module, state: bytes, split: DataSplit) -> ModelScores:
    """Accuracy, balanced accuracy and per-class recall of ``state`` (loaded into ``model``)
    on the test split."""
    load_state_bytes(model, state)
    model.eval()
    x = torch.from_numpy(split.test.x)
    predictions = []
    with torch.inference_mode():
        for start in range(0, x.shape[0], _EVAL_BATCH):
            predictions.append(model(x[start : start + _EVAL_BATCH]).argmax(dim=1))
    predicted = torch.cat(predictions).numpy().astype(np.int64)
    y, classes = split.test.y, split.test.num_classes
    return ModelScores(
        accuracy(y, predicted),
        balanced_accuracy(y, predicted, classes),
        class_recall(y, predicted, classes),
    )


def per_class_losses(
    model: nn.Module, state: bytes, data: PreparedData
) -> list[list[float | None]]:
    """Each client's mean cross-entropy per (noisy) label class under ``state``, eval mode;
    ``None`` for a class the client does not hold (``per_class_loss``, FedNoRo eq. 3's input)."""
    load_state_bytes(model, state)
    model.eval()
    num_classes = data.split.train.num_classes
    result: list[list[float | None]] = []
    with torch.inference_mode():
        for k in range(len(data.client_indices)):
            local = data.local_data(k)
            losses = torch.nn.functional.cross_entropy(
                model(local.inputs), local.labels, reduction="none"
            ).double()
            sums = torch.zeros(num_classes, dtype=torch.float64).index_add_(0, local.labels, losses)
            counts = torch.bincount(local.labels, minlength=num_classes)
            result.append(
                [
                    float(sums[c] / counts[c]) if int(counts[c]) > 0 else None
                    for c in range(num_classes)
                ]
            )
    return result
