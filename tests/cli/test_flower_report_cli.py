"""`fedaudit report --file`: a Flower run's report file, read without a coordinator."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from client_sdk.flower_report import (
    FlowerReportError,
    flower_report_csv,
    flower_report_rows,
    read_flower_report,
)
from service.cli import app

runner = CliRunner()


def _site(node, flag, status, weight, score, classes):
    verdict = None if flag is None else {"score": score, "evidence": {"noisy_classes": classes}}
    return {
        "node_id": node,
        "num_samples": 100 + node,
        "flag": flag,
        "status_before": "trusted",
        "status": status,
        "weight": weight,
        "verdict": verdict,
    }


# Three rounds of three nodes: round 1 abstains (flags None), node 7 is flagged in rounds 2 and 3
# (noisy after the third), node 9 in round 2 only; round 4 was not audited at all.
REPORT = {
    "format": "fedaudit.flower-report/1",
    "wrapped_strategy": "FedAvg",
    "audit_config": {"primary_detector": "evidence"},
    "rounds": [
        {
            "round": 1,
            "audited": True,
            "decided": False,
            "applied": "wrapped",
            "reason": "primary detector 'evidence' inconclusive (model weak)",
            "detector_status": {"evidence": "inconclusive"},
            "clients": [_site(n, None, "trusted", 1 / 3, None, []) for n in (3, 7, 9)],
        },
        {
            "round": 2,
            "audited": True,
            "decided": True,
            "applied": "audit",
            "reason": None,
            "detector_status": {"evidence": "ok"},
            "clients": [
                _site(3, False, "trusted", 0.4, 0.1, []),
                _site(7, True, "suspect", 0.3, 5.0, [2]),
                _site(9, True, "suspect", 0.3, 3.5, [1]),
            ],
        },
        {
            "round": 3,
            "audited": True,
            "decided": True,
            "applied": "audit",
            "reason": None,
            "detector_status": {"evidence": "ok"},
            "clients": [
                _site(3, False, "trusted", 0.5, -0.2, []),
                _site(7, True, "noisy", 0.1, 6.25, [2, 5]),
                _site(9, False, "suspect", 0.4, 0.3, []),
            ],
        },
        {"round": 4, "audited": False, "decided": False, "applied": "wrapped", "reason": "x"},
    ],
    "statuses": {
        "3": {"status": "trusted", "recent_flags": [False, False]},
        "7": {"status": "noisy", "recent_flags": [True, True]},
        "9": {"status": "suspect", "recent_flags": [True, False]},
    },
}


@pytest.fixture
def report_file(tmp_path):
    path = tmp_path / "flower-report.json"
    path.write_text(json.dumps(REPORT))
    return path


def test_rows_count_flags_over_the_rounds_that_judged_the_node(report_file):
    rows = {r["node_id"]: r for r in flower_report_rows(read_flower_report(report_file))}
    assert sorted(rows) == [3, 7, 9]
    # round 1 abstained: it judged nobody
    assert (rows[7]["times_flagged"], rows[7]["rounds_audited"]) == (2, 2)
    assert (rows[9]["times_flagged"], rows[9]["rounds_audited"]) == (1, 2)
    assert rows[7]["status"] == "noisy"
    assert (rows[7]["latest_score"], rows[7]["noisy_classes"], rows[7]["latest_weight"]) == (
        6.25,
        [2, 5],
        0.1,
    )


def test_csv_by_hand(report_file):
    assert flower_report_csv(read_flower_report(report_file)).splitlines() == [
        "node_id,status,times_flagged,rounds_audited,latest_flag,latest_score,noisy_classes,"
        "latest_weight,num_samples",
        "3,trusted,0,2,false,-0.2,,0.5,103",
        "7,noisy,2,2,true,6.25,2 5,0.1,107",
        "9,suspect,1,2,false,0.3,,0.4,109",
    ]
    result = runner.invoke(app, ["report", "--file", str(report_file), "--csv"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[2] == "7,noisy,2,2,true,6.25,2 5,0.1,107"


def test_table_and_json(report_file):
    result = runner.invoke(app, ["report", "--file", str(report_file)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "Flower run (FedAvg wrapped, in process): 4 training rounds, 3 audited" in result.output
    line = next(x for x in result.output.splitlines() if "noisy" in x and " 7 " in x)
    assert "2 of 2" in line
    assert "6.25" in line
    assert "round 4: x" in result.output  # the latest round was not audited: why
    as_json = runner.invoke(app, ["report", "--file", str(report_file), "--json"])
    assert json.loads(as_json.output) == REPORT


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not a JSON file"),
        (json.dumps({"format": "other/1"}), "not a fedaudit Flower report (format 'other/1'"),
        (json.dumps([1, 2]), "format 'list'"),
        (json.dumps({"format": "fedaudit.flower-report/1"}), "no 'rounds' list"),
    ],
)
def test_a_file_that_is_not_a_flower_report_is_refused(tmp_path, content, message):
    path = tmp_path / "r.json"
    path.write_text(content)
    with pytest.raises(FlowerReportError, match=message.replace("(", r"\(").replace("[", r"\[")):
        read_flower_report(path)
    result = runner.invoke(app, ["report", "--file", str(path)])
    assert result.exit_code == 1
    assert message in " ".join(result.output.split())


def test_a_missing_file_and_the_argument_rules(tmp_path, report_file):
    missing = runner.invoke(app, ["report", "--file", str(tmp_path / "nope.json")])
    assert missing.exit_code == 1
    assert "cannot be read" in missing.output
    for args in (["report"], ["report", "some-id", "--file", str(report_file)]):
        result = runner.invoke(app, args)
        assert result.exit_code == 1
        assert "give a FEDERATION_ID" in " ".join(result.output.split())
