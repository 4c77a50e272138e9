"""Pure building blocks of the simulator: data sets, partitions, label noise, models, metrics.

the papers' partitions and noise protocols, and the data sets and metrics of docs/evaluation.md.
These modules import numpy, scipy, scikit-learn and torch only.

The names below are re-exported lazily (PEP 562): ``import fedaudit_sim.metrics`` does not
pay for importing torch, and ``from fedaudit_sim import build_model`` imports only
``models``. The partition names are imported eagerly (numpy only, cheap) because the function
``partition`` shares its name with its module: binding it here, after the submodule is loaded,
makes ``fedaudit_sim.partition`` the function however the package is first imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fedaudit_sim.partition import (
    PARTITION_METHODS,
    PartitionError,
    as_generator,
    bernoulli_dirichlet,
    dirichlet,
    iid,
    k_classes,
    lognormal_quantity,
    partition,
    shards,
)

if TYPE_CHECKING:
    from fedaudit_sim.datasets import (
        DATASET_NAMES,
        Dataset,
        DatasetChecksumError,
        DatasetError,
        DatasetFormatError,
        DatasetNotFoundError,
        DataSplit,
        UnknownDatasetError,
        default_data_dir,
        load_dataset,
    )
    from fedaudit_sim.metrics import (
        CurveSummary,
        DetectionOutcome,
        DetectionScores,
        MetricInputError,
        SelectionScores,
        accuracy,
        auroc,
        balanced_accuracy,
        detection_metrics,
        detection_scores,
        label_precision_recall,
        spearman,
        summarise_curve,
    )
    from fedaudit_sim.models import (
        MLP,
        ModelConfigError,
        SmallCNN,
        TorchvisionNotInstalledError,
        build_model,
        classifier_head,
    )
    from fedaudit_sim.noise import (
        CONTINUOUS_PROTOCOLS,
        FLIP_TYPES,
        NOISE_PROTOCOLS,
        TWO_GROUP_PROTOCOLS,
        InstanceProbabilities,
        NoiseError,
        NoiseReport,
        flip_labels,
        inject_noise,
        instance_probabilities,
        noise_levels,
    )

_EXPORTS: dict[str, tuple[str, ...]] = {
    "datasets": (
        "DATASET_NAMES",
        "DataSplit",
        "Dataset",
        "DatasetChecksumError",
        "DatasetError",
        "DatasetFormatError",
        "DatasetNotFoundError",
        "UnknownDatasetError",
        "default_data_dir",
        "load_dataset",
    ),
    "partition": (
        "PARTITION_METHODS",
        "PartitionError",
        "as_generator",
        "bernoulli_dirichlet",
        "dirichlet",
        "iid",
        "k_classes",
        "lognormal_quantity",
        "partition",
        "shards",
    ),
    "noise": (
        "CONTINUOUS_PROTOCOLS",
        "FLIP_TYPES",
        "NOISE_PROTOCOLS",
        "TWO_GROUP_PROTOCOLS",
        "InstanceProbabilities",
        "NoiseError",
        "NoiseReport",
        "flip_labels",
        "inject_noise",
        "instance_probabilities",
        "noise_levels",
    ),
    "models": (
        "MLP",
        "ModelConfigError",
        "SmallCNN",
        "TorchvisionNotInstalledError",
        "build_model",
        "classifier_head",
    ),
    "metrics": (
        "CurveSummary",
        "DetectionOutcome",
        "DetectionScores",
        "MetricInputError",
        "SelectionScores",
        "accuracy",
        "auroc",
        "balanced_accuracy",
        "detection_metrics",
        "detection_scores",
        "label_precision_recall",
        "spearman",
        "summarise_curve",
    ),
}
_MODULE_OF: dict[str, str] = {name: mod for mod, names in _EXPORTS.items() for name in names}

__all__ = [
    "CONTINUOUS_PROTOCOLS",
    "CurveSummary",
    "DATASET_NAMES",
    "DataSplit",
    "Dataset",
    "DatasetChecksumError",
    "DatasetError",
    "DatasetFormatError",
    "DatasetNotFoundError",
    "DetectionOutcome",
    "DetectionScores",
    "FLIP_TYPES",
    "InstanceProbabilities",
    "MLP",
    "MetricInputError",
    "ModelConfigError",
    "NOISE_PROTOCOLS",
    "NoiseError",
    "NoiseReport",
    "PARTITION_METHODS",
    "PartitionError",
    "SelectionScores",
    "SmallCNN",
    "TWO_GROUP_PROTOCOLS",
    "TorchvisionNotInstalledError",
    "UnknownDatasetError",
    "accuracy",
    "as_generator",
    "auroc",
    "balanced_accuracy",
    "bernoulli_dirichlet",
    "build_model",
    "classifier_head",
    "default_data_dir",
    "detection_metrics",
    "detection_scores",
    "dirichlet",
    "flip_labels",
    "iid",
    "inject_noise",
    "instance_probabilities",
    "k_classes",
    "label_precision_recall",
    "load_dataset",
    "lognormal_quantity",
    "noise_levels",
    "partition",
    "shards",
    "spearman",
    "summarise_curve",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
