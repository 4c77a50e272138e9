"""Read-only use cases behind the admin and client endpoints."""

from __future__ import annotations

import uuid

from sqlalchemy.orm import Session

from service.coordinator.resources import Services
from service.errors import ForbiddenError, GoneError, NotFoundError
from service.report_views import FederationOverview
from service.store import repositories as repo
from service.store.tables import Client, Event, Federation, ModelUpdate, ModelVersion, Round


def list_federations(session: Session, *, offset: int, limit: int) -> tuple[list[Federation], int]:
    return repo.list_federations(session, offset=offset, limit=limit), repo.count_federations(
        session
    )


def federation_overview(session: Session) -> list[FederationOverview]:
    """Every federation with its status, client count, noisy and suspect clients (a pin counts
    over the detected status) and rounds closed (the admin index)."""
    counts = repo.federation_counts(session)
    statuses = repo.client_status_counts(session)
    rows = []
    for federation in repo.list_federations(session, offset=0, limit=None):
        rows.append(
            FederationOverview(
                id=str(federation.id),
                name=federation.name,
                status=federation.status,
                method=federation.config.get("method"),
                rounds_planned=federation.rounds,
                rounds_closed=counts.get(federation.id, {}).get("rounds_closed", 0),
                clients=counts.get(federation.id, {}).get("clients", 0),
                noisy=statuses.get(federation.id, {}).get("noisy", 0),
                suspect=statuses.get(federation.id, {}).get("suspect", 0),
                created_at=federation.created_at,
            )
        )
    return rows


def list_clients(session: Session, federation_id: uuid.UUID) -> list[Client]:
    return repo.list_clients(session, federation_id)


def get_client(session: Session, federation_id: uuid.UUID, client_id: uuid.UUID) -> Client:
    client = repo.get_client(session, client_id)
    if client is None or client.federation_id != federation_id:
        raise NotFoundError(f"client {client_id} does not exist in federation {federation_id}")
    return client


def list_rounds(
    session: Session, federation_id: uuid.UUID, *, offset: int, limit: int
) -> tuple[list[Round], int]:
    return (
        repo.list_rounds(session, federation_id, offset=offset, limit=limit),
        repo.count_rounds(session, federation_id),
    )


def list_events(
    session: Session,
    federation_id: uuid.UUID,
    *,
    kind: str | None,
    client_id: uuid.UUID | None,
    after_id: int,
    limit: int,
) -> list[Event]:
    return repo.list_events(
        session, federation_id, kind=kind, client_id=client_id, after_id=after_id, limit=limit
    )


def list_models(session: Session, federation_id: uuid.UUID) -> list[ModelVersion]:
    return repo.list_model_versions(session, federation_id)


def updates_of_round(session: Session, round_id: uuid.UUID) -> list[ModelUpdate]:
    return repo.updates_of_round(session, round_id)


def downloadable_model(
    session: Session, model_id: uuid.UUID, *, client: Client | None
) -> tuple[str, str, int]:
    """(blob key, sha256, size) of a model the caller may download.

    The admin may download any model. A client may download its federation's global model
    versions (the initial one once round 0 has opened), its own updates, and the latest local
    models of the neighbors it was assigned in the open round's instructions — nothing else
    (other clients' models are private). A model update that retention pruned is gone (410).
    """
    version = repo.get_model_version(session, model_id)
    if version is not None:
        if client is not None and version.federation_id != client.federation_id:
            raise NotFoundError(f"model {model_id} does not exist")
        if client is not None and version.version == 0:
            federation = repo.get_federation(session, version.federation_id)
            if federation is not None and federation.status in ("created", "waiting"):
                # Not handed out before round 0: until then the admin may still replace it.
                raise NotFoundError(f"model {model_id} is not handed out before round 0 opens")
        return version.blob_key, version.sha256, version.size_bytes
    update = repo.get_update(session, model_id)
    if update is None or (client is not None and update.federation_id != client.federation_id):
        raise NotFoundError(f"model {model_id} does not exist")
    if client is not None and update.client_id != client.id:
        rnd = repo.open_round_of(session, client.federation_id)
        participant = repo.participant(session, rnd.id, client.id) if rnd is not None else None
        assigned = (
            {n["model_id"] for n in (participant.instructions.get("neighbors") or [])}
            if participant is not None
            else set()
        )
        if str(update.id) not in assigned:
            raise ForbiddenError(
                f"model {model_id} is another client's local model and was not assigned to you"
            )
    if update.pruned_at is not None:
        raise GoneError(
            f"model {model_id} is the update of round {update.round_index} that retention "
            f"pruned at {update.pruned_at.isoformat()}; its row and the audit results stay, the "
            "global models of every round can still be downloaded",
            reason="pruned by retention",
            pruned_at=update.pruned_at.isoformat(),
            round=update.round_index,
        )
    return update.blob_key, update.sha256, update.size_bytes


def model_to_download(
    services: Services, model_id: uuid.UUID, *, client: Client | None
) -> tuple[str, str, int]:
    """`downloadable_model` in a short session of its own (the connection is back in the pool
    before the file is sent)."""
    with services.sessions() as session:
        return downloadable_model(session, model_id, client=client)


def federation_of(session: Session, federation_id: uuid.UUID) -> Federation:
    federation = repo.get_federation(session, federation_id)
    if federation is None:
        raise NotFoundError(f"federation {federation_id} does not exist")
    return federation


def audit_of_round(session: Session, round_id: uuid.UUID) -> dict[str, object] | None:
    audit = repo.audit_of_round(session, round_id)
    return None if audit is None else audit.result
