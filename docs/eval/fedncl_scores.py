"""Claim 3 (Fed-NCL Figure 7): does the reliability score q = e * h / n separate noisy clients?

Reads the run JSONs of a ``fedaudit simulate --out`` directory (scenario V5) and reports, for
every federation and seed, the AUROC of Fed-NCL's score q (higher = noisier) per round, and the
precision / recall / F1 of Fed-NCL's one-sided mean + beta * sigma flags, averaged over rounds
(all rounds, and rounds >= 3). It also draws ``--plot``: left, the AUROC per round (mean over
seeds) of each federation; right, q of every client per round in the first seed of ``--method``
(log scale; red = truly noisy).

Usage (from the repository root)::

    .venv/bin/python docs/eval/fedncl_scores.py runs/eval/V5 --method fedavg \
        --plot runs/eval/V5_fedncl_scores.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _runs import load_run_jsons  # noqa: E402

from fedaudit_sim.metrics import auroc, detection_metrics  # noqa: E402


def per_round(run: dict[str, Any]) -> tuple[list[float | None], list[dict[str, float]]]:
    truth = np.asarray([c["true_noisy"] for c in run["clients"]], dtype=bool)
    aurocs: list[float | None] = []
    detections: list[dict[str, float]] = []
    for record in run["rounds"]:
        entries = [c["detectors"].get("fedncl") or {} for c in record["clients"]]
        scores = [e.get("score") for e in entries]
        if any(s is None for s in scores):
            aurocs.append(None)
            continue
        aurocs.append(auroc(truth, np.asarray(scores, dtype=np.float64)))
        flags = np.asarray([bool(e.get("flag")) for e in entries], dtype=bool)
        detections.append(dict(detection_metrics(truth, flags)))
    return aurocs, detections


def _mean(values: list[float | None]) -> float:
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description="Fed-NCL score separation (claim 3)")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--method", default="fedavg", help="federation shown in the q panel")
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    runs = load_run_jsons(args.run_dir)
    labels: list[str] = []
    for run in runs:
        if run["label"] not in labels:
            labels.append(run["label"])
    print(
        "| federation | seed | AUROC of q, all rounds | AUROC, rounds >= 3 | rounds >= 3 with "
        "AUROC = 1 | AUROC rounds 0-2 | flags: precision / recall / F1 (all rounds) |"
    )
    print("|" + " --- |" * 7)
    curves: dict[str, list[list[float | None]]] = {label: [] for label in labels}
    for run in sorted(runs, key=lambda r: (labels.index(r["label"]), r["seed"])):
        aurocs, detections = per_round(run)
        curves[run["label"]].append(aurocs)
        late = aurocs[3:]
        perfect = sum(1 for a in late if a is not None and a >= 1.0)
        first = ", ".join("-" if a is None else f"{a:.2f}" for a in aurocs[:3])
        p, r, f = (
            float(np.mean([d[key] for d in detections])) for key in ("precision", "recall", "f1")
        )
        print(
            f"| {run['label']} | {run['seed']} | {_mean(aurocs):.3f} | {_mean(late):.3f} | "
            f"{perfect} / {len(late)} | {first} | {p:.2f} / {r:.2f} / {f:.2f} |"
        )
    if args.plot is not None:
        figure = Figure(figsize=(9, 3.4), dpi=90)
        FigureCanvasAgg(figure)
        left, right = figure.subplots(1, 2)
        for label, group in curves.items():
            length = min(len(c) for c in group)
            matrix = np.asarray(
                [[np.nan if v is None else v for v in c[:length]] for c in group], dtype=float
            )
            left.plot(np.arange(length), np.nanmean(matrix, axis=0), label=label)
        left.set_xlabel("round")
        left.set_ylabel("AUROC of q (mean over seeds)")
        left.set_ylim(-0.02, 1.02)
        left.grid(alpha=0.3)
        left.legend(fontsize=8)
        left.set_title("Fed-NCL score q: AUROC noisy vs clean", fontsize=9)
        shown = next(r for r in runs if r["label"] == args.method)
        truth = [c["true_noisy"] for c in shown["clients"]]
        for k, noisy in enumerate(truth):
            values = [
                max(float(rec["clients"][k]["detectors"]["fedncl"]["score"]), 1e-6)
                for rec in shown["rounds"]
            ]
            right.plot(
                range(len(values)),
                values,
                color="tab:red" if noisy else "tab:blue",
                alpha=0.7,
                linewidth=1,
            )
        right.set_yscale("log")
        right.set_xlabel("round")
        right.set_ylabel("q = e h / n")
        right.set_title(
            f"q per client, {args.method} federation, seed {shown['seed']} (red = noisy)",
            fontsize=9,
        )
        right.grid(alpha=0.3)
        figure.tight_layout()
        figure.savefig(args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
