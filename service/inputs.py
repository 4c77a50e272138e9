"""Bounds and checks on untrusted input, shared by the API schemas and the use cases.

Every integer a request carries stops where the database column it reaches does (INTEGER is
32-bit on PostgreSQL, BIGINT 64-bit; SQLite refuses a Python int beyond 64 bits). Text carries no
NUL (PostgreSQL cannot store one in a text column) and no unpaired surrogate (not encodable as
UTF-8 on either database). Names, shown on the dashboard, in reports and in terminals, carry no
control character, no bidirectional formatting character (a right-to-left override can make a
name read as another) and are not blank. Free-form JSON is nested at most `MAX_JSON_DEPTH` deep.

No web or database imports: pydantic types for the schemas, plain functions for the use cases.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, Field

INT32_MAX = 2**31 - 1
"""The largest value of an INTEGER column (PostgreSQL's is 32-bit)."""
INT64_MAX = 2**63 - 1
"""The largest value of a BIGINT column, and of any SQL offset or id the API compares with."""
MAX_JSON_DEPTH = 32
"""How deep free-form JSON (update metadata, audit overrides) may nest objects and arrays."""

_NUL = re.compile("\x00")
_SURROGATE = re.compile("[\ud800-\udfff]")
# C0 and C1 controls and DEL; tab, line feed and carriage return are allowed in free text.
_CONTROL_IN_TEXT = re.compile("[\x01-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_CONTROL_IN_NAME = re.compile("[\x01-\x1f\x7f-\x9f]")
# Bidirectional formatting: the Arabic letter mark, LRM/RLM, embeddings and overrides
# (U+202A-U+202E), isolates (U+2066-U+2069).
_BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def text_problem(value: str) -> str | None:
    """Why `value` cannot be stored as free text (a reason, a message), or None."""
    if _NUL.search(value):
        return "must not contain NUL characters"
    if _SURROGATE.search(value):
        return "must not contain unpaired surrogates"
    if _CONTROL_IN_TEXT.search(value):
        return "must not contain control characters (tab and line breaks are allowed)"
    return None


def name_problem(value: str) -> str | None:
    """Why `value` is not acceptable as a name (of a federation, a client, a class), or None."""
    if _NUL.search(value):
        return "must not contain NUL characters"
    if _SURROGATE.search(value):
        return "must not contain unpaired surrogates"
    if _CONTROL_IN_NAME.search(value):
        return "must not contain control characters"
    if _BIDI.search(value):
        return "must not contain bidirectional formatting characters (e.g. right-to-left override)"
    if not value.strip():
        return "must not be blank"
    return None


def json_depth_exceeds(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether decoded JSON nests objects/arrays deeper than `limit` (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth + 1 > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _check_text(value: str) -> str:
    problem = text_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _check_name(value: str) -> str:
    problem = name_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _check_depth(value: Any) -> Any:
    if json_depth_exceeds(value):
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    return value


NAME_RULES = (
    "No control characters, no bidirectional formatting characters (such as a right-to-left "
    "override), not blank."
)
TEXT_RULES = "No NUL or other control characters but tab, line feed and carriage return."

_NOT_IN_NAMES = r"\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
NAME_PATTERN = rf"^[^{_NOT_IN_NAMES}]*[^\s{_NOT_IN_NAMES}][^{_NOT_IN_NAMES}]*$"
"""The name rules as a regular expression, for the OpenAPI document (the check: `name_problem`)."""
TEXT_PATTERN = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]*$"
"""The text rules as a regular expression, for the OpenAPI document (the check: `text_problem`)."""

Name = Annotated[
    str, Field(json_schema_extra={"pattern": NAME_PATTERN}), AfterValidator(_check_name)
]
"""A name (federation, client, class); give its length with Field(min_length, max_length)."""
Text = Annotated[
    str, Field(json_schema_extra={"pattern": TEXT_PATTERN}), AfterValidator(_check_text)
]
"""Free text (a reason); give its length with Field(min_length, max_length)."""
BoundedJson = Annotated[dict[str, Any], AfterValidator(_check_depth)]
"""A free-form JSON object nested at most `MAX_JSON_DEPTH` deep."""

Int32 = Annotated[int, Field(ge=0, le=INT32_MAX)]
"""A non-negative integer that fits an INTEGER column."""
PositiveInt32 = Annotated[int, Field(ge=1, le=INT32_MAX)]
Int64 = Annotated[int, Field(ge=0, le=INT64_MAX)]
"""A non-negative integer that fits a BIGINT column (offsets, event ids)."""
