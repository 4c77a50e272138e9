"""Each detector's evidence beside the verdict, per site and per class
(``service.coordinator.report_evidence``), from a literal stored audit with hand-written values:
the report shows exactly those values, and an audit that lacks them (stored by an older version,
a detector not run, a part not used) shows them as null, not as an error."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

from service.coordinator.reports import _client_entry
from service.coordinator.stored_audit import client_audit_in
from service.report_views import ClientRound

FEDERATION: Any = SimpleNamespace(class_names=["cat", "dog", "<eel>"])

EVIDENCE_A = {
    "p_value": 0.0012,
    "q_value": 0.0024,
    "site_z": 3.25,
    "site_factor": 1.75,
    "stouffer_z": 2.5,
    "class_z": [0.25, None, 4.5],
    "noisy_classes": [2],
    "mean_loss": 1.125,
    "anchor": False,
    "significant": True,
    "errors": 7,
    "errors_expected": 2.5,
    "errors_z": 2.75,
    "errors_p_value": 0.003,
    "confident_errors": 6,
    "confident_errors_expected": 1.25,
    "confident_errors_z": 3.5,
    "confident_errors_p_value": 0.0004,
    "accuracy_z": -0.5,
    "accuracy_p_value": 0.69,
    "accuracy_gap": -0.02,
    "flagged_by_accuracy": False,
    "geometry_cosine": 0.125,
    "geometry_z": 11.5,
    "geometry_p_value": 1e-6,
    "flagged_by_geometry": False,
}

RESULT: dict[str, Any] = {
    "client_ids": ["a", "b"],
    "primary": "evidence",
    "primary_flags": [True, False],
    "detections": {
        "evidence": {
            "method": "evidence",
            "status": "ok",
            "verdicts": [
                {"score": 3.25, "flag": True, "evidence": EVIDENCE_A},
                # b: a verdict stored before the parts were recorded
                {"score": -0.5, "flag": False, "evidence": {"p_value": 0.8}},
            ],
        },
        "fednoro": {
            "method": "fednoro",
            "status": "ok",
            "verdicts": [
                {
                    "score": 2.125,
                    "flag": True,
                    "evidence": {
                        "normalised_loss": [0.0, None, 0.875],
                        "noisy_classes": [2, 0],
                        "mean_loss": 1.5,
                        "class_z": 2.125,
                        "gmm_noisy_probability": 0.9375,
                        "noisy_votes": 9,
                    },
                },
                None,  # no verdict on b
            ],
        },
        "fedncl": {
            "method": "fedncl",
            "status": "ok",
            "verdicts": [
                {
                    "score": 144.0,
                    "flag": True,
                    "evidence": {"divergence": 72.0, "data_quality": 20.0, "deviation": 1.75},
                },
                {"score": 0.8, "flag": False, "evidence": {}},
            ],
        },
        "expertise": {
            "method": "expertise",
            "status": "ok",
            "verdicts": [
                {"score": 0.0, "flag": None, "evidence": {"train_accuracy": 0.625}},
                {"score": 1.0, "flag": None, "evidence": {"train_accuracy": 0.9}},
            ],
        },
    },
    "aggregation": {"rule": "fednoro", "weights": [0.25, 0.75]},
}


def entry(result: dict[str, Any], position: int) -> ClientRound:
    client_id = result["client_ids"][position]
    return _client_entry(FEDERATION, 4, client_audit_in(result, position, client_id))


def test_each_detectors_evidence_is_the_stored_value() -> None:
    found = entry(RESULT, 0).detector_evidence
    assert found["evidence"] == {
        "p_value": 0.0012,
        "q_value": 0.0024,
        "site_z": 3.25,
        "site_factor": 1.75,
        "stouffer_z": 2.5,
        "mean_loss": 1.125,
        "errors": 7,
        "errors_expected": 2.5,
        "errors_z": 2.75,
        "errors_p_value": 0.003,
        "confident_errors": 6,
        "confident_errors_expected": 1.25,
        "confident_errors_z": 3.5,
        "confident_errors_p_value": 0.0004,
        "accuracy_z": -0.5,
        "accuracy_p_value": 0.69,
        "accuracy_gap": -0.02,
        "geometry_cosine": 0.125,
        "geometry_z": 11.5,
        "geometry_p_value": 1e-6,
    }
    assert found["fednoro"] == {
        "separation_score": 2.125,
        "class_z": 2.125,
        "mean_loss": 1.5,
        "noisy_probability": 0.9375,
        "noisy_votes": 9,
    }
    assert found["fedncl"] == {
        "q": 144.0,
        "divergence": 72.0,
        "data_quality": 20.0,
        "deviation": 1.75,
    }
    assert found["expertise"] == {"expertise": 0.0, "train_accuracy": 0.625}


def test_per_class_rows_hold_each_detectors_value_and_who_names_the_class() -> None:
    assert entry(RESULT, 0).class_evidence == [
        {
            "index": 0,
            "label": "cat",
            "evidence_z": 0.25,
            "fednoro_normalised_loss": 0.0,
            "noisy_by": ["fednoro"],
        },
        # class 1: the site holds none, FedNoRo dropped the column: nothing to show
        {
            "index": 2,
            "label": "<eel>",
            "evidence_z": 4.5,
            "fednoro_normalised_loss": 0.875,
            "noisy_by": ["fednoro", "evidence"],  # in the registry's order
        },
    ]


def test_an_older_verdict_and_a_missing_one_read_as_null() -> None:
    second = entry(RESULT, 1)
    found = second.detector_evidence
    assert found["evidence"]["p_value"] == 0.8
    assert found["evidence"]["site_z"] is None
    assert found["evidence"]["geometry_z"] is None
    assert found["evidence"]["errors"] is None
    assert found["fednoro"] is None  # no verdict on b
    assert found["fedncl"] == {
        "q": 0.8,
        "divergence": None,
        "data_quality": None,
        "deviation": None,
    }
    assert second.class_evidence == []


def test_a_detector_not_run_and_an_audit_without_evidence_show_nothing() -> None:
    older = copy.deepcopy(RESULT)
    for detection in older["detections"].values():
        for verdict in detection["verdicts"]:
            if verdict is not None:
                del verdict["evidence"]
    del older["detections"]["fedncl"]
    first = entry(older, 0)
    assert first.detector_evidence == {
        "evidence": None,
        "fednoro": None,
        "fedncl": None,
        "expertise": None,
    }
    assert first.class_evidence == []
    assert first.scores["evidence"] == 3.25  # the verdict itself still reads


def test_an_inconclusive_detector_still_shows_its_evidence() -> None:
    abstained = copy.deepcopy(RESULT)
    abstained["detections"]["evidence"]["status"] = "inconclusive"
    for verdict in abstained["detections"]["evidence"]["verdicts"]:
        verdict["flag"] = None
    first = entry(abstained, 0)
    assert first.scores["evidence"] is None
    assert first.detector_evidence["evidence"]["site_z"] == 3.25
    # the classes it would name are not named: it abstained
    assert [c["noisy_by"] for c in first.class_evidence] == [["fednoro"], ["fednoro"]]
