"""The report table the CLI prints (``fedaudit report`` and ``fedaudit demo``)."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from client_sdk.report_table import render_report


def report(statistic: str | None) -> dict[str, Any]:
    summary = {"ashman_d": 1.2} if statistic is None else {"separation_statistic": statistic}
    return {
        "federation": "fed",
        "rounds_audited": 4,
        "primary_detector": "fednoro",
        "latest": {
            "round": 5,
            "primary_detector": "fednoro",
            "primary_status": "ok",
            "primary_summary": summary,
            "aggregation_rule": "daagg",
        },
        "clients": [
            {
                "name": "site-a",
                "status": "trusted",
                "times_flagged": 0,
                "rounds_audited": 4,
                "latest_scores": {"fednoro": 3.456, "fedncl": None},
                "reliability": 0.5,
                "noisy_classes": ["2"],
                "last_weight": 0.25,
            }
        ],
    }


def text_of(data: dict[str, Any], truth: dict[str, float] | None = None) -> str:
    console = Console(width=250, record=True)
    console.print(render_report(data, truth=truth or {"site-a": 0.3}))
    return console.export_text()


def test_fednoro_column_is_the_graded_score_and_the_caption_names_it():
    text = text_of(report("class_z"))
    assert "FedNoRo score" in text
    assert "3.46" in text  # the graded score, not a probability
    assert "FedNoRo score = class-standardised loss excess" in text
    assert "FedNoRo score = mean loss on the site's own labels" in text_of(report("mean_loss"))


def test_caption_without_a_fednoro_summary_names_no_statistic():
    assert "FedNoRo score =" not in text_of(report(None))


def test_the_latest_audits_warnings_are_printed():
    data = report("class_z")
    data["latest"]["warnings"] = ["the flagged clients hold 57% of round 5's samples"]
    assert "WARNING: the flagged clients hold 57% of round 5's samples" in text_of(data)
    assert "WARNING" not in text_of(report("class_z"))


def test_the_caption_gives_the_separation_and_what_the_guard_needs():
    data = report("class_z")
    data["latest"]["primary_summary"].update({"ashman_d": 6.8, "separation_threshold": 12.0})
    assert "Ashman's D 6.8 (needs 12.0)" in text_of(data)
    assert "needs" not in text_of(report(None))  # a D without a threshold: nothing to compare
    data["latest"]["primary_summary"].update(
        {"separation_threshold": 2.0, "separation_confirmed_group": True}
    )
    assert "Ashman's D 6.8 (needs 2.0, the group already noisy)" in text_of(data)


def test_the_caption_says_when_several_groups_were_judged():
    data = report("class_z")
    summary = data["latest"]["primary_summary"]
    summary.update({"ashman_d": 6.1, "separation_threshold": 5.77, "n_fits": 9})
    summary.update({"groups_tested": 2, "vote_count": 4})
    assert "Ashman's D 6.1 (needs 5.8; 2 groups judged, this one from 4 of 9 fits)" in text_of(data)
    summary["groups_tested"] = 1  # the fits agreed: nothing to add
    assert "Ashman's D 6.1 (needs 5.8)" in text_of(data)


def test_names_reasons_and_classes_are_text_not_markup():
    # A site, a class, a federation or a reason can hold brackets; rich would take "[a]" for
    # a style tag and drop it.
    data = report("class_z")
    data["federation"] = "fed[b]"
    data["status"] = "stopped"
    data["status_reason"] = "stopped by the admin: [audit] relabelled"
    data["clients"][0].update({"name": "site[a]", "noisy_classes": ["[x]"]})
    data["latest"]["warnings"] = ["look at [site]"]
    text = text_of(data, truth={"site[a]": 0.3})
    for word in ("fed[b]", "[audit] relabelled", "site[a]", "[x]", "look at [site]"):
        assert word in text, word
    assert "0.30" in text  # the true rate found under the bracketed name


def test_inconsistent_claims_get_a_column_only_when_a_site_has_some():
    assert "inconsistent claims" not in text_of(report("class_z"))
    data = report("class_z")
    data["clients"][0].update(
        {"inconsistent_updates": 3, "last_inconsistent_at": "2026-11-25T09:12:30Z"}
    )
    text = text_of(data)
    assert "inconsistent claims (last)" in text
    assert "3 (2026-11-25 09:12)" in text


def test_evidence_column_is_the_sites_stouffer_z():
    data = report("class_z")
    data["clients"][0]["latest_scores"] = {"evidence": 4.25, "fednoro": -0.5, "fedncl": None}
    text = text_of(data)
    header = next(line for line in text.splitlines() if "evidence z" in line)
    row = next(line for line in text.splitlines() if "site-a" in line)
    # The evidence column comes before FedNoRo's, and holds the evidence score, not FedNoRo's.
    assert header.index("evidence z") < header.index("FedNoRo score")
    assert row.index("4.25") < row.index("-0.50")


def test_the_latest_site_errors_show_their_first_lines():
    # torch's load error names the cause on its second line; a traceback's tail stays out
    data = report("class_z")
    data["site_errors"] = [
        {
            "name": "site-[b]",
            "round": 0,
            "stage": "load",
            "error_type": "RuntimeError",
            "message": "Error(s) in loading state_dict for Net:\n\tsize mismatch for fc.weight"
            "\n\tthird line\n\tfourth line",
        }
    ]
    text = " ".join(text_of(data).split())  # the table wraps its caption
    assert (
        "SITE ERROR: site-[b] round 0 (load): RuntimeError: Error(s) in loading state_dict for "
        "Net: / size mismatch for fc.weight / third line"
    ) in text
    assert "fourth line" not in text
    assert "SITE ERROR" not in text_of(report("class_z"))


def test_a_score_without_an_answer_says_why():
    data = report("class_z")
    data["latest"]["detectors"] = {
        "fednoro": {"status": "ok", "reason": None},
        "fedncl": {"status": "undetermined", "reason": "fewer than 4 clients"},
    }
    data["clients"][0]["latest_statuses"] = {"fednoro": "ok", "fedncl": "undetermined"}
    text = text_of(data)
    assert "n/a (undetermined)" in text  # Fed-NCL's cell
    assert "n/a (not run)" in text  # the evidence detector's cell: not in latest_scores
    assert "Fed-NCL undetermined in round 5: fewer than 4 clients" in text
    assert "n/a (undetermined): too few sites or signals to decide" in text
    assert "inconclusive" not in text  # no such marker shown: no legend line for it


def test_an_abstaining_detector_is_marked_inconclusive():
    data = report("class_z")
    row = data["clients"][0]
    row["latest_scores"] = {"fednoro": None, "evidence": None}
    row["latest_statuses"] = {"fednoro": "undetermined", "evidence": "inconclusive"}
    data["latest"]["primary_status"] = "undetermined"
    data["latest"]["detectors"] = {
        "fednoro": {"status": "undetermined", "reason": "fewer than 4 clients"},
        "evidence": {"status": "inconclusive", "reason": "I2 above 0.9"},
    }
    text = text_of(data)
    assert "n/a (inconclusive)" in text
    assert "n/a (undetermined)" in text
    assert "evidence inconclusive in round 5: I2 above 0.9" in text
    # the primary's verdict is on the caption's first line, not repeated as a note
    assert "FedNoRo undetermined in round" not in text
    assert "abstained: the consensus is suspect" in text


def test_a_site_never_audited_shows_a_dash_not_a_reason():
    data = report("class_z")
    data["clients"][0]["latest_scores"] = None
    assert "n/a" not in text_of(data)


def test_the_primary_verdicts_q_value_and_geometry_get_columns_when_a_site_has_them():
    data = report("class_z")
    assert "q-value" not in text_of(data)
    assert "geometry z" not in text_of(data)
    data["clients"][0]["latest_detector_evidence"] = {
        "evidence": {"q_value": 0.00123, "geometry_z": 12.34}
    }
    # the q-value beside the z the detector answered with (not where it abstained)
    assert "0.0012" not in text_of(data)
    data["clients"][0]["latest_scores"]["evidence"] = 4.5
    text = text_of(data)
    assert "q-value" in text
    assert "0.0012" in text
    assert "geometry z" in text
    assert "12.3" in text
    # a site without the parts shows dashes in those columns
    data["clients"].append({**data["clients"][0], "name": "site-b"})
    data["clients"][1]["latest_detector_evidence"] = {"evidence": None}
    line = next(x for x in text_of(data).splitlines() if "site-b" in x)
    assert line.count(" - ") >= 2


def test_a_trust_anchor_is_marked_in_its_status():
    data = report("class_z")
    data["clients"][0]["anchor"] = True
    assert "trusted (anchor)" in text_of(data)
    assert "(anchor)" not in text_of(report("class_z"))


def test_a_site_that_does_not_take_part_says_why_in_its_status():
    data = report("class_z")
    data["clients"][0]["attendance"] = "absent"
    assert "trusted (absent)" in text_of(data)
    data["clients"][0]["attendance"] = "suspended"
    assert "trusted (suspended)" in text_of(data)
    plain = text_of(report("class_z"))  # present, or a report from before attendance
    assert "(absent)" not in plain
    assert "(suspended)" not in plain


def test_a_stopped_or_failed_federation_says_so_in_the_title():
    data = report("class_z")
    data["status"], data["status_reason"] = "stopped", "stopped by the admin: wrong spec"
    assert "STOPPED: stopped by the admin: wrong spec" in " ".join(text_of(data).split())
    data["status"], data["status_reason"] = "failed", "round 3 failed to close: boom"
    assert "FAILED: round 3 failed to close: boom" in " ".join(text_of(data).split())
    assert "STOPPED" not in text_of(report("class_z"))
