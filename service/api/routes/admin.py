"""Admin dashboard: server-rendered HTML pages under /admin (kept out of the OpenAPI schema).

Auth: the admin bearer token (as the API), or the session cookie that `POST /admin/login`
sets after checking the token: a random value whose hash is a server-side session row
(`service.coordinator.admin_auth`), so the token is never stored in the browser, logging out
ends the session for good, and changing the admin token ends every session. HttpOnly,
SameSite=Strict, Secure on https or always with `force_secure_cookies`. Without either, a page
request is redirected (303) to /admin/login; a request that sends an Authorization header or
asks for JSON (Accept) gets a 401 problem+json instead. Wrong tokens at the login form count
towards the per-address throttle as wrong bearer tokens do (429 past it). The forms (login,
logout, log out everywhere) also refuse a cross-site Origin header (CSRF).
"""

from __future__ import annotations

import logging
import uuid
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from service.api.dashboard import pages
from service.api.dashboard.svg import ICON_SVG
from service.api.deps import (
    Credentials,
    ServicesDep,
    SessionDep,
    check_throttle,
    client_address,
    note_wrong_token,
    require_admin,
)
from service.coordinator import admin_auth, queries, reports
from service.coordinator.resources import Services
from service.errors import AuthError, ForbiddenError, NotFoundError
from service.inputs import INT32_MAX

log = logging.getLogger(__name__)

router = APIRouter(prefix="/admin", include_in_schema=False)
icon_router = APIRouter(include_in_schema=False)
"""``/favicon.ico``, outside ``/admin``: where browsers and probes look for a site's icon."""


@icon_router.api_route("/favicon.ico", methods=["GET", "HEAD"], summary="The dashboard's icon")
def favicon() -> Response:
    """The icon the pages carry inline (SVG), for whoever asks for it here: no 404 in the logs."""
    return Response(
        ICON_SVG,
        media_type="image/svg+xml",
        headers={"Cache-Control": "public, max-age=86400"},
    )


COOKIE = "fedaudit_admin"
HEADERS = {
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
}


def _html(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers=HEADERS)


def _redirect(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303, headers={"Cache-Control": "no-store"})


def _authenticated(request: Request, services: ServicesDep, credentials: Credentials) -> bool:
    if credentials is not None:
        require_admin(request, services, credentials)  # a wrong bearer token: 401, not a redirect
        return True
    return admin_auth.session_is_live(services, request.cookies.get(COOKIE))


def _wants_json(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return "json" in accept and "text/html" not in accept


def refusal(request: Request, services: ServicesDep, credentials: Credentials) -> Response | None:
    """None when the request may see admin pages; otherwise the answer to send."""
    try:
        if _authenticated(request, services, credentials):
            return None
    except AuthError:
        pass
    if "authorization" in request.headers or _wants_json(request):
        raise AuthError("a valid admin bearer token or dashboard session is required")
    return _redirect("/admin/login")


Refusal = Annotated[Response | None, Depends(refusal)]


def _cookie_attributes(request: Request, services: Services) -> dict[str, Any]:
    """What set_cookie and delete_cookie must agree on, or the browser keeps the cookie."""
    return {
        "path": "/admin",
        "secure": services.settings.force_secure_cookies or request.url.scheme == "https",
        "httponly": True,
        "samesite": "strict",
    }


def _check_origin(request: Request) -> None:
    """Refuse a form post whose Origin names another site (browsers send it on POST)."""
    origin = request.headers.get("origin")
    if origin is None:
        return  # not a browser form, or an old browser: SameSite=Strict still applies
    if origin == "null" or urlsplit(origin).netloc != request.headers.get("host"):
        raise ForbiddenError("cross-site form post refused")


@router.api_route("/login", methods=["GET", "HEAD"], summary="The login form")
def login_form() -> HTMLResponse:
    return _html(pages.login_page())


@router.post("/login", summary="Check the admin token and start a dashboard session")
def login(request: Request, services: ServicesDep, token: Annotated[str, Form()] = "") -> Response:
    _check_origin(request)
    check_throttle(request, services, token or "(empty)")
    value = admin_auth.log_in(services, token, address=client_address(request))
    if value is None:
        note_wrong_token(request, services, token or "(empty)")
        log.warning("dashboard login refused from %s", client_address(request))
        return _html(pages.login_page("That is not the admin token."), status=401)
    response = _redirect("/admin")
    response.set_cookie(
        COOKIE,
        value,
        max_age=int(admin_auth.ADMIN_SESSION_TTL.total_seconds()),
        **_cookie_attributes(request, services),
    )
    return response


@router.post("/logout", summary="End this dashboard session")
def logout(request: Request, services: ServicesDep) -> Response:
    _check_origin(request)
    admin_auth.log_out(services, request.cookies.get(COOKIE))
    response = _redirect("/admin/login")
    response.delete_cookie(COOKIE, **_cookie_attributes(request, services))
    return response


@router.post("/logout-everywhere", summary="End every dashboard session")
def logout_everywhere(
    request: Request, services: ServicesDep, credentials: Credentials, refused: Refusal
) -> Response:
    _check_origin(request)
    if refused is not None:
        return refused
    ended = admin_auth.log_out_everywhere(services)
    log.warning("dashboard: every session ended (%d) from %s", ended, client_address(request))
    response = _redirect("/admin/login")
    response.delete_cookie(COOKIE, **_cookie_attributes(request, services))
    return response


@router.api_route("", methods=["GET", "HEAD"], summary="Federations")
def index(refused: Refusal, session: SessionDep) -> Response:
    if refused is not None:
        return refused
    return _html(pages.index_page(queries.federation_overview(session)))


def _federation_id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise NotFoundError(f"federation {raw} does not exist") from None


@router.api_route(
    "/federations/{federation_id}",
    methods=["GET", "HEAD"],
    summary="The noisy-client report of a federation",
)
def federation_report(federation_id: str, refused: Refusal, session: SessionDep) -> Response:
    if refused is not None:
        return refused
    try:
        federation = queries.federation_of(session, _federation_id(federation_id))
        report = reports.noisy_client_report(session, federation)
        latest = None if report.latest is None else report.latest.round
        view = None if latest is None else reports.round_view(session, federation, latest)
    except NotFoundError as exc:
        return _html(pages.not_found_page(exc.detail), status=404)
    return _html(pages.federation_page(report, view))


@router.api_route(
    "/federations/{federation_id}/clients/{client_id}",
    methods=["GET", "HEAD"],
    summary="One client of a federation",
)
def client_detail(
    federation_id: str, client_id: str, refused: Refusal, session: SessionDep
) -> Response:
    if refused is not None:
        return refused
    try:
        federation = queries.federation_of(session, _federation_id(federation_id))
        try:
            cid = uuid.UUID(client_id)
        except ValueError:
            raise NotFoundError(f"client {client_id[:40]} does not exist") from None
        client = queries.get_client(session, federation.id, cid)
        view = reports.client_page_view(session, federation, client)
    except NotFoundError as exc:
        return _html(pages.not_found_page(exc.detail), status=404)
    return _html(pages.client_page(view, federation.config.get("primary_detector")))


@router.api_route(
    "/federations/{federation_id}/rounds/{index}",
    methods=["GET", "HEAD"],
    summary="One round of a federation",
)
def round_detail(federation_id: str, index: str, refused: Refusal, session: SessionDep) -> Response:
    if refused is not None:
        return refused
    try:
        federation = queries.federation_of(session, _federation_id(federation_id))
        in_range = index.isascii() and index.isdigit() and len(index) <= 10
        if not (in_range and int(index) <= INT32_MAX):
            raise NotFoundError(f"round {index[:20]} does not exist")
        view = reports.round_view(session, federation, int(index))
    except NotFoundError as exc:
        return _html(pages.not_found_page(exc.detail), status=404)
    return _html(pages.round_page(str(federation.id), federation.name, view))
