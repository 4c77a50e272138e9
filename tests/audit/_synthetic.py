"""Synthetic per-class loss matrices for the FedNoRo detector tests.

A federation is drawn the way per-class losses arise in practice: each client's value for
class c is the mean of its own per-sample cross-entropies, one per sample it holds. Clean
samples of class c have losses ~ Gamma(shape 2, mean mu_c) with mu_c ~ U(0.2, 1.0) shared by
the whole federation ("all clients drawn from the same distribution"); a mislabelled sample
has loss ~ Gamma(shape 4, mean 3), the order of magnitude of the cross-entropy of a wrong
label under a warmed-up model. Class counts are U{5..199}, each entry missing (count 0) with
probability ``p_missing``, and every client keeps at least one sample.
"""

from __future__ import annotations

import numpy as np

from service.audit import ClientRoundData, DictStateReader

__all__ = ["loss_clients", "synthetic_federation"]


def loss_clients(loss: np.ndarray, counts: np.ndarray) -> list[ClientRoundData]:
    """One round's clients ``c0, c1, ...`` sending these per-class losses and counts.

    Each state is a two-value tensor ``w`` filled with the client's index (distinct states, so
    the aggregation rules have something to weigh).
    """
    return [
        ClientRoundData(
            client_id=f"c{k}",
            num_samples=int(counts[k].sum()),
            class_counts=[int(n) for n in counts[k]],
            per_class_loss=[float(v) for v in loss[k]],
            state=DictStateReader({"w": np.full(2, float(k), dtype=np.float32)}),
        )
        for k in range(loss.shape[0])
    ]


def synthetic_federation(
    n_clients: int,
    n_classes: int,
    seed: int,
    *,
    n_noisy: int = 0,
    noise_rate: float = 0.0,
    p_missing: float = 0.2,
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(per_class_loss, class_counts)``; clients ``0 .. n_noisy - 1`` are noisy.

    A noisy client mislabels each of its samples with probability ``noise_rate``.
    """
    rng = np.random.default_rng(seed)
    mu = rng.uniform(0.2, 1.0, size=n_classes)
    counts = rng.integers(5, 200, size=(n_clients, n_classes))
    counts[rng.random((n_clients, n_classes)) < p_missing] = 0
    counts[counts.sum(axis=1) == 0, 0] = 10
    loss = np.full((n_clients, n_classes), np.nan)
    for k in range(n_clients):
        for c in range(n_classes):
            n = int(counts[k, c])
            if n == 0:
                continue
            samples = rng.gamma(2.0, mu[c] / 2.0, size=n)
            if k < n_noisy:
                wrong = rng.random(n) < noise_rate
                samples[wrong] = rng.gamma(4.0, 3.0 / 4.0, size=int(wrong.sum()))
            loss[k, c] = samples.mean()
    return loss, counts
