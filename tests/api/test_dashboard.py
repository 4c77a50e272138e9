"""Admin dashboard pages: login flow, auth on every page, escaping, the report page's plots."""

from __future__ import annotations

import html
import xml.etree.ElementTree as ET
from urllib.parse import quote

import httpx
import pytest
from pydantic import SecretStr

from service.api.dashboard.pages import SCORE_MEANINGS
from service.api.routes.admin import COOKIE
from service.config import Settings
from service.main import create_app
from tests.api.conftest import make_federation
from tests.api.test_rounds import submit
from tests.conftest import ADMIN_TOKEN
from tests.factories import ADMIN, tiny_state

pytestmark = [pytest.mark.anyio, pytest.mark.db]

EVIL = "<script>alert(1)</script>"
NAMES = ("a", "b", "c", EVIL)
# Fed-NCL with no warm-up: the audit of round 0 already counts (see test_reports for the numbers).
FEDNCL = {
    "method": "fedncl",
    "detectors": ["fedncl"],
    "primary_detector": "fedncl",
    "warmup_rounds": 0,
}
SVG_NS = "{http://www.w3.org/2000/svg}"


async def login(api: httpx.AsyncClient, token: str = ADMIN_TOKEN) -> httpx.Response:
    return await api.post("/admin/login", data={"token": token})


def svgs(html: str) -> list[ET.Element]:
    """Every inline <svg> of a page, parsed as XML (so each one is well formed)."""
    found = []
    rest = html
    while "<svg" in rest:
        start = rest.index("<svg")
        end = rest.index("</svg>", start) + len("</svg>")
        found.append(ET.fromstring(rest[start:end]))
        rest = rest[end:]
    return found


def assert_page(response: httpx.Response, status: int = 200) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert response.headers["cache-control"] == "no-store"


async def test_pages_redirect_to_login_without_auth(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api)
    for path in ("/admin", f"/admin/federations/{fed.id}", f"/admin/federations/{fed.id}/rounds/0"):
        response = await api.get(path, headers={"Accept": "text/html"})
        assert response.status_code == 303, path
        assert response.headers["location"] == "/admin/login"
        assert fed.data["name"] not in response.text
    as_json = await api.get("/admin", headers={"Accept": "application/json"})
    assert as_json.status_code == 401
    assert as_json.headers["content-type"] == "application/problem+json"
    wrong_bearer = await api.get("/admin", headers={"Authorization": "Bearer wrong"})
    assert wrong_bearer.status_code == 401
    client_token = await api.get("/admin", headers=fed.headers("a"))
    assert client_token.status_code == 401
    form = await api.get("/admin/login")
    assert_page(form)
    assert 'name="token"' in form.text


async def test_login_flow_sets_a_cookie_that_grants_pages(api: httpx.AsyncClient) -> None:
    # wrong token: no cookie, the form again with 401
    wrong = await login(api, "not-the-token")
    assert_page(wrong, 401)
    assert "set-cookie" not in wrong.headers
    assert not api.cookies
    assert (await api.get("/admin")).status_code == 303

    # right token: an HttpOnly, SameSite=Strict cookie that is not the token, then pages open
    right = await login(api)
    assert right.status_code == 303
    assert right.headers["location"] == "/admin"
    cookie = right.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=")
    assert "HttpOnly" in cookie
    assert "samesite=strict" in cookie.lower()
    assert "Secure" not in cookie  # plain http here
    assert ADMIN_TOKEN not in cookie
    page = await api.get("/admin")
    assert_page(page)
    assert "Federations" in page.text

    # logout clears it, and ends the session: the same cookie sent again opens nothing
    value = api.cookies[COOKIE]
    out = await api.post("/admin/logout")
    assert out.status_code == 303
    assert (await api.get("/admin")).status_code == 303
    api.cookies.set(COOKIE, value, path="/admin")
    assert (await api.get("/admin")).status_code == 303


async def test_bearer_header_also_grants_pages(api: httpx.AsyncClient) -> None:
    assert_page(await api.get("/admin", headers=ADMIN))


async def test_secure_cookie_on_https(app) -> None:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="https://test") as api:
        right = await login(api)
        assert "Secure" in right.headers["set-cookie"]


async def test_cross_site_login_post_is_refused(api: httpx.AsyncClient) -> None:
    response = await api.post(
        "/admin/login", data={"token": ADMIN_TOKEN}, headers={"Origin": "https://evil.example"}
    )
    assert response.status_code == 403
    assert "set-cookie" not in response.headers
    same_site = await api.post(
        "/admin/login", data={"token": ADMIN_TOKEN}, headers={"Origin": "http://test"}
    )
    assert same_site.status_code == 303


async def test_changing_the_admin_token_invalidates_the_cookie(
    api: httpx.AsyncClient, settings: Settings
) -> None:
    await login(api)
    session = api.cookies[COOKIE]
    # another process over the same database with a new admin token
    rotated = settings.model_copy(update={"admin_token": SecretStr("a-brand-new-admin-token-42")})
    app = create_app(rotated, run_reaper=False)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as other:
            other.cookies.set(COOKIE, session)
            assert (await other.get("/admin")).status_code == 303
    finally:
        app.state.services.close()
    # the original process still accepts it; a tampered value does not pass
    assert (await api.get("/admin")).status_code == 200
    tampered = session[:-1] + ("A" if session[-1] != "A" else "B")
    api.cookies.set(COOKIE, tampered)
    assert (await api.get("/admin")).status_code == 303


async def test_malicious_names_are_escaped(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api, name=f"fed {EVIL}", clients=("a", EVIL))
    await login(api)
    index = await api.get("/admin")
    assert_page(index)
    assert EVIL not in index.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in index.text
    report = await api.get(f"/admin/federations/{fed.id}")
    assert_page(report)
    assert "<script" not in report.text
    assert report.text.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 2  # title, h1, table
    assert "script-src" not in report.headers["content-security-policy"]
    assert "default-src 'none'" in report.headers["content-security-policy"]


async def test_unknown_federation_and_round_are_html_404(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api)
    await login(api)
    for path in (
        "/admin/federations/00000000-0000-0000-0000-000000000000",
        "/admin/federations/not-a-uuid",
        f"/admin/federations/{fed.id}/rounds/7",
        f"/admin/federations/{fed.id}/rounds/x",
        f"/admin/federations/{fed.id}/clients/00000000-0000-0000-0000-000000000000",
        f"/admin/federations/{fed.id}/clients/not-a-uuid",
    ):
        response = await api.get(path)
        assert_page(response, 404)
        assert "Not found" in response.text


async def test_index_lists_federations_with_counts(api: httpx.AsyncClient) -> None:
    one = await make_federation(api, name="one", clients=("a", "b", "c"))
    await make_federation(api, name="two", clients=("x",), join=False)
    await login(api)
    page = await api.get("/admin")
    assert_page(page)
    row_one = page.text.split(f'href="/admin/federations/{one.id}">one</a>')[1].split("</tr>")[0]
    assert "<td>running</td>" in row_one
    assert '<td class="num">0 / 2</td>' in row_one  # rounds closed / planned
    assert '<td class="num">3</td>' in row_one  # clients
    assert '<td><span class="muted">none</span></td>' in row_one  # no noisy or suspect site
    assert ">two</a>" in page.text
    row_two = page.text.split(">two</a>")[1].split("</tr>")[0]
    assert '<td class="num">1</td>' in row_two

    # once every client of "one" has submitted, its round 0 counts as closed
    for i, name in enumerate(("a", "b", "c")):
        response = await submit(api, one, name, 0, tiny_state(1.0), 10, key=f"k-{i}")
        assert response.status_code == 201, response.text
    page = await api.get("/admin")
    row_one = page.text.split(f'href="/admin/federations/{one.id}">one</a>')[1].split("</tr>")[0]
    assert '<td class="num">1 / 2</td>' in row_one

    # a pinned status counts over the detected one
    ids = {
        row["name"]: row["client_id"]
        for row in (await api.get(f"/api/v1/federations/{one.id}/report", headers=ADMIN)).json()[
            "clients"
        ]
    }
    for name, status in (("a", "noisy"), ("b", "suspect")):
        response = await api.put(
            f"/api/v1/federations/{one.id}/clients/{ids[name]}/pin",
            json={"status": status, "reason": "checked by hand"},
            headers=ADMIN,
        )
        assert response.status_code == 200, response.text
    page = await api.get("/admin")
    row_one = page.text.split(f'href="/admin/federations/{one.id}">one</a>')[1].split("</tr>")[0]
    assert (
        '<td><span class="badge noisy">1</span> / <span class="badge suspect">1</span></td>'
        in row_one
    )


# c holds no sample of class 1 (its updates must agree with its join).
JOINS = {"c": {"num_samples": 10, "class_counts": [10, 0]}}


async def run_round(api, fed, index: int) -> None:
    # d (the malicious name) is the outlier Fed-NCL flags, as in test_reports; client c holds
    # no sample of class 1 and sends no loss for it (a "no data" cell).
    for name in NAMES:
        noisy = name == EVIL
        overrides: dict = {"train_loss": 2.0 if noisy else 0.1}
        if name == "c":
            overrides.update(class_counts=[10, 0], per_class_loss=[0.3, None])
        elif noisy:
            overrides["per_class_loss"] = [0.4, 2.5]
        response = await submit(
            api,
            fed,
            name,
            index,
            tiny_state(3.0 if noisy else 1.0),
            10,
            signal_overrides=overrides,
            key=f"{NAMES.index(name)}-{index}",
        )
        assert response.status_code == 201, response.text


async def test_report_page_shows_statuses_and_plots(api: httpx.AsyncClient) -> None:
    # Prepare: one audited round in which the malicious-name client is flagged
    fed = await make_federation(api, clients=NAMES, rounds=3, config=FEDNCL, joins=JOINS)
    await run_round(api, fed, 0)
    report = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    statuses = {row["name"]: row["status"] for row in report["clients"]}
    assert statuses == {"a": "trusted", "b": "trusted", "c": "trusted", EVIL: "suspect"}
    await login(api)

    # Execute
    page = await api.get(f"/admin/federations/{fed.id}")

    # Assert
    assert_page(page)
    assert "<script" not in page.text
    table = page.text.split("<tbody>")[1].split("</tbody>")[0]
    rows = table.split("<tr>")[1:]
    assert len(rows) == len(NAMES)
    ids = {row["name"]: row["client_id"] for row in report["clients"]}
    for row, name in zip(rows, NAMES, strict=True):
        escaped = name.replace("<", "&lt;").replace(">", "&gt;")
        link = f"/admin/federations/{fed.id}/clients/{ids[name]}"
        assert row.startswith(f'<td><a href="{link}">{escaped}</a></td>')
        assert f'<span class="badge {statuses[name]}">{statuses[name]}</span>' in row
    plots = {svg.get("aria-label"): svg for svg in svgs(page.text)}
    assert set(plots) == {
        "flags over rounds",
        "per-class loss, round 0",
        "aggregation weights, round 0",
    }
    assert "No neighbor relation in the latest audit." in page.text  # Fed-NCL: no FedRN probes
    heat = plots["per-class loss, round 0"]
    cells = [r for r in heat.iter(f"{SVG_NS}rect") if r.get("class") in ("cell", "nodata")]
    assert len(cells) == len(NAMES) * 2  # one per (client, class)
    nodata = [(r.get("data-row"), r.get("data-col")) for r in cells if r.get("class") == "nodata"]
    # rows sorted by name ("<" sorts before letters); c holds no sample of class 1
    assert nodata == [(str(sorted(NAMES).index("c")), "1")]
    tips = {r.find(f"{SVG_NS}title").text for r in cells}
    assert f"{EVIL}, 1: 2.5" in tips
    flags = [
        r
        for r in plots["flags over rounds"].iter(f"{SVG_NS}rect")
        if "flag" in (r.get("class") or "")
    ]
    assert [r.get("class") for r in flags] == ["flag clear"] * 3 + ["flag flagged"]
    weights = plots["aggregation weights, round 0"].iter(f"{SVG_NS}rect")
    bars = {r.find(f"{SVG_NS}title").text.rsplit(":", 1)[0]: r for r in weights}
    assert set(bars) == set(NAMES)
    # Fed-NCL's layer-wise rule penalises the flagged client: its bar is the shortest
    widths = {name: float(bar.get("width", "nan")) for name, bar in bars.items()}
    assert widths[EVIL] < min(widths[n] for n in "abc")

    round_page = await api.get(f"/admin/federations/{fed.id}/rounds/0")
    assert_page(round_page)
    assert "fedncl_layerwise" in round_page.text
    assert "<script" not in round_page.text
    # The round's own verdict, in words (no warm-up here: warmup_rounds 0)
    assert "<dt>warm-up</dt><dd>no</dd>" in round_page.text
    assert "<dt>primary verdict</dt><dd>fedncl: ok" in round_page.text


async def test_round_page_shows_that_rounds_separation_guard(api: httpx.AsyncClient) -> None:
    # FedNoRo as primary, no warm-up: round 0's audit runs the mixture and its guard
    fed = await make_federation(
        api,
        clients=NAMES,
        rounds=3,
        config={
            "method": "fednoro",
            "primary_detector": "fednoro",
            "detectors": ["fednoro"],
            "warmup_rounds": 0,
        },
        joins=JOINS,
    )
    await run_round(api, fed, 0)
    audit = (await api.get(f"/api/v1/federations/{fed.id}/rounds/0", headers=ADMIN)).json()
    guard = audit["audit"]["detections"]["fednoro"]["summary"]["guard"]
    await login(api)

    page = await api.get(f"/admin/federations/{fed.id}/rounds/0")

    assert_page(page)
    assert "<dt>primary verdict</dt><dd>fednoro: ok" in page.text
    assert f"<dt>separation guard</dt><dd>{html.escape(guard)}</dd>" in page.text


async def test_client_page_shows_the_history_flags_and_losses(api: httpx.AsyncClient) -> None:
    # Prepare: two audited rounds; the malicious-name client is Fed-NCL's outlier in both
    fed = await make_federation(api, clients=NAMES, rounds=3, config=FEDNCL, joins=JOINS)
    other = await make_federation(api, name="other", clients=("z",))
    await run_round(api, fed, 0)
    await run_round(api, fed, 1)
    report = (await api.get(f"/api/v1/federations/{fed.id}/report", headers=ADMIN)).json()
    ids = {row["name"]: row["client_id"] for row in report["clients"]}
    await login(api)

    # Execute
    page = await api.get(f"/admin/federations/{fed.id}/clients/{ids[EVIL]}")
    clean = await api.get(f"/admin/federations/{fed.id}/clients/{ids['c']}")
    elsewhere = await api.get(f"/admin/federations/{other.id}/clients/{ids['c']}")

    # Assert
    assert_page(page)
    assert "<script" not in page.text
    assert "<h1>&lt;script&gt;alert(1)&lt;/script&gt;</h1>" in page.text
    assert f'<a href="/admin/federations/{fed.id}">' in page.text
    history = page.text.split("<tbody>")[1].split("</tbody>")[0].split("<tr>")[1:]
    assert [r.split("</td>")[0] for r in history] == ['<td class="num">0', '<td class="num">1']
    assert all("<td>flagged</td>" in r for r in history)  # the primary flag, both rounds
    assert "Fed-NCL: the site&#x27;s q" in page.text or "Fed-NCL: the site's q" in page.text
    plots = {svg.get("aria-label"): svg for svg in svgs(page.text)}
    assert set(plots) == {"flags per detector", "per-class loss over rounds"}
    marks = [
        r.get("class")
        for r in plots["flags per detector"].iter(f"{SVG_NS}rect")
        if "flag" in (r.get("class") or "")
    ]
    assert marks == ["flag flagged", "flag flagged"]  # one detector (fedncl), two rounds
    heat = plots["per-class loss over rounds"]
    tips = sorted(
        str(r.findtext(f"{SVG_NS}title"))
        for r in heat.iter(f"{SVG_NS}rect")
        if r.get("class") in ("cell", "nodata")
    )
    # rows: the classes ("0", "1"), columns: rounds 0 and 1; its losses [0.4, 2.5] both rounds
    assert tips == ["0, 0: 0.4", "0, 1: 0.4", "1, 0: 2.5", "1, 1: 2.5"]
    # c holds no sample of class 1: grey cells there, and it is never flagged
    assert_page(clean)
    clean_heat = {svg.get("aria-label"): svg for svg in svgs(clean.text)}
    nodata = [
        r.get("data-row")
        for r in clean_heat["per-class loss over rounds"].iter(f"{SVG_NS}rect")
        if r.get("class") == "nodata"
    ]
    assert nodata == ["1", "1"]
    assert "<td>flagged</td>" not in clean.text
    # a client of another federation is not found through this one
    assert_page(elsewhere, 404)


async def test_pages_answer_head_and_carry_their_icon(api: httpx.AsyncClient) -> None:
    login_head = await api.head("/admin/login")
    assert login_head.status_code == 200
    assert login_head.content == b""
    await login(api)
    index = await api.get("/admin")
    assert '<link rel="icon" href="data:image/svg+xml,' in index.text
    assert (await api.head("/admin")).status_code == 200


async def test_the_icon_is_served_at_favicon_ico_too(api: httpx.AsyncClient) -> None:
    # browsers and probes still ask for /favicon.ico: the pages' own icon, no 404, no login
    icon = await api.get("/favicon.ico")
    assert icon.status_code == 200
    assert icon.headers["content-type"].startswith("image/svg+xml")
    assert icon.text.startswith("<svg ")
    assert quote(icon.text, safe="/:=") in (await api.get("/admin/login")).text
    head = await api.head("/favicon.ico")
    assert head.status_code == 200
    assert head.content == b""


def test_expertise_meaning_is_the_accuracy_on_the_sites_own_labels() -> None:
    # FedRN eq. 4 (service.audit.detectors.expertise): the min-max normalised accuracy of the
    # site's model on its own labels; the probe inputs carry no labels
    assert "own labels" in SCORE_MEANINGS["expertise"]
    assert "probe" not in SCORE_MEANINGS["expertise"]
