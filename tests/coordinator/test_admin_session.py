"""Dashboard sessions stored server-side, and admin tokens rotated in the database."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from service.coordinator import admin_auth
from service.coordinator.federations import hash_token
from service.store.session import make_engine, make_sessionmaker
from service.store.tables import AdminSession

pytestmark = pytest.mark.db

TOKEN = "an-admin-token-of-some-length"
NOW = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)


@pytest.fixture
def sessions(database_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(database_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def open_session(sessions: sessionmaker[Session], token: str = TOKEN) -> str:
    with sessions.begin() as session:
        return admin_auth.start_session(session, hash_token(token), now=NOW, address="10.0.0.1")


def valid(sessions: sessionmaker[Session], value: str | None, *, now: datetime = NOW) -> bool:
    with sessions() as session:
        return admin_auth.check_session(session, value, TOKEN, now=now)


def test_a_session_is_a_random_value_whose_hash_is_stored(sessions) -> None:
    value = open_session(sessions)
    assert TOKEN not in value
    assert len(value) >= 40
    with sessions() as session:
        row = session.query(AdminSession).one()
    assert row.token_hash == hash_token(value)
    assert row.created_from == "10.0.0.1"
    assert valid(sessions, value)
    assert valid(sessions, value, now=NOW + admin_auth.ADMIN_SESSION_TTL - timedelta(seconds=1))
    assert not valid(sessions, value, now=NOW + admin_auth.ADMIN_SESSION_TTL)


def test_ending_a_session_revokes_it_and_only_it(sessions) -> None:
    first, second = open_session(sessions), open_session(sessions)
    with sessions.begin() as session:
        assert admin_auth.end_session(session, first, now=NOW)
        assert not admin_auth.end_session(session, first, now=NOW)  # already ended
    assert not valid(sessions, first)
    assert valid(sessions, second)


def test_ending_every_session(sessions) -> None:
    values = [open_session(sessions) for _ in range(3)]
    with sessions.begin() as session:
        assert admin_auth.end_all_sessions(session, now=NOW) == 3
    assert not any(valid(sessions, v) for v in values)


def test_a_session_opened_with_another_admin_token_is_refused(sessions) -> None:
    value = open_session(sessions, token=TOKEN + "-old")
    assert not valid(sessions, value)


def test_rotating_the_admin_token_replaces_the_configured_one_and_ends_sessions(
    sessions,
) -> None:
    value = open_session(sessions)
    with sessions.begin() as session:
        new = admin_auth.rotate_admin_token(session, now=NOW, actor="test")
    with sessions() as session:
        assert admin_auth.is_admin_token(session, new, TOKEN)
        assert not admin_auth.is_admin_token(session, TOKEN, TOKEN)
    assert not valid(sessions, value)
    with sessions.begin() as session:
        newer = admin_auth.rotate_admin_token(session, now=NOW + timedelta(seconds=1), actor="t")
    with sessions() as session:
        assert admin_auth.is_admin_token(session, newer, TOKEN)
        assert not admin_auth.is_admin_token(session, new, TOKEN)


@pytest.mark.parametrize("value", [None, "", ".", "x" * 500, "\u00b2\u00b3"])
def test_malformed_sessions_are_refused(sessions, value: str | None) -> None:
    assert not valid(sessions, value)
