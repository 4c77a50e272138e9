"""The update geometry's consensus terms of a blocked pass (:mod:`service.audit.blocks`).

Per block ``X @ S_b`` and ``||S_b||^2`` for the consensus difference ``S = sum_j c_j (theta_j -
theta_G)`` (:mod:`service.audit.geometry_evidence`), added to the totals in a serial pass's
order."""

from __future__ import annotations

import numpy as np

from service.audit._typing import AnyArray, FloatArray

__all__ = ["Consensus", "ConsensusParts"]


class ConsensusParts:
    """One tensor's blocks' terms of the consensus geometry, kept in block order so that the
    pass adds them to the totals in the order a serial pass would (the totals do not depend on
    which thread computed which tensor)."""

    def __init__(self, weights: FloatArray) -> None:
        self.weights = weights
        self.terms: list[tuple[FloatArray, float]] = []

    def add(self, x: AnyArray) -> None:
        """One block X (K x b): S_b = c @ X, then X @ S_b and ||S_b||^2 (two GEMVs)."""
        s = self.weights.astype(x.dtype) @ x
        self.terms.append(((x @ s).astype(np.float64), float(np.dot(s, s))))


class Consensus:
    """Running totals of the consensus geometry (clients in the pass's ``order``)."""

    def __init__(self, weights: FloatArray, k: int) -> None:
        self.weights = weights
        self.dots = np.zeros(k)
        self.norm2 = 0.0

    def replay(self, parts: ConsensusParts) -> None:
        """Add one tensor's block terms, in block order."""
        for dots, norm2 in parts.terms:
            self.dots += dots
            self.norm2 += norm2

    def dots_by_client(self, order: AnyArray) -> FloatArray:
        """The dot products per client, from the pass's ``order`` back to client order."""
        result = np.zeros_like(self.dots)
        result[order] = self.dots
        return result
