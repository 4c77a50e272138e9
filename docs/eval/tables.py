"""Markdown tables for docs/evaluation.md from a ``fedaudit simulate --out`` directory.

Reads ``<dir>/runs/<label>_seed<seed>.json`` (written by ``fedaudit_sim.results``) and
prints, per method, mean ± std over seeds of:

- model quality: best and last-10% accuracy and balanced accuracy;
- detection by the primary detector, averaged over the rounds from the warm-up on (precision,
  recall, F1, matching ratio, AUROC) and at the last round (F1);
- Spearman correlations with the realised noise rate (last round and mean over the rounds from
  the warm-up on) of the expertise, of each detector's noisiness score (FedNoRo's: the
  separation statistic in runs since the score became graded; the GMM posterior before), of
  FedNoRo's mean loss and of its GMM posterior before the guard;
- label precision / recall of sample selection (mean over rounds, and last round);
- coordinator seconds per round and wall seconds per run;
- per seed, the clients flagged by the primary detector in each round after the warm-up, and
  the flags of the other detectors (for the all-clean scenario V4), with ``--flags``.

Usage (from the repository root)::

    .venv/bin/python docs/eval/tables.py runs/eval/V1 [--flags]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from _runs import fmt, load_run_jsons


def load(run_dir: Path) -> list[dict[str, Any]]:
    """Every run JSON of a simulation output directory, in (label order of first seed, seed)."""
    runs = load_run_jsons(run_dir)
    order: list[str] = []
    scenario = json.loads((run_dir / "scenario.json").read_text(encoding="utf-8"))
    for method in scenario.get("methods", []):
        name = method.get("name") or method.get("method")
        if name not in order:
            order.append(name)
    for run in runs:
        if run["label"] not in order:
            order.append(run["label"])
    return sorted(runs, key=lambda r: (order.index(r["label"]), r["seed"]))


def _mean(values: Iterable[float | None]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def groups(runs: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    labels: list[str] = []
    for run in runs:
        if run["label"] not in labels:
            labels.append(run["label"])
    return [(label, [r for r in runs if r["label"] == label]) for label in labels]


def spearman_after(run: dict[str, Any], key: str) -> float | None:
    warmup = int(run["config"]["warmup_rounds"])
    return _mean(
        (r["metrics"].get("spearman") or {}).get(key) for r in run["rounds"] if r["index"] >= warmup
    )


def table(rows: list[list[str]], header: list[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def quality(runs: list[dict[str, Any]]) -> str:
    rows = []
    for label, group in groups(runs):
        s = [r["summary"] for r in group]
        rows.append(
            [
                label,
                ",".join(str(x["seed"]) for x in s),
                fmt(x["accuracy"]["best"] for x in s),
                fmt(x["accuracy"]["last10"] for x in s),
                fmt(x["balanced_accuracy"]["best"] for x in s),
                fmt(x["balanced_accuracy"]["last10"] for x in s),
                fmt((x["coordinator_seconds_mean"] for x in s), 2),
                fmt((x["wall_seconds"] for x in s), 0),
            ]
        )
    return table(
        rows,
        [
            "method",
            "seeds",
            "acc best",
            "acc last 10%",
            "bal. acc best",
            "bal. acc last 10%",
            "coordinator s/round",
            "wall s/run",
        ],
    )


def detection(runs: list[dict[str, Any]]) -> str:
    rows = []
    for label, group in groups(runs):
        s = [r["summary"] for r in group]
        a = [x["after_warmup"] for x in s]
        rows.append(
            [
                label,
                str(s[0]["primary_detector"]),
                f"{s[0]['warmup_rounds']} ({a[0]['rounds']} scored)",
                str(s[0]["true_noisy"]) + "/" + str(s[0]["clients"]),
                fmt((x["precision"] for x in a), 2),
                fmt((x["recall"] for x in a), 2),
                fmt((x["f1"] for x in a), 2),
                fmt((x["matching_ratio"] for x in a), 2),
                fmt((x["auroc"] for x in a), 2),
                fmt((x["final"]["f1"] for x in s), 2),
                ",".join(str(x["rounds_primary_undetermined"]) for x in a),
            ]
        )
    return table(
        rows,
        [
            "method",
            "primary detector",
            "warm-up rounds",
            "noisy clients",
            "precision",
            "recall",
            "F1",
            "matching",
            "AUROC",
            "F1 last round",
            "undetermined rounds (per seed)",
        ],
    )


def reliability(runs: list[dict[str, Any]]) -> str:
    rows = []
    for label, group in groups(runs):
        s = [r["summary"] for r in group]
        rows.append(
            [
                label,
                fmt((x["spearman_final"].get("expertise") for x in s), 2),
                fmt((spearman_after(r, "expertise") for r in group), 2),
                fmt((x["spearman_final"].get("fednoro_score") for x in s), 2),
                fmt((spearman_after(r, "fednoro_score") for r in group), 2),
                fmt((x["spearman_final"].get("fedncl_score") for x in s), 2),
                fmt((spearman_after(r, "fedncl_score") for r in group), 2),
                fmt((x["spearman_final"].get("fednoro_mean_loss") for x in s), 2),
                fmt((x["spearman_final"].get("fednoro_posterior") for x in s), 2),
                fmt((spearman_after(r, "fednoro_posterior") for r in group), 2),
                fmt((x["label_precision_mean"] for x in s), 3),
                fmt((x["label_recall_mean"] for x in s), 3),
                fmt((x["label_precision_final"] for x in s), 3),
                fmt((x["label_recall_final"] for x in s), 3),
            ]
        )
    return table(
        rows,
        [
            "method",
            "ρ expertise (last)",
            "ρ expertise (mean after warm-up)",
            "ρ FedNoRo score (last)",
            "ρ FedNoRo score (mean)",
            "ρ Fed-NCL q (last)",
            "ρ Fed-NCL q (mean)",
            "ρ FedNoRo mean loss (last)",
            "ρ FedNoRo posterior (last)",
            "ρ FedNoRo posterior (mean)",
            "label prec. (mean)",
            "label rec. (mean)",
            "label prec. (last)",
            "label rec. (last)",
        ],
    )


def flags(runs: list[dict[str, Any]]) -> str:
    """Per run: primary flags per round after warm-up, and every detector's flag count."""
    lines = []
    for run in runs:
        warmup = int(run["config"]["warmup_rounds"])
        per_round = []
        other: dict[str, list[int]] = {}
        for r in run["rounds"]:
            if r["index"] < warmup:
                continue
            per_round.append(sum(1 for c in r["clients"] if c["primary_flag"]))
            for c in r["clients"]:
                for name in c["detectors"]:
                    other.setdefault(name, [])
            for name in other:
                other[name].append(
                    sum(1 for c in r["clients"] if (c["detectors"].get(name) or {}).get("flag"))
                )
        dets = "; ".join(f"{n}: {sum(v)} flags in {len(v)} rounds" for n, v in other.items())
        lines.append(
            f"- {run['label']} seed {run['seed']} (primary {run['rounds'][-1]['primary']}, "
            f"warm-up {warmup}): clients flagged per round after warm-up = {per_round}; "
            f"{dets}; final statuses not trusted = "
            f"{sorted(k for k, v in run['summary']['final_status'].items() if v != 'trusted')}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description="Markdown tables for docs/evaluation.md")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--flags", action="store_true", help="per-seed flags per round")
    args = parser.parse_args()
    runs = load(args.run_dir)
    print(quality(runs), end="\n\n")
    print(detection(runs), end="\n\n")
    print(reliability(runs), end="\n\n")
    if args.flags:
        print(flags(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
