"""Offline data sets for the simulator (docs/evaluation.md, "How the figures are made").

Three scikit-learn bundles (``digits``, ``breast_cancer``, ``wine``) that ship inside the wheel, and
three real image sets read from a directory (``pneumoniamnist``, ``breastmnist`` and the MNIST
**test set** ``mnist``; see ``shared/data/*/README.md`` beside the repository). Nothing is ever
downloaded: every file is checked against the sha256 of the table in ``shared/data/README.md``
before it is parsed.

Custom data sets (scenario ``dataset: custom``) come from arrays: :func:`load_npz` reads an ``.npz``
file, :func:`load_callable` calls a Python function named ``module:function`` (or
``path/to/file.py:function``), and both end in :func:`split_arrays`. The contract:

- ``x``: numbers, shape ``(n, features)`` (tabular), ``(n, H, W)`` (one-channel images; a channel
  axis is added) or ``(n, C, H, W)`` (images); finite values.
- ``y``: integer labels, shape ``(n,)``, in ``0..num_classes-1`` (``num_classes`` defaults to the
  largest label + 1, over the training and test labels).
- A test split may be given (``x_test``/``y_test`` in the ``.npz``; the callable returns
  ``((x_train, y_train), (x_test, y_test))``); otherwise a seeded, stratified split holds out
  ``test_fraction`` of the samples (``sklearn.model_selection.train_test_split`` with
  ``stratify=y`` and the run's seed, as for the built-in sets without a published split).
- The callable is called with the scenario's ``params`` as keyword arguments and returns
  ``(x, y)`` or the train/test pair; it should be deterministic (pass a seed in ``params`` if it
  draws anything).

Custom arrays are scaled like the built-in sets (below) unless ``standardize`` is false: images
with the training split's scalar mean and std, tabular features per feature.

Scaling: images are mapped to [0, 1] and then standardised with the training split's scalar pixel
mean and standard deviation (one channel, so one mean and one std, as ``Normalize`` would); tabular
features are standardised per feature with the training split's statistics. The test split is
transformed with the training statistics only, so nothing leaks from it.

Exception tree::

    ValueError
    └── DatasetError
        ├── UnknownDatasetError          (name not in DATASET_NAMES)
        ├── DatasetNotFoundError         (also a FileNotFoundError)
        ├── DatasetChecksumError         (sha256 differs from the published one)
        └── DatasetFormatError           (the file is not what its README describes)
"""

from __future__ import annotations

import gzip
import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt
from sklearn.datasets import load_breast_cancer, load_digits, load_wine
from sklearn.model_selection import train_test_split

__all__ = [
    "DATASET_NAMES",
    "DATA_DIR_ENV",
    "FILE_SHA256",
    "DataSplit",
    "Dataset",
    "DatasetChecksumError",
    "DatasetError",
    "DatasetFormatError",
    "DatasetNotFoundError",
    "UnknownDatasetError",
    "default_data_dir",
    "load_callable",
    "load_dataset",
    "load_npz",
    "sha256_file",
    "split_arrays",
    "verify_sha256",
]

DATA_DIR_ENV: Final = "FEDAUDIT_DATASETS_DIR"

#: Published sha256 of every file the loaders read, keyed by path relative to the data directory
#: (``shared/data/README.md``).
FILE_SHA256: Final[dict[str, str]] = {
    "pneumoniamnist/pneumoniamnist.npz": (
        "e1792d3f03751cb101e99f19a63b3c1941436c988665f47853417b05be250cd8"
    ),
    "breastmnist/breastmnist.npz": (
        "3a22d2a4625e7dd8903f0f59030e81a3d0c222bece2e5e10927456cb50efdec1"
    ),
    "mnist/t10k-images-idx3-ubyte.gz": (
        "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6"
    ),
    "mnist/t10k-labels-idx1-ubyte.gz": (
        "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"
    ),
}

_SKLEARN_NAMES: Final = ("digits", "breast_cancer", "wine")
_FILE_NAMES: Final = ("pneumoniamnist", "breastmnist", "mnist")
DATASET_NAMES: Final[tuple[str, ...]] = _SKLEARN_NAMES + _FILE_NAMES

_MEDMNIST_CLASS_NAMES: Final[dict[str, tuple[str, ...]]] = {
    # Label order as published (the READMEs): note BreastMNIST's 0 is malignant.
    "pneumoniamnist": ("normal", "pneumonia"),
    "breastmnist": ("malignant", "normal_or_benign"),
}
_IDX_IMAGES_MAGIC: Final = 0x00000803
_IDX_LABELS_MAGIC: Final = 0x00000801

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


def default_data_dir() -> Path | None:
    """Return the default directory of the file-based data sets.

    The environment variable ``FEDAUDIT_DATASETS_DIR`` wins; otherwise ``<repo>/../shared/data``
    when that directory exists; otherwise ``None``.
    """
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2]
    candidate = repo.parent / "shared" / "data"
    return candidate if candidate.is_dir() else None


def sha256_file(path: Path) -> str:
    """Return the hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_sha256(path: Path, expected: str) -> None:
    """Check that ``path`` exists and has the sha256 ``expected``.

    Raises
    ------
    DatasetNotFoundError
        The file does not exist.
    DatasetChecksumError
        The file's sha256 differs from ``expected``.
    """
    if not path.is_file():
        raise DatasetNotFoundError(
            f"data file {str(path)!r} not found; point data_dir (or the {DATA_DIR_ENV} environment "
            "variable) at the directory that holds the shared data sets"
        )
    actual = sha256_file(path)
    if actual != expected.lower():
        raise DatasetChecksumError(
            f"sha256 of {str(path)!r} is {actual}, expected {expected}: the file is corrupt or not "
            "the published one"
        )


def load_dataset(
    name: str,
    *,
    data_dir: Path | str | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> DataSplit:
    """Load a data set as a scaled training split and a clean test split.

    Parameters
    ----------
    name : str
        One of ``digits``, ``breast_cancer``, ``wine`` (scikit-learn bundles), ``pneumoniamnist``,
        ``breastmnist`` (MedMNIST ``.npz``; train + val become the training split, test the test
        split) or ``mnist`` (the MNIST test set only, IDX files).
    data_dir : pathlib.Path or str, optional
        Directory holding ``<name>/...`` for the file-based sets. Defaults to
        :func:`default_data_dir`. Ignored by the scikit-learn sets.
    test_fraction : float
        Fraction of samples in the held-out test split, in (0, 1), for the sets without a
        published split (the scikit-learn sets and ``mnist``). The split is stratified by label.
        The MedMNIST sets keep their published split and ignore it.
    seed : int
        Seed of the stratified split.

    Returns
    -------
    DataSplit

    Raises
    ------
    UnknownDatasetError
        ``name`` is not a known data set.
    DatasetNotFoundError
        No data directory, or a file is missing.
    DatasetChecksumError
        A file's sha256 differs from the published one.
    DatasetFormatError
        A file does not have the documented layout.
    ValueError
        ``test_fraction`` is not in (0, 1) or ``seed`` is not a non-negative int.
    """
    if name not in DATASET_NAMES:
        raise UnknownDatasetError(
            f"name={name!r} is not a known data set; choose one of {', '.join(DATASET_NAMES)}"
        )
    if isinstance(test_fraction, bool) or not 0.0 < float(test_fraction) < 1.0:
        raise DatasetError(f"test_fraction={test_fraction!r} must lie strictly between 0 and 1")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise DatasetError(f"seed={seed!r} must be a non-negative int")
    if name in _SKLEARN_NAMES:
        return _load_sklearn(name, float(test_fraction), int(seed))
    root = _resolve_data_dir(data_dir, name)
    if name == "mnist":
        return _load_mnist(root, float(test_fraction), int(seed))
    return _load_medmnist(name, root)


# --------------------------------------------------------------------------------------------
# scikit-learn bundles


def _load_sklearn(name: str, test_fraction: float, seed: int) -> DataSplit:
    if name == "digits":
        bunch = load_digits()
        # Digits pixels are integers 0..16.
        x_all = (np.asarray(bunch.images, dtype=np.float64) / 16.0)[:, None, :, :]
        class_names = tuple(str(c) for c in bunch.target_names)
        kind: Literal["image", "tabular"] = "image"
    else:
        bunch = load_breast_cancer() if name == "breast_cancer" else load_wine()
        x_all = np.asarray(bunch.data, dtype=np.float64)
        class_names = tuple(str(c) for c in bunch.target_names)
        kind = "tabular"
    y_all = np.asarray(bunch.target, dtype=np.int64)
    x_tr, x_te, y_tr, y_te = _stratified_split(x_all, y_all, test_fraction, seed)
    return _finish(name, x_tr, y_tr, x_te, y_te, len(class_names), class_names, kind)


# --------------------------------------------------------------------------------------------
# file-based sets


_WHERE_TO_POINT = (
    "pass data_dir= (fedaudit simulate: --datasets-dir, or data_dir in a scenario file) or set "
    f"{DATA_DIR_ENV}"
)
"""How to point the loaders at the data files, in the not-found errors."""


def _resolve_data_dir(data_dir: Path | str | None, name: str) -> Path:
    if data_dir is None:
        found = default_data_dir()
        if found is None:
            here = Path(__file__).resolve().parents[2].parent / "shared" / "data"
            raise DatasetNotFoundError(
                f"data set {name!r} needs its files but no data directory was found: "
                f"{DATA_DIR_ENV} is not set and {str(here)!r} does not exist; {_WHERE_TO_POINT} "
                f"to the directory holding {name}/"
            )
        return found
    return Path(data_dir)


def _checked_file(root: Path, relative: str) -> Path:
    path = root / relative
    if not path.is_file():
        raise DatasetNotFoundError(
            f"data file {str(path)!r} not found (looked in data_dir={str(root)!r}); "
            f"{_WHERE_TO_POINT} to the directory that holds {relative.split('/')[0]}/"
        )
    verify_sha256(path, FILE_SHA256[relative])
    return path


def _load_medmnist(name: str, root: Path) -> DataSplit:
    path = _checked_file(root, f"{name}/{name}.npz")
    keys = (
        "train_images",
        "train_labels",
        "val_images",
        "val_labels",
        "test_images",
        "test_labels",
    )
    # allow_pickle stays False (the default): the archive holds plain uint8 arrays.
    with np.load(path, allow_pickle=False) as archive:
        missing = [k for k in keys if k not in archive.files]
        if missing:
            raise DatasetFormatError(f"{str(path)!r} lacks the arrays {missing}")
        arrays = {k: np.asarray(archive[k]) for k in keys}
    x_tr = np.concatenate([arrays["train_images"], arrays["val_images"]])
    y_tr = np.concatenate([arrays["train_labels"].ravel(), arrays["val_labels"].ravel()])
    x_te, y_te = arrays["test_images"], arrays["test_labels"].ravel()
    for x, y in ((x_tr, y_tr), (x_te, y_te)):
        if x.ndim != 3 or x.shape[1:] != (28, 28) or x.shape[0] != y.shape[0]:
            raise DatasetFormatError(
                f"{str(path)!r} does not hold (N, 28, 28) images with N labels"
            )
    class_names = _MEDMNIST_CLASS_NAMES[name]
    return _finish(
        name,
        (x_tr.astype(np.float64) / 255.0)[:, None, :, :],
        y_tr.astype(np.int64),
        (x_te.astype(np.float64) / 255.0)[:, None, :, :],
        y_te.astype(np.int64),
        len(class_names),
        class_names,
        "image",
    )


def _read_idx(path: Path, magic: int, ndim: int) -> npt.NDArray[np.uint8]:
    """Parse a gzip-compressed IDX file of unsigned bytes (big-endian header)."""
    with gzip.open(path, "rb") as handle:
        raw = handle.read()
    header_len = 4 + 4 * ndim
    if len(raw) < header_len:
        raise DatasetFormatError(f"{str(path)!r} is too short to be an IDX file")
    header = np.frombuffer(raw, dtype=">u4", count=1 + ndim)
    if int(header[0]) != magic:
        raise DatasetFormatError(
            f"{str(path)!r} has IDX magic 0x{int(header[0]):08x}, expected 0x{magic:08x}"
        )
    dims = tuple(int(d) for d in header[1:])
    data = np.frombuffer(raw, dtype=np.uint8, offset=header_len)
    if data.size != int(np.prod(dims)):
        raise DatasetFormatError(f"{str(path)!r} holds {data.size} bytes, header says {dims}")
    return data.reshape(dims)


def _load_mnist(root: Path, test_fraction: float, seed: int) -> DataSplit:
    images = _read_idx(
        _checked_file(root, "mnist/t10k-images-idx3-ubyte.gz"), _IDX_IMAGES_MAGIC, ndim=3
    )
    labels = _read_idx(
        _checked_file(root, "mnist/t10k-labels-idx1-ubyte.gz"), _IDX_LABELS_MAGIC, ndim=1
    )
    if images.shape[0] != labels.shape[0] or images.shape[1:] != (28, 28):
        raise DatasetFormatError("MNIST images and labels disagree in count or image size")
    x_all = (images.astype(np.float64) / 255.0)[:, None, :, :]
    y_all = labels.astype(np.int64)
    x_tr, x_te, y_tr, y_te = _stratified_split(x_all, y_all, test_fraction, seed)
    class_names = tuple(str(d) for d in range(10))
    return _finish("mnist", x_tr, y_tr, x_te, y_te, 10, class_names, "image")


# --------------------------------------------------------------------------------------------
# shared steps


def _stratified_split(
    x: npt.NDArray[np.float64], y: IntArray, test_fraction: float, seed: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], IntArray, IntArray]:
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y
    )
    return x_tr, x_te, y_tr, y_te


def _finish(
    name: str,
    x_tr: npt.NDArray[np.float64],
    y_tr: IntArray,
    x_te: npt.NDArray[np.float64],
    y_te: IntArray,
    num_classes: int,
    class_names: tuple[str, ...],
    kind: Literal["image", "tabular"],
) -> DataSplit:
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


# --------------------------------------------------------------------------------------------
# custom data sets from arrays


def _custom_features(name: str, value: Any) -> tuple[npt.NDArray[np.float64], bool]:
    """``value`` as float64 features and whether they are images (module docstring)."""
    try:
        x = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DatasetFormatError(f"{name} must be an array of numbers: {exc}") from None
    if x.ndim == 2:
        image = False
    elif x.ndim == 3:
        x, image = x[:, None, :, :], True
    elif x.ndim == 4:
        image = True
    else:
        raise DatasetFormatError(
            f"{name} has shape {x.shape}; expected (n, features), (n, H, W) or (n, C, H, W)"
        )
    if x.shape[0] == 0 or any(d < 1 for d in x.shape[1:]):
        raise DatasetFormatError(f"{name} has shape {x.shape}: no samples or an empty axis")
    if not np.all(np.isfinite(x)):
        raise DatasetFormatError(f"{name} holds NaN or infinite values")
    return x, image


def _custom_labels(name: str, value: Any, n: int) -> IntArray:
    y = np.asarray(value)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]  # (n, 1), as MedMNIST stores them
    if y.ndim != 1:
        raise DatasetFormatError(f"{name} must be 1-D labels, got shape {y.shape}")
    if y.dtype == np.bool_ or not np.issubdtype(y.dtype, np.integer):
        raise DatasetFormatError(f"{name} must hold integer class labels, got dtype {y.dtype}")
    if y.shape[0] != n:
        raise DatasetFormatError(f"{name} has {y.shape[0]} labels for {n} samples")
    if int(y.min()) < 0:
        raise DatasetFormatError(f"{name} has a negative label ({int(y.min())}); use 0..C-1")
    return y.astype(np.int64)


def split_arrays(
    x: Any,
    y: Any,
    *,
    x_test: Any | None = None,
    y_test: Any | None = None,
    name: str = "custom",
    test_fraction: float = 0.2,
    seed: int = 0,
    num_classes: int | None = None,
    class_names: tuple[str, ...] | list[str] | None = None,
    standardize: bool = True,
) -> DataSplit:
    """A :class:`DataSplit` from arrays (the contract is in the module docstring).

    Parameters
    ----------
    x, y : array_like
        Features and integer labels of the training split, or of all samples when no test
        split is given.
    x_test, y_test : array_like, optional
        A given test split (both or neither).
    name : str
        The data set's name in the results.
    test_fraction : float
        Held-out fraction of the seeded stratified split when no test split is given.
    seed : int
        Seed of that split.
    num_classes : int, optional
        Number of classes C; default the largest label + 1.
    class_names : sequence of str, optional
        One name per class; default ``"0"``, ``"1"``, ...
    standardize : bool
        Scale like the built-in sets (module docstring); False keeps the values as given.

    Raises
    ------
    DatasetFormatError
        An array breaks the contract, or the stratified split is impossible (a class with a
        single sample, a test split smaller than the number of classes).
    """
    x_all, image = _custom_features("x", x)
    y_all = _custom_labels("y", y, x_all.shape[0])
    if (x_test is None) != (y_test is None):
        raise DatasetFormatError("give both x_test and y_test, or neither")
    if x_test is not None:
        x_te, image_te = _custom_features("x_test", x_test)
        y_te = _custom_labels("y_test", y_test, x_te.shape[0])
        if x_te.shape[1:] != x_all.shape[1:] or image_te != image:
            raise DatasetFormatError(
                f"x_test samples have shape {x_te.shape[1:]}, x samples {x_all.shape[1:]}"
            )
        x_tr, y_tr = x_all, y_all
    else:
        if isinstance(test_fraction, bool) or not 0.0 < float(test_fraction) < 1.0:
            raise DatasetError(f"test_fraction={test_fraction!r} must lie strictly between 0 and 1")
        try:
            x_tr, x_te, y_tr, y_te = _stratified_split(x_all, y_all, float(test_fraction), seed)
        except ValueError as exc:
            raise DatasetFormatError(
                f"the seeded stratified split (test_fraction={test_fraction}) is impossible: "
                f"{exc}; give a test split or more samples per class"
            ) from None
    largest = int(max(y_tr.max(), y_te.max()))
    if num_classes is None:
        classes = largest + 1
    else:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise DatasetFormatError(f"num_classes={num_classes!r} must be an int >= 1")
        if largest >= num_classes:
            raise DatasetFormatError(
                f"label {largest} is outside 0..{num_classes - 1} (num_classes={num_classes})"
            )
        classes = num_classes
    if class_names is None:
        names = tuple(str(c) for c in range(classes))
    else:
        names = tuple(str(c) for c in class_names)
        if len(names) != classes:
            raise DatasetFormatError(f"{len(names)} class_names for {classes} classes")
    kind: Literal["image", "tabular"] = "image" if image else "tabular"
    if not standardize:
        return DataSplit(
            train=_dataset(name, x_tr, y_tr, classes, names, kind),
            test=_dataset(name, x_te, y_te, classes, names, kind),
        )
    return _finish(name, x_tr, y_tr, x_te, y_te, classes, names, kind)


def _dataset(
    name: str,
    x: npt.NDArray[np.float64],
    y: IntArray,
    num_classes: int,
    class_names: tuple[str, ...],
    kind: Literal["image", "tabular"],
) -> Dataset:
    return Dataset(
        name=name,
        x=np.ascontiguousarray(x, dtype=np.float32),
        y=np.ascontiguousarray(y, dtype=np.int64),
        num_classes=num_classes,
        input_shape=tuple(int(d) for d in x.shape[1:]),
        class_names=class_names,
        kind=kind,
    )


_NPZ_KEYS: Final = frozenset({"x", "y", "x_test", "y_test"})


def load_npz(path: Path | str, *, name: str | None = None, **options: Any) -> DataSplit:
    """A custom data set from an ``.npz`` file with arrays ``x``, ``y`` and optionally
    ``x_test``, ``y_test`` (no other arrays); ``options`` as for :func:`split_arrays`.

    Raises
    ------
    DatasetNotFoundError
        The file does not exist.
    DatasetFormatError
        Not a readable ``.npz``, missing or unexpected arrays, or arrays that break the contract.
    """
    file = Path(path)
    if not file.is_file():
        raise DatasetNotFoundError(f"npz file {str(file)!r} not found")
    try:
        # allow_pickle=False: object arrays (which could run code when loaded) are refused.
        with np.load(file, allow_pickle=False) as archive:
            keys = set(archive.files)
            missing = sorted({"x", "y"} - keys)
            unexpected = sorted(keys - _NPZ_KEYS)
            if missing or unexpected:
                raise DatasetFormatError(
                    f"{str(file)!r} must hold the arrays x and y (optionally x_test and y_test); "
                    + (f"missing {missing}" if missing else "")
                    + ("; " if missing and unexpected else "")
                    + (f"unexpected {unexpected}" if unexpected else "")
                )
            arrays = {key: np.asarray(archive[key]) for key in keys}
    except (OSError, ValueError) as exc:
        if isinstance(exc, DatasetError):
            raise
        raise DatasetFormatError(f"{str(file)!r} is not a readable .npz file: {exc}") from None
    return split_arrays(
        arrays["x"],
        arrays["y"],
        x_test=arrays.get("x_test"),
        y_test=arrays.get("y_test"),
        name=name or file.stem,
        **options,
    )


def _resolve_callable(target: str) -> Any:
    """The function that ``module:function`` or ``path/file.py:function`` names."""
    module_name, sep, attribute = target.rpartition(":")
    if not sep or not module_name or not attribute:
        raise DatasetFormatError(
            f"callable {target!r} must be 'module:function' or 'path/to/file.py:function'"
        )
    if module_name.endswith(".py"):
        file = Path(module_name)
        if not file.is_file():
            raise DatasetNotFoundError(f"callable {target!r}: file {module_name!r} not found")
        spec = importlib.util.spec_from_file_location(f"_fedaudit_data_{file.stem}", file)
        if spec is None or spec.loader is None:
            raise DatasetFormatError(f"callable {target!r}: {module_name!r} cannot be imported")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        # The working directory is searched too (a console script's sys.path lacks it).
        added = os.getcwd() not in sys.path
        if added:
            sys.path.append(os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise DatasetNotFoundError(
                f"callable {target!r}: module {module_name!r} cannot be imported ({exc})"
            ) from None
        finally:
            if added:
                sys.path.remove(os.getcwd())
    function = getattr(module, attribute, None)
    if function is None or not callable(function):
        raise DatasetFormatError(
            f"callable {target!r}: {module_name!r} has no function {attribute!r}"
        )
    return function


def load_callable(
    target: str,
    params: Mapping[str, Any] | None = None,
    *,
    name: str | None = None,
    **options: Any,
) -> DataSplit:
    """A custom data set returned by the function ``target`` names, called with ``params``.

    The function returns ``(x, y)`` (split by the seeded stratified split) or
    ``((x_train, y_train), (x_test, y_test))``; ``options`` as for :func:`split_arrays`.

    Raises
    ------
    DatasetNotFoundError
        The module or file cannot be found.
    DatasetFormatError
        No such function, it raised, or it returned something else than the contract says.
    """
    function = _resolve_callable(target)
    try:
        result = function(**dict(params or {}))
    except Exception as exc:
        raise DatasetFormatError(f"callable {target!r} raised {type(exc).__name__}: {exc}") from exc
    shape = "(x, y) or ((x_train, y_train), (x_test, y_test))"
    if not isinstance(result, tuple | list) or len(result) != 2:
        raise DatasetFormatError(
            f"callable {target!r} returned {type(result).__name__}; expected {shape}"
        )
    first, second = result
    label = name or target.rpartition(":")[2]
    if isinstance(first, tuple | list):
        if not (isinstance(second, tuple | list) and len(first) == 2 and len(second) == 2):
            raise DatasetFormatError(
                f"callable {target!r} returned a malformed pair; expected {shape}"
            )
        return split_arrays(
            first[0], first[1], x_test=second[0], y_test=second[1], name=label, **options
        )
    return split_arrays(first, second, name=label, **options)
