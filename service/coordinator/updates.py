"""Accepting a client's update: every check happens before anything is stored.

Order: idempotent replay, round state, selection, duplicate, declared sha256, tensor manifest
(names, shapes, dtypes equal the global model's), finite values, signals, and num_samples /
class_counts against the site's join (within the federation's ``max_sample_drift``). Only then
is the blob stored and the row inserted, in a transaction that first locks the round against a
concurrent close; a blob whose transaction does not commit is removed again. A rejected request
changes nothing but the event trail, which records why.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.coordinator import rounds
from service.coordinator.services import Services
from service.coordinator.tensors import (
    SafetensorsFormatError,
    manifest_differences,
    non_finite_tensors,
    read_manifest,
)
from service.errors import (
    CoordinatorError,
    DuplicateUpdateError,
    ForbiddenError,
    IdempotencyKeyReusedError,
    InconsistentUpdateError,
    NotFoundError,
    RoundClosedError,
    UpdateRejectedError,
)
from service.inputs import INT32_MAX, MAX_JSON_DEPTH, json_depth_exceeds, name_problem
from service.store import repositories as repo
from service.store.models import Client, Federation, ModelUpdate, Round

log = logging.getLogger(__name__)

PROBABILITY_TOLERANCE = 1e-3
MAX_METRICS = 64


@dataclass(frozen=True)
class StagedUpload:
    """The state file as received: already on disk, hashed while streaming."""

    path: Path
    sha256: str
    size: int


@dataclass(frozen=True)
class SubmitResult:
    update: ModelUpdate
    created: bool


def _error(loc: list[Any], msg: str) -> dict[str, Any]:
    return {"loc": loc, "msg": msg}


def _check_per_class(
    errors: list[dict[str, Any]],
    name: str,
    values: Any,
    counts: list[int] | None,
    num_classes: int,
    *,
    counted: bool = False,
) -> None:
    """A per-class signal: one value per held class, null elsewhere. A finite non-negative
    number; with ``counted``, an integer from 0 to the class's count (``per_class_errors``)."""
    loc: list[str | int] = ["metadata", "signals", name]
    if not isinstance(values, list) or len(values) != num_classes:
        errors.append(_error(loc, f"must have {num_classes} entries"))
        return
    for c, value in enumerate(values):
        present = counts is not None and counts[c] > 0
        if value is None:
            if present:
                errors.append(_error([*loc, c], "null for a class the client holds"))
        elif counted and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            errors.append(_error([*loc, c], "must be a non-negative integer"))
        elif not counted and not (_finite(value) and value >= 0):
            errors.append(_error([*loc, c], "must be a finite non-negative number"))
        elif counts is not None and not present:
            errors.append(_error([*loc, c], "must be null for a class with no sample"))
        elif counted and counts is not None and value > counts[c]:
            errors.append(_error([*loc, c], f"exceeds the class's count {counts[c]}"))


def parse_metadata(raw: str | bytes) -> dict[str, Any]:
    too_deep = f"nested deeper than {MAX_JSON_DEPTH} levels"
    try:
        data = json.loads(raw)
    except RecursionError:
        raise UpdateRejectedError(
            f"metadata is {too_deep}", errors=[_error(["metadata"], too_deep)]
        ) from None
    except ValueError as exc:  # not JSON, not UTF-8, or an integer of more than 4300 digits
        raise UpdateRejectedError(
            f"metadata is not valid JSON: {exc}", errors=[_error(["metadata"], str(exc))]
        ) from None
    if json_depth_exceeds(data):
        raise UpdateRejectedError(
            f"metadata is {too_deep}", errors=[_error(["metadata"], too_deep)]
        )
    if not isinstance(data, dict):
        raise UpdateRejectedError(
            "metadata must be a JSON object", errors=[_error(["metadata"], "not an object")]
        )
    return data


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def validate_signals(
    metadata: dict[str, Any], federation: Federation
) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """Check the metadata's numbers against the federation; return (n, signals, metrics)."""
    errors: list[dict[str, Any]] = []
    num_classes = federation.num_classes
    n = metadata.get("num_samples")
    if not (isinstance(n, int) and not isinstance(n, bool) and 0 < n <= INT32_MAX):
        errors.append(
            _error(["metadata", "num_samples"], f"must be an integer from 1 to {INT32_MAX}")
        )
        n = None
    signals = metadata.get("signals")
    if not isinstance(signals, dict):
        errors.append(_error(["metadata", "signals"], "must be an object"))
        raise UpdateRejectedError("signals are missing", errors=errors)
    known = {
        "class_counts",
        "per_class_loss",
        "per_class_loss_sd",
        "per_class_errors",
        "train_loss",
        "train_accuracy",
        "probe_softmax",
        "centroids",
    }
    for key in sorted(set(signals) - known):
        errors.append(_error(["metadata", "signals", key], "unknown signal"))
    for key in federation.config["signals"]:
        if signals.get(key) is None:
            errors.append(_error(["metadata", "signals", key], "required by this federation"))

    counts: Any = signals.get("class_counts")
    counts_ok = (
        isinstance(counts, list)
        and len(counts) == num_classes
        and all(
            isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= INT32_MAX for c in counts
        )
    )
    if not counts_ok:
        errors.append(
            _error(
                ["metadata", "signals", "class_counts"],
                f"must be {num_classes} integers from 0 to {INT32_MAX}",
            )
        )
    elif n is not None and sum(counts) != n:
        errors.append(
            _error(
                ["metadata", "signals", "class_counts"],
                f"sums to {sum(counts)} but num_samples is {n}",
            )
        )

    losses = signals.get("per_class_loss")
    if losses is not None:
        _check_per_class(
            errors, "per_class_loss", losses, counts if counts_ok else None, num_classes
        )
    # Sent with per_class_loss only: its spread, and its error counts (integers up to the count).
    for name, counted in (("per_class_loss_sd", False), ("per_class_errors", True)):
        values = signals.get(name)
        if values is None:
            continue
        if losses is None:
            errors.append(_error(["metadata", "signals", name], "sent without per_class_loss"))
        else:
            _check_per_class(
                errors, name, values, counts if counts_ok else None, num_classes, counted=counted
            )

    train_loss = signals.get("train_loss")
    if train_loss is not None and not (_finite(train_loss) and train_loss >= 0):
        errors.append(
            _error(["metadata", "signals", "train_loss"], "must be a finite non-negative number")
        )
    accuracy = signals.get("train_accuracy")
    if accuracy is not None and not (_finite(accuracy) and 0.0 <= accuracy <= 1.0):
        errors.append(_error(["metadata", "signals", "train_accuracy"], "must be in [0, 1]"))

    probe = signals.get("probe_softmax")
    if probe is not None:
        loc = ["metadata", "signals", "probe_softmax"]
        size = int(federation.config["probe_size"])
        rows_ok = (
            isinstance(probe, list)
            and len(probe) == size
            and all(isinstance(r, list) and len(r) == num_classes for r in probe)
        )
        if not rows_ok:
            errors.append(_error(loc, f"must be {size} rows of {num_classes} probabilities"))
        else:
            for i, row in enumerate(probe):
                if not all(_finite(p) and -1e-6 <= p <= 1 + 1e-6 for p in row):
                    errors.append(_error([*loc, i], "probabilities must be in [0, 1]"))
                elif abs(sum(row) - 1.0) > PROBABILITY_TOLERANCE:
                    errors.append(_error([*loc, i], f"sums to {sum(row):.6f}, not 1"))

    centroids = signals.get("centroids")
    if centroids is not None:
        loc = ["metadata", "signals", "centroids"]
        ok = (
            isinstance(centroids, list)
            and len(centroids) == num_classes
            and all(isinstance(r, list) and r for r in centroids)
            and len({len(r) for r in centroids}) == 1
            and all(_finite(v) for r in centroids for v in r)
        )
        if not ok:
            errors.append(_error(loc, f"must be {num_classes} equal-length rows of finite numbers"))

    metrics = metadata.get("metrics", {})
    if not isinstance(metrics, dict) or len(metrics) > MAX_METRICS:
        errors.append(_error(["metadata", "metrics"], f"must be an object of <= {MAX_METRICS}"))
        metrics = {}
    else:
        for key, value in metrics.items():
            if not (1 <= len(key) <= 64) or name_problem(key) is not None:
                errors.append(
                    _error(["metadata", "metrics"], "names must be 1-64 printable characters")
                )
            elif not (value is None or _finite(value)):
                errors.append(_error(["metadata", "metrics", key], "finite number"))
    for key in sorted(set(metadata) - {"num_samples", "sha256", "signals", "metrics"}):
        errors.append(_error(["metadata", key], "unknown field"))
    if errors:
        raise UpdateRejectedError(
            f"the update's metadata is invalid ({len(errors)} problems; first: "
            f"{'.'.join(map(str, errors[0]['loc']))}: {errors[0]['msg']})",
            errors=errors,
        )
    assert n is not None
    clean = {k: v for k, v in signals.items() if v is not None}
    return n, clean, dict(metrics)


def join_drift_errors(
    num_samples: int,
    class_counts: list[int],
    joined_samples: int,
    joined_counts: list[int],
    drift: float,
) -> list[dict[str, Any]]:
    """How an update's counts leave the drift allowed from the join (empty: within it).

    With n the joined num_samples and d the drift: ``|num_samples - n| <= d n``, and the class
    histogram's L1 distance to the joined one, ``sum_c |class_counts[c] - joined[c]|``, at most
    ``d n`` (so relabelling m samples costs 2m). d = 0: exactly the join.
    """
    allowed = drift * joined_samples
    errors: list[dict[str, Any]] = []
    if abs(num_samples - joined_samples) > allowed:
        errors.append(
            _error(
                ["metadata", "num_samples"],
                f"{num_samples} is not within {drift:g} x the {joined_samples} samples declared "
                f"at join (at most {allowed:g} more or fewer)",
            )
        )
    distance = sum(abs(int(a) - int(b)) for a, b in zip(class_counts, joined_counts, strict=True))
    if distance > allowed:
        errors.append(
            _error(
                ["metadata", "signals", "class_counts"],
                f"differs from the class counts declared at join by {distance} samples in all "
                f"(sum of absolute differences); at most {allowed:g} allowed",
            )
        )
    return errors


def check_join_consistency(
    num_samples: int,
    class_counts: list[int],
    joined_samples: int | None,
    joined_counts: list[int] | None,
    drift: float,
) -> None:
    """Refuse an update whose counts are not what the site declared at join, within ``drift``."""
    if joined_samples is None or joined_counts is None:
        raise InconsistentUpdateError(
            "this site has declared no sample counts: join before submitting",
            errors=[_error(["metadata", "num_samples"], "no join declaration to compare with")],
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


def _open_round_hint(session: Session, federation_id: uuid.UUID) -> dict[str, Any]:
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
    if result.created:
        schedule_close_if_complete(services, result.update.round_id)
    return result


def record_rejection(
    services: Services,
    client: Client | None,
    federation_id: uuid.UUID | None,
    round_index: int | None,
    exc: CoordinatorError,
) -> None:
    """The event saying why an upload was refused (its own transaction)."""
    with services.sessions.begin() as session:
        fid = (
            federation_id
            if repo.get_federation(session, federation_id or uuid.UUID(int=0))
            else None
        )
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
            errors=[_error(["header", "Idempotency-Key"], "1-200 characters")],
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
        expected_manifest = model_in.manifest
        site = repo.get_client(session, client.id)
        assert site is not None
        joined_samples = site.num_samples
        joined_counts = None if site.class_counts is None else [int(c) for c in site.class_counts]

    declared = metadata.get("sha256")
    if declared != staged.sha256:
        raise UpdateRejectedError(
            f"declared sha256 {declared!r} does not match the received state ({staged.sha256})",
            errors=[_error(["metadata", "sha256"], "does not match the state's bytes")],
        )
    try:
        manifest = read_manifest(staged.path)
    except SafetensorsFormatError as exc:
        raise UpdateRejectedError(
            f"the state is not usable safetensors: {exc}", errors=[_error(["state"], str(exc))]
        ) from None
    differences = manifest_differences(expected_manifest, manifest)
    if differences:
        raise UpdateRejectedError(
            f"the state does not match the global model: {'; '.join(differences[:5])}",
            errors=[_error(["state"], d) for d in differences[:50]],
        )
    bad = non_finite_tensors(staged.path, manifest)
    if bad:
        raise UpdateRejectedError(
            f"non-finite values (NaN or infinity) in {', '.join(bad[:5])}",
            errors=[_error(["state", name], "non-finite values") for name in bad[:50]],
        )
    num_samples, signals, metrics = validate_signals(metadata, federation)
    check_join_consistency(
        num_samples,
        signals["class_counts"],
        joined_samples,
        joined_counts,
        float(federation.config["max_sample_drift"]),
    )

    # The blob belongs to this transaction: the store removes it again if the transaction ends
    # without a commit, whatever the exception (service.store.blobs).
    try:
        with services.sessions.begin() as session:
            if not repo.touch_open_round(session, rnd.id):
                raise RoundClosedError(
                    f"round {round_index} closed while this update was being received",
                    **_open_round_hint(session, federation_id),
                )
            if repo.update_of(session, rnd.id, client.id) is not None:
                raise DuplicateUpdateError(
                    f"an update for round {round_index} was already accepted from this client"
                )
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
            repo.add_event(
                session,
                kind="update.accepted",
                actor=f"client:{client.id}",
                message=f"update for round {round_index} accepted from {client.name!r}",
                federation_id=federation_id,
                round_id=rnd.id,
                client_id=client.id,
                data={"update_id": str(update.id), "sha256": staged.sha256, "size": staged.size},
            )
    except IntegrityError:
        raise DuplicateUpdateError(
            f"an update for round {round_index} was already accepted from this client"
        ) from None
    return SubmitResult(update, created=True)


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
    if repo.update_of(session, rnd.id, client.id) is not None:
        raise DuplicateUpdateError(
            f"an update for round {rnd.index} was already accepted from this client"
        )


def schedule_close_if_complete(services: Services, round_id: uuid.UUID) -> None:
    """Close the round now (inline) or on the background worker once everyone has submitted."""
    with services.sessions() as session:
        rnd = repo.get_round(session, round_id)
        complete = (
            rnd is not None and rnd.state == "open" and rounds.round_is_complete(session, rnd)
        )
    if not complete:
        return
    if services.settings.close_rounds_inline:
        rounds.close_round(services, round_id, reason="complete")
    else:
        services.worker.submit_once(
            round_id, lambda: rounds.close_round(services, round_id, reason="complete")
        )
