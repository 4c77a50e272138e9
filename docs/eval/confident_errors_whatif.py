"""The evidence detector with and without the confident errors, on signals sites actually sent.

Reads the coordinator database ``fedaudit simulate --keep-coordinator-data`` keeps (as
``docs/eval/evidence_whatif.py``, whose loader this uses), and judges every complete round after
the warm-up twice with the product's ``EvidenceDetector`` (defaults, the losses with their
spreads and the error counts): once without the sites' ``per_class_confident_errors`` and once
with them. No status history, no update geometry: the detector's own flags.

A ``fedavg`` federation is the fair counterfactual (its flags do not feed back into training);
a ``fednoro`` federation's signals were shaped by the flags of the detector that ran (with the
confident errors, where the run's SDK sent them).

Per run: rounds after the warm-up with a false flag, F1 mean over them (a round without a flag:
F1 0) and at the last round, the noisy sites flagged at least once and the slowest first flag in
rounds after the warm-up, and rounds the detector abstained in.

Usage (from the repository root; one directory per ``fedaudit simulate --out``, e.g. the stress
matrix's ``OUT/<scenario>/seed<S>`` with ``docs/eval/matrix.py --keep-coordinator-data``)::

    .venv/bin/python docs/eval/confident_errors_whatif.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from evidence_whatif import stored_runs  # noqa: E402

from service.audit.evidence import EvidenceDetector  # noqa: E402


def _matrix(rows: list[Any]) -> np.ndarray:
    return np.asarray([[np.nan if v is None else v for v in r] for r in rows], dtype=np.float64)


def _f1(flags: np.ndarray, truth: np.ndarray) -> float:
    tp = int((flags & truth).sum())
    wrong = int((flags & ~truth).sum()) + int((~flags & truth).sum())
    return 2 * tp / (2 * tp + wrong) if 2 * tp + wrong else float("nan")


def judge(data: dict[str, Any], rounds: list[list[dict[str, Any]]], confident: bool) -> dict:
    truth = np.asarray([c["true_noisy"] for c in data["clients"]], dtype=bool)
    warmup = int(data["config"]["warmup_rounds"])
    f1s, false_rounds, abstained, first = [], 0, 0, {}
    last = float("nan")
    for sig in rounds:
        index = sig[0]["_round"]
        if index < warmup:
            continue
        extra = {}
        if all("per_class_errors" in s for s in sig):
            extra["per_class_errors"] = _matrix([s["per_class_errors"] for s in sig])
        if confident and all("per_class_confident_errors" in s for s in sig):
            extra["per_class_confident_errors"] = _matrix(
                [s["per_class_confident_errors"] for s in sig]
            )
        sd = (
            _matrix([s["per_class_loss_sd"] for s in sig])
            if all("per_class_loss_sd" in s for s in sig)
            else None
        )
        result = EvidenceDetector().fit(
            _matrix([s["per_class_loss"] for s in sig]),
            np.asarray([[c or 0 for c in s["class_counts"]] for s in sig], dtype=np.int64),
            sd,
            **extra,
        )
        flags = np.asarray([bool(v is not None and v.flag) for v in result.verdicts])
        abstained += result.status == "inconclusive"
        false_rounds += bool((flags & ~truth).any())
        for i in np.flatnonzero(flags & truth):
            first.setdefault(int(i), index - warmup)
        last = _f1(flags, truth)
        f1s.append(last)
    return {
        "false_rounds": false_rounds,
        "rounds": len(f1s),
        "f1_mean": float(np.nanmean(f1s)) if truth.any() and f1s else float("nan"),
        "f1_last": last,
        "found": len(first),
        "noisy": int(truth.sum()),
        "slowest": max(first.values()) if first else None,
        "inconclusive": abstained,
    }


def main(paths: list[str]) -> None:
    for run_dir in paths:
        for data, rounds in stored_runs(Path(run_dir)):
            name = f"{Path(run_dir).parent.name}/{Path(run_dir).name}/{data['label']}"
            for confident in (False, True):
                r = judge(data, rounds, confident)
                print(
                    f"{name:48s} {'with' if confident else 'without':7s} "
                    f"false {r['false_rounds']}/{r['rounds']} F1 mean {r['f1_mean']:.2f} "
                    f"last {r['f1_last']:.2f} found {r['found']}/{r['noisy']} "
                    f"slowest {r['slowest']} inconclusive {r['inconclusive']}",
                    flush=True,
                )


if __name__ == "__main__":
    main(sys.argv[1:])
