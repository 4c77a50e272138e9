"""The committed OpenAPI spec is exactly what the app serves (regenerate: `fedaudit openapi`)."""

from __future__ import annotations

import json

from service.openapi_spec import DEFAULT_OUTPUT, build_spec, render


def test_committed_spec_matches_the_app() -> None:
    committed = DEFAULT_OUTPUT.read_text(encoding="utf-8")
    assert committed == render(build_spec()), (
        "openapi/openapi.json is stale: run `fedaudit openapi` and commit the result"
    )


def test_every_error_response_is_a_problem() -> None:
    spec = build_spec()
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            for status, response in operation.get("responses", {}).items():
                if status.startswith(("4", "5")):
                    content = response.get("content", {})
                    assert "application/problem+json" in content, (method, path, status)


def test_every_operation_with_a_body_documents_the_400_for_an_unreadable_one() -> None:
    spec = build_spec()
    with_body = [
        (method, path, operation)
        for path, operations in spec["paths"].items()
        for method, operation in operations.items()
        if "requestBody" in operation
    ]
    # create, stop, add client, join, pin, anchor, suspend, revoke a site's token, recompute,
    # close a round, 2 uploads, a site's error report, prune
    assert len(with_body) == 14
    for method, path, operation in with_body:
        assert "400" in operation["responses"], (method, path)


def test_every_operation_documents_the_431_for_a_head_too_large() -> None:
    # the server refuses a request head past 64 KiB before any route (service.http_protocol)
    spec = build_spec()
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            assert "431" in operation["responses"], (method, path)


def test_the_model_list_documents_its_404() -> None:
    responses = build_spec()["paths"]["/api/v1/federations/{federation_id}/models"]["get"]
    assert "404" in responses["responses"]


def test_integer_parameters_are_bounded_in_the_spec() -> None:
    spec = build_spec()
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                schema = parameter["schema"]
                schema = next((s for s in schema.get("anyOf", [schema]) if s.get("type")), schema)
                if schema.get("type") == "integer":
                    assert "maximum" in schema, (method, path, parameter["name"])


def test_the_update_metadata_is_a_schema_with_its_constraints() -> None:
    spec = json.loads(DEFAULT_OUTPUT.read_text(encoding="utf-8"))
    upload = spec["paths"]["/api/v1/federations/{federation_id}/rounds/{round_index}/updates"]
    body = upload["post"]["requestBody"]["content"]["multipart/form-data"]
    assert body["schema"]["properties"]["metadata"] == {
        "$ref": "#/components/schemas/UpdateMetadata"
    }
    assert body["encoding"]["metadata"]["contentType"] == "application/json"
    schemas = spec["components"]["schemas"]
    metadata = schemas["UpdateMetadata"]
    assert metadata["additionalProperties"] is False
    assert set(metadata["required"]) == {"num_samples", "sha256", "signals"}
    assert metadata["properties"]["num_samples"]["minimum"] == 1
    assert metadata["properties"]["sha256"]["pattern"] == "^[0-9a-f]{64}$"
    signals = schemas["UpdateSignals"]["properties"]
    accuracy = signals["train_accuracy"]["anyOf"][0]
    assert (accuracy["minimum"], accuracy["maximum"]) == (0, 1)
    # a count, or null for a class the federation's privacy policy suppresses
    count, suppressed = signals["class_counts"]["items"]["anyOf"]
    assert (count["minimum"], suppressed["type"]) == (0, "null")
    assert schemas["UpdateSignals"]["required"] == ["class_counts"]
