"""docs/eval/matrix.py (issue 17's stress matrix): the table builder on fabricated outputs.

The runs here are hand-written ``results.json`` files (only the keys the builder reads, with
literal values), so no simulation runs; every expected figure below is worked out by hand from
those literals. The scenario files of ``docs/eval/matrix/`` are validated too.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from fedaudit_sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]


def _load_matrix() -> Any:
    spec = importlib.util.spec_from_file_location("matrix_script", ROOT / "docs/eval/matrix.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["matrix_script"] = module
    spec.loader.exec_module(module)
    return module


matrix = _load_matrix()


def _summary(label: str, **kw: Any) -> dict[str, Any]:
    """A run summary with only the keys matrix.py reads."""
    per_round = kw.get("per_round", [])
    return {
        "label": label,
        "seed": kw["seed"],
        "clients": kw["clients"],
        "true_noisy": kw["noisy"],
        "warmup_rounds": 4,
        "rounds": 8,
        "primary_detector": "evidence",
        "final": {"f1": kw.get("f1_last")},
        "after_warmup": {
            "rounds": 4,
            "f1": kw.get("f1_mean"),
            "f1_rounds": 4 if kw.get("f1_mean") is not None else 0,
            "rounds_primary_undetermined": kw.get("undetermined", 0),
        },
        "false_alarms": {
            "rounds_with_false_flags": kw.get("false_rounds", 0),
            "first_false_flag_round": kw.get("first_false"),
            "worst_round": kw.get("worst"),
        },
        "first_detection": {
            "detected": kw.get("detected", 0),
            "noisy_sites": kw["noisy"],
            "max": kw.get("first_max"),
        },
        "detection_per_round": [
            {"round": r, "flagged": flagged, "f1": None} for r, flagged in per_round
        ],
        "accuracy": {"last10": kw["acc"], "best": kw["best"]},
        "balanced_accuracy": {"last10": kw.get("bacc", 0.5), "best": kw.get("bbest", 0.5)},
        "wall_seconds": kw.get("wall", 1.0),
    }


def _write_seed(
    root: Path,
    scenario: str,
    seed: int,
    runs: list[dict[str, Any]],
    statuses: list[str] | None = None,
    directory: str | None = None,
) -> None:
    d = root / scenario / (directory or f"seed{seed}")
    (d / "runs").mkdir(parents=True)
    (d / "results.json").write_text(json.dumps({"runs": runs, "failures": []}), encoding="utf-8")
    if statuses is not None:
        rounds = [
            {"index": i, "primary": "evidence", "detector_status": {"evidence": s}}
            for i, s in enumerate(statuses)
        ]
        run = {"rounds": rounds}
        (d / "runs" / f"fednoro_seed{seed}.json").write_text(json.dumps(run), encoding="utf-8")


@pytest.fixture
def fabricated(tmp_path: Path) -> tuple[Path, list[Path]]:
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    for name, dataset in (
        ("t-clean", "wine"),
        ("t-majority", "breastmnist"),
        ("t-minor", "digits"),
    ):
        (scenarios / f"{name}.yaml").write_text(f"name: {name}\ndataset: {dataset}\n", "utf-8")
    out = tmp_path / "out"
    ok, inc = "ok", "inconclusive"
    # t-minor, seed 0: round 3 (warm-up, not counted) inconclusive, round 4 inconclusive.
    _write_seed(
        out, "t-minor", 0,
        [
            _summary(
                "fednoro", seed=0, clients=5, noisy=2, f1_last=1.0, f1_mean=0.9, undetermined=1,
                false_rounds=1, first_false=5, worst={"round": 5, "sites": ["site-3"]},
                detected=2, first_max=6, acc=0.90, best=0.92, wall=10.0,
                per_round=[(3, ["site-1"]), (4, []), (5, ["site-0", "site-3"]),
                           (6, ["site-0", "site-1"]), (7, ["site-0", "site-1"])],
            ),
            _summary("fedavg", seed=0, clients=5, noisy=2, acc=0.85, best=0.95, wall=8.0),
        ],
        statuses=[ok, ok, ok, inc, inc, ok, ok, ok],
    )  # fmt: skip
    _write_seed(
        out, "t-minor", 1,
        [
            _summary(
                "fednoro", seed=1, clients=5, noisy=2, f1_last=0.8, f1_mean=0.7, detected=1,
                first_max=4, acc=0.88, best=0.90, wall=12.0,
                per_round=[(4, ["site-2"]), (5, []), (6, []), (7, ["site-2"])],
            ),
            _summary("fedavg", seed=1, clients=5, noisy=2, acc=0.90, best=0.91, wall=6.0),
        ],
        statuses=[ok] * 8,
    )  # fmt: skip
    # t-clean, seed 0 only (seed 1 not run): one clean site flagged in round 6.
    _write_seed(
        out, "t-clean", 0,
        [
            _summary(
                "fednoro", seed=0, clients=5, noisy=0, false_rounds=1, first_false=6,
                worst={"round": 6, "sites": ["site-4"]}, acc=0.97, best=0.98,
                per_round=[(4, []), (5, []), (6, ["site-4"]), (7, [])],
            ),
            _summary("fedavg", seed=0, clients=5, noisy=0, acc=0.975, best=0.98),
        ],
        statuses=[ok] * 8,
    )  # fmt: skip
    # t-majority (balanced accuracy), seed 0: no flag, inconclusive from round 5 on; a clean
    # FedAvg reference exists.
    _write_seed(
        out, "t-majority", 0,
        [
            _summary(
                "fednoro", seed=0, clients=4, noisy=3, f1_last=0.0, f1_mean=0.0, acc=0.6,
                best=0.7, bacc=0.55, bbest=0.6, per_round=[(r, []) for r in range(4, 8)],
            ),
            _summary("fedavg", seed=0, clients=4, noisy=3, acc=0.6, best=0.7, bacc=0.52,
                     bbest=0.6),
        ],
        statuses=[ok] * 5 + [inc] * 3,
    )  # fmt: skip
    _write_seed(
        out,
        "t-majority",
        0,
        [_summary("fedavg", seed=0, clients=4, noisy=0, acc=0.9, best=0.9, bacc=0.62, bbest=0.7)],
        directory="seed0-clean",
    )
    return out, sorted(scenarios.glob("*.yaml"))


def test_rows_are_the_hand_computed_figures(fabricated: tuple[Path, list[Path]]) -> None:
    out, files = fabricated
    text, data = matrix.build_table(out, files, [0, 1], 8)
    rows = {row["scenario"]: row for row in data["rows"]}

    minor = rows["t-minor"]
    assert minor["kind"] == "minority"
    assert minor["seeds"] == [0, 1]
    assert minor["f1_last"] == pytest.approx(0.9)  # (1.0 + 0.8) / 2
    assert minor["f1_last_min"] == pytest.approx(0.8)
    assert minor["f1_mean"] == pytest.approx(0.8)  # (0.9 + 0.7) / 2
    assert minor["false_flag_rounds"] == 1  # 1 + 0
    assert minor["rounds_after_warmup"] == 8  # 4 + 4
    assert minor["flagged_rounds"] == 5  # seed 0: rounds 5, 6, 7; seed 1: rounds 4, 7
    assert minor["inconclusive_rounds"] == 1  # round 4 of seed 0 (round 3 is in the warm-up)
    assert minor["undetermined_rounds"] == 1
    assert (minor["detected"], minor["noisy_total"]) == (3, 4)
    assert minor["first_detection_max"] == 2  # seed 0: round 6 - warm-up 4; seed 1: 4 - 4 = 0
    assert minor["accuracy"] == pytest.approx(0.89)
    assert minor["fedavg_accuracy"] == pytest.approx(0.875)
    assert minor["difference_points"] == pytest.approx(1.5)  # (+5 - 2) / 2
    assert minor["seeds_ahead"] == 1
    assert minor["worst_false_flag"] == [{"seed": 0, "round": 5, "sites": ["site-3"]}]
    assert minor["wall_seconds"] == pytest.approx(18.0)  # (10 + 8 + 12 + 6) / 2
    # No clean reference: FedAvg's fall from its best round, (10 + 1) / 2 = 5.5 >= 3 points.
    assert minor["fedavg_suffers"] is True
    assert minor["targets"] == {
        "f1": False,  # 0.8 < 0.95 in seed 1
        "first_detection": False,  # 3 of 4 noisy sites found
        "clean_no_flag": None,
        "corrupted_abstains": None,
        "no_harm": True,  # +1.5 >= -1
        "gain": False,  # +1.5 < +5 where FedAvg suffers
    }

    clean = rows["t-clean"]
    assert clean["kind"] == "clean"
    assert clean["seeds"] == [0]
    assert clean["f1_last"] is None
    assert clean["f1_undefined_seeds"] == 1
    assert clean["false_flag_rounds"] == 1
    assert clean["difference_points"] == pytest.approx(-0.5)
    assert clean["targets"]["clean_no_flag"] is False
    assert clean["targets"]["no_harm"] is True
    assert clean["targets"]["gain"] is None

    major = rows["t-majority"]
    assert major["kind"] == "majority"
    assert major["inconclusive_rounds"] == 3  # rounds 5-7
    assert major["accuracy"] == pytest.approx(0.55)  # balanced accuracy for BreastMNIST
    assert major["difference_points"] == pytest.approx(3.0)  # 100 * (0.55 - 0.52)
    assert major["fedavg_suffers"] is True  # clean FedAvg 0.62 - 0.52 = 10 points
    assert major["fedavg_suffers_basis"] == "clean FedAvg − FedAvg: 10.0 pts, seeds 0"
    assert major["targets"]["corrupted_abstains"] is True
    assert major["targets"]["f1"] is None
    assert major["targets"]["gain"] is False

    assert (
        "| t-minor | 5 / 2 | 0,1 | 0.90 | 0.80 | 1 / 8 | 1 / 8 | 3/4, ≤ 2 | 0.890 | 0.875 "
        "| +1.50 (1/2) |" in text
    )
    assert "| t-clean | 5 / 0 | 0 | n/a (clean) | n/a (clean) | 1 / 4 | 0 / 4 | n/a |" in text


def test_table_only_runs_no_simulation(
    fabricated: tuple[Path, list[Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    out, files = fabricated

    def refuse(*args: Any, **kwargs: Any) -> int:
        raise AssertionError("no simulation may run")

    monkeypatch.setattr(matrix.subprocess, "call", refuse)
    scenarios = str(files[0].parent)
    assert matrix.main(["--out", str(out), "--scenarios", scenarios, "--table-only"]) == 0
    assert (out / "matrix.md").is_file()
    assert json.loads((out / "matrix.json").read_text("utf-8"))["rounds"] == 40
    # Finished runs are skipped (resumable): only t-minor's two seeds are asked for, both done.
    args = ["--out", str(out), "--scenarios", scenarios, "--only", "t-minor", "--seeds", "0", "1"]
    assert matrix.main(args) == 0


def test_the_matrix_scenarios_are_valid_and_span_the_issue() -> None:
    files = sorted((ROOT / "docs/eval/matrix").glob("*.yaml"))
    scenarios = [load_scenario(f) for f in files]
    assert len(scenarios) >= 14
    assert [s.name for s in scenarios] == [f.stem for f in files]
    assert {s.clients for s in scenarios} >= {5, 100}
    assert sum(1 for s in scenarios if s.noise.protocol == "none") >= 3
    assert any(s.noise.protocol == "none" and s.clients == 5 for s in scenarios)
    for s in scenarios:
        assert [m.method for m in s.methods] == ["fednoro", "fedavg"]


def test_the_privacy_scenarios_are_valid() -> None:
    # docs/eval/privacy/ (docs/evaluation.md, "Signal privacy"): one matrix scenario each, with
    # FedNoRo under no policy, minimum counts and the Gaussian mechanism.
    files = sorted((ROOT / "docs/eval/privacy").glob("*.yaml"))
    assert len(files) == 2
    for f in files:
        scenario = load_scenario(f)
        assert scenario.name == f"privacy-{f.stem.removeprefix('p-')}"
        assert [m.name for m in scenario.methods] == [
            "exact",
            "min5",
            "min5-b5",
            "dp-s0.5",
            "dp-s1",
            "dp-s2",
        ]
