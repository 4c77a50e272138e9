"""A stored audit on the wire: each detector's verdict evidence is typed by the detection's
method, and the JSON is the stored JSON (absent keys stay absent, nulls stay null, unknown keys
and unknown detectors are kept)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from pydantic import BaseModel

from client_sdk._detection_responses import (
    AuditDetection,
    AuditEvidenceDetails,
    AuditEvidenceDetection,
    AuditFedNCLDetection,
)
from client_sdk._responses import AuditRecord as SDKAuditRecord
from service.api.schemas.audits import (
    _TYPED_DETECTORS,
    AuditRecord,
    DetectionRecord,
    EvidenceDetectionRecord,
    ExpertiseDetectionRecord,
    FedNCLDetectionRecord,
    FedNoRoDetectionRecord,
)
from service.audit import DETECTORS, AuditConfig, run_audit
from service.audit_records.detection_summaries import SUMMARY_MODELS
from tests.audit.test_pipeline import N_CLASSES, NOISY, flagged_before, make_federation


def stored_audit() -> dict:
    """A real audit of ten sites (three noisy) with error counts, as the coordinator stores it
    (``to_json``, then JSON text)."""
    global_state, clients = make_federation()
    rng = np.random.default_rng(1)
    with_counts = []
    for k, client in enumerate(clients):
        errors = rng.binomial(25, 0.6 if k in NOISY else 0.1, N_CLASSES)
        with_counts.append(
            dataclasses.replace(
                client,
                per_class_loss_sd=[0.4] * N_CLASSES,
                per_class_errors=errors.tolist(),
                per_class_confident_errors=(errors // 2).tolist(),
            )
        )
    outcome = run_audit(global_state, with_counts, AuditConfig(), round_index=3)
    return dict(json.loads(json.dumps(outcome.to_json())))


def test_the_typed_records_cover_the_registry() -> None:
    assert set(DETECTORS) == _TYPED_DETECTORS
    # the catch-all's schema excludes them, so that a typed record matches one member only
    excluded = DetectionRecord.model_json_schema()["properties"]["method"]["not"]["enum"]
    assert set(excluded) == _TYPED_DETECTORS
    # the coordinator and the report read each stored summary as its detector's record
    assert set(SUMMARY_MODELS) == set(DETECTORS)
    for name in DETECTORS:
        record = {
            "evidence": EvidenceDetectionRecord,
            "fednoro": FedNoRoDetectionRecord,
            "fedncl": FedNCLDetectionRecord,
            "expertise": ExpertiseDetectionRecord,
        }[name]
        assert record.model_fields["summary"].annotation is SUMMARY_MODELS[name]


def test_a_real_audit_validates_as_typed_records_and_serialises_as_stored() -> None:
    stored = stored_audit()
    record = AuditRecord.model_validate(stored)
    kinds = {name: type(d) for name, d in record.detections.items()}
    assert kinds == {
        "evidence": EvidenceDetectionRecord,
        "fednoro": FedNoRoDetectionRecord,
        "fedncl": FedNCLDetectionRecord,
        "expertise": ExpertiseDetectionRecord,
    }
    evidence = record.detections["evidence"]
    assert isinstance(evidence, EvidenceDetectionRecord)
    first = evidence.verdicts[0]
    assert first is not None
    assert (
        first.evidence.errors
        == stored["detections"]["evidence"]["verdicts"][0]["evidence"]["errors"]
    )
    # the detections come back key for key and value for value
    served = record.model_dump(mode="json")["detections"]
    assert served == stored["detections"]
    for name in served:  # in the stored order too
        for mine, theirs in zip(
            served[name]["verdicts"], stored["detections"][name]["verdicts"], strict=True
        ):
            assert mine is None or list(mine["evidence"]) == list(theirs["evidence"])


def test_absent_keys_stay_absent_nulls_stay_null_and_unknown_ones_are_kept() -> None:
    verdict = {
        "score": 1.5,
        "probability": None,
        "flag": True,
        "evidence": {"p_value": 0.001, "site_z": None, "from_a_newer_version": [1, 2]},
    }
    audit = {
        "client_ids": ["a", "b"],
        "detections": {
            "evidence": {
                "method": "evidence",
                "status": "ok",
                "reason": None,
                "verdicts": [verdict, None],
                "summary": {"q": 0.01},
            },
            "retired": {
                "method": "retired",
                "status": "ok",
                "reason": None,
                "verdicts": [{"score": 2.0, "probability": None, "flag": None, "evidence": {}}],
                "summary": {},
            },
        },
        "primary": "evidence",
        "primary_flags": [True, None],
        "aggregation": {"rule": "fedavg"},
    }
    record = AuditRecord.model_validate(audit)
    assert type(record.detections["retired"]) is DetectionRecord
    served = record.model_dump(mode="json")["detections"]
    assert served == audit["detections"]
    assert "errors" not in served["evidence"]["verdicts"][0]["evidence"]


def test_a_wrongly_typed_field_is_refused() -> None:
    audit = {
        "method": "fedncl",
        "status": "ok",
        "verdicts": [{"score": 1.0, "flag": False, "evidence": {"divergence": "far"}}],
    }
    with pytest.raises(ValueError, match="divergence"):
        FedNCLDetectionRecord.model_validate(audit)


def test_the_sdk_reads_the_evidence_and_summaries_as_the_dicts_they_always_were() -> None:
    stored = stored_audit()
    record = SDKAuditRecord.model_validate(stored)
    evidence = record.detections["evidence"]
    assert isinstance(evidence, AuditEvidenceDetection)
    assert isinstance(evidence, AuditDetection)  # every detection still is one
    assert isinstance(record.detections["fedncl"], AuditFedNCLDetection)
    verdict = evidence.verdicts[0]
    assert verdict is not None
    raw = stored["detections"]["evidence"]["verdicts"][0]["evidence"]
    # the keys sent, and only those, with dict semantics
    assert verdict.evidence == raw
    assert "p_value" in verdict.evidence
    assert "prior_loss" not in verdict.evidence  # a known key the round did not send
    assert verdict.evidence.get("prior_loss", "absent") == "absent"
    assert json.loads(json.dumps(evidence.summary)) == stored["detections"]["evidence"]["summary"]
    # what Flower's forwarding mode returns is what the in-process audit stored
    assert verdict.model_dump(mode="json")["evidence"] == raw
    dumped = record.model_dump(mode="json")
    assert dumped["detections"] == stored["detections"]
    assert dumped["aggregation"]["details"] == stored["aggregation"]["details"]
    # an unknown detector stays a plain record
    other = SDKAuditRecord.model_validate(
        {
            **stored,
            "detections": {
                "retired": {
                    "method": "retired",
                    "status": "ok",
                    "verdicts": [{"score": 1.0, "flag": None, "evidence": {"x": 1}}],
                }
            },
        }
    )
    retired = other.detections["retired"]
    assert type(retired) is AuditDetection
    assert retired.verdicts[0] is not None
    assert retired.verdicts[0].evidence == {"x": 1}


def test_the_sdk_keeps_a_key_a_newer_coordinator_adds_and_checks_known_ones() -> None:
    from pydantic import TypeAdapter, ValidationError

    details = TypeAdapter(AuditEvidenceDetails).validate_python({"p_value": 0.5, "new_part_z": 3.0})
    assert details == {"p_value": 0.5, "new_part_z": 3.0}
    with pytest.raises(ValidationError, match="p_value"):
        TypeAdapter(AuditEvidenceDetails).validate_python({"p_value": "small"})


def small_round(seed: int, k: int, *, anchors: bool) -> tuple[dict, list[bool] | None]:
    """One audited round of k sites of 3 classes (the first two noisy), stored as JSON."""
    global_state, clients = make_federation(n_clients=max(k, 4), seed=seed)
    clients = [dataclasses.replace(c, per_class_loss_sd=[0.3] * N_CLASSES) for c in clients[:k]]
    anchor = [i == k - 1 for i in range(k)] if anchors else None
    outcome = run_audit(global_state, clients, AuditConfig(), round_index=5, anchors=anchor)
    return dict(json.loads(json.dumps(outcome.to_json()))), anchor


@pytest.mark.parametrize(
    ("k", "anchors"), [(2, False), (3, False), (4, False), (6, True), (12, True), (12, False)]
)
def test_audits_of_every_mode_round_trip(k: int, anchors: bool) -> None:
    # 2-4 sites: the small federation's test or undetermined detectors; anchors: anchored mode
    stored, _ = small_round(k, k, anchors=anchors)
    record = AuditRecord.model_validate(stored)
    assert record.model_dump(mode="json")["detections"] == stored["detections"]
    evidence = record.detections["evidence"]
    assert isinstance(evidence, EvidenceDetectionRecord)
    assert (
        evidence.summary.model_dump(exclude_unset=True)
        == stored["detections"]["evidence"]["summary"]
    )


@pytest.mark.parametrize("rule", ["daagg", "fedncl_layerwise", "trimmed_mean", "median"])
def test_the_aggregation_details_round_trip(rule: str) -> None:
    global_state, clients = make_federation()
    # sites 0-2 flagged in the round before too: the aggregation treats them as noisy
    outcome = run_audit(
        global_state,
        clients,
        AuditConfig(aggregation=rule),
        round_index=4,
        status_history=flagged_before(),
    )
    stored = dict(json.loads(json.dumps(outcome.to_json())))
    served = AuditRecord.model_validate(stored).model_dump(mode="json")["aggregation"]
    # (the weight cap's record serialises its optional note as null: typed last release)
    assert served["details"] == stored["aggregation"]["details"]
    assert served["details"], "each of these rules reports something of itself"
    if rule == "daagg":  # the flagged sites' nearest clean sites, by position
        assert set(served["details"]["nearest_clean"]) == {"0", "1", "2"}


def test_every_key_the_audit_writes_is_typed_on_the_wire() -> None:
    # A key a detector starts writing without its field here would still be served (extra
    # keys are kept), untyped: this catches it. Audits of every mode and rule.
    from service.audit_records.aggregation_details import AggregationDetails
    from service.audit_records.detection_summaries import (
        EvidenceSummary,
        ExpertiseSummary,
        FedNCLSummary,
        FedNoRoSummary,
    )
    from service.audit_records.verdict_evidence import (
        EvidenceVerdictEvidence,
        ExpertiseVerdictEvidence,
        FedNCLVerdictEvidence,
        FedNoRoVerdictEvidence,
    )

    typed: dict[str, tuple[type[BaseModel], type[BaseModel]]] = {
        "evidence": (EvidenceVerdictEvidence, EvidenceSummary),
        "fednoro": (FedNoRoVerdictEvidence, FedNoRoSummary),
        "fedncl": (FedNCLVerdictEvidence, FedNCLSummary),
        "expertise": (ExpertiseVerdictEvidence, ExpertiseSummary),
    }
    audits = [small_round(k, k, anchors=a)[0] for k, a in ((2, False), (4, False), (6, True))]
    audits.append(stored_audit())
    for rule in ("daagg", "fedncl_layerwise", "trimmed_mean", "median"):
        global_state, clients = make_federation()
        config = AuditConfig(aggregation=rule)
        outcome = run_audit(
            global_state, clients, config, round_index=4, status_history=flagged_before()
        )
        audits.append(dict(json.loads(json.dumps(outcome.to_json()))))
    untyped: set[str] = set()
    for audit in audits:
        for name, detection in audit["detections"].items():
            evidence_model, summary_model = typed[name]
            for verdict in detection["verdicts"]:
                if verdict is not None:
                    untyped |= {f"{name}.evidence.{k}" for k in verdict["evidence"]} - {
                        f"{name}.evidence.{k}" for k in evidence_model.model_fields
                    }
            untyped |= {f"{name}.summary.{k}" for k in detection["summary"]} - {
                f"{name}.summary.{k}" for k in summary_model.model_fields
            }
        details = audit["aggregation"].get("details") or {}
        untyped |= {f"details.{k}" for k in details} - {
            f"details.{k}" for k in AggregationDetails.model_fields
        }
    assert not untyped
