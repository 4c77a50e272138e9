"""The one transaction rule: the use cases in `service.coordinator` own the unit of work.

A route translates HTTP to a use case and back. It never commits, rolls back, begins or flushes
a transaction, and never opens a session of its own: a use case that writes opens its
transaction (``with services.sessions.begin()``) and commits it; a route that only reads gets
the request's session from the `SessionDep` dependency. This test reads the source of
`service/api` and fails on any such call, so the rule cannot quietly come back.
"""

from __future__ import annotations

import ast
from pathlib import Path

API = Path(__file__).resolve().parents[2] / "service" / "api"

TRANSACTION_CALLS = {"commit", "rollback", "begin", "begin_nested"}
"""Methods that start or end a transaction, whatever they are called on."""

SESSION_CALLS = {"flush", "close"}
"""Methods that write or end a unit of work when called on a session (a file has them too)."""

ALLOWED: dict[tuple[str, str, str], str] = {
    # (file under service/api, enclosing function, what) -> why it is allowed
    ("deps.py", "get_session", ".sessions"): (
        "the request's read session: the one place a session is made for a route; it is closed "
        "(and any transaction rolled back) when the request ends"
    ),
}


def _violations(path: Path) -> list[tuple[str, str, str, int]]:
    return _violations_in(path.read_text(encoding="utf-8"), path.relative_to(API).as_posix())


def _violations_in(source: str, name: str) -> list[tuple[str, str, str, int]]:
    """(file, function, what, line) of every transaction call or session opened in `source`."""
    tree = ast.parse(source, filename=name)
    found: list[tuple[str, str, str, int]] = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in TRANSACTION_CALLS
        ):
            found.append((name, function, f".{node.func.attr}(", node.lineno))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in SESSION_CALLS
            and isinstance(node.func.value, ast.Name)
            and "session" in node.func.value.id
        ):
            found.append((name, function, f"session.{node.func.attr}(", node.lineno))
        if isinstance(node, ast.Attribute) and node.attr == "sessions":
            found.append((name, function, ".sessions", node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "<module>")
    return found


def test_the_api_layer_owns_no_transaction() -> None:
    files = sorted(API.rglob("*.py"))
    assert files, f"no sources found under {API}"
    violations = [v for path in files for v in _violations(path) if v[:3] not in ALLOWED]
    assert not violations, (
        "service/api must not run transactions or open sessions; move the unit of work into a "
        "use case in service/coordinator:\n"
        + "\n".join(f"  service/api/{f}:{line} in {fn}: {what}" for f, fn, what, line in violations)
    )


def test_the_allow_list_has_no_stale_entries() -> None:
    """Every allowed exception still exists, so the list cannot grow unnoticed."""
    seen = {v[:3] for path in sorted(API.rglob("*.py")) for v in _violations(path)}
    assert set(ALLOWED) <= seen, sorted(set(ALLOWED) - seen)


def test_the_check_sees_each_kind_of_breach() -> None:
    """The checker itself, on a route written the old way."""
    source = (
        "def route(session, services):\n"
        "    session.commit()\n"
        "    session.rollback()\n"
        "    session.close()\n"
        "    with services.sessions.begin() as other_session:\n"
        "        other_session.flush()\n"
    )
    found = {(fn, what) for _, fn, what, _ in _violations_in(source, "routes/x.py")}
    assert found == {
        ("route", ".commit("),
        ("route", ".rollback("),
        ("route", "session.close("),
        ("route", ".sessions"),
        ("route", ".begin("),
        ("route", "session.flush("),
    }
