"""Hostile input gets a 4xx problem, never a 500, and changes nothing stored (issue 20, point 2):
integers beyond the database's columns, NUL characters (PostgreSQL cannot store them), control
and right-to-left characters in names, blank names, and JSON nested 200,000 levels deep."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.api.conftest import Federation, make_federation
from tests.api.test_rounds import submit
from tests.api.test_updates import blob_files, nothing_stored
from tests.factories import ADMIN, federation_spec, sha256, state_bytes, tiny_state

pytestmark = [pytest.mark.anyio, pytest.mark.db]

INT32_MAX = 2_147_483_647
INT64_MAX = 9_223_372_036_854_775_807
PROBLEM = "application/problem+json"


def refused(response: httpx.Response, status: int, loc: list[object]) -> dict:
    """The response is a `status` problem whose first error is at `loc`."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body: dict = response.json()
    assert body["status"] == status
    assert body["errors"][0]["loc"] == loc, body
    return body


async def counts(api: httpx.AsyncClient, fed: Federation | None = None) -> tuple[int, ...]:
    """What is stored: federations, and for `fed` its clients and events."""
    total = (await api.get("/api/v1/federations", headers=ADMIN)).json()["total"]
    if fed is None:
        return (total,)
    clients = (await api.get(f"/api/v1/federations/{fed.id}/clients", headers=ADMIN)).json()
    events = (await api.get(f"/api/v1/federations/{fed.id}/events", headers=ADMIN)).json()
    return total, len(clients), len(events["items"])


# -- integers -------------------------------------------------------------------------------


async def test_offsets_and_event_ids_stop_at_64_bits(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api)
    base = f"/api/v1/federations/{fed.id}"
    for url, name in (
        ("/api/v1/federations?offset=", "offset"),
        (f"{base}/rounds?offset=", "offset"),
        (f"{base}/events?after_id=", "after_id"),
    ):
        refused(await api.get(f"{url}{INT64_MAX + 1}", headers=ADMIN), 422, ["query", name])
        edge = await api.get(f"{url}{INT64_MAX}", headers=ADMIN)
        assert edge.status_code == 200, edge.text
        assert edge.json()["items"] == []


async def test_round_indices_in_paths_stop_at_32_bits(api: httpx.AsyncClient, settings) -> None:
    fed = await make_federation(api)
    base = f"/api/v1/federations/{fed.id}/rounds"
    refused(await api.get(f"{base}/{INT32_MAX + 1}", headers=ADMIN), 422, ["path", "index"])
    refused(await api.get(f"{base}/{10**30}", headers=ADMIN), 422, ["path", "index"])
    assert (await api.get(f"{base}/{INT32_MAX}", headers=ADMIN)).status_code == 404
    recompute = await api.post(f"{base}/{10**20}/recompute", json={}, headers=ADMIN)
    refused(recompute, 422, ["path", "index"])
    before = blob_files(settings)
    upload = await submit(api, fed, "a", INT32_MAX + 1, tiny_state(1.0), 10)
    refused(upload, 422, ["path", "round_index"])
    assert blob_files(settings) == before


async def test_plan_and_join_counts_fit_an_integer_column(api: httpx.AsyncClient) -> None:
    for field in ("min_clients", "max_clients"):
        spec = federation_spec(f"big-{field}")
        spec["plan"][field] = INT32_MAX + 1
        response = await api.post("/api/v1/federations", json=spec, headers=ADMIN)
        refused(response, 422, ["body", "plan", field])
    assert await counts(api) == (0,)

    fed = await make_federation(api, join=False)
    stored = await counts(api, fed)
    join = f"/api/v1/federations/{fed.id}/join"
    for body, loc in (
        ({"num_samples": INT32_MAX + 1, "class_counts": [INT32_MAX + 1, 0]}, ["num_samples"]),
        ({"num_samples": 10, "class_counts": [10**19, 0]}, ["class_counts", 0]),
        ({"num_samples": 10, "class_counts": [11, -1]}, ["class_counts", 1]),
    ):
        response = await api.post(join, json=body, headers=fed.headers("a"))
        refused(response, 422, ["body", *loc])
    assert await counts(api, fed) == stored
    clients = (await api.get(f"/api/v1/federations/{fed.id}/clients", headers=ADMIN)).json()
    assert [c["num_samples"] for c in clients] == [None, None]


async def test_an_update_claiming_more_samples_than_a_column_holds_is_refused(
    api: httpx.AsyncClient, settings
) -> None:
    fed = await make_federation(api)
    before = blob_files(settings)
    response = await submit(api, fed, "a", 0, tiny_state(1.0), INT32_MAX + 1)
    body = refused(response, 422, ["metadata", "num_samples"])
    assert body["type"] == "/problems/update-rejected"
    assert len(await nothing_stored(api, fed, settings, before)) == 1


@pytest.mark.parametrize("signal", ["per_class_loss", "per_class_loss_sd"])
async def test_a_loss_beyond_any_model_is_refused(
    api: httpx.AsyncClient, settings, signal: str
) -> None:
    # 1e155 nats: the audit's squared deviations overflowed and the round's close failed
    fed = await make_federation(api)
    before = blob_files(settings)
    response = await submit(
        api, fed, "a", 0, tiny_state(1.0), 10, signal_overrides={signal: [1e155, 0.5]}
    )
    body = refused(response, 422, ["metadata", "signals", signal, 0])
    assert body["type"] == "/problems/update-rejected"
    assert len(await nothing_stored(api, fed, settings, before)) == 1
    edge = await submit(
        api, fed, "a", 0, tiny_state(1.0), 10, signal_overrides={signal: [1e6, 0.5]}
    )
    assert edge.status_code == 201, edge.text


# -- text -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("site\x00a", "NUL"),
        ("site\u202eexe.txt", "bidirectional"),
        ("\u2067site", "bidirectional"),
        ("site\na", "control"),
        ("\x1b[31msite", "control"),
        ("site\x85", "control"),
        ("   ", "blank"),
        ("\t\u3000", "control"),
        ("site\ud800", "unicode"),  # pydantic's own check: not encodable as UTF-8
    ],
)
async def test_names_without_nul_controls_bidi_overrides_or_blanks(
    api: httpx.AsyncClient, name: str, why: str
) -> None:
    fed = await make_federation(api, join=False)
    stored = await counts(api, fed)
    # json.dumps escapes the NUL and the lone surrogate as \\u0000 and \\ud800, as a client would
    content = json.dumps({"name": name})
    headers = {**ADMIN, "Content-Type": "application/json"}
    url = f"/api/v1/federations/{fed.id}/clients"
    client = await api.post(url, content=content, headers=headers)
    body = refused(client, 422, ["body", "name"])
    assert why in body["errors"][0]["msg"]
    spec = federation_spec()
    spec["name"] = name
    federation = await api.post("/api/v1/federations", content=json.dumps(spec), headers=headers)
    refused(federation, 422, ["body", "name"])
    assert await counts(api, fed) == stored


async def test_class_names_follow_the_name_rules(api: httpx.AsyncClient) -> None:
    spec = federation_spec()
    spec["task"]["class_names"] = ["normal", "pneu\u202emonia"]
    response = await api.post("/api/v1/federations", json=spec, headers=ADMIN)
    refused(response, 422, ["body", "task", "class_names", 1])
    assert await counts(api) == (0,)


async def test_names_in_other_scripts_and_with_inner_spaces_are_accepted(
    api: httpx.AsyncClient,
) -> None:
    fed = await make_federation(api, clients=(), join=False)
    for name in ("Hôpital Saint-Louis", "病院 東京", "مستشفى", "a"):
        response = await api.post(
            f"/api/v1/federations/{fed.id}/clients", json={"name": name}, headers=ADMIN
        )
        assert response.status_code == 201, response.text
        assert response.json()["name"] == name


async def test_reasons_refuse_nul_and_controls_but_keep_line_breaks(
    api: httpx.AsyncClient,
) -> None:
    fed = await make_federation(api)
    client = fed.client_ids["a"]
    base = f"/api/v1/federations/{fed.id}"
    stored = await counts(api, fed)
    for method, url, extra in (
        ("POST", f"{base}/stop", {}),
        ("PUT", f"{base}/clients/{client}/pin", {"status": "noisy"}),
        ("PUT", f"{base}/clients/{client}/anchor", {}),
    ):
        for reason in ("bad\x00reason", "bad\x07bell", "bad\ud800"):
            response = await api.request(
                method,
                url,
                content=json.dumps({**extra, "reason": reason}),
                headers={**ADMIN, "Content-Type": "application/json"},
            )
            refused(response, 422, ["body", "reason"])
    assert await counts(api, fed) == stored
    federation = (await api.get(base, headers=ADMIN)).json()
    assert federation["status"] != "failed"

    pinned = await api.put(
        f"{base}/clients/{client}/pin",
        json={"status": "noisy", "reason": "re-read the labels:\n\tclass 3 is wrong"},
        headers=ADMIN,
    )
    assert pinned.status_code == 200, pinned.text
    assert pinned.json()["pin_reason"] == "re-read the labels:\n\tclass 3 is wrong"


async def test_event_kind_filter_and_idempotency_key_are_checked(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api)
    events = await api.get(
        f"/api/v1/federations/{fed.id}/events", params={"kind": "a\x00b"}, headers=ADMIN
    )
    refused(events, 422, ["query", "kind"])
    # a well-formed kind that does not exist is refused too, naming the kinds that do
    typo = await api.get(
        f"/api/v1/federations/{fed.id}/events", params={"kind": "client.pined"}, headers=ADMIN
    )
    refused(typo, 422, ["query", "kind"])
    assert "client.pinned" in typo.text
    ok = await api.get(
        f"/api/v1/federations/{fed.id}/events", params={"kind": "client.added"}, headers=ADMIN
    )
    assert ok.status_code == 200
    upload = await submit(api, fed, "a", 0, tiny_state(1.0), 10, key="two words")
    refused(upload, 422, ["header", "Idempotency-Key"])


async def test_a_refused_token_on_a_path_with_nul_is_recorded_without_it(
    api: httpx.AsyncClient,
) -> None:
    # The refusal event quotes the request's path; a NUL there must not make it unstorable.
    fed = await make_federation(api)
    response = await api.post(
        f"/api/v1/federations/{fed.id}/rounds/%00/updates",
        headers={"Authorization": "Bearer not-a-token", "Idempotency-Key": "k"},
    )
    assert response.status_code == 401, response.text
    events = (await api.get(f"/api/v1/federations/{fed.id}/events", headers=ADMIN)).json()
    refusals = [e for e in events["items"] if e["kind"] == "auth.rejected"]
    assert len(refusals) == 1
    assert refusals[0]["data"]["path"] == f"/api/v1/federations/{fed.id}/rounds/\ufffd/updates"
    assert "\x00" not in refusals[0]["message"]


# -- nesting --------------------------------------------------------------------------------


async def test_metadata_nested_200000_deep_is_refused(api: httpx.AsyncClient, settings) -> None:
    fed = await make_federation(api)
    before = blob_files(settings)
    data = state_bytes(tiny_state(1.0))
    for metadata in ("[" * 200_000, '{"metrics": ' + "[" * 40 + "]" * 40 + "}"):
        response = await api.post(
            f"/api/v1/federations/{fed.id}/rounds/0/updates",
            files={
                "metadata": (None, metadata, "application/json"),
                "state": ("state.safetensors", data, "application/octet-stream"),
            },
            headers={**fed.headers("a"), "Idempotency-Key": "deep"},
        )
        body = refused(response, 422, ["metadata"])
        assert body["type"] == "/problems/update-rejected"
        assert "nested deeper than 32 levels" in body["detail"]
    assert len(await nothing_stored(api, fed, settings, before)) == 2
    # a well-formed metadata still goes through
    honest = await submit(api, fed, "a", 0, tiny_state(1.0), 10)
    assert honest.status_code == 201, honest.text
    assert sha256(data) == honest.json()["sha256"]


async def test_a_json_body_nested_200000_deep_is_a_400_problem(api: httpx.AsyncClient) -> None:
    response = await api.post(
        "/api/v1/federations",
        content="[" * 200_000,
        headers={**ADMIN, "Content-Type": "application/json"},
    )
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == PROBLEM
    assert await counts(api) == (0,)


async def test_audit_overrides_nested_too_deep_are_refused(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api)
    deep: object = 1
    for _ in range(40):
        deep = [deep]
    response = await api.post(
        f"/api/v1/federations/{fed.id}/rounds/0/recompute",
        json={"audit": {"status_m": deep}},
        headers=ADMIN,
    )
    refused(response, 422, ["body", "audit"])


async def test_the_dashboard_round_page_bounds_its_index(api: httpx.AsyncClient) -> None:
    fed = await make_federation(api)
    for index in (str(INT32_MAX + 1), "9" * 5000):
        response = await api.get(f"/admin/federations/{fed.id}/rounds/{index}", headers=ADMIN)
        assert response.status_code == 404, response.text[:200]
