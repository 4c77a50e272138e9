"""mkdocs hook: the HTTP API page's tables, generated from the committed OpenAPI spec.

``docs/api.md`` holds the prose and two markers, ``<!-- openapi:operations -->`` and
``<!-- openapi:schemas -->``; at build time they are replaced by tables read from
``openapi/openapi.json`` (the file ``fedaudit openapi`` writes and a test keeps equal to the
running app's schema). The page therefore cannot drift from the spec, and nothing is fetched
when it is read: no Swagger UI, no CDN script.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SPEC = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"
METHODS = ("get", "post", "put", "patch", "delete")


def _cell(text: object) -> str:
    """One markdown table cell: no line breaks, no raw pipes, no ``<`` read as an HTML tag."""
    s = " ".join(str(text).split())
    return s.replace("|", "\\|").replace("<", "&lt;")


def _schema_type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[`{name}`](#schema-{name.lower()})"
    if "anyOf" in schema or "oneOf" in schema:
        parts = [_schema_type(s) for s in schema.get("anyOf", schema.get("oneOf", []))]
        return " or ".join(parts)
    if "allOf" in schema:
        return " and ".join(_schema_type(s) for s in schema["allOf"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_schema_type(schema.get('items', {}))}"
    if kind == "object" and "additionalProperties" in schema:
        extra = schema["additionalProperties"]
        if isinstance(extra, dict):
            return f"object of {_schema_type(extra)}"
    if "enum" in schema:
        return ", ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    fmt = schema.get("format")
    return f"{kind} ({fmt})" if fmt else str(kind)


def _number(value: object) -> object:
    """1.0 as 1 (the spec writes integer bounds as floats); anything else unchanged."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return int(value)
    return value


def _constraints(schema: dict[str, Any]) -> str:
    keys = (
        ("minimum", ">= {}"),
        ("exclusiveMinimum", "> {}"),
        ("maximum", "<= {}"),
        ("exclusiveMaximum", "< {}"),
        ("minLength", "length >= {}"),
        ("maxLength", "length <= {}"),
        ("minItems", "items >= {}"),
        ("maxItems", "items <= {}"),
        ("pattern", "pattern `{}`"),
    )
    found = [template.format(_number(schema[key])) for key, template in keys if key in schema]
    for option in schema.get("anyOf", []):
        found.extend(_constraints(option).split("; ") if _constraints(option) else [])
    if "default" in schema:
        found.append(f"default `{json.dumps(schema['default'])}`")
    return "; ".join(found)


def _response_content(response: dict[str, Any]) -> str:
    content = response.get("content", {})
    parts = []
    for media, body in content.items():
        schema = body.get("schema")
        parts.append(f"{media}: {_schema_type(schema)}" if schema else media)
    return ", ".join(parts)


def operations_markdown(spec: dict[str, Any]) -> str:
    """One section per tag: a table of operations, then each operation's responses."""
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, item in spec["paths"].items():
        for method in METHODS:
            if method in item:
                operation = item[method]
                tag = (operation.get("tags") or ["other"])[0]
                by_tag.setdefault(tag, []).append((method.upper(), path, operation))
    lines: list[str] = []
    for tag in sorted(by_tag):
        lines += [f"### {tag}", "", "| method | path | what it does | auth |"]
        lines.append("| --- | --- | --- | --- |")
        for method, path, operation in by_tag[tag]:
            auth = "bearer token" if operation.get("security") else "none"
            lines.append(
                f"| `{method}` | `{path}` | {_cell(operation.get('summary', ''))} | {auth} |"
            )
        lines.append("")
        for method, path, operation in by_tag[tag]:
            lines += [f"#### `{method} {path}`", ""]
            if operation.get("description"):
                lines += [operation["description"].strip(), ""]
            params = operation.get("parameters", [])
            if params:
                lines += ["| parameter | in | type | required |", "| --- | --- | --- | --- |"]
                for p in params:
                    lines.append(
                        f"| `{p['name']}` | {p['in']} | {_schema_type(p.get('schema', {}))} "
                        f"| {'yes' if p.get('required') else 'no'} |"
                    )
                lines.append("")
            body = operation.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                lines += [f"Request body: `{media}`, {_schema_type(content.get('schema', {}))}."]
                properties = content.get("schema", {}).get("properties", {})
                for name, prop in properties.items():
                    described = f": {_cell(prop['description'])}" if "description" in prop else ""
                    lines.append(f"- `{name}` ({_schema_type(prop)}){described}")
                lines.append("")
            lines += ["| status | meaning | body |", "| --- | --- | --- |"]
            for status, response in operation.get("responses", {}).items():
                lines.append(
                    f"| {status} | {_cell(response.get('description', ''))} "
                    f"| {_cell(_response_content(response))} |"
                )
            lines.append("")
    return "\n".join(lines)


def schemas_markdown(spec: dict[str, Any]) -> str:
    """One table per component schema: field, type, required, constraints, description."""
    lines: list[str] = []
    for name, schema in sorted(spec.get("components", {}).get("schemas", {}).items()):
        lines += [f"### {name} {{#schema-{name.lower()}}}", ""]
        if schema.get("description"):
            lines += [" ".join(schema["description"].split()), ""]
        properties = schema.get("properties", {})
        if not properties:
            lines += [f"Type: {_schema_type(schema)}.", ""]
            continue
        required = set(schema.get("required", []))
        lines += [
            "| field | type | required | constraints | description |",
            "| --- | --- | --- | --- | --- |",
        ]
        for field, prop in properties.items():
            needed = "yes" if field in required else "no"
            lines.append(
                f"| `{field}` | {_cell(_schema_type(prop))} | {needed} "
                f"| {_cell(_constraints(prop))} | {_cell(prop.get('description', ''))} |"
            )
        lines.append("")
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """mkdocs event: fill the API page's markers from the spec."""
    if page.file.src_uri != "api.md":
        return markdown
    spec = json.loads(SPEC.read_text(encoding="utf-8"))
    markdown = markdown.replace("<!-- openapi:operations -->", operations_markdown(spec))
    return markdown.replace("<!-- openapi:schemas -->", schemas_markdown(spec))
