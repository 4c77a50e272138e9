"""What a stored audit says about one client (``reports._client_entry``), on literal values read
as the database gives them (``stored_audit.client_audit``): the classes the report names come
from the primary detector."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from service.coordinator.reports import _client_entry
from service.coordinator.stored_audit import client_audit

FEDERATION: Any = SimpleNamespace(class_names=["cat", "dog", "eel"])


def fields(primary: str, **statuses: str) -> dict[str, Any]:
    """An audit in which the evidence detector lists class 2 and FedNoRo classes 1 and 2 for
    the client (Fed-NCL and expertise not run unless given a status)."""
    out: dict[str, Any] = {
        "primary": primary,
        "primary_flag": True,
        "weight": 0.25,
        "reliability": None,
        "neighbors": None,
        "evidence.noisy_classes": [2],
        "fednoro.noisy_classes": [1, 2],
        # No Gaussian mechanism: the audit holds no privacy budget.
        "epsilon_round": None,
        "epsilon_total": None,
        # The evidence flag rests on the losses (no update geometry, no accuracy evidence).
        "evidence.flagged_by_geometry": False,
        "evidence.geometry_carried": False,
        "evidence.flagged_by_accuracy": False,
    }
    for name in ("fednoro", "fedncl", "expertise", "evidence"):
        out[f"{name}.status"] = statuses.get(name)
        out[f"{name}.score"] = 1.5
        out[f"{name}.flag"] = True
    return out


def test_the_primary_detectors_classes_are_the_reports() -> None:
    entry = _client_entry(
        FEDERATION, 7, client_audit(fields("evidence", evidence="ok", fednoro="ok"))
    )
    assert entry.round == 7
    assert entry.noisy_classes == ["eel"]
    assert entry.classes_by_detector == {"evidence": ["eel"], "fednoro": ["dog", "eel"]}
    assert set(entry.flags) == {"evidence", "fednoro"}  # the two not run are left out

    entry = _client_entry(
        FEDERATION, 7, client_audit(fields("fednoro", evidence="ok", fednoro="ok"))
    )
    assert entry.noisy_classes == ["dog", "eel"]


def test_a_primary_that_judges_sites_only_shows_fednoros_classes() -> None:
    entry = _client_entry(FEDERATION, 7, client_audit(fields("fedncl", fedncl="ok", fednoro="ok")))
    assert entry.noisy_classes == ["dog", "eel"]
    assert entry.classes_by_detector == {"fednoro": ["dog", "eel"]}


def test_an_abstaining_primary_names_no_class() -> None:
    entry = _client_entry(
        FEDERATION, 7, client_audit(fields("evidence", evidence="inconclusive", fednoro="ok"))
    )
    assert entry.noisy_classes == []
    assert entry.classes_by_detector == {"fednoro": ["dog", "eel"]}
    assert entry.flags["evidence"] is None
    assert entry.scores["evidence"] is None
    # what each detector that ran answered, so that a missing score can say why
    assert entry.statuses == {"evidence": "inconclusive", "fednoro": "ok"}
