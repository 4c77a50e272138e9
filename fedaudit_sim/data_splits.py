"""What every data set of the simulator becomes, and the steps every loader ends in.

:class:`Dataset` (one split, scaled) and :class:`DataSplit` (a training split and a clean test
split); the loading errors; :func:`stratified_split` (the seeded, stratified hold-out of the sets
without a published split) and :func:`scaled_split` (the scaling below). The loaders are in
``fedaudit_sim.datasets`` (the built-in sets) and ``fedaudit_sim.custom_data`` (arrays).

Scaling: images are mapped to [0, 1] and then standardised with the training split's scalar pixel
mean and standard deviation (one channel, so one mean and one std, as ``Normalize`` would); tabular
features are standardised per feature with the training split's statistics. The test split is
transformed with the training statistics only, so nothing leaks from it.

Exception tree::

    ValueError
    └── DatasetError
        ├── UnknownDatasetError          (name not in datasets.DATASET_NAMES)
        ├── DatasetNotFoundError         (also a FileNotFoundError)
        ├── DatasetChecksumError         (sha256 differs from the published one)
        └── DatasetFormatError           (the file is not what its README describes)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
from sklearn.model_selection import train_test_split

__all__ = [
    "DataSplit",
    "Dataset",
    "DatasetChecksumError",
    "DatasetError",
    "DatasetFormatError",
    "DatasetNotFoundError",
    "UnknownDatasetError",
    "scaled_split",
    "stratified_split",
]

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]


class DatasetError(ValueError):
    """Base class of every data-set loading error."""


class UnknownDatasetError(DatasetError):
    """The requested data-set name is not one of :data:`DATASET_NAMES`."""


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """A data file (or the data directory) is missing; the message says where we looked."""


class DatasetChecksumError(DatasetError):
    """A data file's sha256 differs from the published checksum."""


class DatasetFormatError(DatasetError):
    """A data file passed its checksum step but does not have the documented layout."""


# eq=False: the fields hold numpy arrays, whose == is elementwise (no usable equality/hash).
@dataclass(frozen=True, eq=False)
class Dataset:
    """One split of a data set, ready for training.

    Attributes
    ----------
    name : str
        Data-set name (one of :data:`DATASET_NAMES`).
    x : numpy.ndarray
        float32 array of shape ``(N, *input_shape)``, already scaled (see the module docstring).
    y : numpy.ndarray
        int64 labels of shape ``(N,)`` in ``[0, num_classes)``.
    num_classes : int
        Number of classes of the task (not of this split: a split may miss a class).
    input_shape : tuple of int
        Shape of one sample, ``(1, 8, 8)`` for digits, ``(30,)`` for breast cancer, ...
    class_names : tuple of str
        Human-readable name of each class, indexed by label.
    kind : {"image", "tabular"}
        Image sets are ``(channels, height, width)``; tabular sets are ``(features,)``.
    """

    name: str
    x: FloatArray
    y: IntArray
    num_classes: int
    input_shape: tuple[int, ...]
    class_names: tuple[str, ...]
    kind: Literal["image", "tabular"]

    def __len__(self) -> int:
        return int(self.y.shape[0])


# eq=False: the fields hold numpy arrays, whose == is elementwise (no usable equality/hash).
@dataclass(frozen=True, eq=False)
class DataSplit:
    """A training split and a clean held-out test split of one data set."""

    train: Dataset
    test: Dataset


def stratified_split(
    x: npt.NDArray[np.float64], y: IntArray, test_fraction: float, seed: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], IntArray, IntArray]:
    """``x_train, x_test, y_train, y_test``: ``test_fraction`` held out, stratified by label,
    drawn with ``seed`` (``sklearn.model_selection.train_test_split``)."""
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y
    )
    return x_tr, x_te, y_tr, y_te


def scaled_split(
    name: str,
    x_tr: npt.NDArray[np.float64],
    y_tr: IntArray,
    x_te: npt.NDArray[np.float64],
    y_te: IntArray,
    num_classes: int,
    class_names: tuple[str, ...],
    kind: Literal["image", "tabular"],
) -> DataSplit:
    """The :class:`DataSplit` of these arrays, scaled with the training split's statistics
    (module docstring)."""
    if kind == "image":
        # One channel: a single scalar mean/std over all training pixels.
        mean: float | npt.NDArray[np.float64] = float(x_tr.mean())
        std: float | npt.NDArray[np.float64] = float(x_tr.std())
        if std == 0.0:
            std = 1.0
    else:
        mean = x_tr.mean(axis=0)
        std = x_tr.std(axis=0)
        # A constant feature carries no information; dividing by 1 keeps it at 0 instead of NaN.
        std = np.where(std == 0.0, 1.0, std)
    input_shape = tuple(int(d) for d in x_tr.shape[1:])

    def make(x: npt.NDArray[np.float64], y: IntArray) -> Dataset:
        """One scaled split."""
        return Dataset(
            name=name,
            x=np.ascontiguousarray((x - mean) / std, dtype=np.float32),
            y=np.ascontiguousarray(y, dtype=np.int64),
            num_classes=num_classes,
            input_shape=input_shape,
            class_names=class_names,
            kind=kind,
        )

    return DataSplit(train=make(x_tr, y_tr), test=make(x_te, y_te))
