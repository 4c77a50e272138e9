"""The report's ``latest.primary_summary`` is the primary detector's summary record, chosen by
``primary_detector`` (not by whichever record accepts the keys first), in the API and the SDK."""

from __future__ import annotations

from client_sdk._report_responses import ReportLatest as SdkReportLatest
from service.api.schemas.reports import ReportLatest
from service.audit_records.detection_summaries import (
    EvidenceSummary,
    FedNCLSummary,
    FedNoRoSummary,
)
from service.openapi_spec import build_spec


def test_the_summary_is_read_as_the_primary_detectors_record() -> None:
    # keys only one record has: any reading gets these right
    fedncl = ReportLatest.model_validate(
        {"primary_detector": "fedncl", "primary_summary": {"mean": 1.5, "std": 0.5}}
    )
    assert type(fedncl.primary_summary) is FedNCLSummary
    # an undetermined Fed-NCL round's summary is empty, and FedNoRo counts its flags under the
    # same key: only the name tells them apart (without the validator these read as the
    # evidence detector's and FedNoRo's records: checked by removing it)
    for summary in ({}, {"n_flagged": 0}):
        read = ReportLatest.model_validate(
            {"primary_detector": "fedncl", "primary_summary": summary}
        )
        assert type(read.primary_summary) is FedNCLSummary, summary
    fednoro = ReportLatest.model_validate(
        {"primary_detector": "fednoro", "primary_summary": {"guard": "Ashman's D 6.8 < 12"}}
    )
    assert type(fednoro.primary_summary) is FedNoRoSummary
    assert fednoro.primary_summary.guard == "Ashman's D 6.8 < 12"
    evidence = ReportLatest.model_validate(
        {"primary_detector": "evidence", "primary_summary": {"verdict": "ok", "q": 0.01}}
    )
    assert type(evidence.primary_summary) is EvidenceSummary
    # written back as it was stored: the keys it had, a key a newer version added kept
    stored = {"verdict": "ok", "q": 0.01, "added_later": [1, 2]}
    again = ReportLatest.model_validate({"primary_detector": "evidence", "primary_summary": stored})
    assert again.model_dump(mode="json", exclude_unset=True)["primary_summary"] == stored


def test_the_sdk_reads_the_same_summary_as_a_dict() -> None:
    stored = {"verdict": "inconclusive", "q": 0.01, "majority_suspected": True}
    latest = SdkReportLatest.model_validate(
        {"primary_detector": "evidence", "primary_summary": stored}
    )
    assert latest.primary_summary == stored
    assert SdkReportLatest.model_validate({}).primary_summary is None


def test_the_spec_lists_each_detectors_summary_for_the_report() -> None:
    schema = build_spec()["components"]["schemas"]["ReportLatest"]["properties"]
    refs = {
        option.get("$ref", "").rsplit("/", 1)[-1] for option in schema["primary_summary"]["anyOf"]
    }
    assert {"EvidenceSummary", "FedNoRoSummary", "FedNCLSummary", "ExpertiseSummary"} <= refs
