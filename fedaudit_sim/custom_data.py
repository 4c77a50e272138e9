"""Custom data sets from arrays (scenario ``dataset: custom``).

:func:`load_npz` reads an ``.npz`` file, :func:`load_callable` calls a Python function named
``module:function`` (or ``path/to/file.py:function``), and both end in :func:`split_arrays`.
The contract:

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

Custom arrays are scaled like the built-in sets (``fedaudit_sim.data_splits``) unless
``standardize`` is false: images with the training split's scalar mean and std, tabular features
per feature.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from fedaudit_sim.data_splits import (
    Dataset,
    DatasetError,
    DatasetFormatError,
    DatasetNotFoundError,
    DataSplit,
    scaled_split,
    stratified_split,
)

__all__ = [
    "load_callable",
    "load_npz",
    "split_arrays",
]

IntArray = npt.NDArray[np.int64]


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
    """``value`` as int64 labels of ``n`` samples (module docstring)."""
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
            x_tr, x_te, y_tr, y_te = stratified_split(x_all, y_all, float(test_fraction), seed)
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
    return scaled_split(name, x_tr, y_tr, x_te, y_te, classes, names, kind)


def _dataset(
    name: str,
    x: npt.NDArray[np.float64],
    y: IntArray,
    num_classes: int,
    class_names: tuple[str, ...],
    kind: Literal["image", "tabular"],
) -> Dataset:
    """One split of these arrays, as given (no scaling)."""
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
