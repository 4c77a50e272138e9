"""Accepting a client's update: every check happens before anything is stored.

Order: idempotent replay, round state, selection, duplicate, declared sha256, tensor manifest
(names, shapes, dtypes equal the global model's), finite values, signals, and num_samples /
class_counts against the site's join (within the federation's ``max_sample_drift``). Only then
are the blob stored and the row inserted, in one transaction that locks the round against a
concurrent close (a file or an object is put before that lock, so no connection is held while it
travels; the database store's row after it); a blob whose transaction does not commit is
removed again. A rejected request
changes nothing but the event trail, which records why. The metadata's checks are in
:mod:`service.coordinator.update_metadata`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from typing_extensions import TypedDict

from service.coordinator import rounds
from service.coordinator.resources import Services
from service.coordinator.tensors import (
    SafetensorsFormatError,
    manifest_differences,
    non_finite_tensors,
    read_manifest,
)
from service.coordinator.update_metadata import parse_metadata, problem, validate_signals
from service.errors import (
    CoordinatorError,
    DuplicateUpdateError,
    ForbiddenError,
    IdempotencyKeyReusedError,
    InconsistentUpdateError,
    NotFoundError,
    Problem,
    RoundClosedError,
    UpdateRejectedError,
)
from service.store import repositories as repo
from service.store.base import utcnow
from service.store.tables import Client, Federation, ModelUpdate, Round

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StagedUpload:
    """The state file as received: already on disk, hashed while streaming."""

    path: Path
    sha256: str
    size: int
    non_finite: list[str] | None = None
    """The float tensors holding NaN or infinity, found while the bytes streamed in
    (:class:`service.coordinator.finite_scan.FiniteScan`); None: not known, read the file."""


@dataclass(frozen=True)
class SubmitResult:
    update: ModelUpdate
    created: bool
    # counted in the transaction that stored the update, under the round's lock: every site the
    # round selected has its update stored, so the round can close
    round_complete: bool = False


def join_drift_errors(
    num_samples: int,
    class_counts: list[int | None],
    joined_samples: int,
    joined_counts: list[int | None],
    drift: float,
) -> list[Problem]:
    """How an update's counts leave the drift allowed from the join (empty: within it).

    With n the joined num_samples and d the drift: ``|num_samples - n| <= d n``, and the class
    histogram's L1 distance to the joined one, ``sum_c |class_counts[c] - joined[c]|``, at most
    ``d n`` (so relabelling m samples costs 2m). d = 0: exactly the join. A class count the
    privacy policy suppresses (null) counts as 0 here: null on both sides is no change.
    """
    allowed = drift * joined_samples
    errors: list[Problem] = []
    if abs(num_samples - joined_samples) > allowed:
        errors.append(
            problem(
                ["metadata", "num_samples"],
                f"{num_samples} is not within {drift:g} x the {joined_samples} samples declared "
                f"at join (at most {allowed:g} more or fewer)",
            )
        )
    distance = sum(
        abs(int(a or 0) - int(b or 0)) for a, b in zip(class_counts, joined_counts, strict=True)
    )
    if distance > allowed:
        errors.append(
            problem(
                ["metadata", "signals", "class_counts"],
                f"differs from the class counts declared at join by {distance} samples in all "
                f"(sum of absolute differences); at most {allowed:g} allowed",
            )
        )
    return errors


def check_join_consistency(
    num_samples: int,
    class_counts: list[int | None],
    joined_samples: int | None,
    joined_counts: list[int | None] | None,
    drift: float,
) -> None:
    """Refuse an update whose counts are not what the site declared at join, within ``drift``."""
    if joined_samples is None or joined_counts is None:
        raise InconsistentUpdateError(
            "this site has declared no sample counts: join before submitting",
            errors=[problem(["metadata", "num_samples"], "no join declaration to compare with")],
        )
    errors = join_drift_errors(num_samples, class_counts, joined_samples, joined_counts, drift)
    if errors:
        raise InconsistentUpdateError(
            f"the update is inconsistent with the site's join ({len(errors)} problem(s); "
            f"allowed drift {drift:g} of the {joined_samples} joined samples; first: "
            f"{'.'.join(map(str, errors[0]['loc']))}: {errors[0]['msg']})",
            errors=errors,
            claimed={"num_samples": num_samples, "class_counts": class_counts},
            declared={"num_samples": joined_samples, "class_counts": joined_counts},
            max_sample_drift=drift,
        )


def request_hash(metadata: dict[str, Any], sha256: str) -> str:
    canonical = json.dumps(metadata, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{canonical}\n{sha256}".encode()).hexdigest()


class OpenRoundHint(TypedDict):
    """The extension of a refusal for a round that is not open: the index of the round that is,
    so that a site that fell behind knows where to go on; None when none is (the problem then
    leaves the key out, as it does every null)."""

    open_round: int | None


def _open_round_hint(session: Session, federation_id: uuid.UUID) -> OpenRoundHint:
    open_round = repo.open_round_of(session, federation_id)
    return {"open_round": None if open_round is None else open_round.index}


def submit_update(
    services: Services,
    client: Client,
    *,
    federation_id: uuid.UUID,
    round_index: int,
    metadata_raw: str | bytes,
    staged: StagedUpload,
    idempotency_key: str,
) -> SubmitResult:
    """Validate and store one update; record a rejection in the event trail."""
    try:
        result = _submit(
            services,
            client,
            federation_id=federation_id,
            round_index=round_index,
            metadata_raw=metadata_raw,
            staged=staged,
            idempotency_key=idempotency_key,
        )
    except CoordinatorError as exc:
        record_rejection(services, client, federation_id, round_index, exc)
        raise
    finally:
        staged.path.unlink(missing_ok=True)
    if result.round_complete:
        schedule_close(services, result.update.round_id)
    return result


MAX_RECORDED_REJECTIONS = 20
"""``update.rejected`` events recorded per site within ``REJECTION_WINDOW``: beyond, a refused
upload or join is refused as before but only logged, so that a site with a valid token cannot grow
the event trail without bound (the report's count of a site's inconsistent claims then stops
there for that window)."""

REJECTION_WINDOW = timedelta(minutes=10)


def record_rejection(
    services: Services,
    client: Client | None,
    federation_id: uuid.UUID | None,
    round_index: int | None,
    exc: CoordinatorError,
) -> None:
    """The event saying why an upload was refused (its own transaction), at most
    ``MAX_RECORDED_REJECTIONS`` a site within ``REJECTION_WINDOW``."""
    with services.sessions.begin() as session:
        fid = (
            federation_id
            if repo.get_federation(session, federation_id or uuid.UUID(int=0))
            else None
        )
        if client is not None and fid is not None:
            since = utcnow() - REJECTION_WINDOW  # as the events' created_at is stamped
            recent = repo.recent_client_events(
                session, fid, client.id, kind="update.rejected", since=since
            )
            if recent >= MAX_RECORDED_REJECTIONS:
                log.warning(
                    "site %s: refused again (%s), not recorded: %d refusals recorded in the last "
                    "%s",
                    client.id,
                    exc.type_slug,
                    recent,
                    REJECTION_WINDOW,
                )
                return
        repo.add_event(
            session,
            kind="update.rejected",
            actor=f"client:{client.id}" if client else "anonymous",
            message=f"update for round {round_index} rejected ({exc.status}): {exc.detail}",
            federation_id=fid,
            client_id=client.id if client else None,
            data={
                "status": exc.status,
                "type": exc.type_slug,
                "round_index": round_index,
                "errors": exc.extensions.get("errors", [])[:20],
                **{
                    key: exc.extensions[key]
                    for key in ("claimed", "declared", "max_sample_drift")
                    if key in exc.extensions
                },
            },
        )


def _submit(
    services: Services,
    client: Client,
    *,
    federation_id: uuid.UUID,
    round_index: int,
    metadata_raw: str | bytes,
    staged: StagedUpload,
    idempotency_key: str,
) -> SubmitResult:
    if client.federation_id != federation_id:
        raise NotFoundError(f"federation {federation_id} does not exist")
    if not (1 <= len(idempotency_key) <= 200):
        raise UpdateRejectedError(
            "the Idempotency-Key header must be 1-200 characters",
            errors=[problem(["header", "Idempotency-Key"], "1-200 characters")],
        )
    metadata = parse_metadata(metadata_raw)
    digest = request_hash(metadata, staged.sha256)
    with services.sessions() as session:
        previous = repo.update_by_idempotency_key(session, client.id, idempotency_key)
        if previous is not None:
            if previous.request_hash == digest:
                return SubmitResult(previous, created=False)
            raise IdempotencyKeyReusedError(
                "this Idempotency-Key was used for a different update",
                update_id=str(previous.id),
            )
        context = _round_context(session, federation_id, round_index, client)
    federation, rnd = context.federation, context.round

    _check_state_file(metadata, staged, context.manifest)
    num_samples, signals, metrics = validate_signals(metadata, federation)
    check_join_consistency(
        num_samples,
        signals["class_counts"],
        context.joined_samples,
        context.joined_counts,
        float(federation.config["max_sample_drift"]),
    )

    # The blob belongs to this transaction: the store removes it again if the transaction ends
    # without a commit, whatever the exception (service.store.blobs). A file or an object is put
    # before the transaction's first statement: the session takes a pooled connection only
    # then, so none is held while the blob travels (a network PUT with the S3 store). The
    # database store writes a row: it puts after the round's lock, which orders two sites'
    # puts of the same bytes (else both would insert the row and one be refused).
    early = not services.blobs.writes_rows
    try:
        with services.sessions.begin() as session:
            if early:
                services.blobs.put_file(staged.path, staged.sha256, session=session)
            _lock_open_round(session, rnd, client)
            if not early:
                services.blobs.put_file(staged.path, staged.sha256, session=session)
            update = ModelUpdate(
                federation_id=federation_id,
                round_id=rnd.id,
                client_id=client.id,
                round_index=round_index,
                blob_key=staged.sha256,
                sha256=staged.sha256,
                size_bytes=staged.size,
                num_samples=num_samples,
                signals=signals,
                metrics=metrics,
                idempotency_key=idempotency_key,
                request_hash=digest,
                received_at=services.clock(),
            )
            repo.add(session, update)
            repo.touch_client(session, client.id, services.clock())
            _log_accepted(session, update, client)
            complete = rounds.round_is_complete(session, rnd)
    except IntegrityError:
        raise DuplicateUpdateError(
            f"an update for round {round_index} was already accepted from this client"
        ) from None
    return SubmitResult(update, created=True, round_complete=complete)


def _lock_open_round(session: Session, rnd: Round, client: Client) -> None:
    """Lock the round against a concurrent close (and a suspension's withdrawal); refuse the
    update if the round closed meanwhile, the client's update for it was accepted already, or the
    client was withdrawn from it (``attendance``)."""
    if not repo.touch_open_round(session, rnd.id):
        raise RoundClosedError(
            f"round {rnd.index} closed while this update was being received",
            **_open_round_hint(session, rnd.federation_id),
        )
    if repo.has_update(session, rnd.id, client.id):
        raise DuplicateUpdateError(
            f"an update for round {rnd.index} was already accepted from this client"
        )
    if repo.participant(session, rnd.id, client.id) is None:  # an admin's suspension meanwhile
        raise ForbiddenError(
            f"this client was withdrawn from round {rnd.index} while its update was received"
        )


class _RoundContext(NamedTuple):
    """What an update is checked against, read in one short session: the federation, the open
    round, the global model's tensor manifest, and what the site declared when it joined."""

    federation: Federation
    round: Round
    manifest: Any
    joined_samples: int | None
    joined_counts: list[int | None] | None


def _round_context(
    session: Session, federation_id: uuid.UUID, round_index: int, client: Client
) -> _RoundContext:
    """The context of an update for ``round_index``; raises when that round does not exist, is
    not open, did not select the client, or already has its update."""
    federation = repo.get_federation(session, federation_id)
    assert federation is not None
    rnd = repo.get_round_by_index(session, federation_id, round_index)
    if rnd is None:
        raise NotFoundError(
            f"round {round_index} does not exist", **_open_round_hint(session, federation_id)
        )
    _check_round(session, rnd, client)
    model_in = repo.get_model_version(session, rnd.model_in_id)
    assert model_in is not None
    site = repo.get_client(session, client.id)
    assert site is not None
    joined_counts = (
        None
        if site.class_counts is None
        else [None if c is None else int(c) for c in site.class_counts]
    )
    return _RoundContext(federation, rnd, model_in.manifest, site.num_samples, joined_counts)


def _check_state_file(metadata: dict[str, Any], staged: StagedUpload, expected: Any) -> None:
    """The received state against the metadata and the global model: the declared sha256, a
    readable safetensors header, the same tensors (names, shapes, dtypes), finite values."""
    declared = metadata.get("sha256")
    if declared != staged.sha256:
        raise UpdateRejectedError(
            f"declared sha256 {declared!r} does not match the received state ({staged.sha256})",
            errors=[problem(["metadata", "sha256"], "does not match the state's bytes")],
        )
    try:
        manifest = read_manifest(staged.path)
    except SafetensorsFormatError as exc:
        raise UpdateRejectedError(
            f"the state is not usable safetensors: {exc}", errors=[problem(["state"], str(exc))]
        ) from None
    differences = manifest_differences(expected, manifest)
    if differences:
        raise UpdateRejectedError(
            f"the state does not match the global model: {'; '.join(differences[:5])}",
            errors=[problem(["state"], d) for d in differences[:50]],
        )
    bad = (
        staged.non_finite
        if staged.non_finite is not None
        else non_finite_tensors(staged.path, manifest)
    )
    if bad:
        raise UpdateRejectedError(
            f"non-finite values (NaN or infinity) in {', '.join(bad[:5])}",
            errors=[problem(["state", name], "non-finite values") for name in bad[:50]],
        )


def _log_accepted(session: Session, update: ModelUpdate, client: Client) -> None:
    """The audit trail's ``update.accepted`` event of ``update``."""
    repo.add_event(
        session,
        kind="update.accepted",
        actor=f"client:{client.id}",
        message=f"update for round {update.round_index} accepted from {client.name!r}",
        federation_id=update.federation_id,
        round_id=update.round_id,
        client_id=client.id,
        data={"update_id": str(update.id), "sha256": update.sha256, "size": update.size_bytes},
    )


def _check_round(session: Session, rnd: Round, client: Client) -> None:
    if rnd.state != "open":
        hint = _open_round_hint(session, rnd.federation_id)
        where = (
            f"round {hint['open_round']} is open"
            if hint["open_round"] is not None
            else "no round is open"
        )
        raise RoundClosedError(f"round {rnd.index} is {rnd.state}; {where}", **hint)
    if repo.participant(session, rnd.id, client.id) is None:
        raise ForbiddenError(f"this client was not selected for round {rnd.index}")
    if repo.has_update(session, rnd.id, client.id):
        raise DuplicateUpdateError(
            f"an update for round {rnd.index} was already accepted from this client"
        )


def schedule_close(services: Services, round_id: uuid.UUID) -> None:
    """Close the complete round now (inline) or on the background worker (once per round)."""
    if services.settings.close_rounds_inline:
        rounds.close_round(services, round_id, reason="complete")
    else:
        services.worker.submit_once(
            round_id, lambda: rounds.close_round(services, round_id, reason="complete")
        )
