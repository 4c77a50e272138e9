"""The audit of one round: detectors, reliability, neighbors, aggregation and centroids.

:func:`run_audit` composes the pure algorithms of this package in the order the coordinator
needs them at a round close (docs/algorithms.md):

1. every configured detector (FedNoRo per-class-loss GMM, Fed-NCL reliability score, FedRN
   expertise), each kept separately in the outcome;
2. the primary detector's flags (``None`` per client when it is undetermined), and the set of
   clients the aggregation treats as noisy: by default those whose status after this round
   (:func:`~service.audit.detection.next_status` over their flag history) is "noisy", so one
   chance flag does not change the aggregate (``config.aggregation_settings.flags``, flat key
   ``aggregation_flags``);
3. FedRN k-reliable neighbors of every client (when probes and accuracies are present);
4. the configured aggregation rule, streamed tensor by tensor, with a recorded FedAvg
   fallback when the rule needs flags or probabilities the primary detector could not give;
5. RoFL global centroids (when clients sent local centroids).

An audit that cannot decide never raises: the detector says "undetermined" with the reason
and the aggregation falls back to FedAvg with the reason recorded. Invalid configuration or
malformed client data raise :class:`~service.audit._validation.InvalidParameterError` /
:class:`~service.audit._validation.InvalidInputError`.

The Fed-NCL divergence and the aggregation share the round's reads of the updates
(:class:`~service.audit.round_pass.RoundPass`): one blocked pass computes the divergences
together with, for FedAvg, the new state and, for DaAgg, what its distances need: where the
status rule and the pins say before the detectors run which clients it may treat as noisy
(:func:`~service.audit.noisy_set.possible_noisy`), their distances to every other client and the
mean of the others, so that its weighted sum reads only those clients again
(:class:`~service.audit.round_pass.NoisySplit`); else the Gram matrices up to
``GRAM_MAX_CLIENTS``, or a pass of its own. The layer-wise rule reads the updates once more for
its weighted sum. Never all states at once.

What it composes has rooms of its own: the configuration (:mod:`service.audit.audit_config`),
the round's inputs and their checks (:mod:`service.audit.round_inputs`) and the detectors' runs
(:mod:`service.audit.round_detectors`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np

from service.audit._json import to_jsonable
from service.audit._typing import FloatArray
from service.audit._validation import (
    InvalidInputError,
    InvalidParameterError,
    check_bool,
    check_int,
)
from service.audit.aggregation import NOISY_SET_RULES, aggregate, with_fallback_context
from service.audit.aggregators.common import AggregationResult
from service.audit.aggregators.daagg import daagg_split
from service.audit.aggregators.fedavg import planned_fedavg_weights
from service.audit.anchor_mode import anchor_led_clients
from service.audit.audit_config import PROBABILITY_DETECTORS, AuditConfig
from service.audit.centroids import aggregate_centroids
from service.audit.detection import DetectionResult
from service.audit.detector_registry import geometry_peers
from service.audit.noisy_set import noisy_set, possible_noisy
from service.audit.reliability import NeighborWeight, k_reliable_neighbors
from service.audit.round_detectors import run_detectors
from service.audit.round_inputs import (
    CheckedClients,
    ClientRoundData,
    StatusHistory,
    check_clients,
    check_history,
    missing,
)
from service.audit.round_pass import RoundPass
from service.audit.state import StateReader

__all__ = ["AuditOutcome", "run_audit"]

EXACT_NEIGHBOR_LIMIT = 2048
"""Up to this many neighbor candidates the exact K x K search is used (a few MB)."""


AUTO_NEIGHBOR_CHUNK_ENTRIES = 1 << 19
"""Beyond it, target rows go in chunks of ``AUTO_NEIGHBOR_CHUNK_ENTRIES // K`` rows, so each
chunk x K temporary holds about 524,000 entries (2 MB in float32, 4 MB in float64; the search
keeps a handful of them) whatever K is. Measured at K = 10,000 on a 2-core machine: 52 rows a
chunk took 0.65 s, 26 rows 0.8 s, 104 rows 0.64 s (``benchmarks/bench_audit_scaling.py``)."""


@dataclass(frozen=True)
class AuditOutcome:
    """Everything one audit decided.

    Attributes
    ----------
    detections : dict of str to DetectionResult
        Per detector name, each kept separately (never merged).
    primary : str
        The primary detector's name.
    primary_flags : list of bool or None
        Aligned with the clients; None = undetermined.
    expertise : list of float or None
        FedRN expertise per client, when every client reported an accuracy.
    neighbors : dict or None
        client_id -> list of ``{"client_id", "weight"}`` (R'), best neighbor first.
    self_weights : dict or None
        client_id -> R'(c, c).
    aggregation : AggregationResult
        The new global state and the weights used.
    centroids : ndarray of shape (n_classes, dim) or None
        New RoFL global centroids.
    client_ids : list of str
        The clients, in input order (what the per-client lists are aligned with).
    centroid_weights : ndarray of shape (n_clients, n_classes) or None
        Weights of the centroid aggregation.
    effective_flags : list of bool or None, optional
        The primary flags with the caller's overrides (an admin's pins) applied. None when no
        override was given.
    aggregation_flags : list of bool or None, optional
        The noisy set the aggregation rule was given (see :attr:`AggregationSettings.flags
        <service.audit.config_groups.AggregationSettings.flags>`; pins applied). None when
        the rule reads no noisy set or the primary detector is undetermined.
    """

    detections: dict[str, DetectionResult]
    primary: str
    primary_flags: list[bool | None]
    expertise: list[float] | None
    neighbors: dict[str, list[NeighborWeight]] | None
    self_weights: dict[str, float] | None
    aggregation: AggregationResult
    centroids: FloatArray | None
    client_ids: list[str] = field(default_factory=list)
    centroid_weights: FloatArray | None = None
    effective_flags: list[bool | None] | None = None
    aggregation_flags: list[bool] | None = None

    def to_json(self) -> dict[str, Any]:
        """Return everything but the aggregated state as plain JSON values (NaN-free)."""
        return {
            "client_ids": list(self.client_ids),
            "detections": {name: r.to_json() for name, r in self.detections.items()},
            "primary": self.primary,
            "primary_flags": list(self.primary_flags),
            "expertise": to_jsonable(self.expertise, "$.expertise"),
            "neighbors": to_jsonable(self.neighbors, "$.neighbors"),
            "self_weights": to_jsonable(self.self_weights, "$.self_weights"),
            "aggregation": self.aggregation.to_json(),
            "centroids": to_jsonable(self.centroids, "$.centroids"),
            "centroid_weights": to_jsonable(self.centroid_weights, "$.centroid_weights"),
            "effective_flags": (
                None if self.effective_flags is None else list(self.effective_flags)
            ),
            "aggregation_flags": (
                None if self.aggregation_flags is None else list(self.aggregation_flags)
            ),
        }


def _neighbors(
    data: CheckedClients, candidates: CheckedClients, config: AuditConfig
) -> tuple[dict[str, list[NeighborWeight]], dict[str, float]] | None:
    if missing(data.ids, data.probes) or missing(data.ids, data.train_accuracy):
        return None
    own = {cid: i for i, cid in enumerate(data.ids)}
    pool_ids: list[str] = []
    pool_probes: list[FloatArray] = []
    pool_acc: list[float] = []
    for i, cid in enumerate(candidates.ids):
        source, j = (data, own[cid]) if cid in own else (candidates, i)
        probe, acc = source.probes[j], source.train_accuracy[j]
        if probe is None or acc is None:
            continue  # a candidate without the signals cannot be compared
        pool_ids.append(cid)
        pool_probes.append(probe)
        pool_acc.append(acc)
    n_candidates = len(pool_ids)
    in_pool = set(pool_ids)
    for i, cid in enumerate(data.ids):
        if cid not in in_pool:
            pool_ids.append(cid)
            pool_probes.append(cast(FloatArray, data.probes[i]))
            pool_acc.append(cast(float, data.train_accuracy[i]))
    shape = pool_probes[0].shape
    for cid, probe in zip(pool_ids, pool_probes, strict=True):
        if probe.shape != shape:
            raise InvalidInputError(
                f"probe_softmax: client {cid!r} has shape {probe.shape}, expected {shape}"
            )
    index = {cid: i for i, cid in enumerate(pool_ids)}
    sets = k_reliable_neighbors(
        np.stack(pool_probes),
        np.asarray(pool_acc, dtype=np.float64),
        k=config.fedrn.k,
        alpha=config.fedrn.alpha,
        targets=[index[cid] for cid in data.ids],
        candidates=list(range(n_candidates)),
        chunk_size=(
            config.fedrn.chunk_size
            if config.fedrn.chunk_size is not None
            else (
                None
                if len(pool_ids) <= EXACT_NEIGHBOR_LIMIT
                else max(1, AUTO_NEIGHBOR_CHUNK_ENTRIES // len(pool_ids))
            )
        ),
        variant=config.fedrn.similarity,
    )
    neighbors: dict[str, list[NeighborWeight]] = {}
    self_weights: dict[str, float] = {}
    for t, cid in enumerate(data.ids):
        neighbors[cid] = [
            {"client_id": pool_ids[j], "weight": w}
            for j, w in zip(sets.neighbors[t], sets.weights[t], strict=True)
        ]
        self_weights[cid] = sets.self_weight[t]
    return neighbors, self_weights


def _centroids(data: CheckedClients, previous: Any) -> tuple[FloatArray, FloatArray] | None:
    given = [c for c in data.centroids if c is not None]
    if not given:
        return None
    n_classes = data.class_counts.shape[1]
    shape = given[0].shape
    if shape[0] != n_classes:
        raise InvalidInputError(f"centroids: {shape[0]} classes, expected {n_classes}")
    local = np.zeros((len(data.ids), *shape))
    present = data.class_counts > 0
    for i, c in enumerate(data.centroids):
        if c is None:
            present[i] = False
        elif c.shape != shape:
            raise InvalidInputError(
                f"centroids: client {data.ids[i]!r} has shape {c.shape}, expected {shape}"
            )
        else:
            local[i] = c
    return aggregate_centroids(previous, local, present)


def run_audit(
    global_state: StateReader,
    clients: Sequence[ClientRoundData],
    config: AuditConfig,
    *,
    round_index: int,
    previous_centroids: FloatArray | None = None,
    neighbor_candidates: Sequence[ClientRoundData] | None = None,
    flag_overrides: Sequence[bool | None] | None = None,
    status_history: Sequence[StatusHistory] | None = None,
    anchors: Sequence[bool] | None = None,
    majority_rounds: int = 0,
    anchor_led_rounds: int | None = None,
) -> AuditOutcome:
    """Audit one round and aggregate its updates.

    Parameters
    ----------
    global_state : StateReader
        theta_G, the model broadcast this round.
    clients : sequence of ClientRoundData
        This round's reports (at least one).
    config : AuditConfig
        Hyper-parameters.
    round_index : int
        0-based index of the round (Fed-NCL layer-wise penalty schedule).
    previous_centroids : ndarray of shape (n_classes, dim), optional
        Last round's global RoFL centroids.
    neighbor_candidates : sequence of ClientRoundData, optional
        Clients whose latest local model is stored and may serve as FedRN neighbors (default:
        ``clients``). Matched by ``client_id``; a client present in both uses its ``clients``
        entry (this round's signals). Candidates without probe or accuracy are skipped; a
        client missing from the candidates is a target only. Only their probes and
        accuracies are read.
    flag_overrides : sequence of bool or None, optional
        Aligned with ``clients``: True/False forces that client's flag (and its noisy
        probability to 1/0) for the aggregation, None keeps the primary detector's verdict.
        This is how an admin's pin reaches the aggregation; the detectors' own results are
        reported unchanged. Ignored for the aggregation when the primary detector is
        undetermined (FedAvg fallback).
    status_history : sequence of StatusHistory, optional
        Aligned with ``clients``: each client's status and earlier flags, from which
        ``config.aggregation_settings.flags == "status"`` (flat key ``aggregation_flags``)
        decides the noisy set. None: every client is new (trusted, no earlier flag), so with
        the default ``config.status.m == 2`` nobody is noisy for the aggregation in a single
        call; set the flags to ``"round"`` to aggregate on this round's flags alone.
    anchors : sequence of bool, optional
        Aligned with ``clients``: True for a trust anchor (a site an admin marked as curated),
        used by the ``evidence`` detector (:mod:`service.audit.evidence`, "Trust anchors").
    majority_rounds : int, default=0
        Earlier rounds of the federation, after the warm-up, in which the ``evidence`` detector
        abstained because the group it would flag was not a clear minority (its summary's
        ``majority_suspected``); from ``MAJORITY_MEMORY`` on, a consensus verdict of ``ok`` is
        ``inconclusive`` (:mod:`service.audit.majority_memory`).
    anchor_led_rounds : int or None, default=None
        Earlier rounds of the federation whose aggregate was anchor-led
        (:mod:`service.audit.anchor_mode`); None: anchor-led aggregation is not considered this
        round (the coordinator passes None during the warm-up). Off with
        ``config.aggregation_settings.anchor_lead`` false.

    Returns
    -------
    AuditOutcome
        Detector results, primary flags, expertise, neighbors, aggregation and centroids.
        A detector whose inputs are missing for some client is "undetermined" (never run on
        a subset). Neighbors are computed when every client sent a probe and an accuracy.
        Centroids when at least one client sent them (classes a client does not hold, or
        clients without centroids, get weight 0).

    Raises
    ------
    InvalidParameterError
        If ``config`` is not an :class:`AuditConfig` or ``round_index`` is negative.
    InvalidInputError
        If there is no client, an id repeats, a client's arrays or state are malformed, or
        ``status_history`` does not match the clients.
    """
    rnd, data = _checked_round(config, round_index, clients, status_history, anchors)

    shared = _round_pass(global_state, data, config, status_history, flag_overrides)
    lead = config.aggregation_settings.anchor_lead and bool(anchor_led_rounds)
    detections = run_detectors(
        data, config, shared, status_history, anchors, majority_rounds, lead and any(anchors or ())
    )
    primary = detections[config.primary_detector]
    primary_flags = primary.flags

    candidates = (
        data
        if neighbor_candidates is None
        else check_clients(neighbor_candidates, "neighbor_candidates")
    )
    neighbor_info = _neighbors(data, candidates, config)

    effective_flags: list[bool | None] | None = None
    noisy = noisy_set(primary, config, status_history, len(data.ids))
    probability = (
        np.asarray(primary.probabilities, dtype=np.float64)
        if primary.status == "ok" and primary.method in PROBABILITY_DETECTORS
        else None
    )
    if flag_overrides is not None:
        effective_flags = _apply_overrides(flag_overrides, primary_flags, noisy, probability)
    led = _anchor_led(
        global_state, data, config, anchors, detections, flag_overrides, anchor_led_rounds
    )
    if led is not None:
        return _outcome(
            detections, config, data, previous_centroids, neighbor_info, effective_flags, None, led
        )
    aggregation = aggregate(
        config.aggregation,
        global_state,
        data.states,
        data.num_samples,
        noisy=noisy,
        noisy_probability=probability,
        params=_aggregation_params(config),
        round_index=rnd,
        max_client_weight_factor=config.aggregation_settings.max_client_weight_factor,
        shared=shared,
    )
    if primary.status != "ok":
        aggregation = with_fallback_context(
            aggregation, f"primary detector {primary.method!r} {primary.status} ({primary.reason})"
        )

    return _outcome(
        detections,
        config,
        data,
        previous_centroids,
        neighbor_info,
        effective_flags,
        noisy.tolist() if noisy is not None and config.aggregation in NOISY_SET_RULES else None,
        aggregation,
    )


def _outcome(
    detections: dict[str, DetectionResult],
    config: AuditConfig,
    data: CheckedClients,
    previous_centroids: Any,
    neighbor_info: tuple[dict[str, list[NeighborWeight]], dict[str, float]] | None,
    effective_flags: list[bool | None] | None,
    aggregation_flags: list[bool] | None,
    aggregation: AggregationResult,
) -> AuditOutcome:
    """The outcome of ``run_audit`` once the aggregate is made: the centroids added."""
    centroid_result = _centroids(data, previous_centroids)
    return AuditOutcome(
        detections=detections,
        primary=config.primary_detector,
        primary_flags=detections[config.primary_detector].flags,
        expertise=_expertise_values(detections),
        neighbors=None if neighbor_info is None else neighbor_info[0],
        self_weights=None if neighbor_info is None else neighbor_info[1],
        aggregation=aggregation,
        centroids=None if centroid_result is None else centroid_result[0],
        client_ids=data.ids,
        centroid_weights=None if centroid_result is None else centroid_result[1],
        effective_flags=effective_flags,
        aggregation_flags=aggregation_flags,
    )


def _anchor_led(
    global_state: StateReader,
    data: CheckedClients,
    config: AuditConfig,
    anchors: Sequence[bool] | None,
    detections: Mapping[str, DetectionResult],
    pins: Sequence[bool | None] | None,
    rounds: int | None,
) -> AggregationResult | None:
    """The anchor-led aggregate (:mod:`service.audit.anchor_mode`): FedAvg over the clients it
    takes, the weight cap over them, the others weigh 0, the reason recorded as the fallback's;
    None when the round is not anchor-led."""
    settings = config.aggregation_settings
    chosen = anchor_led_clients(
        anchors,
        detections.get("evidence"),
        pins,
        rounds if settings.anchor_lead else None,
        settings.anchor_lead_only_rounds,
    )
    if chosen is None:
        return None
    rounds_led = rounds or 0
    keep = np.flatnonzero(chosen)
    result = aggregate(
        "fedavg",
        global_state,
        [data.states[i] for i in keep],
        np.asarray(data.num_samples, dtype=np.float64)[keep],
        max_client_weight_factor=config.aggregation_settings.max_client_weight_factor,
    )
    weights = np.zeros(len(data.ids))
    weights[keep] = result.weights
    cap = result.weight_cap
    if cap is not None:
        cap = {**cap, "capped": [{**c, "index": int(keep[c["index"]])} for c in cap["capped"]]}
    only = rounds_led < config.aggregation_settings.anchor_lead_only_rounds
    who = "the trust anchors alone" if only else "the trust anchors and the sites it cleared"
    return replace(
        result,
        weights=weights,
        requested_rule=config.aggregation,
        fallback_reason=(
            f"anchor-led aggregation, round {rounds_led + 1} of the lead: FedAvg over {who} "
            f"({keep.size} of {len(data.ids)} sites: the audit took the anchors as its reference)"
        ),
        details={
            **result.details,
            "anchor_led": {"round": rounds_led + 1, "sites": int(keep.size)},
        },
        weight_cap=cap,
    )


def _checked_round(
    config: AuditConfig,
    round_index: int,
    clients: Sequence[ClientRoundData],
    status_history: Sequence[StatusHistory] | None,
    anchors: Sequence[bool] | None,
) -> tuple[int, CheckedClients]:
    """``run_audit``'s arguments, checked: the round index and the clients' arrays."""
    if not isinstance(config, AuditConfig):
        raise InvalidParameterError(f"config: expected AuditConfig, got {type(config).__name__}")
    rnd = check_int("round_index", round_index, min_value=0)
    if len(clients) == 0:
        raise InvalidInputError("clients: at least one client is needed")
    data = check_clients(clients, "clients")
    check_history(status_history, len(data.ids))
    if anchors is not None and len(anchors) != len(data.ids):
        raise InvalidInputError(f"anchors: {len(anchors)} entries for {len(data.ids)} clients")
    return rnd, data


def _expertise_values(detections: Mapping[str, DetectionResult]) -> list[float] | None:
    """FedRN's expertise per client, where the ``expertise`` detector ran and judged."""
    expertise_result = detections.get("expertise")
    if expertise_result is None or expertise_result.status != "ok":
        return None
    return [cast(float, s) for s in expertise_result.scores]


def _apply_overrides(
    flag_overrides: Sequence[bool | None],
    primary_flags: list[bool | None],
    noisy: np.ndarray | None,
    probability: FloatArray | None,
) -> list[bool | None]:
    """The primary flags with the overrides (an admin's pins) applied; ``noisy`` and
    ``probability`` are changed in place the same way."""
    if len(flag_overrides) != len(primary_flags):
        raise InvalidInputError(
            f"flag_overrides: {len(flag_overrides)} entries for {len(primary_flags)} clients"
        )
    effective_flags = list(primary_flags)
    for i, override in enumerate(flag_overrides):
        if override is None:
            continue
        check_bool(f"flag_overrides[{i}]", override)
        effective_flags[i] = override
        if noisy is not None:
            noisy[i] = override
        if probability is not None:
            probability[i] = 1.0 if override else 0.0
    return effective_flags


def _aggregation_params(config: AuditConfig) -> dict[str, Any]:
    """The configured rule's own parameters (:func:`~service.audit.aggregation.aggregate`)."""
    params: dict[str, Any] = {}
    if config.aggregation == "daagg":
        params["variant"] = config.aggregation_settings.daagg_variant
    elif config.aggregation == "fedncl_layerwise":
        fedncl = config.fedncl
        params["tau"] = fedncl.tau
        params["t_k"] = fedncl.t_k if fedncl.t_k is not None else fedncl.t_corr
    elif config.aggregation == "trimmed_mean":
        params["trim_fraction"] = config.aggregation_settings.trim_fraction
    return params


GRAM_MAX_CLIENTS = 32
"""Up to this many clients a DaAgg round computes the K x K Gram matrices in the shared pass
(about K / 2 multiply-adds per value read); above it, a pass of DaAgg's own (noisy x clean
products) costs less than the full Gram matrix (measured: at K = 20 the Gram matrices cost about
as much as one more pass, at K = 64 more)."""


def _round_pass(
    global_state: StateReader,
    data: CheckedClients,
    config: AuditConfig,
    history: Sequence[StatusHistory] | None,
    pins: Sequence[bool | None] | None,
) -> RoundPass:
    """The round's shared pass, planned for what the configured aggregation will ask: FedAvg's
    state; for DaAgg, where the clients it may treat as noisy are known before the detectors
    run, their distances to every client and the others' mean (:class:`NoisySplit`), else the
    Gram matrices up to ``GRAM_MAX_CLIENTS``."""
    # The update geometry's consensus rides on the first pass, where some site can be judged.
    judged = (
        config.geometry.check
        and (config.detectors is None or "evidence" in config.detectors)
        and bool((geometry_peers(data, config, history) >= 0).any())
    )
    consensus = np.asarray(data.num_samples, dtype=np.float64) if judged else None
    if config.aggregation == "fedavg":
        weights = planned_fedavg_weights(
            data.num_samples, config.aggregation_settings.max_client_weight_factor
        )
        return RoundPass(
            global_state,
            data.states,
            weights=weights,
            chosen=int(np.argmax(weights)),
            consensus=consensus,
        )
    if config.aggregation == "daagg":
        split = daagg_split(
            global_state, data.num_samples, possible_noisy(config, history, pins, len(data.ids))
        )
        if split is not None:
            return RoundPass(global_state, data.states, split=split, consensus=consensus)
    gram = config.aggregation == "daagg" and len(data.states) <= GRAM_MAX_CLIENTS
    return RoundPass(global_state, data.states, gram=gram, consensus=consensus)
