"""Array type aliases shared by the audit core (Flower style).

Every public function of :mod:`service.audit` takes and returns numpy arrays; these aliases keep
the signatures short and make the dtype explicit.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["AnyArray", "BoolArray", "FloatArray", "IntArray"]

FloatArray = npt.NDArray[np.float64]
"""A float64 array."""

IntArray = npt.NDArray[np.int64]
"""An int64 array."""

BoolArray = npt.NDArray[np.bool_]
"""A boolean array."""

AnyArray = npt.NDArray[Any]
"""An array of any dtype (model tensors keep their own dtype)."""
