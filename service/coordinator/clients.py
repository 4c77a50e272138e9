"""Use cases of a client: authenticate, join, read its own diagnostics.

The functions that take `Services` are the use cases the routes call, each in a short session
or transaction of its own (committed here); those that take a `Session` are their steps and
leave the commit to their caller.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import NotRequired

from sqlalchemy.orm import Session
from typing_extensions import TypedDict

from service.coordinator import rounds
from service.coordinator.federations import CLIENT_TOKEN_PREFIX, hash_token
from service.coordinator.ratelimit import EventBudget
from service.coordinator.resources import Services
from service.coordinator.signal_policy import count_problems, policy_of
from service.coordinator.updates import join_drift_errors, record_rejection
from service.errors import (
    AuthError,
    BadRequestError,
    InconsistentUpdateError,
    NotFoundError,
    PrivacyPolicyError,
)
from service.store import repositories as repo
from service.store.tables import Client, Event, Federation

log = logging.getLogger(__name__)


def check_token_shape(token: str | None) -> str:
    """The token when it can be a client token; AuthError without touching the database (a
    request with no token, or an admin's, is refused even when no connection is free)."""
    if not token or not token.startswith(CLIENT_TOKEN_PREFIX):
        raise AuthError("a valid client bearer token is required")
    return token


def authenticate_client(session: Session, token: str | None) -> Client:
    token = check_token_shape(token)
    client = repo.get_client_by_token_hash(session, hash_token(token))
    if client is None:
        raise AuthError("a valid client bearer token is required")
    if client.token_revoked_at is not None:
        raise AuthError("this client token was revoked by the admin")
    return client


class AuthRejectedData(TypedDict):
    """The data of an ``auth.rejected`` event: the refused request's method and path, and how
    many refusals before it were counted but not written (only when some were)."""

    method: str
    path: str
    left_out_before: NotRequired[int]


def record_auth_failure(
    session: Session,
    federation_id: uuid.UUID | None,
    *,
    method: str,
    path: str,
    reason: str,
    budget: EventBudget,
    now: datetime,
) -> None:
    """An event for a refused token, when the request names a federation that exists.

    At most ``budget.limit`` such events per federation and minute are written; the next one
    written says how many were left out before it (``data.left_out_before``).
    """
    if federation_id is None or repo.get_federation(session, federation_id) is None:
        return
    admission = budget.admit(federation_id, now)
    if not admission.record:
        if admission.first_left_out:
            log.warning(
                "federation %s: more than %d refused tokens within %.0f s; the rest of this "
                "window is counted, not written, until the next recorded auth.rejected event",
                federation_id,
                budget.limit,
                budget.window_s,
            )
        return
    message = f"{method} {path} refused: {reason}"
    data: AuthRejectedData = {"method": method, "path": path}
    if admission.left_out_before:
        message += (
            f" ({admission.left_out_before} earlier refusal(s) not recorded: more than "
            f"{budget.limit} per {budget.window_s:.0f} s)"
        )
        data["left_out_before"] = admission.left_out_before
    repo.add_event(
        session,
        kind="auth.rejected",
        actor="anonymous",
        message=message,
        federation_id=federation_id,
        data=data,
    )


def check_scope(client: Client, federation_id: uuid.UUID) -> None:
    """A client sees only its own federation; another one does not exist for it."""
    if client.federation_id != federation_id:
        raise NotFoundError(f"federation {federation_id} does not exist")


def _check_join_counts(
    federation: Federation, num_samples: int, class_counts: list[int | None]
) -> None:
    """One count per class, within the federation's privacy policy, adding up to num_samples."""
    if len(class_counts) != federation.num_classes:
        msg = f"must have {federation.num_classes} entries"
        raise BadRequestError(
            "invalid join request: " + msg, errors=[{"loc": ["body", "class_counts"], "msg": msg}]
        )
    forbidden, wrong = count_problems(
        num_samples,
        class_counts,
        policy_of(federation.config),
        samples_loc=["body", "num_samples"],
        counts_loc=["body", "class_counts"],
    )
    if forbidden:
        raise PrivacyPolicyError(
            f"the join's counts are finer than the federation's privacy policy allows "
            f"({len(forbidden)} problem(s); first: {'.'.join(map(str, forbidden[0]['loc']))}: "
            f"{forbidden[0]['msg']}); nothing was recorded",
            errors=forbidden,
        )
    if wrong:
        raise BadRequestError("invalid join request: " + wrong[0]["msg"], errors=wrong)


def join(
    session: Session,
    client: Client,
    *,
    num_samples: int,
    class_counts: list[int | None],
    now: datetime,
) -> Client:
    """Record the client's data summary; joining again updates it (e.g. after a restart).

    Once the federation runs, joining again may not move the declaration beyond the
    federation's ``max_sample_drift`` (the bound an update's counts have): otherwise a site could
    rejoin with an inflated count and pass the update check against it
    (:class:`~service.errors.InconsistentUpdateError`, nothing changed).

    `client` may come from another (closed) session, authentication's: its row is read again
    here and the attached copy is returned.
    """
    attached = repo.get_client(session, client.id)
    if attached is None:
        raise AuthError("a valid client bearer token is required")
    client = attached
    # Locked (PostgreSQL) so that joins of one federation take turns: the join that completes
    # the roster must see every other join committed, or, with the last joins concurrent, each
    # counts the others as not joined and round 0 never opens (`rounds.maybe_start`).
    federation = repo.lock_federation(session, client.federation_id)
    assert federation is not None
    session.refresh(federation)  # the locked row's values, even if loaded before in this session
    _check_join_counts(federation, num_samples, class_counts)
    first = client.joined_at is None
    if (
        not first
        and federation.status == "running"
        and client.num_samples is not None
        and client.class_counts is not None
    ):
        drift = float(federation.config.get("max_sample_drift", 0.0))
        drift_errors = join_drift_errors(
            num_samples, list(class_counts), client.num_samples, list(client.class_counts), drift
        )
        if drift_errors:
            raise InconsistentUpdateError(
                f"a running federation's site may not change its declared counts beyond the "
                f"allowed drift ({drift:g} of the {client.num_samples} joined samples) by "
                f"joining again; first: {drift_errors[0]['msg']}",
                errors=[{**e, "loc": ["body", *e["loc"][1:]]} for e in drift_errors],
                claimed={"num_samples": num_samples, "class_counts": list(class_counts)},
                declared={"num_samples": client.num_samples, "class_counts": client.class_counts},
                max_sample_drift=drift,
            )
    client.num_samples = num_samples
    client.class_counts = list(class_counts)
    client.joined_at = client.joined_at or now
    client.last_seen_at = now
    repo.add_event(
        session,
        kind="client.joined" if first else "client.rejoined",
        actor=f"client:{client.id}",
        message=f"client {client.name!r} {'joined' if first else 'joined again'} "
        f"with {num_samples} samples",
        federation_id=federation.id,
        client_id=client.id,
        data={"num_samples": num_samples, "class_counts": class_counts},
    )
    session.flush()
    rounds.maybe_start(session, federation, now, force=False)
    return client


# --- use cases: one session or transaction each -----------------------------------------------


def authenticate(services: Services, token: str | None) -> Client:
    """The client of a bearer token, read in a short session of its own: the connection goes
    back to the pool at once, and the returned row is detached (its columns are loaded)."""
    token = check_token_shape(token)
    with services.sessions() as session:
        return authenticate_client(session, token)


def record_refusal(
    services: Services, federation_id: uuid.UUID | None, *, method: str, path: str, reason: str
) -> None:
    """Record a refused token (`record_auth_failure`) in a transaction of its own.

    Raises `sqlalchemy.exc.TimeoutError` when no connection is free; the caller decides
    whether a refusal that cannot be recorded matters.
    """
    with services.sessions.begin() as session:
        record_auth_failure(
            session,
            federation_id,
            method=method,
            path=path,
            reason=reason,
            budget=services.auth_events,
            now=services.clock(),
        )


def join_federation(
    services: Services,
    client: Client,
    federation_id: uuid.UUID,
    *,
    num_samples: int,
    class_counts: list[int | None],
) -> tuple[Client, Federation]:
    """Join (`join`) and commit; returns the client and its federation as stored.

    A declaration that moves too far from the previous one changes nothing; the refusal is
    recorded as an ``update.rejected`` event (its own transaction) and raised again.
    """
    try:
        with services.sessions.begin() as session:
            joined = join(
                session,
                client,
                num_samples=num_samples,
                class_counts=class_counts,
                now=services.clock(),
            )
            federation = repo.get_federation(session, federation_id)
            if federation is None:
                raise NotFoundError(f"federation {federation_id} does not exist")
    except InconsistentUpdateError as exc:
        record_rejection(services, client, federation_id, None, exc)
        raise
    return joined, federation


MAX_SITE_ERRORS_PER_ROUND = 5
"""A site's error reports recorded per round; more are answered but not recorded."""


def record_site_error(
    services: Services,
    client: Client,
    federation_id: uuid.UUID,
    round_index: int,
    *,
    stage: str,
    error_type: str,
    message: str,
) -> Event | None:
    """Record a site's failed round as a ``site.error`` event; None once the site has reported
    `MAX_SITE_ERRORS_PER_ROUND` errors for that round (a site in a crash loop cannot flood the
    trail).

    Raises
    ------
    NotFoundError
        No such federation, or no such round in it.
    """
    with services.sessions.begin() as session:
        federation = repo.get_federation(session, federation_id)
        if federation is None:
            raise NotFoundError(f"federation {federation_id} does not exist")
        rnd = repo.get_round_by_index(session, federation_id, round_index)
        if rnd is None:
            raise NotFoundError(f"federation {federation.name!r} has no round {round_index}")
        if (
            repo.count_events(session, kind="site.error", round_id=rnd.id, client_id=client.id)
            >= MAX_SITE_ERRORS_PER_ROUND
        ):
            return None
        return repo.add_event(
            session,
            kind="site.error",
            actor=f"client:{client.id}",
            message=f"site {client.name!r} failed round {round_index} ({stage}): "
            f"{error_type}: {message}",
            federation_id=federation.id,
            round_id=rnd.id,
            client_id=client.id,
            data={
                "round_index": round_index,
                "stage": stage,
                "error_type": error_type,
                "error": message,
            },
        )
