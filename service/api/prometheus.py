"""Prometheus text exposition format 0.0.4, written by hand (no prometheus_client dependency).

Format: https://prometheus.io/docs/instrumenting/exposition_formats/ — per family a ``# HELP``
and a ``# TYPE`` line, then ``name{label="value",...} number`` samples. Label values escape
backslash, double quote and line feed; HELP text escapes backslash and line feed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class MetricFamily:
    """One metric family: its name, help text, type and samples (labels, value)."""

    name: str
    help: str
    type: Literal["counter", "gauge", "untyped"]
    samples: list[tuple[Mapping[str, str], float]] = field(default_factory=list)


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels.items())
    return "{" + inner + "}"


def render(families: Iterable[MetricFamily]) -> str:
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.type}")
        for labels, value in family.samples:
            lines.append(f"{family.name}{_labels(labels)} {format_value(value)}")
    return "\n".join(lines) + "\n"


def by_label(label: str, counts: Mapping[str, int]) -> list[tuple[Mapping[str, str], float]]:
    """Samples of one labelled family, sorted by label value."""
    return [({label: key}, float(n)) for key, n in sorted(counts.items())]
