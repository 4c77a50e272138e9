"""One pass over the round's updates, shared by the Fed-NCL divergence and the aggregation
(:func:`service.audit.blocks.stream_pass` does the reading)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from service.audit._typing import AnyArray, FloatArray
from service.audit.blocks import StreamResult, stream_pass
from service.audit.state import StateReader

__all__ = ["RoundPass"]


class RoundPass:
    """The reads of one round close, shared by the Fed-NCL divergence and the aggregation.

    What the round will need is declared up front (``gram`` for DaAgg, ``weights`` for a rule
    whose weights do not depend on the detectors, such as FedAvg). When the divergences are
    asked for (:meth:`squared`, the Fed-NCL detector, which runs before the aggregation), one
    :func:`stream_pass` computes them together with everything declared and keeps the small
    results (per tensor: K squared distances, a K x K Gram matrix) and the weighted state. A
    request that pass cannot serve (other weights, no Gram matrix declared), or any request
    when the divergences were never asked for, runs the pass that request alone needs, as it
    would without sharing. ``passes`` counts the passes made.

    Parameters
    ----------
    global_state, updates
        As for :func:`stream_pass`.
    gram : bool, default=False
        Compute the Gram matrices in the first pass (DaAgg's distances for any noisy set).
    weights : ndarray of shape (K,), optional
        Weights of the weighted state to compute in the first pass.
    chosen : int, default=0
        Client whose non-float tensors the weighted state copies.
    consensus : ndarray of shape (K,), optional
        Weights of the consensus difference whose dot products the first pass also computes
        (:meth:`consensus`, the update geometry).
    """

    def __init__(
        self,
        global_state: StateReader,
        updates: Sequence[StateReader],
        *,
        gram: bool = False,
        weights: FloatArray | None = None,
        chosen: int = 0,
        consensus: FloatArray | None = None,
    ) -> None:
        self.global_state = global_state
        self.updates = list(updates)
        self._gram = gram
        self._consensus = None if consensus is None else np.asarray(consensus, dtype=np.float64)
        self._weights = None if weights is None else np.asarray(weights, dtype=np.float64)
        self._chosen = chosen
        self._first: StreamResult | None = None
        self.passes = 0

    def _run_first(self) -> StreamResult:
        if self._first is None:
            self._first = stream_pass(
                self.global_state,
                self.updates,
                distances=True,
                gram=self._gram,
                weights=self._weights,
                chosen=self._chosen,
                consensus=self._consensus,
            )
            self.passes += 1
        return self._first

    def consensus(self) -> tuple[FloatArray, FloatArray, float] | None:
        """Per client ``||theta_k - theta_G||^2`` and ``(theta_k - theta_G) . S``, and ``||S||^2``
        (float tensors; ``S`` the consensus difference); None when no weights were declared."""
        first = self._run_first() if self._consensus is not None else None
        if first is None or first.squared is None or first.consensus_dots is None:
            return None
        return first.squared.sum(axis=0), first.consensus_dots, float(first.consensus_norm2 or 0)

    def squared(self) -> tuple[list[str], FloatArray]:
        """Float tensor names and ``||theta_k[l] - theta_G[l]||^2`` (tensors x clients)."""
        first = self._run_first()
        assert first.squared is not None
        return first.float_names, first.squared

    def pair_squared(
        self,
        noisy: Sequence[int],
        clean: Sequence[int],
        clean_weights: FloatArray | None = None,
    ) -> tuple[FloatArray, dict[str, AnyArray] | None]:
        """Squared distances between each noisy and each clean client, per float tensor; with
        ``clean_weights`` (0 for every noisy client) also the state they weight (its non-float
        tensors the largest weight's), where the distances take a pass of their own (None where
        they come from the Gram matrices)."""
        if not self._gram or self._first is None:
            self.passes += 1
            result = stream_pass(
                self.global_state,
                self.updates,
                pairs=(noisy, clean),
                weights=clean_weights,
                chosen=0 if clean_weights is None else int(np.argmax(clean_weights)),
            )
            assert result.pair_squared is not None
            return result.pair_squared, result.state
        first = self._run_first()
        assert first.gram is not None
        g = first.gram
        n_idx = np.asarray(noisy, dtype=np.int64)
        c_idx = np.asarray(clean, dtype=np.int64)
        diag = np.diagonal(g, axis1=1, axis2=2)
        squared = diag[:, n_idx, None] + diag[:, None, c_idx] - 2.0 * g[:, n_idx][:, :, c_idx]
        result_pairs: FloatArray = np.maximum(squared, 0.0)
        return result_pairs, None

    def weighted(self, weights: FloatArray, chosen: int) -> dict[str, AnyArray]:
        """The weighted state: from the first pass when it had these weights, else a pass."""
        if (
            self._first is not None
            and self._weights is not None
            and chosen == self._chosen
            and np.array_equal(np.asarray(weights, dtype=np.float64), self._weights)
        ):
            first = self._run_first()
            assert first.state is not None
            return first.state
        self.passes += 1
        result = stream_pass(self.global_state, self.updates, weights=weights, chosen=chosen)
        assert result.state is not None
        return result.state

    def layer_weighted(
        self, layer_weights: Mapping[str, FloatArray], chosen: int
    ) -> dict[str, AnyArray]:
        """The state weighted per float tensor (the layer-wise rule): always a pass of its own
        (its weights depend on the whole first pass)."""
        self.passes += 1
        result = stream_pass(
            self.global_state, self.updates, layer_weights=layer_weights, chosen=chosen
        )
        assert result.state is not None
        return result.state
