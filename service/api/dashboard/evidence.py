"""The client page's evidence beside the verdict: each detector's parts with what they mean, and
a per-class table, for the client's latest audited round.

Built from the client history's ``detector_evidence`` and ``class_evidence``
(``service.coordinator.report_evidence``); what each part means is the API schema's own
description (``service.api.schemas.evidence``), so the page and the OpenAPI spec say the same.
Every value goes through `esc` or `number` (class labels come from admins); no script, no style
attribute.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel

from service.api.dashboard.svg import esc, number
from service.api.schemas.evidence import (
    ClassEvidence,
    EvidenceParts,
    ExpertiseParts,
    FedNCLParts,
    FedNoRoParts,
)
from service.report_views import ClassEvidenceEntry, ClientPageView, DetectorEvidenceEntry

PARTS: tuple[tuple[str, type[BaseModel]], ...] = (
    ("evidence", EvidenceParts),
    ("fednoro", FedNoRoParts),
    ("fedncl", FedNCLParts),
    ("expertise", ExpertiseParts),
)
"""The detectors whose evidence the page shows, in this order, and the wire type that says what
each of their parts means."""

ROLES = {
    "evidence": "shown; not the primary detector here",
    "fednoro": "shown; its mixture can make the evidence detector abstain",
    "fedncl": "shown; does not decide",
    "expertise": "shown; a reliability signal, never flags",
}
"""What each detector's evidence does to the verdict when it is not the primary detector
(docs/algorithms.md, "The verdict: which evidence decides")."""


def role(name: str, primary: str | None) -> str:
    """Whether the detector's evidence decides the verdict (it is the primary detector)."""
    return "decides: the primary detector" if name == primary else ROLES[name]


def meaning(model: type[BaseModel], part: str) -> str:
    """The one-line meaning of a part: its field's description in the API schema."""
    return model.model_fields[part].description or part


def _by_name(found: DetectorEvidenceEntry) -> dict[str, dict[str, float | None] | None]:
    """Each detector's parts under its name."""
    return {
        "evidence": found["evidence"],
        "fednoro": found["fednoro"],
        "fedncl": found["fedncl"],
        "expertise": found["expertise"],
    }


def _detector_rows(
    found: Mapping[str, Mapping[str, float | None] | None], primary: str | None
) -> str:
    rows = []
    for name, model in PARTS:
        parts = found.get(name)
        if not parts:
            continue
        fields = list(model.model_fields)
        for i, part in enumerate(fields):
            head = (
                f'<td rowspan="{len(fields)}">{esc(name)}<br>'
                f'<span class="muted">{esc(role(name, primary))}</span></td>'
                if i == 0
                else ""
            )
            rows.append(
                f"<tr>{head}<td>{esc(part)}</td>"
                f'<td class="num">{number(parts.get(part))}</td>'
                f'<td class="muted">{esc(meaning(model, part))}</td></tr>'
            )
    return "".join(rows)


def _class_rows(classes: Sequence[ClassEvidenceEntry], counts: Sequence[int] | None) -> str:
    rows = []
    for c in classes:
        index = c["index"]
        count = (
            counts[index]
            if counts is not None and isinstance(index, int) and 0 <= index < len(counts)
            else None
        )
        noisy = ", ".join(str(d) for d in c["noisy_by"])
        noisy_cell = esc(noisy) if noisy else '<span class="muted">-</span>'
        rows.append(
            f"<tr><td>{esc(c['label'])}</td>"
            f'<td class="num">{number(count)}</td>'
            f'<td class="num">{number(c["evidence_z"])}</td>'
            f'<td class="num">{number(c["fednoro_normalised_loss"])}</td>'
            f"<td>{noisy_cell}</td></tr>"
        )
    return "".join(rows)


def evidence_section(view: ClientPageView, primary: str | None) -> str:
    """The section of the client page: the latest audited round's evidence per detector and per
    class (a note where the round's audit holds none, e.g. one stored by an older version)."""
    if not view.rounds:
        return ""
    latest = view.rounds[-1].audit
    index = latest.round
    found = _by_name(latest.detector_evidence)
    classes = latest.class_evidence
    title = f"<h2>Evidence beside the verdict, round {esc(index)}</h2>"
    if not any(found.get(name) for name, _ in PARTS) and not classes:
        return (
            f'<section>{title}<p class="muted">The audit of this round holds no detector '
            "evidence for the site.</p></section>"
        )
    detectors = (
        "<table><thead><tr><th>detector</th><th>evidence</th><th>value</th><th>meaning</th>"
        f"</tr></thead><tbody>{_detector_rows(found, primary)}</tbody></table>"
    )
    counts = view.class_counts.get(index)
    per_class = (
        "<h2>Per class</h2><table><thead><tr><th>class</th><th>samples</th>"
        f'<th title="{esc(meaning(ClassEvidence, "evidence_z"))}">evidence class z</th>'
        f'<th title="{esc(meaning(ClassEvidence, "fednoro_normalised_loss"))}">'
        "FedNoRo normalised loss</th>"
        f'<th title="{esc(meaning(ClassEvidence, "noisy_by"))}">noisy (by)</th></tr></thead>'
        f"<tbody>{_class_rows(classes, counts)}</tbody></table>"
        '<p class="muted">samples: the site\'s count of the class in the update of that round; '
        "-: not known. Classes of which no detector says anything are left out.</p>"
        if classes
        else '<p class="muted">No per-class evidence in this round.</p>'
    )
    return f"<section>{title}{detectors}{per_class}</section>"
