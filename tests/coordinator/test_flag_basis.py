"""What a report says a flag rests on (service.coordinator.reports), and how the table shows it."""

from __future__ import annotations

from typing import Any

import pytest

from client_sdk.report_table import _classes_text
from service.coordinator.reports import _advice, _flag_basis
from service.coordinator.stored_audit import client_audit


def fields(primary: str = "evidence", flag: bool | None = True, **evidence: bool) -> dict[str, Any]:
    keys = ("flagged_by_geometry", "geometry_carried", "flagged_by_accuracy")
    return {
        "primary": primary,
        "primary_flag": flag,
        **{f"evidence.{key}": evidence.get(key) for key in keys},
    }


@pytest.mark.parametrize(
    ("given", "basis"),
    [
        (fields(flag=False, flagged_by_geometry=True), None),  # not flagged: no basis
        (fields(flag=None), None),
        (fields(), "losses"),
        (fields(flagged_by_geometry=True), "update_direction"),
        (fields(geometry_carried=True), "update_direction"),
        (fields(flagged_by_accuracy=True), "accuracy"),
        (fields(flagged_by_geometry=True, flagged_by_accuracy=True), "update_direction"),
        (fields(primary="fednoro", flagged_by_geometry=True), "losses"),  # FedNoRo reads losses
    ],
)
def test_the_flag_basis(given: dict[str, Any], basis: str | None) -> None:
    assert _flag_basis(client_audit(given)) == basis


def test_the_advice_names_the_update_direction() -> None:
    advice = _advice("noisy", [], "update_direction")
    assert "model updates move away" in advice
    assert "class(es)" not in advice
    assert "class(es) 3" in _advice("suspect", ["3"], "losses")
    assert _advice("trusted", [], None).startswith("No label problem")


def test_the_report_table_shows_a_flag_without_classes() -> None:
    assert _classes_text({"noisy_classes": ["3", "5"]}) == "3, 5"
    assert _classes_text({"noisy_classes": [], "flag_basis": "update_direction"}) == (
        "(update direction)"
    )
    assert _classes_text({"noisy_classes": ["2"], "flag_basis": "accuracy"}) == (
        "2 (own-label accuracy)"
    )
    assert _classes_text({"noisy_classes": []}) == "-"
