"""The audit trail's kinds (``service.store.event_kinds``): every ``add_event`` call in
``service`` writes a registered kind, every registered kind is written somewhere, and an
unregistered one is refused."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from service.store import repositories as repo
from service.store.event_kinds import EVENT_KINDS

SERVICE = Path(__file__).resolve().parents[2] / "service"

# The one call whose kind is built (round_events.record_abstention): audit.<status>, written
# only for these two statuses.
BUILT = {("round_events.py", "audit."): {"audit.inconclusive", "audit.undetermined"}}


def written_kinds() -> dict[str, list[str]]:
    """Each kind an ``add_event`` call can write, with where: the string constants of its
    ``kind`` argument (both branches of a conditional expression)."""
    found: dict[str, list[str]] = {}
    for path in sorted(SERVICE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            if name != "add_event":
                continue
            kind = next(k.value for k in node.keywords if k.arg == "kind")
            where = f"{path.name}:{node.lineno}"
            for const in ast.walk(kind):
                if isinstance(const, ast.Constant) and isinstance(const.value, str):
                    for value in BUILT.get((path.name, const.value), {const.value}):
                        found.setdefault(value, []).append(where)
    return found


def test_every_kind_written_is_registered_and_every_registered_kind_is_written() -> None:
    written = written_kinds()
    assert len(written) > 30  # the scan found the calls
    assert {k: w for k, w in written.items() if k not in EVENT_KINDS} == {}
    assert sorted(set(EVENT_KINDS) - set(written)) == []


def test_an_unregistered_kind_is_refused_before_anything_is_added() -> None:
    class Session:  # add_event raises before it touches the session
        def add(self, _: object) -> None:
            raise AssertionError("added")

    with pytest.raises(ValueError, match="'client.teleported' is not in"):
        repo.add_event(Session(), kind="client.teleported", actor="x", message="y")  # type: ignore[arg-type]


def test_the_operator_guide_lists_every_kind() -> None:
    guide = (SERVICE.parent / "docs" / "operator-guide.md").read_text(encoding="utf-8")
    assert [k for k in EVENT_KINDS if f"| `{k}` |" not in guide] == []
