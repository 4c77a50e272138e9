"""Dashboard session values: an HMAC of an expiry under the admin token."""

from __future__ import annotations

import pytest

from service.coordinator.clients import ADMIN_SESSION_TTL_S, admin_session, check_admin_session

TOKEN = "an-admin-token-of-some-length"


def test_session_is_valid_until_it_expires() -> None:
    value = admin_session(TOKEN, now=1000.0)
    assert TOKEN not in value
    assert value.startswith(f"{1000 + ADMIN_SESSION_TTL_S}.")
    assert check_admin_session(value, TOKEN, now=1000.0)
    assert check_admin_session(value, TOKEN, now=1000.0 + ADMIN_SESSION_TTL_S - 1)
    assert not check_admin_session(value, TOKEN, now=1000.0 + ADMIN_SESSION_TTL_S)


def test_session_of_another_token_is_refused() -> None:
    value = admin_session(TOKEN, now=1000.0)
    assert not check_admin_session(value, TOKEN + "x", now=1000.0)


@pytest.mark.parametrize(
    "value", [None, "", ".", "123", "123.", ".abc", "12a.abc", "\u00b2\u00b3.abc", "1.2.3"]
)
def test_malformed_sessions_are_refused(value: str | None) -> None:
    assert not check_admin_session(value, TOKEN, now=0.0)
