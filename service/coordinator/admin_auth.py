"""The admin's credentials: the admin token, dashboard sessions, and site token rotation.

**The admin token.** ``FEDAUDIT_ADMIN_TOKEN`` (or ``_FILE``) is the admin token until one is
set in the database (``fedaudit admin rotate-token``, or ``POST /api/v1/admin/token``): from then
on the newest token stored there is the admin token, the environment's is no longer accepted,
and every replica sees the change at its next request, with no restart. Only the sha256 of a
token is stored (tokens are 256-bit random strings, so a plain hash is a safe stored form).

**Dashboard sessions** are rows (``admin_session``): the browser's cookie holds a random value
and the row its sha256, so logging out, "log out everywhere" and a token change end sessions at
once, on every replica. A session is tied to the admin token it was opened with: once that
token is no longer the admin token, the session is no longer valid.
"""

from __future__ import annotations

import hmac
import secrets
import uuid
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.coordinator.federations import CLIENT_TOKEN_PREFIX, hash_token
from service.coordinator.resources import Services
from service.errors import AuthError, NotFoundError
from service.store import repositories as repo
from service.store.tables import AdminSession, AdminToken, Client

ADMIN_SESSION_TTL = timedelta(hours=12)
ADMIN_TOKEN_PREFIX = "fa_a_"


def current_admin_hash(session: Session, configured_token: str) -> str:
    """The sha256 of the admin token in force: the newest stored one, else the configured."""
    stored = session.scalar(
        select(AdminToken.token_hash)
        .where(AdminToken.revoked_at.is_(None))
        .order_by(AdminToken.created_at.desc())
        .limit(1)
    )
    return stored if stored is not None else hash_token(configured_token)


def is_admin_token(session: Session, token: str | None, configured_token: str) -> bool:
    if not token:
        return False
    return hmac.compare_digest(hash_token(token), current_admin_hash(session, configured_token))


def authenticate_admin(session: Session, token: str | None, configured_token: str) -> None:
    if not is_admin_token(session, token, configured_token):
        raise AuthError("a valid admin bearer token is required")


def rotate_admin_token(session: Session, *, now: datetime, actor: str) -> str:
    """A new admin token (returned once, stored hashed); the previous ones and every dashboard
    session end."""
    token = ADMIN_TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.execute(
        update(AdminToken).where(AdminToken.revoked_at.is_(None)).values(revoked_at=now)
    )
    session.add(AdminToken(token_hash=hash_token(token), created_at=now, created_by=actor))
    end_all_sessions(session, now=now)
    repo.add_event(
        session,
        kind="admin.token_rotated",
        actor=actor,
        message="the admin token was rotated; every dashboard session ended",
    )
    session.flush()
    return token


# --- dashboard sessions ----------------------------------------------------------------------


def start_session(
    session: Session, credential_hash: str, *, now: datetime, address: str | None
) -> str:
    """Open a session for an admin who gave the token whose hash is `credential_hash`; return
    the cookie value (only its hash is stored)."""
    value = secrets.token_urlsafe(32)
    session.add(
        AdminSession(
            token_hash=hash_token(value),
            credential_hash=credential_hash,
            created_at=now,
            expires_at=now + ADMIN_SESSION_TTL,
            created_from=(address or "")[:200] or None,
        )
    )
    session.flush()
    return value


def _live(session: Session, value: str | None, now: datetime) -> AdminSession | None:
    if not value or len(value) > 200:
        return None
    row = session.scalar(select(AdminSession).where(AdminSession.token_hash == hash_token(value)))
    if row is None or row.revoked_at is not None or row.expires_at <= now:
        return None
    return row


def check_session(
    session: Session, value: str | None, configured_token: str, *, now: datetime
) -> bool:
    """Whether a cookie value opens the dashboard: a live session opened with the token that is
    the admin token now."""
    row = _live(session, value, now)
    if row is None:
        return False
    return hmac.compare_digest(row.credential_hash, current_admin_hash(session, configured_token))


def end_session(session: Session, value: str | None, *, now: datetime) -> bool:
    """Revoke the session of this cookie value; False when there was none live."""
    row = _live(session, value, now)
    if row is None:
        return False
    row.revoked_at = now
    session.flush()
    return True


def end_all_sessions(session: Session, *, now: datetime) -> int:
    """Revoke every live session ("log out everywhere"); return how many."""
    result = session.execute(
        update(AdminSession)
        .where(AdminSession.revoked_at.is_(None), AdminSession.expires_at > now)
        .values(revoked_at=now)
    )
    session.flush()
    return int(getattr(result, "rowcount", 0) or 0)


# --- site tokens -----------------------------------------------------------------------------


def _site(session: Session, federation_id: uuid.UUID, client_id: uuid.UUID) -> Client:
    client = repo.get_client(session, client_id)
    if client is None or client.federation_id != federation_id:
        raise NotFoundError(f"client {client_id} does not exist in federation {federation_id}")
    return client


def rotate_client_token(
    session: Session, federation_id: uuid.UUID, client_id: uuid.UUID, *, now: datetime, actor: str
) -> tuple[Client, str]:
    """A new token for the site (returned once); the old one stops working at once. Also
    un-revokes a revoked site."""
    client = _site(session, federation_id, client_id)
    token = CLIENT_TOKEN_PREFIX + secrets.token_urlsafe(32)
    client.token_hash = hash_token(token)
    client.token_revoked_at = None
    repo.add_event(
        session,
        kind="client.token_rotated",
        actor=actor,
        message=f"the token of client {client.name!r} was rotated",
        federation_id=federation_id,
        client_id=client.id,
    )
    session.flush()
    return client, token


def revoke_client_token(
    session: Session,
    federation_id: uuid.UUID,
    client_id: uuid.UUID,
    *,
    now: datetime,
    actor: str,
    reason: str,
) -> Client:
    """The site's token stops working until an admin rotates it (idempotent)."""
    client = _site(session, federation_id, client_id)
    if client.token_revoked_at is None:
        client.token_revoked_at = now
        repo.add_event(
            session,
            kind="client.token_revoked",
            actor=actor,
            message=f"the token of client {client.name!r} was revoked: {reason}",
            federation_id=federation_id,
            client_id=client.id,
            data={"reason": reason},
        )
        session.flush()
    return client


# --- use cases: one session or transaction each -----------------------------------------------


def is_admin(services: Services, token: str | None) -> bool:
    """Whether `token` is the admin token in force (a short session of its own)."""
    if not token:
        return False
    with services.sessions() as session:
        return is_admin_token(session, token, services.settings.admin_secret())


def session_is_live(services: Services, value: str | None) -> bool:
    """Whether a dashboard cookie value opens the dashboard now (`check_session`)."""
    with services.sessions() as session:
        return check_session(session, value, services.settings.admin_secret(), now=services.clock())


def log_in(services: Services, token: str, *, address: str | None) -> str | None:
    """A new dashboard session's cookie value when `token` is the admin token, else None."""
    with services.sessions.begin() as session:
        secret = services.settings.admin_secret()
        if not is_admin_token(session, token, secret):
            return None
        return start_session(
            session, current_admin_hash(session, secret), now=services.clock(), address=address
        )


def log_out(services: Services, value: str | None) -> bool:
    """End the dashboard session of this cookie value (`end_session`) and commit."""
    with services.sessions.begin() as session:
        return end_session(session, value, now=services.clock())


def log_out_everywhere(services: Services) -> int:
    """End every dashboard session (`end_all_sessions`) and commit; return how many."""
    with services.sessions.begin() as session:
        return end_all_sessions(session, now=services.clock())


def new_admin_token(services: Services, *, actor: str) -> str:
    """Rotate the admin token (`rotate_admin_token`) and commit; the token is returned once."""
    with services.sessions.begin() as session:
        return rotate_admin_token(session, now=services.clock(), actor=actor)


def new_client_token(
    services: Services, federation_id: uuid.UUID, client_id: uuid.UUID, *, actor: str
) -> tuple[Client, str]:
    """Rotate a site's token (`rotate_client_token`) and commit; the token is returned once."""
    with services.sessions.begin() as session:
        return rotate_client_token(
            session, federation_id, client_id, now=services.clock(), actor=actor
        )


def revoke_site_token(
    services: Services,
    federation_id: uuid.UUID,
    client_id: uuid.UUID,
    *,
    actor: str,
    reason: str,
) -> Client:
    """Revoke a site's token (`revoke_client_token`) and commit."""
    with services.sessions.begin() as session:
        return revoke_client_token(
            session, federation_id, client_id, now=services.clock(), actor=actor, reason=reason
        )
