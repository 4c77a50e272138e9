"""Use cases of the operator: federations, the initial model, clients.

The functions that take `Services` are the use cases the routes call: each runs one unit of
work (``with services.sessions.begin()``) and commits it. The functions that take a `Session`
are their steps: they flush and leave the commit to their caller, so they compose (tests and
the use cases above build a federation in one transaction with them).
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.coordinator import rounds
from service.coordinator.federation_config import (
    FederationConfigInput,
    InvalidHyperparametersError,
    resolve_config,
)
from service.coordinator.model_fit import fit_problems
from service.coordinator.notify import mark_changed
from service.coordinator.privacy_budget import require_accountant
from service.coordinator.resources import Services
from service.coordinator.tensors import (
    Manifest,
    SafetensorsFormatError,
    non_finite_tensors,
    read_manifest,
)
from service.errors import (
    BadRequestError,
    ConflictError,
    FederationStateError,
    InvalidModelError,
    InvalidSpecError,
    NotFoundError,
)
from service.store import repositories as repo
from service.store.tables import ENDED_STATUSES, Client, Federation, ModelVersion

CLIENT_TOKEN_PREFIX = "fa_c_"


def hash_token(token: str) -> str:
    """Client tokens are 256-bit random strings, so a plain sha256 is a safe stored form."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def get_federation(session: Session, federation_id: uuid.UUID) -> Federation:
    federation = repo.get_federation(session, federation_id)
    if federation is None:
        raise NotFoundError(f"federation {federation_id} does not exist")
    return federation


def create_federation(
    session: Session,
    *,
    name: str,
    num_classes: int,
    input_shape: list[int],
    class_names: list[str] | None,
    rounds: int,
    min_clients: int,
    max_clients: int | None,
    round_deadline_s: float,
    config: FederationConfigInput,
    seed: int | None,
    actor: str,
) -> Federation:
    if class_names is not None and len(class_names) != num_classes:
        raise BadRequestError(
            f"class_names has {len(class_names)} names for {num_classes} classes",
            errors=[{"loc": ["task", "class_names"], "msg": "length must equal num_classes"}],
        )
    if max_clients is not None and max_clients < min_clients:
        raise BadRequestError(
            "max_clients is smaller than min_clients",
            errors=[{"loc": ["plan", "max_clients"], "msg": "must be >= min_clients"}],
        )
    if repo.get_federation_by_name(session, name) is not None:
        raise ConflictError(f"a federation named {name!r} already exists")
    try:
        resolved = resolve_config(config, rounds=rounds)
    except InvalidHyperparametersError as exc:
        raise InvalidSpecError(
            str(exc),
            errors=[
                {**error, "loc": ["body", "config", "hyperparameters", *error["loc"]]}
                for error in exc.errors
            ],
        ) from None
    except ValueError as exc:
        raise BadRequestError(
            f"invalid audit configuration: {exc}",
            errors=[{"loc": ["config"], "msg": str(exc)}],
        ) from None
    if config.privacy.dp_active:
        require_accountant()  # no federation whose budget could not be accounted
    federation = Federation(
        name=name,
        num_classes=num_classes,
        input_shape=list(input_shape),
        class_names=class_names,
        rounds=rounds,
        min_clients=min_clients,
        max_clients=max_clients,
        round_deadline_s=round_deadline_s,
        seed=seed if seed is not None else secrets.randbelow(2**31),
        config=resolved,
        status="created",
    )
    try:
        repo.add(session, federation)
    except IntegrityError:
        raise ConflictError(f"a federation named {name!r} already exists") from None
    repo.add_event(
        session,
        kind="federation.created",
        actor=actor,
        message=f"federation {name!r} created ({rounds} rounds, method {resolved['method']})",
        federation_id=federation.id,
        data={"config": resolved},
    )
    return federation


def _federation_before_first_round(session: Session, federation_id: uuid.UUID) -> Federation:
    """The federation, locked, while its initial model may still be replaced (no round opened,
    not finished, failed or stopped); raises otherwise."""
    federation = repo.lock_federation(session, federation_id)
    if federation is None:
        raise NotFoundError(f"federation {federation_id} does not exist")
    session.refresh(federation)  # the locked row's values
    if federation.status in ENDED_STATUSES:
        raise FederationStateError(
            f"federation {federation.name!r} has {federation.status}; its initial model can no "
            "longer be replaced"
        )
    if federation.status not in ("created", "waiting") or repo.count_rounds(session, federation.id):
        raise FederationStateError(
            f"federation {federation.name!r} has opened its first round (status "
            f"{federation.status}): the sites have the initial model, which can no longer be "
            "replaced; to start over with another model, stop this federation and create a new "
            "one"
        )
    return federation


def _checked_initial_model(staged: Path, federation: Federation) -> Manifest:
    """The initial model's tensor manifest once it is usable safetensors that fits the task
    (``model_fit.fit_problems``) with finite values; raises ``InvalidModelError`` otherwise."""
    try:
        manifest = read_manifest(staged)
    except SafetensorsFormatError as exc:
        raise InvalidModelError(f"the initial model is not usable safetensors: {exc}") from None
    problems = fit_problems(
        manifest,
        num_classes=federation.num_classes,
        hyperparameters=(federation.config or {}).get("hyperparameters"),
        input_shape=federation.input_shape,
    )
    if problems:
        raise InvalidModelError(
            "the initial model cannot fit the task: " + "; ".join(p["msg"] for p in problems),
            errors=problems,
        )
    bad = non_finite_tensors(staged, manifest)
    if bad:
        raise InvalidModelError(f"the initial model has non-finite values in {bad[:5]}")
    return manifest


def upload_initial_model(
    services: Services,
    session: Session,
    federation_id: uuid.UUID,
    *,
    staged: Path,
    sha256: str,
    size: int,
    actor: str,
) -> tuple[ModelVersion, str | None]:
    """Store version 0 of the global model; the federation then waits for its clients.

    The model must fit the task (`model_fit.fit_problems`). It may be replaced as long as no
    round has opened: a site receives the model's id only in a round's instructions (and may not
    download version 0 before), so until then no site has it. The old version's row goes in this
    transaction; its blob key is returned (None when nothing was replaced) so that the caller
    can remove the blob once the transaction has committed.
    """
    federation = _federation_before_first_round(session, federation_id)
    manifest = _checked_initial_model(staged, federation)
    previous = (
        repo.get_model_version(session, federation.current_model_id)
        if federation.current_model_id is not None
        else None
    )
    replaced_key: str | None = None
    if previous is not None:
        replaced_key = previous.blob_key
        federation.current_model_id = None
        session.flush()
        session.delete(previous)
        session.flush()
    services.blobs.put_file(staged, sha256, session=session)
    version = ModelVersion(
        federation_id=federation.id,
        version=0,
        round_index=None,
        sha256=sha256,
        size_bytes=size,
        blob_key=sha256,
        manifest=manifest,
    )
    repo.add(session, version)
    federation.current_model_id = version.id
    federation.status = "waiting"
    mark_changed(session, federation.id)
    repo.add_event(
        session,
        kind="model.initial_replaced" if previous is not None else "model.initial_uploaded",
        actor=actor,
        message=(
            f"initial model {'replaced' if previous is not None else 'uploaded'} "
            f"({len(manifest)} tensors, {size} bytes)"
        ),
        federation_id=federation.id,
        data={
            "model_id": str(version.id),
            "sha256": sha256,
            **(
                {"replaced_model_id": str(previous.id), "replaced_sha256": previous.sha256}
                if previous is not None
                else {}
            ),
        },
    )
    session.flush()
    return version, (replaced_key if replaced_key != sha256 else None)


def stop_federation(
    session: Session, federation_id: uuid.UUID, *, reason: str, actor: str
) -> Federation:
    """Stop a federation for good: status ``stopped`` with the admin's reason, its open round
    ``failed``; the sites' next instruction call answers 409 with the reason (the SDK raises
    ``FederationFailedError``).

    Lock order as in closing a round (round, then federation), so a stop and a close never wait
    on each other in a cycle: a round that is being closed finishes closing, and the round it
    opens is failed here too.

    Raises
    ------
    NotFoundError
        No such federation.
    FederationStateError
        The federation has already finished, failed or stopped.
    """
    round_reason = f"the federation was stopped by the admin: {reason}"
    failed_rounds = repo.fail_open_rounds(session, federation_id, round_reason)
    federation = repo.lock_federation(session, federation_id)
    if federation is None:
        raise NotFoundError(f"federation {federation_id} does not exist")
    session.refresh(federation)  # the locked row's values, even if a caller loaded it before
    if federation.status in ENDED_STATUSES:
        raise FederationStateError(
            f"federation {federation.name!r} has already {federation.status}; nothing to stop"
        )
    failed_rounds += repo.fail_open_rounds(session, federation_id, round_reason)
    federation.status = "stopped"
    mark_changed(session, federation.id)
    federation.status_reason = f"stopped by the admin: {reason}"
    repo.add_event(
        session,
        kind="federation.stopped",
        actor=actor,
        message=f"federation stopped: {reason}",
        federation_id=federation.id,
        data={"reason": reason, "open_rounds_failed": failed_rounds},
    )
    session.flush()
    return federation


def add_client(
    session: Session, federation_id: uuid.UUID, *, name: str, actor: str
) -> tuple[Client, str]:
    """Register a client; its token is returned once and only its hash is stored."""
    federation = get_federation(session, federation_id)
    if federation.status in ENDED_STATUSES:
        raise FederationStateError(f"federation {federation.name!r} is {federation.status}")
    if repo.client_name_taken(session, federation.id, name):
        raise ConflictError(f"federation {federation.name!r} already has a client named {name!r}")
    token = CLIENT_TOKEN_PREFIX + secrets.token_urlsafe(32)
    client = Client(federation_id=federation.id, name=name, token_hash=hash_token(token))
    repo.add(session, client)
    repo.add_event(
        session,
        kind="client.added",
        actor=actor,
        message=f"client {name!r} added",
        federation_id=federation.id,
        client_id=client.id,
    )
    return client, token


def federation_summary(session: Session, federation: Federation) -> dict[str, int]:
    """Counts shown with a federation."""
    return federation_summaries(session, [federation])[federation.id]


def federation_summaries(
    session: Session, federations: Sequence[Federation]
) -> dict[uuid.UUID, dict[str, int]]:
    """Counts shown with each federation of a page, in a fixed number of queries."""
    counts = repo.federation_counts(session, [f.id for f in federations])
    shown = ("clients", "joined_clients", "rounds_started")
    return {fid: {key: c[key] for key in shown} for fid, c in counts.items()}


# --- use cases: one transaction each, committed here -----------------------------------------


def register_federation(
    services: Services,
    *,
    name: str,
    num_classes: int,
    input_shape: list[int],
    class_names: list[str] | None,
    rounds: int,
    min_clients: int,
    max_clients: int | None,
    round_deadline_s: float,
    config: FederationConfigInput,
    seed: int | None,
    actor: str,
) -> Federation:
    """Create a federation (`create_federation`) and commit it."""
    with services.sessions.begin() as session:
        return create_federation(
            session,
            name=name,
            num_classes=num_classes,
            input_shape=input_shape,
            class_names=class_names,
            rounds=rounds,
            min_clients=min_clients,
            max_clients=max_clients,
            round_deadline_s=round_deadline_s,
            config=config,
            seed=seed,
            actor=actor,
        )


def store_initial_model(
    services: Services,
    federation_id: uuid.UUID,
    *,
    staged: Path,
    sha256: str,
    size: int,
    actor: str,
) -> ModelVersion:
    """Check and store the uploaded initial model (`upload_initial_model`), then commit.

    The staged file is removed whatever happens; the blob is tied to the transaction, so a
    refused model leaves no blob behind.
    """
    try:
        with services.sessions.begin() as session:
            version, replaced_key = upload_initial_model(
                services,
                session,
                federation_id,
                staged=staged,
                sha256=sha256,
                size=size,
                actor=actor,
            )
    finally:
        staged.unlink(missing_ok=True)
    if replaced_key is not None:
        services.blobs.discard(replaced_key, services.sessions)
    return version


def stop(services: Services, federation_id: uuid.UUID, *, reason: str, actor: str) -> Federation:
    """Stop a federation for good (`stop_federation`) and commit."""
    with services.sessions.begin() as session:
        return stop_federation(session, federation_id, reason=reason, actor=actor)


def close_round_now(
    services: Services, federation_id: uuid.UUID, index: int, *, reason: str, actor: str
) -> None:
    """The admin's "close": close the open round ``index`` now with the updates it has, as its
    deadline would (at least the plan's ``min_clients`` of them); its selected sites that have
    not sent are left out of its audit and aggregate, and the next round opens as usual.

    A ``round.close_requested`` event records who asked and why; the round's ``state_reason``
    is ``closed by the admin: <reason>``. A round that another closer (the deadline checker, the
    last upload) closes meanwhile is answered as it is.

    Raises
    ------
    NotFoundError
        No such federation or round.
    FederationStateError
        The round is not open, or has fewer than ``min_clients`` updates.
    """
    with services.sessions.begin() as session:
        federation = get_federation(session, federation_id)
        rnd = rounds.get_round(session, federation_id, index)
        if rnd.state != "open":
            raise FederationStateError(f"round {index} is {rnd.state}; only an open round closes")
        updates = repo.count_updates_of_round(session, rnd.id)
        if updates < max(federation.min_clients, 1):
            raise FederationStateError(
                f"round {index} has {updates} updates; closing it needs at least "
                f"{max(federation.min_clients, 1)} (the plan's min_clients)"
            )
        repo.add_event(
            session,
            kind="round.close_requested",
            actor=actor,
            message=f"round {index}: close requested with {updates} updates: {reason}",
            federation_id=federation.id,
            round_id=rnd.id,
            data={"index": index, "updates": updates, "reason": reason},
        )
        round_id = rnd.id
    rounds.close_round(services, round_id, reason=f"closed by the admin: {reason}")


def register_client(
    services: Services, federation_id: uuid.UUID, *, name: str, actor: str
) -> tuple[Client, str]:
    """Add a client (`add_client`) and commit; its token is returned once."""
    with services.sessions.begin() as session:
        return add_client(session, federation_id, name=name, actor=actor)
