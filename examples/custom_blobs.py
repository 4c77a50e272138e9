"""A custom data set for ``fedaudit simulate`` (``examples/simulate_custom.yaml``).

``custom_data.function: examples/custom_blobs.py:blobs`` names this function; the scenario's
``custom_data.params`` are its keyword arguments. It returns ``(x, y)``: features of shape
``(n, features)`` and integer labels ``0..classes-1``; the simulator holds out a seeded,
stratified test split. (Return ``((x_train, y_train), (x_test, y_test))`` to give the split.)
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def blobs(
    n_per_class: int = 60, classes: int = 4, features: int = 8, seed: int = 0
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """``n_per_class`` Gaussian samples per class around a random centre per class."""
    gen = np.random.default_rng(seed)
    centres = gen.normal(scale=2.0, size=(classes, features))
    y = np.repeat(np.arange(classes, dtype=np.int64), n_per_class)
    x = centres[y] + gen.normal(size=(y.size, features))
    return x, y
