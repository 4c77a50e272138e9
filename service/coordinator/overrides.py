"""An admin's decisions about sites, and re-runs of past rounds: pins (a status set by hand),
trust anchors, and the recomputation of a closed round's audit and aggregation with other
settings or without some sites (a what-if that stores nothing).

The functions that take ``Services`` are the use cases the routes call, each in a transaction
of its own; those that take a ``Session`` are their steps and leave the commit to their caller.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from service.audit import AuditConfig, InvalidParameterError
from service.coordinator import attendance, audits, queries, retention
from service.coordinator.resources import Services
from service.coordinator.rounds import get_round, round_is_complete
from service.coordinator.tensors import SafetensorsReader
from service.coordinator.updates import schedule_close
from service.errors import BadRequestError, NotFoundError
from service.store import repositories as repo
from service.store.base import utcnow
from service.store.tables import Client, Federation

__all__ = [
    "ModelDistance",
    "RecomputedRound",
    "anchor",
    "pin",
    "recompute",
    "recompute_round",
    "set_anchor",
    "set_pin",
    "suspend",
]


@dataclass(frozen=True)
class ModelDistance:
    """How far a recomputed global model is from the one its round produced: the Euclidean
    distance over every tensor, and per tensor name."""

    total: float
    per_tensor: dict[str, float]


@dataclass(frozen=True)
class RecomputedRound:
    """A closed round's audit and aggregation re-run with other settings or without some sites
    (nothing stored); the API answers it as ``RecomputeResult``."""

    round: int
    audit_settings: dict[str, Any]
    """The audit configuration that was run (``AuditConfig.to_json``)."""
    excluded_clients: list[str]
    aggregation_rule: str
    """The rule applied, after any fallback."""
    fallback_reason: str | None
    weights: dict[str, float]
    """The aggregation weight per client id."""
    flags: dict[str, dict[str, bool | None]]
    """Per client id: the primary flag, the effective one (pins) and each detector's."""
    audit: dict[str, Any]
    """The audit result, shaped as a round's stored audit."""
    distance_to_actual_model: ModelDistance


def set_pin(
    session: Session,
    federation: Federation,
    client: Client,
    *,
    status: str | None,
    reason: str | None,
    actor: str,
) -> Client:
    """Pin a client's status (or unpin with status None), recorded in the event trail."""
    if status is not None and not reason:
        raise BadRequestError(
            "a pin needs a reason", errors=[{"loc": ["body", "reason"], "msg": "required"}]
        )
    previous = client.pinned_status
    client.pinned_status = status
    client.pin_reason = reason if status is not None else None
    client.pinned_by = actor if status is not None else None
    client.pinned_at = utcnow() if status is not None else None
    repo.add_event(
        session,
        kind="client.pinned" if status is not None else "client.unpinned",
        actor=actor,
        message=(
            f"client {client.name!r} pinned {status} by {actor}: {reason}"
            if status is not None
            else f"client {client.name!r} unpinned by {actor} (was {previous})"
        ),
        federation_id=federation.id,
        client_id=client.id,
        data={"status": status, "previous": previous, "reason": reason},
    )
    return client


def set_anchor(
    session: Session,
    federation: Federation,
    client: Client,
    *,
    reason: str | None,
    actor: str,
) -> Client:
    """Mark a client as a trust anchor (``reason`` given) or remove the mark (None), recorded in
    the event trail. The evidence detector uses anchors from the next audited round on."""
    client.anchor = reason is not None
    client.anchor_reason = reason
    repo.add_event(
        session,
        kind="client.anchored" if reason is not None else "client.unanchored",
        actor=actor,
        message=(
            f"client {client.name!r} marked as a trust anchor by {actor}: {reason}"
            if reason is not None
            else f"client {client.name!r} is no longer a trust anchor ({actor})"
        ),
        federation_id=federation.id,
        client_id=client.id,
        data={"anchor": reason is not None, "reason": reason},
    )
    return client


def recompute_round(
    services: Services,
    session: Session,
    federation: Federation,
    index: int,
    *,
    audit_overrides: dict[str, Any] | None = None,
    exclude_clients: list[uuid.UUID] | None = None,
) -> RecomputedRound:
    """Re-run the audit (and aggregation) of a closed round from its stored updates; store nothing.

    `audit_overrides` changes audit settings (e.g. ``{"aggregation": "median"}``);
    `exclude_clients` leaves some updates out. The answer compares the recomputed global model
    with the one actually produced (L2 distance per tensor and overall).
    """
    rnd = get_round(session, federation.id, index)
    if rnd.state != "closed" or rnd.model_out_id is None:
        raise BadRequestError(f"round {index} is {rnd.state}; only closed rounds can be recomputed")
    stored = dict(federation.config["audit"])
    try:
        config = AuditConfig.from_json({**stored, **(audit_overrides or {})})
    except InvalidParameterError as exc:
        raise BadRequestError(f"invalid audit settings: {exc}") from None
    clients = {c.id: c for c in repo.list_clients(session, federation.id)}
    excluded = set(exclude_clients or [])
    unknown = excluded - set(clients)
    if unknown:
        raise NotFoundError(
            f"client(s) {sorted(map(str, unknown))} do not exist in this federation"
        )
    updates = repo.updates_of_round(session, rnd.id)
    if not [u for u in updates if u.client_id not in excluded]:
        raise BadRequestError("no update left after the exclusions")
    retention.check_not_pruned(
        [u for u in updates if u.client_id not in excluded],
        {c.id: c.name for c in clients.values()},
        needed_for=f"a what-if of round {index}",
    )
    model_in = repo.get_model_version(session, rnd.model_in_id)
    model_out = repo.get_model_version(session, rnd.model_out_id)
    assert model_in is not None
    assert model_out is not None
    outcome = audits.audit_round(
        services,
        session,
        federation,
        rnd,
        model_in,
        updates,
        clients,
        config=config,
        exclude=excluded,
    )
    actual = SafetensorsReader(services.blobs.local_path(model_out.blob_key))
    distances = {}
    total = 0.0
    for name, value in outcome.state.items():
        diff = float(np.sum((value.astype(np.float64) - actual.get(name).astype(np.float64)) ** 2))
        distances[name] = diff**0.5
        total += diff
    return RecomputedRound(
        round=index,
        audit_settings=config.to_json(),
        excluded_clients=sorted(str(c) for c in excluded),
        aggregation_rule=outcome.rule,
        fallback_reason=outcome.fallback_reason,
        weights=outcome.weights_by_client,
        flags=outcome.flags_by_client,
        audit=outcome.result,
        distance_to_actual_model=ModelDistance(total=total**0.5, per_tensor=distances),
    )


# --- use cases: one session or transaction each -----------------------------------------------


def _federation_and_client(
    session: Session, federation_id: uuid.UUID, client_id: uuid.UUID
) -> tuple[Federation, Client]:
    federation = queries.federation_of(session, federation_id)
    return federation, queries.get_client(session, federation_id, client_id)


def pin(
    services: Services,
    federation_id: uuid.UUID,
    client_id: uuid.UUID,
    *,
    status: str | None,
    reason: str | None,
    actor: str,
) -> Client:
    """Pin a client's status, or unpin it with status None (`set_pin`), and commit."""
    with services.sessions.begin() as session:
        federation, client = _federation_and_client(session, federation_id, client_id)
        return set_pin(session, federation, client, status=status, reason=reason, actor=actor)


def anchor(
    services: Services,
    federation_id: uuid.UUID,
    client_id: uuid.UUID,
    *,
    reason: str | None,
    actor: str,
) -> Client:
    """Mark a client as a trust anchor, or remove the mark with reason None (`set_anchor`), and
    commit."""
    with services.sessions.begin() as session:
        federation, client = _federation_and_client(session, federation_id, client_id)
        return set_anchor(session, federation, client, reason=reason, actor=actor)


def suspend(
    services: Services,
    federation_id: uuid.UUID,
    client_id: uuid.UUID,
    *,
    reason: str | None,
    actor: str,
) -> Client:
    """Suspend a site, or resume it with reason None (`attendance.set_suspended`), and commit;
    a round the withdrawal left complete is closed then, as after its last upload."""
    with services.sessions.begin() as session:
        if repo.lock_federation_for_write(session, federation_id) is None:
            raise NotFoundError(f"federation {federation_id} does not exist")
        federation, client = _federation_and_client(session, federation_id, client_id)
        withdrawn = attendance.set_suspended(
            session, federation, client, reason=reason, actor=actor, now=services.clock()
        )
        complete = withdrawn is not None and round_is_complete(session, withdrawn)
    if complete and withdrawn is not None:
        schedule_close(services, withdrawn.id)
    return client


def recompute(
    services: Services,
    federation_id: uuid.UUID,
    index: int,
    *,
    audit_overrides: dict[str, Any] | None = None,
    exclude_clients: list[uuid.UUID] | None = None,
) -> RecomputedRound:
    """`recompute_round` in a session of its own; nothing is stored."""
    with services.sessions() as session:
        federation = queries.federation_of(session, federation_id)
        return recompute_round(
            services,
            session,
            federation,
            index,
            audit_overrides=audit_overrides,
            exclude_clients=exclude_clients,
        )
