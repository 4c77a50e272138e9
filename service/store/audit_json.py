"""Reads inside stored audit results (JSON documents), done by the database: one client's
values of one audit, the client list of each audit. Like :mod:`service.store.repositories`, these
functions only read and leave the session to the caller."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.store.tables import AuditResult

__all__ = ["JsonPath", "audit_client_ids", "audit_values"]


def audit_client_ids(
    session: Session, federation_id: uuid.UUID
) -> list[tuple[uuid.UUID, int, list[str]]]:
    """(audit id, round index, client ids) of every stored audit of a federation, by round: the
    one list of each result needed to find a client's position in it, read in the database."""
    query = select(AuditResult.id, AuditResult.round_index, AuditResult.result["client_ids"])
    rows = session.execute(
        query.where(AuditResult.federation_id == federation_id).order_by(AuditResult.round_index)
    ).all()
    return [(audit_id, int(index), list(ids or [])) for audit_id, index, ids in rows]


class JsonPath(NamedTuple):
    """A path into a stored JSON document (keys and list positions) and the type of what it
    leads to: ``"json"`` (any value, a list or an object included), ``"bool"``, ``"float"`` or
    ``"str"``. The scalar types matter on SQLite, whose JSON functions give true as 1."""

    steps: tuple[str | int, ...]
    kind: Literal["json", "bool", "float", "str"] = "json"

    def of(self, column: Any) -> Any:
        """The SQL expression reading this path from the JSON ``column``."""
        element = column[self.steps]
        if self.kind == "bool":
            return element.as_boolean()
        if self.kind == "float":
            return element.as_float()
        if self.kind == "str":
            return element.as_string()
        return element


def audit_values(
    session: Session, audit_id: uuid.UUID, paths: Mapping[str, JsonPath]
) -> dict[str, Any]:
    """The values at ``paths`` in one stored audit result, read in the database; None where a
    path leads nowhere."""
    if not paths:
        return {}
    columns = [path.of(AuditResult.result) for path in paths.values()]
    row = session.execute(select(*columns).where(AuditResult.id == audit_id)).one_or_none()
    if row is None:
        return dict.fromkeys(paths)
    return dict(zip(paths, row, strict=True))
