"""The audit at round close, and what its results mean for the next round.

Loads the stored updates as lazy safetensors readers (one tensor at a time), turns their signals
into the arrays `service.audit.run_audit` takes, and keeps the JSON result for the reports. Flags
drive roles and aggregation only after the federation's warm-up, through each client's status
(or the round's flags, per ``aggregation_flags``; :func:`status_history` supplies the history);
an admin's pin overrides the detector for that client (recorded in the result).
"""

from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np
from sqlalchemy.orm import Session

from service.audit import (
    AuditConfig,
    AuditOutcome,
    ClientRoundData,
    ClientStatus,
    StatusHistory,
    correction_candidates,
    next_status,
    raised_by_geometry,
    run_audit,
)
from service.coordinator.privacy_budget import round_privacy
from service.coordinator.resources import Services
from service.coordinator.round_events import anchor_led_rounds, majority_rounds
from service.coordinator.signal_policy import policy_of
from service.coordinator.stored_audit import (
    client_audit_in,
    flag_entries,
    read_audit,
    read_neighbors,
)
from service.coordinator.tensors import SafetensorsReader, write_state
from service.store import repositories as repo
from service.store.tables import AuditResult, Client, Federation, ModelUpdate, ModelVersion, Round


@dataclass
class RoundOutcome:
    state: dict[str, np.ndarray]
    rule: str
    fallback_reason: str | None
    weights_by_client: dict[str, float]
    flags_by_client: dict[str, dict[str, bool | None]]
    centroids: list[list[float]] | None
    result: dict[str, Any]


def _array(value: Any, dtype: Any = np.float64) -> np.ndarray | None:
    if value is None:
        return None
    return np.asarray([np.nan if v is None else v for v in value], dtype=dtype)


def _matrix(value: Any) -> np.ndarray | None:
    return None if value is None else np.asarray(value, dtype=np.float64)


def counts_are_exact(federation: Federation) -> bool:
    """Whether the sites send exact class counts (no ``count_bucket`` in the privacy policy).
    Rounded-up counts would bias the error counts' expected values (a small site's rounding
    lowers the pooled error rates): under a bucket the audit leaves the error counts out."""
    return policy_of(federation.config).count_bucket <= 1


def mechanism_scale(federation: Federation) -> float | None:
    """sigma * B of the federation's Gaussian mechanism (None without it): a class mean of n_c
    samples carries noise of standard deviation sigma B / n_c, which the audit must count as
    sampling error (module ``client_round_data``)."""
    policy = policy_of(federation.config)
    if not policy.dp_noise_multiplier or policy.dp_clip_loss is None:
        return None
    return float(policy.dp_noise_multiplier) * float(policy.dp_clip_loss)


def _mechanism_spread(counts: np.ndarray, scale: float) -> np.ndarray:
    """The per-sample spread whose mean has the mechanism's noise: sd / sqrt(n_c) = sigma B / n_c
    gives sd = sigma B / sqrt(n_c); NaN where the class is not held."""
    n = counts.astype(np.float64)
    return np.where(n > 0, scale / np.sqrt(np.maximum(n, 1.0)), np.nan)


def client_round_data(
    update: ModelUpdate,
    reader: Any,
    *,
    exact_counts: bool = True,
    mechanism: float | None = None,
) -> ClientRoundData:
    """What the audit reads of one stored update. ``exact_counts`` False (a count bucket): the
    error counts are left out. ``mechanism`` (sigma B of the Gaussian mechanism): the sites send
    no spreads, and the audit is given the noise's own as ``per_class_loss_sd`` instead, so that
    the evidence counts the noise as sampling error (without it, 10-15 of 36 rounds flagged a
    clean site at sigma 0.5-2 on 20 digit sites)."""
    signals = update.signals
    per_class = signals.get("per_class_loss")
    # A class count the privacy policy suppresses (null; its per-class signals are null too) is
    # a class the site does not hold, for the audit.
    counts = np.asarray([c or 0 for c in signals["class_counts"]], dtype=np.int64)
    return ClientRoundData(
        client_id=str(update.client_id),
        num_samples=int(update.num_samples),
        class_counts=counts,
        per_class_loss=_array(per_class) if per_class is not None else None,
        per_class_loss_sd=(
            _mechanism_spread(counts, mechanism)
            if mechanism is not None and per_class is not None
            else _array(signals.get("per_class_loss_sd"))
        ),
        per_class_errors=_array(signals.get("per_class_errors")) if exact_counts else None,
        per_class_confident_errors=(
            _array(signals.get("per_class_confident_errors")) if exact_counts else None
        ),
        train_loss=signals.get("train_loss"),
        train_accuracy=signals.get("train_accuracy"),
        probe_softmax=_matrix(signals.get("probe_softmax")),
        centroids=_matrix(signals.get("centroids")),
        state=reader,
    )


def audit_config_for_round(federation: Federation, rnd: Round) -> tuple[AuditConfig, bool]:
    """The federation's audit configuration; FedAvg while the warm-up lasts."""
    data = dict(federation.config["audit"])
    in_warmup = rnd.index < int(federation.config["warmup_rounds"])
    if in_warmup:
        data["aggregation"] = "fedavg"
    return AuditConfig.from_json(data), in_warmup


def pinned_flags(clients: list[Client]) -> list[bool | None]:
    """An admin pin forces the flag: noisy -> True, trusted -> False, suspect/none -> detector."""
    result: list[bool | None] = []
    for client in clients:
        if client.pinned_status == "noisy":
            result.append(True)
        elif client.pinned_status == "trusted":
            result.append(False)
        else:
            result.append(None)
    return result


def counted_flags(client: Client, before_round: int) -> list[bool]:
    """The client's flags that count towards its status, oldest first: the primary detector's
    determined flags (undetermined rounds skipped) of post-warm-up rounds before ``before_round``.
    """
    return [
        bool(entry["primary"])
        for entry in flag_entries(client.flag_history)
        if not entry.get("in_warmup")
        and entry.get("primary") is not None
        and int(entry["round"]) < before_round
    ]


def status_history(client: Client, round_index: int, config: AuditConfig) -> StatusHistory:
    """The client's status and last ``w`` counted flags before round ``round_index``.

    At a round close every stored entry is older than the round, and the stored status is the
    one after the latest of them. Recomputing an older round replays the status rule over the
    counted flags before it, with ``config.status`` (``status_m`` / ``status_w``).
    """
    flags = counted_flags(client, round_index)
    window: deque[bool] = deque(maxlen=config.status.w)
    # A site pinned trusted is not carried (service.audit.geometry_evidence, "Carried flags").
    by_geometry = client.pinned_status != "trusted" and _latest_flag_by_geometry(
        client, round_index
    )
    if all(int(entry["round"]) < round_index for entry in flag_entries(client.flag_history)):
        window.extend(flags)
        return StatusHistory(status=client.status, flags=tuple(window), by_geometry=by_geometry)
    status: ClientStatus = "trusted"
    for flag in flags:
        window.append(flag)
        status = next_status(status, list(window), m=config.status.m, w=config.status.w)
    return StatusHistory(status=status, flags=tuple(window), by_geometry=by_geometry)


def _latest_flag_by_geometry(client: Client, before_round: int) -> bool:
    """Whether the latest flag raised on the client after the warm-up, before ``before_round``,
    was the update geometry's alone (a flag an admin's pin overrode is nobody's)."""
    for entry in reversed(flag_entries(client.flag_history)):
        if entry.get("in_warmup") or int(entry["round"]) >= before_round:
            continue
        if entry.get("primary") is True:
            return bool(entry.get("geometry")) and entry.get("effective") is not False
    return False


def _round_data(
    services: Services, federation: Federation, updates: list[ModelUpdate]
) -> list[ClientRoundData]:
    """What the audit reads of each update, as the federation's privacy policy lets it."""
    exact, mechanism = counts_are_exact(federation), mechanism_scale(federation)
    return [
        client_round_data(
            u,
            SafetensorsReader(services.blobs.local_path(u.blob_key)),
            exact_counts=exact,
            mechanism=mechanism,
        )
        for u in updates
    ]


def audit_round(
    services: Services,
    session: Session,
    federation: Federation,
    rnd: Round,
    model_in: ModelVersion,
    updates: list[ModelUpdate],
    clients: dict[uuid.UUID, Client],
    *,
    config: AuditConfig | None = None,
    exclude: set[uuid.UUID] | None = None,
) -> RoundOutcome:
    """Run the audit and the aggregation of a round from its stored updates (no writes)."""
    if config is None:
        config, in_warmup = audit_config_for_round(federation, rnd)
    else:
        in_warmup = False
    if exclude:
        updates = [u for u in updates if u.client_id not in exclude]
    # A stable order (by client name) makes results independent of arrival order.
    updates = sorted(updates, key=lambda u: (clients[u.client_id].name, str(u.client_id)))
    round_clients = [clients[u.client_id] for u in updates]
    global_reader = SafetensorsReader(services.blobs.local_path(model_in.blob_key))
    data = _round_data(services, federation, updates)
    candidates = _neighbor_candidates(services, session, federation, updates, data)
    outcome = run_audit(
        global_reader,
        data,
        config,
        round_index=rnd.index,
        previous_centroids=(
            np.asarray(federation.centroids, dtype=np.float64)
            if federation.centroids is not None
            else None
        ),
        neighbor_candidates=candidates,
        flag_overrides=pinned_flags(round_clients),
        anchors=[bool(c.anchor) for c in round_clients],
        status_history=[status_history(c, rnd.index, config) for c in round_clients],
        majority_rounds=majority_rounds(session, federation.id, rnd.index),
        anchor_led_rounds=(
            None if in_warmup else anchor_led_rounds(session, federation.id, rnd.index)
        ),
    )
    aggregation = outcome.aggregation
    ids = [str(u.client_id) for u in updates]
    weights: dict[str, float] = {
        cid: float(w) for cid, w in zip(ids, aggregation.weights, strict=True)
    }
    flags = {cid: _flags_of(outcome, position) for position, cid in enumerate(ids)}
    result = outcome.to_json()
    weight_cap = (result.get("aggregation") or {}).get("weight_cap")
    for held_back in (weight_cap or {}).get("capped", []):
        held_back["client_id"] = ids[held_back["index"]]  # which site the cap held back
    result["round_index"] = rnd.index
    result["in_warmup"] = in_warmup
    result["clients"] = [
        {
            "client_id": cid,
            "name": clients[uuid.UUID(cid)].name,
            "num_samples": u.num_samples,
            "update_id": str(u.id),
            "pinned_status": clients[uuid.UUID(cid)].pinned_status,
        }
        for cid, u in zip(ids, updates, strict=True)
    ]
    privacy = _round_privacy(session, federation, rnd, updates)
    if privacy is not None:
        result["privacy"] = privacy
    centroids = outcome.centroids
    return RoundOutcome(
        state=aggregation.state,
        rule=aggregation.rule,
        fallback_reason=aggregation.fallback_reason,
        weights_by_client=weights,
        flags_by_client=flags,
        centroids=None if centroids is None else np.asarray(centroids).tolist(),
        result=result,
    )


def _round_privacy(
    session: Session, federation: Federation, rnd: Round, updates: list[ModelUpdate]
) -> dict[str, Any] | None:
    """The Gaussian mechanism's budget at this round (None when the federation has none):
    the round's epsilon, and each site's over all its updates up to this round."""
    policy = policy_of(federation.config)
    if not policy.dp_active:
        return None
    ids = [u.client_id for u in updates]
    counts = repo.update_counts(session, federation.id, ids, up_to_round=rnd.index)
    return round_privacy(
        policy,
        federation.config["signals"],
        [str(cid) for cid in ids],
        {str(cid): n for cid, n in counts.items()},
    )


def _flags_of(outcome: AuditOutcome, position: int) -> dict[str, bool | None]:
    """The flags of the site at ``position``: the primary detector's, the effective ones (with
    the status rule) where computed, and each detector's (None where it did not judge)."""
    entry: dict[str, bool | None] = {"primary": outcome.primary_flags[position]}
    if outcome.effective_flags is not None:
        entry["effective"] = outcome.effective_flags[position]
    for name, detection in outcome.detections.items():
        verdict = detection.verdicts[position] if detection.status == "ok" else None
        entry[name] = None if verdict is None else verdict.flag
        if name == outcome.primary and verdict is not None and raised_by_geometry(verdict):
            entry["geometry"] = True  # the primary flag rests on the update's direction alone
    return entry


def _neighbor_candidates(
    services: Services,
    session: Session,
    federation: Federation,
    updates: list[ModelUpdate],
    data: list[ClientRoundData],
) -> list[ClientRoundData] | None:
    """Every client's latest local model with a probe (this round's updates win)."""
    if "probe_softmax" not in federation.config["signals"]:
        return None
    this_round = {u.client_id for u in updates}
    joined = [c.id for c in repo.joined_clients(session, federation.id)]
    older = repo.latest_updates(session, federation.id, [c for c in joined if c not in this_round])
    candidates = list(data)
    for update in sorted(older.values(), key=lambda u: str(u.client_id)):
        if update.signals.get("probe_softmax") is None:
            continue
        candidates.append(client_round_data(update, _LazyReader(services, update.blob_key)))
    return candidates


class _LazyReader:
    """Opens the blob only if an algorithm actually reads the state."""

    def __init__(self, services: Services, key: str) -> None:
        self._services = services
        self._key = key
        self._reader: SafetensorsReader | None = None

    def _open(self) -> SafetensorsReader:
        if self._reader is None:
            self._reader = SafetensorsReader(self._services.blobs.local_path(self._key))
        return self._reader

    def keys(self) -> Any:
        return self._open().keys()

    def get(self, name: str) -> np.ndarray:
        return self._open().get(name)


def store_new_model(
    services: Services,
    session: Session,
    federation: Federation,
    rnd: Round,
    outcome: RoundOutcome,
) -> ModelVersion:
    path, sha, size = write_state(outcome.state, services.settings.tmp_dir)
    try:
        from service.coordinator.tensors import read_manifest

        manifest = read_manifest(path)
        services.blobs.put_file(path, sha, session=session)
    finally:
        path.unlink(missing_ok=True)
    version = ModelVersion(
        federation_id=federation.id,
        version=rnd.index + 1,
        round_index=rnd.index,
        sha256=sha,
        size_bytes=size,
        blob_key=sha,
        manifest=manifest,
    )
    repo.add(session, version)
    return version


class AssignedNeighbor(TypedDict):
    """A reliable neighbor as a round's instructions name it: its latest local model."""

    client_id: str
    model_id: str
    model_sha256: str
    weight: float


def noisy_classes_named(
    audit: AuditResult | None, client_ids: list[uuid.UUID]
) -> dict[uuid.UUID, list[int]]:
    """Per client asked for, the classes the audit's primary detector names noisy at it, where
    it names some (:func:`distil_classes` does not spare those)."""
    if audit is None or not client_ids:
        return {}
    stored = read_audit(audit.result)
    positions, primary = stored.positions, stored.primary
    if primary is None:
        return {}
    named: dict[uuid.UUID, list[int]] = {}
    for client_id in client_ids:
        position = positions.get(str(client_id))
        if position is None:
            continue
        verdict = client_audit_in(audit.result, position, str(client_id)).detectors.get(primary)
        if verdict is not None and verdict.noisy_classes:
            named[client_id] = list(verdict.noisy_classes)
    return named


OWNED_CLASS_SHARE = 0.25
"""A site holds a class (for FedNoRo's ``kd_scope: "classes"``) where it declared at least this
share, and at least 2 / K, of the round's K sites' declared samples of it."""


def distil_classes(
    audit: AuditResult | None, selected: list[Client], noisy: set[uuid.UUID], federation: Federation
) -> dict[uuid.UUID, list[int]]:
    """Per noisy site, the classes it distils under FedNoRo's ``kd_scope: "classes"`` (nothing
    for another recipe or scope): every class but those it holds (:data:`OWNED_CLASS_SHARE`;
    with K = 2 sites or fewer no site holds a class) and the audit does not name noisy there;
    none listed (every class distilled) where the audit names no class at the site."""
    config, num_classes = federation.config, federation.num_classes
    if config["recipe"] != "fednoro" or config["hyperparameters"].get("kd_scope", "classes") != (
        "classes"
    ):
        return {}
    named = noisy_classes_named(audit, sorted(noisy, key=str))
    totals = [0] * num_classes
    for client in selected:
        for c, n in enumerate(client.class_counts or []):
            totals[c] += n or 0
    share = max(OWNED_CLASS_SHARE, 2.0 / max(len(selected), 1))
    result: dict[uuid.UUID, list[int]] = {}
    for client in selected:
        if client.id not in named:
            continue
        counts = client.class_counts or []
        held = {c for c, n in enumerate(counts) if totals[c] and (n or 0) >= share * totals[c]}
        kept = held - set(named[client.id])
        result[client.id] = [c for c in range(num_classes) if c not in kept]
    return result


def neighbor_assignments(
    session: Session, federation: Federation, audit: AuditResult | None
) -> dict[uuid.UUID, tuple[list[AssignedNeighbor], float | None]]:
    """Per client: its neighbors (with weights and the model id of their latest local model).
    A suspended site's model is not handed out (an admin may suspend a site while its labels are
    checked), nor a pruned one; the site ensembles the neighbours it is given."""
    if audit is None:
        return {}
    stored = read_neighbors(audit.result)
    neighbors, self_weights = stored.neighbors, stored.self_weights
    if not neighbors:
        return {}
    suspended = repo.suspended_client_ids(session, federation.id)
    wanted = {
        uuid.UUID(n["client_id"]) for entries in neighbors.values() for n in entries
    } - suspended
    latest = repo.latest_updates(session, federation.id, sorted(wanted, key=str))
    result: dict[uuid.UUID, tuple[list[AssignedNeighbor], float | None]] = {}
    for client_id, entries in neighbors.items():
        assigned: list[AssignedNeighbor] = []
        for entry in entries:
            update = latest.get(uuid.UUID(entry["client_id"]))
            if update is None or update.pruned_at is not None:
                continue  # retention keeps each site's latest update; a pruned one is not sent
            assigned.append(
                AssignedNeighbor(
                    client_id=entry["client_id"],
                    model_id=str(update.id),
                    model_sha256=update.sha256,
                    weight=entry["weight"],
                )
            )
        result[uuid.UUID(client_id)] = (assigned, self_weights.get(client_id))
    return result


def is_correction_candidate(client: Client, t_corr: int, alpha: float) -> bool:
    """Fed-NCL eq. 17 on the client's stored Fed-NCL flags of the first t_corr rounds."""
    history = flag_entries(client.flag_history)
    flagged = sum(
        1 for entry in history if entry.get("round", 0) < t_corr and entry.get("fedncl") is True
    )
    seen = sum(1 for entry in history if entry.get("round", 0) < t_corr)
    if seen == 0:
        return False
    return bool(correction_candidates(np.asarray([flagged]), t_corr=t_corr, alpha=alpha)[0])
