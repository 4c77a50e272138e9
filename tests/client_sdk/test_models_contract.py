"""The SDK's response models agree with the committed OpenAPI spec (its contract)."""

from __future__ import annotations

import json
from typing import get_type_hints

import pytest
from pydantic import BaseModel

from client_sdk import _detection_responses as detections
from client_sdk import _report_responses as reports
from client_sdk import _responses as sdk
from service.openapi_spec import DEFAULT_OUTPUT

SPEC = json.loads(DEFAULT_OUTPUT.read_text(encoding="utf-8"))
SCHEMAS = SPEC["components"]["schemas"]

PAIRS: list[tuple[type[BaseModel], str]] = [
    (sdk.Federation, "FederationRead"),
    (sdk.TaskSpec, "TaskSpec"),
    (sdk.SiteTask, "SiteTask"),
    (sdk.SignalPolicy, "SignalPolicy"),
    (sdk.PlanSpec, "PlanSpec"),
    (sdk.ModelInfo, "ModelRead"),
    (sdk.ClientInfo, "ClientRead"),
    (sdk.ClientCreated, "ClientCreated"),
    (sdk.JoinInfo, "JoinRead"),
    (sdk.Neighbor, "Neighbor"),
    (sdk.Probe, "Probe"),
    (sdk.Instructions, "Instructions"),
    (sdk.RoundRef, "RoundRef"),
    (sdk.CurrentRound, "CurrentRound"),
    (sdk.UpdateReceipt, "UpdateRead"),
    (sdk.RoundInfo, "RoundDetail"),
    (sdk.Event, "EventRead"),
    (sdk.AuditRecord, "AuditRecord"),
    (sdk.AuditDetection, "DetectionRecord"),
    (sdk.AuditVerdict, "VerdictRecord"),
    (detections.AuditEvidenceDetection, "EvidenceDetectionRecord"),
    (detections.AuditFedNoRoDetection, "FedNoRoDetectionRecord"),
    (detections.AuditFedNCLDetection, "FedNCLDetectionRecord"),
    (detections.AuditExpertiseDetection, "ExpertiseDetectionRecord"),
    (detections.AuditEvidenceVerdict, "EvidenceVerdictRecord"),
    (detections.AuditFedNoRoVerdict, "FedNoRoVerdictRecord"),
    (detections.AuditFedNCLVerdict, "FedNCLVerdictRecord"),
    (detections.AuditExpertiseVerdict, "ExpertiseVerdictRecord"),
    (sdk.AuditAggregation, "AggregationRecord"),
    (sdk.AuditClient, "AuditClient"),
    (sdk.AuditWeightCap, "WeightCapRecord"),
    (sdk.AuditCappedWeight, "CappedWeightRecord"),
    (sdk.AuditNeighbor, "NeighborRecord"),
    (reports.NoisyClientReport, "NoisyClientReport"),
    (reports.ReportClient, "ReportClient"),
    (reports.ReportLatest, "ReportLatest"),
    (reports.ReportFlagRound, "ReportFlagRound"),
    (reports.ReportNeighbor, "ReportNeighbor"),
    (reports.NeighborWeight, "NeighborWeight"),
    (reports.DetectorOutcome, "DetectorOutcome"),
    (reports.SiteErrorView, "SiteErrorView"),
    (reports.ReportPrivacy, "ReportPrivacy"),
    (reports.ClientHistory, "ClientHistory"),
    (reports.ClientRoundView, "ClientRoundView"),
    (reports.DetectorEvidence, "DetectorEvidence"),
    (reports.EvidenceParts, "EvidenceParts"),
    (reports.FedNoRoParts, "FedNoRoParts"),
    (reports.FedNCLParts, "FedNCLParts"),
    (reports.ExpertiseParts, "ExpertiseParts"),
    (reports.ClassEvidence, "ClassEvidence"),
]


@pytest.mark.parametrize(("model", "schema_name"), PAIRS, ids=[p[1] for p in PAIRS])
def test_sdk_model_matches_server_schema(model: type[BaseModel], schema_name: str) -> None:
    schema = SCHEMAS[schema_name]
    server_fields = set(schema["properties"])
    sdk_fields = set(model.model_fields)
    assert sdk_fields <= server_fields, (
        f"SDK expects fields the server never sends: {sdk_fields - server_fields}"
    )
    missing = set(schema.get("required", [])) - sdk_fields
    assert not missing, f"SDK ignores required server fields: {missing}"


def test_problem_details_shape() -> None:
    assert set(sdk.ProblemDetails.model_fields) == set(SCHEMAS["ProblemDetails"]["properties"])


@pytest.mark.parametrize(
    ("model", "schema_name"),
    [
        (detections.AuditEvidenceDetails, "EvidenceVerdictEvidence"),
        (detections.AuditFedNoRoDetails, "FedNoRoVerdictEvidence"),
        (detections.AuditFedNCLDetails, "FedNCLVerdictEvidence"),
        (detections.AuditExpertiseDetails, "ExpertiseVerdictEvidence"),
        (detections.AuditEvidenceSummary, "EvidenceSummary"),
        (detections.AuditFedNoRoSummary, "FedNoRoSummary"),
        (detections.AuditFedNCLSummary, "FedNCLSummary"),
        (detections.AuditExpertiseSummary, "ExpertiseSummary"),
        (detections.AuditGroupMeans, "GroupMeans"),
        (sdk.AuditAggregationDetails, "AggregationDetails"),
        (sdk.AuditAnchorLead, "AnchorLead"),
    ],
)
def test_the_sdk_evidence_and_summaries_have_every_field_the_server_types(
    model: type, schema_name: str
) -> None:
    # TypedDicts: every key the server types is typed in the SDK too
    assert set(get_type_hints(model)) == set(SCHEMAS[schema_name]["properties"])
