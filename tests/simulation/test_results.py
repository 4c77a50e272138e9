"""Run records, metrics, JSON/CSV writers, the comparison table and plots (records.py,
summaries.py, results.py, comparison.py, plots.py).

The runs here are written by hand: four clients a, b (clean), c (rate 0.5) and d (rate 0.8),
three rounds, a one-round warm-up. Every expected number is worked out in the comments.
"""

from __future__ import annotations

import copy
import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest

from fedaudit_sim.comparison import comparison_rows, comparison_table, detection_lines
from fedaudit_sim.records import ClientRecord, ClientRoundRecord, RoundRecord, RunResult
from fedaudit_sim.results import write_outputs, write_run_csv, write_run_json
from fedaudit_sim.summaries import round_metrics, summarise_run

RATES = {"a": 0.0, "b": 0.0, "c": 0.5, "d": 0.8}


def client_round(
    name: str,
    *,
    flag: bool | None,
    score: float | None,
    gmm: float | None,
    expertise: float | None,
    label_precision: float | None = None,
    label_recall: float | None = None,
    train_loss: float | None = 0.5,
) -> ClientRoundRecord:
    return ClientRoundRecord(
        name=name,
        role="clean",
        detectors={
            "fednoro": {
                "status": "ok" if score is not None else "undetermined",
                "score": score,
                "flag": flag,
                "noisiness": score,
                "posterior": gmm,
            },
            "expertise": {
                "status": "ok",
                "score": expertise,
                "flag": None,
                "noisiness": expertise,
            },
        },
        primary_flag=flag,
        status="trusted",
        expertise=expertise,
        neighbors=[n for n in ("a", "b", "c", "d") if n != name][:2],
        self_weight=0.5,
        weight=0.25,
        train_loss=train_loss,
        train_seconds=1.0,
        signal_seconds=0.1,
        upload_bytes=100,
        download_bytes=200,
        label_precision=label_precision,
        label_recall=label_recall,
        normalised_loss=[RATES[name], None, 1.0 - RATES[name]],
    )


def make_round(index: int, rows: list[ClientRoundRecord], acc: float, bal: float, coord: Any):
    return RoundRecord(
        index=index,
        in_warmup=index < 1,
        accuracy=acc,
        balanced_accuracy=bal,
        coordinator_seconds=coord,
        wall_seconds=2.0,
        aggregation_rule="daagg",
        fallback_reason=None,
        primary="fednoro",
        detector_status={"fednoro": "ok", "expertise": "ok"},
        detector_reason={"fednoro": None, "expertise": None},
        ashman_d=3.0,
        clients=rows,
    )


def make_run(seed: int = 0, accuracies=(0.5, 0.7, 0.6), label: str = "fednoro") -> RunResult:
    clients = [
        ClientRecord(
            index=i,
            name=name,
            client_id=f"id-{name}",
            num_samples=10,
            class_counts=[5, 0, 5],
            target_rate=rate,
            realised_rate=rate,
            true_noisy=rate > 0,
        )
        for i, (name, rate) in enumerate(RATES.items())
    ]
    round0 = [  # warm-up: c flagged only
        client_round("a", flag=False, score=0.1, gmm=0.1, expertise=1.0),
        client_round("b", flag=False, score=0.2, gmm=0.2, expertise=0.9),
        client_round("c", flag=True, score=0.9, gmm=0.9, expertise=0.4),
        client_round("d", flag=False, score=0.3, gmm=0.3, expertise=0.1),
    ]
    round1 = [  # b, c, d flagged
        client_round("a", flag=False, score=0.1, gmm=0.1, expertise=1.0),
        client_round("b", flag=True, score=0.6, gmm=0.6, expertise=0.8),
        client_round("c", flag=True, score=0.9, gmm=0.9, expertise=0.5),
        client_round("d", flag=True, score=0.8, gmm=0.8, expertise=0.2),
    ]
    round2 = [  # the separation guard withheld the flags; the graded scores rank b above c
        client_round("a", flag=False, score=-1.0, gmm=0.1, expertise=1.0, train_loss=math.nan),
        client_round("b", flag=False, score=2.0, gmm=0.6, expertise=0.8),
        client_round(
            "c",
            flag=False,
            score=1.5,
            gmm=0.9,
            expertise=0.5,
            label_precision=0.5,
            label_recall=0.9,
        ),
        client_round(
            "d",
            flag=False,
            score=0.5,
            gmm=0.8,
            expertise=0.2,
            label_precision=0.7,
            label_recall=1.0,
        ),
    ]
    balanced = (0.4, 0.65, 0.55)
    rounds = [
        make_round(0, round0, accuracies[0], balanced[0], 0.1),
        make_round(1, round1, accuracies[1], balanced[1], 0.2),
        make_round(2, round2, accuracies[2], balanced[2], None),
    ]
    return RunResult(
        scenario="unit",
        label=label,
        seed=seed,
        federation_id="fed",
        config={"warmup_rounds": 1, "method": "fednoro"},
        clients=clients,
        rounds=rounds,
        noise_protocol="rho_range",
        noise_threshold=0.1,
        num_classes=3,
    )


def test_round_metrics_by_hand():
    run = make_run()
    m1 = round_metrics(run, run.rounds[1])
    # flagged {b, c, d}, truly noisy {c, d}: precision 2/3, recall 2/2, F1 2PR/(P+R) = 0.8.
    assert m1["precision"] == pytest.approx(2 / 3)
    assert m1["recall"] == 1.0
    assert m1["f1"] == pytest.approx(0.8)
    assert m1["matching"] == 0.0
    assert m1["flagged"] == ["b", "c", "d"]
    # Noisy scores {0.9, 0.8} beat both clean scores {0.1, 0.6} in all 4 pairs: AUROC 1.
    assert m1["auroc"] == 1.0
    # Expertise [1.0, 0.8, 0.5, 0.2] vs rates [0, 0, 0.5, 0.8]: centred ranks
    # [1.5, 0.5, -0.5, -1.5] and [-1, -1, 0.5, 1.5]; sum of products -4.5,
    # sqrt(5 * 4.5) = sqrt(22.5): rho = -4.5 / 4.7434 = -0.9487.
    assert m1["spearman"]["expertise"] == pytest.approx(-4.5 / math.sqrt(22.5))
    # Scores [0.1, 0.6, 0.9, 0.8]: centred ranks [-1.5, -0.5, 1.5, 0.5];
    # products with the rate ranks 1.5 + 0.5 + 0.75 + 0.75 = 3.5: rho = 3.5 / 4.7434.
    assert m1["spearman"]["fednoro_score"] == pytest.approx(3.5 / math.sqrt(22.5))
    assert m1["label_precision"] is None


def test_guard_withheld_flags_keep_the_graded_score_for_auroc():
    run = make_run()
    m2 = round_metrics(run, run.rounds[2])
    # Nobody flagged while c and d are noisy: precision undefined (no flag), recall 0/2,
    # F1 = 2TP / (2TP + FP + FN) = 0 / 2 = 0.
    assert (m2["precision"], m2["recall"], m2["f1"], m2["matching"]) == (None, 0.0, 0.0, 0.0)
    # AUROC from the scores [-1.0, 2.0, 1.5, 0.5] (a, b clean; c, d noisy): of the 4
    # (noisy, clean) pairs, c > a and d > a, but b beats both: 2 / 4. The posterior
    # [0.1, 0.6, 0.9, 0.8] would give 1.0; it is not what the AUROC uses.
    assert m2["auroc"] == 0.5
    assert m2["auroc_source"].startswith("score")
    # Spearman of the scores: ranks [1, 4, 3, 2], centred [-1.5, 1.5, 0.5, -0.5], against the
    # rate ranks [-1, -1, 0.5, 1.5]: 1.5 - 1.5 + 0.25 - 0.75 = -0.5, rho = -0.5 / 4.7434.
    assert m2["spearman"]["fednoro_score"] == pytest.approx(-0.5 / math.sqrt(22.5))
    # The posterior is correlated on its own: 3.5 / 4.7434 (as the scores of round 1).
    assert m2["spearman"]["fednoro_posterior"] == pytest.approx(3.5 / math.sqrt(22.5))
    # Label selection: mean over the reporting clients c and d.
    assert m2["label_precision"] == pytest.approx((0.5 + 0.7) / 2)
    assert m2["label_recall"] == pytest.approx((0.9 + 1.0) / 2)


def test_undetermined_primary_counts_as_not_flagged():
    run = make_run()
    record = copy.deepcopy(run.rounds[1])
    record.clients[2] = client_round("c", flag=None, score=None, gmm=None, expertise=0.5)
    m = round_metrics(run, record)
    # flagged {b, d} of noisy {c, d}: precision 1/2, recall 1/2.
    assert (m["precision"], m["recall"]) == (0.5, 0.5)
    assert m["primary_undetermined"] is True
    assert m["auroc"] is None  # a missing score makes the AUROC undefined
    assert m["spearman"]["fednoro_score"] is None


def test_summary_by_hand():
    run = make_run()
    s = summarise_run(run)
    assert s is run.summary
    assert s["warmup_rounds"] == 1
    assert s["true_noisy"] == 2
    assert s["ground_truth_rule"] == "realised rate > 0"
    # After the warm-up: rounds 1 and 2. Round 2 flags nothing, so its precision is undefined
    # and left out: precision 2/3 over 1 round (not (2/3 + 0) / 2). Recall (1 + 0) / 2 and F1
    # (0.8 + 0) / 2 over both rounds (round 2 missed c and d: 0, defined), matching
    # (0 + 0) / 2, AUROC (1 + 0.5) / 2.
    after = s["after_warmup"]
    assert after["rounds"] == 2
    assert after["precision"] == pytest.approx(2 / 3)
    assert after["precision_rounds"] == 1
    assert (after["recall"], after["recall_rounds"]) == (0.5, 2)
    assert after["f1"] == pytest.approx(0.4)
    assert after["f1_rounds"] == 2
    assert after["matching_ratio"] == 0.0
    assert (after["auroc"], after["auroc_rounds"]) == (0.75, 2)
    assert s["final"]["f1"] == 0.0
    assert s["final"]["precision"] is None
    # b (clean) was flagged in round 1 only; the warm-up round 0 is not counted.
    assert s["false_alarms"] == {
        "rounds": 2,
        "first_round": 1,
        "last_round": 2,
        "clean_sites": 2,
        "first_false_flag_round": 1,
        "sites": {"b": 1},
        "worst_round": {"round": 1, "sites": ["b"]},
        "rounds_with_false_flags": 1,
        "total_false_flags": 1,
    }
    # c was flagged in the warm-up round 0 too; only round 1 counts. Both first flagged in 1.
    assert s["first_detection"] == {
        "rounds": {"c": 1, "d": 1},
        "noisy_sites": 2,
        "detected": 2,
        "mean": 1.0,
        "max": 1,
    }
    per_round = s["detection_per_round"]
    assert [r["round"] for r in per_round] == [0, 1, 2]
    assert per_round[0]["in_warmup"] is True
    assert per_round[1]["flagged"] == ["b", "c", "d"]
    assert per_round[1]["false_flags"] == ["b"]
    assert per_round[1]["precision"] == pytest.approx(2 / 3)
    assert (per_round[2]["precision"], per_round[2]["recall"]) == (None, 0.0)
    assert per_round[2]["auroc"] == 0.5
    assert s["final"]["auroc"] == 0.5
    # Accuracy [0.5, 0.7, 0.6]: best 0.7, last ceil(3/10) = 1 round: 0.6.
    assert s["accuracy"] == {"best": 0.7, "last10": 0.6}
    assert s["balanced_accuracy"] == {"best": 0.65, "last10": 0.55}
    # Coordinator seconds (0.1, 0.2, unknown): mean of the known 0.15.
    assert s["coordinator_seconds_mean"] == pytest.approx(0.15)
    assert s["bytes_up_per_client_round"] == 100
    assert s["bytes_down_per_client_round"] == 200
    # 12 client rounds of 0.1 s signals and 1.0 s training.
    assert s["signal_to_train_time"] == pytest.approx(0.1)
    assert s["label_precision_final"] == pytest.approx(0.6)
    assert s["final_status"] == {"a": "trusted", "b": "trusted", "c": "trusted", "d": "trusted"}


def test_continuous_protocols_state_their_threshold():
    run = make_run()
    run.noise_protocol = "linear"
    run.noise_threshold = 0.2
    assert summarise_run(run)["ground_truth_rule"] == "realised rate > 0 and >= 0.2"


def test_summary_of_a_run_without_rounds_is_an_error():
    run = make_run()
    run.rounds = []
    with pytest.raises(ValueError, match="has no closed round"):
        summarise_run(run)


def test_json_is_strict_and_complete(tmp_path: Path):
    run = make_run()
    summarise_run(run)
    path = write_run_json(run, tmp_path)
    assert path.name == "fednoro_seed0.json"

    def refuse(constant: str) -> None:
        raise AssertionError(f"non-strict JSON constant {constant}")

    data = json.loads(path.read_text(), parse_constant=refuse)
    assert [c["name"] for c in data["clients"]] == ["a", "b", "c", "d"]
    assert len(data["rounds"]) == 3
    # The NaN training loss of client a in round 2 became null.
    assert data["rounds"][2]["clients"][0]["train_loss"] is None
    assert data["rounds"][1]["clients"][1]["detectors"]["fednoro"]["flag"] is True
    assert data["summary"]["accuracy"] == {"best": 0.7, "last10": 0.6}


def test_csv_rows_per_round_and_per_client(tmp_path: Path):
    run = make_run()
    summarise_run(run)
    rounds_path, clients_path = write_run_csv([run], tmp_path)
    with rounds_path.open() as handle:
        rounds = list(csv.DictReader(handle))
    assert [r["round"] for r in rounds] == ["0", "1", "2"]
    assert rounds[1]["flagged"] == "b;c;d"
    assert rounds[1]["precision"] == "0.666667"
    assert rounds[0]["in_warmup"] == "1"
    assert rounds[2]["coordinator_seconds"] == ""
    with clients_path.open() as handle:
        clients = list(csv.DictReader(handle))
    assert len(clients) == 12  # 3 rounds x 4 clients
    b1 = clients[4 + 1]  # round 1, client b
    assert (b1["round"], b1["client"], b1["true_noise_rate"], b1["true_noisy"]) == (
        "1",
        "b",
        "0",
        "0",
    )
    assert (b1["fednoro_flag"], b1["fednoro_score"], b1["primary_flag"]) == ("1", "0.6", "1")
    assert b1["neighbors"] == "a;c"
    assert b1["expertise_score"] == "0.8"
    d2 = clients[8 + 3]  # round 2, client d: guard withheld, the graded score stays
    assert (d2["fednoro_score"], d2["fednoro_noisiness"], d2["label_precision"]) == (
        "0.5",
        "0.5",
        "0.7",
    )
    # No Fed-NCL in these runs: no Fed-NCL columns.
    assert not any(key.startswith("fedncl") for key in clients[0])


def test_comparison_rows_mean_and_std_over_seeds():
    runs = [
        make_run(seed=0, accuracies=(0.5, 0.7, 0.6)),
        make_run(seed=1, accuracies=(0.5, 0.9, 0.8)),
        make_run(seed=0, accuracies=(0.2, 0.3, 0.4), label="fedavg"),
    ]
    for run in runs:
        summarise_run(run)
    rows = comparison_rows(runs)
    assert [row[0] for row in rows] == ["fednoro", "fedavg"]
    assert rows[0][1] == "0,1"
    # Best accuracy 0.7 and 0.9: mean 0.8, population std 0.1. Last-10%: 0.6 and 0.8.
    assert rows[0][2] == "0.800 ± 0.100"
    assert rows[0][3] == "0.700 ± 0.100"
    assert rows[1][2] == "0.400"
    assert rows[1][3] == "0.400"
    # The last round flags nothing in every run (guard withheld): precision undefined, n/a;
    # recall 0; one false flag (b in round 1) after the warm-up in every run.
    assert rows[0][5] == "n/a"
    assert rows[0][6] == "0.00 ± 0.00"
    assert rows[0][10] == "1.0 ± 0.0"
    table = comparison_table(runs, title="t")
    assert table.row_count == 2
    assert [c.header for c in table.columns][:3] == ["method", "seeds", "acc best"]


def test_write_outputs_writes_every_file_and_valid_pngs(tmp_path: Path):
    runs = [make_run(), make_run(label="fedavg")]
    files = write_outputs(runs, tmp_path)
    names = sorted(str(p.relative_to(tmp_path)) for p in files)
    assert names == [
        "accuracy.png",
        "clients.csv",
        "per_class_loss_fedavg_seed0.png",
        "per_class_loss_fednoro_seed0.png",
        "results.json",
        "rounds.csv",
        "runs/fedavg_seed0.json",
        "runs/fedavg_seed0_clients.csv",
        "runs/fedavg_seed0_rounds.csv",
        "runs/fednoro_seed0.json",
        "runs/fednoro_seed0_clients.csv",
        "runs/fednoro_seed0_rounds.csv",
        "scores_vs_noise.png",
        "summary.csv",
    ]
    for path in files:
        if path.suffix == ".png":
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with (tmp_path / "runs" / "fedavg_seed0_clients.csv").open() as handle:
        assert {row["label"] for row in csv.DictReader(handle)} == {"fedavg"}
    with (tmp_path / "clients.csv").open() as handle:
        assert len(list(csv.DictReader(handle))) == 2 * 12  # both runs, 3 rounds x 4 clients
    overview = json.loads((tmp_path / "results.json").read_text())
    assert [r["label"] for r in overview["runs"]] == ["fednoro", "fedavg"]
    with (tmp_path / "summary.csv").open() as handle:
        summary = list(csv.DictReader(handle))
    assert [(r["label"], r["accuracy_best"], r["final_auroc"]) for r in summary] == [
        ("fednoro", "0.7", "0.5"),
        ("fedavg", "0.7", "0.5"),
    ]


def test_per_class_heat_map_is_skipped_without_losses(tmp_path: Path):
    from fedaudit_sim.plots import plot_per_class_loss

    run = make_run()
    for record in run.rounds:
        for c in record.clients:
            c.normalised_loss = None
    assert plot_per_class_loss(run, tmp_path / "x.png") is None
    assert not (tmp_path / "x.png").exists()
    run.rounds[-1].clients[0].per_class_loss = [0.5, None, 2.0]
    assert plot_per_class_loss(run, tmp_path / "y.png") == tmp_path / "y.png"


def test_fednoro_mean_loss_is_correlated_when_present():
    run = make_run()
    record = run.rounds[1]
    # mean losses [0.2, 0.3, 1.1, 1.6] against rates [0, 0, 0.5, 0.8]: loss ranks [1, 2, 3, 4]
    # centred [-1.5, -0.5, 0.5, 1.5], rate ranks centred [-1, -1, 0.5, 1.5]:
    # products 1.5 + 0.5 + 0.25 + 2.25 = 4.5, over sqrt(5 * 4.5): rho = 4.5 / 4.7434 = 0.9487
    for client, loss in zip(record.clients, [0.2, 0.3, 1.1, 1.6], strict=True):
        client.detectors["fednoro"]["mean_loss"] = loss
    metrics = round_metrics(run, record)
    assert metrics["spearman"]["fednoro_mean_loss"] == pytest.approx(4.5 / math.sqrt(22.5))
    # absent (no fednoro evidence) -> None, never a made-up number
    assert round_metrics(run, run.rounds[0])["spearman"]["fednoro_mean_loss"] is None


def test_fednoro_class_z_is_correlated_when_present():
    run = make_run()
    record = run.rounds[1]
    # class_z [-1.0, 0.5, 0.2, 2.0] against rates [0, 0, 0.5, 0.8]: ranks [1, 3, 2, 4],
    # centred [-1.5, 0.5, -0.5, 1.5], rate ranks centred [-1, -1, 0.5, 1.5]:
    # products 1.5 - 0.5 - 0.25 + 2.25 = 3.0, over sqrt(5 * 4.5): rho = 3 / 4.7434 = 0.6325
    for client, z in zip(record.clients, [-1.0, 0.5, 0.2, 2.0], strict=True):
        client.detectors["fednoro"]["class_z"] = z
    metrics = round_metrics(run, record)
    assert metrics["spearman"]["fednoro_class_z"] == pytest.approx(3.0 / math.sqrt(22.5))
    assert round_metrics(run, run.rounds[0])["spearman"]["fednoro_class_z"] is None


def test_csv_rows_must_share_their_columns(tmp_path: Path):
    from fedaudit_sim.results import _write_rows

    _write_rows(tmp_path / "ok.csv", [{"a": 1, "b": None}, {"a": 2.5, "b": True}])
    assert (tmp_path / "ok.csv").read_text() == "a,b\n1,\n2.5,1\n"
    with pytest.raises(ValueError, match="differ"):
        _write_rows(tmp_path / "bad.csv", [{"a": 1, "b": 2}, {"b": 2, "a": 1}])


def clean_run(flag_rounds: dict[int, list[str]], rounds: int = 8) -> RunResult:
    """A clean federation (a, b, c; no noisy site), one-round warm-up; ``flag_rounds`` maps a
    round to the sites its primary detector flags."""
    clients = [
        ClientRecord(
            index=i,
            name=name,
            client_id=f"id-{name}",
            num_samples=10,
            class_counts=[5, 0, 5],
            target_rate=0.0,
            realised_rate=0.0,
            true_noisy=False,
        )
        for i, name in enumerate("abc")
    ]
    records = []
    for index in range(rounds):
        flagged = flag_rounds.get(index, [])
        rows = [
            client_round(name, flag=name in flagged, score=0.1 * i, gmm=0.1, expertise=1.0)
            for i, name in enumerate("abc")
        ]
        records.append(make_round(index, rows, 0.9, 0.9, 0.1))
    return RunResult(
        scenario="unit",
        label="fednoro",
        seed=0,
        federation_id="fed",
        config={"warmup_rounds": 1, "method": "fednoro"},
        clients=clients,
        rounds=records,
        noise_protocol="none",
        noise_threshold=0.1,
        num_classes=3,
    )


def test_clean_federation_reports_its_false_alarm_not_a_perfect_score():
    # Rounds 0..7, warm-up 1; one false flag, on b in round 5. The flag in the warm-up round
    # 0 (on c) is not counted. The last round flags nothing: before the fix it printed
    # precision/recall/F1 1.00 and hid round 5.
    run = clean_run({0: ["c"], 5: ["b"]})
    s = summarise_run(run)
    assert (s["final"]["precision"], s["final"]["recall"], s["final"]["f1"]) == (None, None, None)
    after = s["after_warmup"]
    assert (after["precision"], after["recall"], after["f1"]) == (None, None, None)
    assert (after["precision_rounds"], after["recall_rounds"], after["f1_rounds"]) == (0, 0, 0)
    # Matching: 6 of the 7 counted rounds (1..7) flag nothing.
    assert after["matching_ratio"] == pytest.approx(6 / 7)
    alarms = s["false_alarms"]
    assert alarms["first_false_flag_round"] == 5
    assert alarms["worst_round"] == {"round": 5, "sites": ["b"]}
    assert alarms["sites"] == {"b": 1}
    assert alarms["total_false_flags"] == 1
    assert (alarms["rounds"], alarms["clean_sites"]) == (7, 3)
    assert s["first_detection"] == {
        "rounds": {},
        "noisy_sites": 0,
        "detected": 0,
        "mean": None,
        "max": None,
    }
    row = comparison_rows([run])[0]
    assert row[5:8] == ["n/a", "n/a", "n/a"]
    assert row[10] == "1.0"
    lines = detection_lines(run)
    assert "precision, recall and F1 are undefined (n/a)" in lines[0]
    assert "1.00" not in " ".join(lines)
    assert lines[1] == (
        "  false alarms: 1 (site, round) flag(s) on 1 of 3 clean sites in 1 of 7 rounds after "
        "the warm-up; first in round 5, worst round 5 (1 site); b (1 round)"
    )
    assert len(lines) == 2  # no first-detection line without a noisy site


def test_false_alarm_worst_round_and_per_site_counts():
    # b in rounds 2 and 6, a and c together in round 4, c again in round 6: first 2, worst 4
    # (2 sites; round 6 ties with 2 sites and is later), b 2 rounds, a 1, c 2; 5 flags in all.
    s = summarise_run(clean_run({2: ["b"], 4: ["a", "c"], 6: ["b", "c"]}))
    alarms = s["false_alarms"]
    assert alarms["first_false_flag_round"] == 2
    assert alarms["worst_round"] == {"round": 4, "sites": ["a", "c"]}
    assert alarms["sites"] == {"a": 1, "b": 2, "c": 2}
    assert alarms["rounds_with_false_flags"] == 3
    assert alarms["total_false_flags"] == 5


def test_a_quiet_clean_federation_has_no_false_alarm():
    run = clean_run({})
    s = summarise_run(run)
    assert s["false_alarms"]["first_false_flag_round"] is None
    assert s["false_alarms"]["worst_round"] is None
    assert s["false_alarms"]["total_false_flags"] == 0
    assert s["after_warmup"]["matching_ratio"] == 1.0
    assert detection_lines(run)[1] == (
        "  false alarms: none on the 3 clean sites in 7 rounds after the warm-up"
    )


def test_first_detection_per_noisy_site():
    run = make_run()
    # d is never flagged after the warm-up; c first in round 2.
    for record in run.rounds:
        for client in record.clients:
            client.primary_flag = record.index == 2 and client.name == "c"
    s = summarise_run(run)
    assert s["first_detection"] == {
        "rounds": {"c": 2, "d": None},
        "noisy_sites": 2,
        "detected": 1,
        "mean": 2.0,
        "max": 2,
    }
    assert detection_lines(run)[2] == (
        "  first detection: 1 of 2 noisy sites flagged after the warm-up; first flagged in "
        "round 2.0 on average, round 2 at the latest; never flagged: d"
    )


def test_results_json_holds_the_new_reports(tmp_path: Path):
    write_outputs([clean_run({5: ["b"]})], tmp_path, plots=False)
    overview = json.loads((tmp_path / "results.json").read_text())
    run = overview["runs"][0]
    assert run["final"]["precision"] is None
    assert run["false_alarms"]["first_false_flag_round"] == 5
    assert run["detection_per_round"][5]["false_flags"] == ["b"]
    with (tmp_path / "summary.csv").open() as handle:
        row = next(csv.DictReader(handle))
    assert (row["final_precision"], row["false_flags_after_warmup"]) == ("", "1")
    assert row["first_false_flag_round"] == "5"
