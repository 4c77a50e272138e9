"""One pass over the round's updates, shared by the Fed-NCL divergence and the aggregation
(:func:`service.audit.blocks.stream_pass` does the reading)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from service.audit._typing import AnyArray, FloatArray
from service.audit._validation import InvalidInputError
from service.audit.blocks import StreamResult, stream_pass
from service.audit.state import StateReader

__all__ = ["CleanPart", "NoisySplit", "RoundPass"]


@dataclass(frozen=True)
class CleanPart:
    """A weighted mean that a pass reading the clients anyway also made: ``state`` is
    ``sum_k weights_k theta_k`` (non-float tensors the largest weight's), the weights sum to 1
    and are 0 for the clients it leaves out (DaAgg completes it with those:
    :mod:`service.audit.aggregators.daagg`)."""

    state: dict[str, AnyArray]
    weights: FloatArray


@dataclass(frozen=True)
class NoisySplit:
    """DaAgg's plan for the round's first pass, made before the detectors run: ``rows`` are
    the clients the aggregation may treat as noisy this round whatever the detectors say (the
    status rule and the pins decide the others). The first pass computes the distances between
    each of them and every other client, so that DaAgg's noisy x clean distances follow for any
    of their subsets, and the mean of the other clients weighted by ``base_weights`` (0 on the
    rows, summing to 1; None: no mean, for a float16 model). The distances between two rows
    are not computed there: DaAgg needs them only where some row is not noisy after all, and
    then takes them from a pass over the rows alone."""

    rows: tuple[int, ...]
    base_weights: FloatArray | None

    def others(self, k: int) -> list[int]:
        """The clients outside the rows, in index order."""
        inside = set(self.rows)
        return [i for i in range(k) if i not in inside]


class RoundPass:
    """The reads of one round close, shared by the Fed-NCL divergence and the aggregation.

    What the round will need is declared up front (``split`` or ``gram`` for DaAgg, ``weights``
    for a rule whose weights do not depend on the detectors, such as FedAvg). When the
    divergences are asked for (:meth:`squared`, the Fed-NCL detector, which runs before the
    aggregation), one :func:`stream_pass` computes them together with everything declared and
    keeps the small results (per tensor: K squared distances, a K x K Gram matrix or the split's
    distances) and the weighted state. A request that pass cannot serve (other weights, no Gram
    matrix declared, a noisy client outside the split's rows), or a request other than the
    split's when the divergences were never asked for, runs the pass that request alone needs,
    as it would without sharing. ``passes`` counts the passes made.

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
    split : NoisySplit, optional
        DaAgg's plan (instead of ``gram`` and ``weights``): the first pass also computes the
        distances of the clients that may be noisy to every client and the mean of the others,
        so that DaAgg reads the updates again only for the clients outside that mean.
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
        split: NoisySplit | None = None,
    ) -> None:
        if split is not None and (gram or weights is not None):
            raise ValueError("split: instead of gram and weights, not with them")
        self.global_state = global_state
        self.updates = list(updates)
        self._gram = gram
        self._consensus = None if consensus is None else np.asarray(consensus, dtype=np.float64)
        self._weights = None if weights is None else np.asarray(weights, dtype=np.float64)
        self._chosen = chosen
        self._split = split
        self._part_taken = False
        self._first: StreamResult | None = None
        self.passes = 0

    def _run_first(self) -> StreamResult:
        if self._first is None:
            split = self._split
            weights = self._weights if split is None else split.base_weights
            chosen = self._chosen if split is None or weights is None else int(np.argmax(weights))
            self._first = stream_pass(
                self.global_state,
                self.updates,
                distances=True,
                gram=self._gram,
                weights=weights,
                chosen=chosen,
                consensus=self._consensus,
                pairs=(
                    (split.rows, split.others(len(self.updates)))
                    if split is not None and split.rows
                    else None
                ),
            )
            self.passes += 1
        return self._first

    def clean_part(self) -> CleanPart | None:
        """The mean of the clients outside the split's rows, from the first pass (run now if it
        was not): handed out once, since DaAgg completes it in place; None without a split or a
        mean, or once handed out."""
        split = self._split
        if split is None or split.base_weights is None or self._part_taken:
            return None
        state = self._run_first().state
        assert state is not None
        self._release_mean()  # held by the caller only: freed as soon as it lets go
        return CleanPart(state, split.base_weights)

    def _release_mean(self) -> None:
        """Drop the first pass's reference to the split's mean (a full state): it is handed out
        once, or not needed by a pass about to make another state."""
        if self._split is not None and self._first is not None and self._first.state is not None:
            self._first = replace(self._first, state=None)
            self._part_taken = True

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
    ) -> tuple[FloatArray, CleanPart | None]:
        """Squared distances between each noisy and each clean client, per float tensor, and a
        clean part: from the first pass where the split's rows hold every noisy client (its
        mean of the clients outside the rows, :meth:`clean_part`); where the distances take a
        pass of their own, the mean ``clean_weights`` (0 for every noisy client) weight, when
        given; None where they come from the Gram matrices."""
        split = self._split
        if split is not None and set(noisy) <= set(split.rows):
            between = self._split_pairs(split, noisy, clean)
            if between is not None:
                return between, self.clean_part()
        if not self._gram or self._first is None:
            self._release_mean()  # DaAgg's own pass makes the clean mean it needs
            self.passes += 1
            result = stream_pass(
                self.global_state,
                self.updates,
                pairs=(noisy, clean),
                weights=clean_weights,
                chosen=0 if clean_weights is None else int(np.argmax(clean_weights)),
            )
            assert result.pair_squared is not None
            if clean_weights is None or result.state is None:
                return result.pair_squared, None
            return result.pair_squared, CleanPart(result.state, clean_weights)
        first = self._run_first()
        assert first.gram is not None
        g = first.gram
        n_idx = np.asarray(noisy, dtype=np.int64)
        c_idx = np.asarray(clean, dtype=np.int64)
        diag = np.diagonal(g, axis1=1, axis2=2)
        squared = diag[:, n_idx, None] + diag[:, None, c_idx] - 2.0 * g[:, n_idx][:, :, c_idx]
        result_pairs: FloatArray = np.maximum(squared, 0.0)
        return result_pairs, None

    def _split_pairs(
        self, split: NoisySplit, noisy: Sequence[int], clean: Sequence[int]
    ) -> FloatArray | None:
        """The noisy x clean distances of a split whose rows hold every noisy client: against
        the clients outside the rows from the first pass, against the rows found clean from a
        pass over the rows alone (None where that pass finds an error: the pass over every
        client then names the client as always)."""
        first = self._run_first()
        assert first.pair_squared is not None
        column = {c: j for j, c in enumerate(split.others(len(self.updates)))}
        row = {r: j for j, r in enumerate(split.rows)}
        result = np.empty((first.pair_squared.shape[0], len(noisy), len(clean)))
        outside = [j for j, c in enumerate(clean) if c in column]
        result[:, :, outside] = first.pair_squared[:, [row[i] for i in noisy]][
            :, :, [column[clean[j]] for j in outside]
        ]
        inside = [j for j, c in enumerate(clean) if c in row]
        if inside:
            self.passes += 1
            try:
                rows_pass = stream_pass(
                    self.global_state,
                    [self.updates[r] for r in split.rows],
                    pairs=([row[i] for i in noisy], [row[clean[j]] for j in inside]),
                )
            except InvalidInputError:
                return None
            assert rows_pass.pair_squared is not None
            result[:, :, inside] = rows_pass.pair_squared
        return result

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
        self._release_mean()  # a split's mean is of no use to another weighting
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
