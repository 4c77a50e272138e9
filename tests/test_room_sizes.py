"""Rooms that fit (docs/architecture.md): no product module over 600 lines, no function over 80.

A function's length is its lines from ``def`` to its last line, less its docstring. A longer
function needs its reason written beside it: a comment that starts with ``# Long function:``
on the line just above the ``def`` (or above its decorators).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("service", "client_sdk", "fedaudit_privacy", "fedaudit_flower", "fedaudit_sim")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
REASON = "# Long function:"


def _modules() -> list[Path]:
    files = [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
    # Alembic revisions are generated records of the schema's history, not rooms.
    return [p for p in files if "migrations" not in p.relative_to(ROOT).parts]


def function_length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from ``def`` to the end, less the docstring's."""
    assert node.end_lineno is not None
    length = node.end_lineno - node.lineno + 1
    first = node.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        assert first.end_lineno is not None
        length -= first.end_lineno - first.lineno + 1
    return length


def long_functions(source: str) -> list[tuple[str, int, int]]:
    """(name, line, length) of each function over the limit without a written reason."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        length = function_length(node)
        if length <= MAX_FUNCTION_LINES:
            continue
        top = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        above = lines[top - 2].strip() if top >= 2 else ""
        if not above.startswith(REASON):
            found.append((node.name, node.lineno, length))
    return found


def test_the_rule_reads_lengths_and_reasons_as_stated() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    doc = '    """A docstring\n    of three\n    lines."""\n'
    # The def line and 80 statements: 81 lines without the 3-line docstring, one too many.
    too_long = f"def too_long():\n{doc}{body}\n"
    assert long_functions(too_long) == [("too_long", 1, 81)]
    # The def line and 79 statements: 80, the limit.
    at_limit = f"def at_limit():\n{doc}" + "\n".join(body.splitlines()[:79]) + "\n"
    assert long_functions(at_limit) == []
    reasoned = f"# Long function: a table of 80 constants\n@staticmethod\n{too_long}"
    assert long_functions(reasoned) == []
    wrong_place = f"# Long function: too far away\n\n{too_long}"
    assert long_functions(wrong_place) == [("too_long", 3, 81)]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_room_over_its_size(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    lines = source.count("\n")
    assert lines <= MAX_MODULE_LINES, f"{lines} lines: split it by what it holds"
    assert long_functions(source) == [], "functions over 80 lines without a written reason"
