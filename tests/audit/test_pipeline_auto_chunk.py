"""Large federations switch to the chunked neighbor search by themselves, with the same answer."""

from __future__ import annotations

import tracemalloc

import numpy as np

from service.audit import (
    AuditConfig,
    ClientRoundData,
    DictStateReader,
    k_reliable_neighbors,
    run_audit,
)
from service.audit.pipeline import EXACT_NEIGHBOR_LIMIT


def test_auto_chunked_neighbors_equal_exact_and_never_build_k_by_k() -> None:
    k_clients = EXACT_NEIGHBOR_LIMIT + 52
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(k_clients, 2, 3))
    probes = np.exp(logits) / np.exp(logits).sum(axis=2, keepdims=True)
    accuracy = rng.uniform(0.2, 1.0, size=k_clients)
    state = DictStateReader({"w": np.zeros(2, dtype=np.float32)})
    clients = [
        ClientRoundData(
            client_id=f"c{i:05d}",
            num_samples=5,
            class_counts=[2, 2, 1],
            train_loss=0.5,
            train_accuracy=float(accuracy[i]),
            probe_softmax=probes[i],
            state=state,
        )
        for i in range(k_clients)
    ]
    config = AuditConfig(detectors=("fedncl",), primary_detector="fedncl")

    tracemalloc.start()
    outcome = run_audit(state, clients, config, round_index=0)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    tracemalloc.start()
    exact = k_reliable_neighbors(probes, accuracy, k=2, alpha=0.6, chunk_size=None)
    _, exact_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    assert outcome.neighbors is not None
    for t in (0, 1, k_clients // 2, k_clients - 1):
        got = [int(n["client_id"][1:]) for n in outcome.neighbors[f"c{t:05d}"]]
        assert got == list(exact.neighbors[t])
    # the exact search holds several K x K float64 matrices (one is K^2 * 8 bytes = 34.4 MB);
    # the automatic chunks hold about a million entries at a time
    assert exact_peak > k_clients * k_clients * 8
    assert peak < k_clients * k_clients * 8
    assert peak < exact_peak / 3
