"""Offline data sets for the simulator (docs/evaluation.md, "How the figures are made").

Three scikit-learn bundles (``digits``, ``breast_cancer``, ``wine``) that ship inside the wheel, and
three real image sets read from a directory (``pneumoniamnist``, ``breastmnist`` and the MNIST
**test set** ``mnist``; see ``shared/data/*/README.md`` beside the repository). Nothing is ever
downloaded: every file is checked against the sha256 of the table in ``shared/data/README.md``
before it is parsed.

:func:`load_dataset` loads one of them as a :class:`~fedaudit_sim.data_splits.DataSplit`.
Custom data sets (scenario ``dataset: custom``) come from arrays: ``fedaudit_sim.custom_data``
(:func:`load_npz`, :func:`load_callable`, :func:`split_arrays`). The scaling and the exception
tree are described in ``fedaudit_sim.data_splits``.

This module is the data-set API of docs/design/simulation-api.md: it re-exports the split types,
the errors and the custom loaders, so ``from fedaudit_sim.datasets import DataSplit, load_npz``
keeps working.
"""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path
from typing import Final, Literal

import numpy as np
import numpy.typing as npt
from sklearn.datasets import load_breast_cancer, load_digits, load_wine

from fedaudit_sim.custom_data import load_callable, load_npz, split_arrays
from fedaudit_sim.data_splits import (
    Dataset,
    DatasetChecksumError,
    DatasetError,
    DatasetFormatError,
    DatasetNotFoundError,
    DataSplit,
    UnknownDatasetError,
    scaled_split,
    stratified_split,
)

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


def default_data_dir() -> Path | None:
    """Return the default directory of the file-based data sets.

    The environment variable ``FEDAUDIT_DATASETS_DIR`` wins; otherwise ``<repo>/../shared/data``
    when that directory exists; otherwise ``None``.
    """
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env)
    candidate = _beside_repository()
    return candidate if candidate.is_dir() else None


def _beside_repository() -> Path:
    """``shared/data`` beside the repository this package sits in (``<repo>/../shared/data``)."""
    return Path(__file__).resolve().parents[1].parent / "shared" / "data"


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
    x_tr, x_te, y_tr, y_te = stratified_split(x_all, y_all, test_fraction, seed)
    return scaled_split(name, x_tr, y_tr, x_te, y_te, len(class_names), class_names, kind)


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
            here = _beside_repository()
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
    return scaled_split(
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
    x_tr, x_te, y_tr, y_te = stratified_split(x_all, y_all, test_fraction, seed)
    class_names = tuple(str(d) for d in range(10))
    return scaled_split("mnist", x_tr, y_tr, x_te, y_te, 10, class_names, "image")
