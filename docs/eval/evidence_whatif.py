"""The calibrated evidence detector against FedNoRo's on signals sites actually sent.

Reads the coordinator database that ``fedaudit simulate`` keeps (``<out>/coordinator``), takes
every round whose updates all arrived, and judges it with the product's ``EvidenceDetector``
(defaults; with the sites' error counts when they sent them) and ``FedNoRoDetector``
(defaults), without status history; where the error counts were sent, a third time with the
evidence detector on the losses only (``error_check=False``) and a fourth with the counts'
per-class part on ("counts per class").
Only ``fedavg`` federations are a fair counterfactual (their flags do not feed back into training).

Per run, after the warm-up: rounds with a false flag (a clean site flagged), mean and last-round
F1 over the rounds where F1 is defined (some site noisy, some clean), rounds the evidence
detector called inconclusive, and the first round each noisy site was flagged.

Usage (from the repository root; one directory per ``fedaudit simulate --out``)::

    .venv/bin/python docs/eval/evidence_whatif.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import json
import sqlite3
import sys
from collections import defaultdict
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from service.audit.detectors.fednoro import FedNoRoDetector  # noqa: E402
from service.audit.evidence import EvidenceDetector  # noqa: E402


def _hex(value: object) -> str:
    return str(value).replace("-", "")


def _matrix(rows: list[list[float | None]]) -> np.ndarray:
    return np.asarray([[np.nan if v is None else v for v in r] for r in rows], dtype=np.float64)


def stored_runs(run_dir: Path) -> list[tuple[dict[str, Any], list[list[dict[str, Any]]]]]:
    """Every run of one ``fedaudit simulate --out`` directory: (its results JSON, with the
    clients sorted by index; the signals of each round whose updates all arrived, in round
    order, each a list in client order with the round index under ``"_round"``)."""
    db = run_dir / "coordinator" / "fedaudit.db"
    if not db.is_file():
        raise SystemExit(f"{db} not found: run fedaudit simulate with the coordinator data kept")
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    runs = []
    for path in sorted((run_dir / "runs").glob("*_seed*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        data["clients"] = sorted(data["clients"], key=lambda c: c["index"])
        order = {_hex(c["client_id"]): i for i, c in enumerate(data["clients"])}
        per_round: dict[int, dict[int, dict[str, Any]]] = defaultdict(dict)
        query = "SELECT round_index, client_id, signals FROM model_update WHERE federation_id = ?"
        for index, cid, signals in con.execute(query, (_hex(data["federation_id"]),)):
            per_round[int(index)][order[_hex(cid)]] = json.loads(signals)
        complete = [
            [{**got[k], "_round": index} for k in range(len(order))]
            for index, got in sorted(per_round.items())
            if len(got) == len(order)
        ]
        runs.append((data, complete))
    con.close()
    return runs


def load(run_dir: Path) -> list[dict[str, Any]]:
    """Every run of one output directory, with its complete rounds' signals."""
    runs = []
    for data, complete in stored_runs(run_dir):
        rounds = []
        for sig in complete:
            sd = (
                _matrix([s["per_class_loss_sd"] for s in sig])
                if all("per_class_loss_sd" in s for s in sig)
                else None
            )
            errors = (
                np.nan_to_num(_matrix([s["per_class_errors"] for s in sig])).astype(np.int64)
                if all("per_class_errors" in s for s in sig)
                else None
            )
            rounds.append(
                (
                    sig[0]["_round"],
                    _matrix([s["per_class_loss"] for s in sig]),
                    np.asarray([s["class_counts"] for s in sig], dtype=np.int64),
                    sd,
                    errors,
                )
            )
        runs.append(
            {
                "name": f"{run_dir.name}/{data['label']}_seed{data['seed']}",
                "warmup": int(data["config"]["warmup_rounds"]),
                "truth": np.asarray([c["true_noisy"] for c in data["clients"]], dtype=bool),
                "rounds": rounds,
            }
        )
    return runs


def f1(flags: np.ndarray, truth: np.ndarray) -> float:
    tp = int((flags & truth).sum())
    wrong = int((flags & ~truth).sum()) + int((~flags & truth).sum())
    return 2 * tp / (2 * tp + wrong) if 2 * tp + wrong else float("nan")


def judge(run: dict[str, Any], kind: str) -> list[tuple[int, str, np.ndarray]]:
    out = []
    for index, loss, counts, sd, errors in run["rounds"]:
        if index < run["warmup"]:
            continue
        if kind == "evidence":
            result = EvidenceDetector(error_check=True).fit(
                loss, counts, sd, per_class_errors=errors
            )
        elif kind == "counts per class":
            result = _with_class_part().fit(loss, counts, sd, per_class_errors=errors)
        elif kind == "losses only":
            result = EvidenceDetector(error_check=False).fit(loss, counts, sd)
        else:
            result = FedNoRoDetector().fit(np.where(counts > 0, loss, np.nan), counts).result_
        flags = np.asarray([bool(v.flag) if v is not None else False for v in result.verdicts])
        out.append((index, result.status, flags))
    return out


def _with_class_part() -> EvidenceDetector:
    """The default detector with the error counts' per-class part on (off in the product:
    ``service.audit.error_evidence``'s docstring says why); replays only."""
    detector = EvidenceDetector(error_check=True)
    counts = detector._counts
    detector._counts = replace(counts, counted=partial(counts.counted, class_part=True))
    return detector


def main(paths: list[str]) -> None:
    print(
        "run | K | noisy | detector | false-flag rounds | F1 mean | F1 last | inconclusive | first"
    )
    for path in paths:
        for run in load(Path(path)):
            truth = run["truth"]
            defined = bool(truth.any() and not truth.all())
            kinds = ["fednoro", "evidence"]
            if run["rounds"] and run["rounds"][0][4] is not None:
                kinds += ["losses only", "counts per class"]
            for kind in kinds:
                rows = judge(run, kind)
                false_rounds = sum(1 for _, _, fl in rows if (fl & ~truth).any())
                scores = [f1(fl, truth) for _, _, fl in rows] if defined else []
                first = [
                    next((i for i, _, fl in rows if fl[k]), None) for k in np.flatnonzero(truth)
                ]
                print(
                    f"{run['name']} | {truth.size} | {int(truth.sum())} | {kind} | {false_rounds}"
                    f" | {np.mean(scores) if scores else float('nan'):.2f}"
                    f" | {scores[-1] if scores else float('nan'):.2f}"
                    f" | {sum(1 for _, s, _ in rows if s == 'inconclusive')}"
                    f" | {first if defined else '-'}"
                )


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    main(sys.argv[1:])
