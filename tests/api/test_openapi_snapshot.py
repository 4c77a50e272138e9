"""The committed OpenAPI spec is exactly what the app serves (regenerate: `fedaudit openapi`)."""

from __future__ import annotations

from service.api.openapi import DEFAULT_OUTPUT, build_spec, render


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
