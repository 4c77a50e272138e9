"""The largest per-class I^2 of the evidence detector, round by round, on stored federations.

For ``MAX_CLASS_HETEROGENEITY`` (service/audit/evidence_abstention.py): judges every round after
the warm-up of each stored federation with the product's ``EvidenceDetector`` (losses with their
spreads, error counts, confident errors: as ``confident_errors_whatif.py``), reads each class's
I^2, and prints how the largest one is distributed over the rounds of clean federations, of
noisy federations that flagged nobody ("silent"), of the others, and how many rounds of each
pass 0.8 to 0.95.

Usage (from the repository root; one directory per ``fedaudit simulate --out`` kept with
``--keep-coordinator-data``)::

    .venv/bin/python docs/eval/class_disagreement.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from evidence_whatif import stored_runs  # noqa: E402

import service.audit.evidence as evidence  # noqa: E402

_SEEN: dict[str, Any] = {}
_heterogeneity = evidence.class_heterogeneity


def _record(class_evidence: Any, counts: Any) -> float:
    _SEEN["i2"] = class_evidence.heterogeneity
    return _heterogeneity(class_evidence, counts)


evidence.class_heterogeneity = _record  # the per-class I^2 of the pass the detector judges


def _matrix(rows: list[Any]) -> np.ndarray:
    return np.asarray([[np.nan if v is None else v for v in r] for r in rows], dtype=np.float64)


def largest_i2(paths: list[str]) -> dict[str, list[float]]:
    groups: dict[str, list[float]] = {"clean": [], "silent": [], "flagging": [], "inconclusive": []}
    for run_dir in paths:
        for data, rounds in stored_runs(Path(run_dir)):
            truth = np.asarray([c["true_noisy"] for c in data["clients"]], dtype=bool)
            for sig in rounds:
                if sig[0]["_round"] < int(data["config"]["warmup_rounds"]):
                    continue
                extra = {
                    key: _matrix([s[key] for s in sig])
                    for key in ("per_class_errors", "per_class_confident_errors")
                    if all(key in s for s in sig)
                }
                sd = (
                    _matrix([s["per_class_loss_sd"] for s in sig])
                    if all("per_class_loss_sd" in s for s in sig)
                    else None
                )
                _SEEN.clear()
                result = evidence.EvidenceDetector().fit(
                    _matrix([s["per_class_loss"] for s in sig]),
                    np.asarray([[c or 0 for c in s["class_counts"]] for s in sig], dtype=np.int64),
                    sd,
                    **extra,
                )
                i2 = np.asarray(_SEEN.get("i2", []), dtype=np.float64)
                if not np.isfinite(i2).any():
                    continue
                flagged = any(v is not None and v.flag for v in result.verdicts)
                group = (
                    "inconclusive"
                    if result.status == "inconclusive"
                    else "clean"
                    if not truth.any()
                    else "flagging"
                    if flagged
                    else "silent"
                )
                groups[group].append(float(np.nanmax(i2)))
    return groups


def main(paths: list[str]) -> None:
    groups = largest_i2(paths)
    for name, values in groups.items():
        if values:
            q = np.quantile(values, [0.5, 0.9, 0.99, 1.0])
            print(f"{name:12s} rounds {len(values):5d}  largest I^2 q50/q90/q99/max {q.round(3)}")
    for threshold in (0.8, 0.85, 0.9, 0.95):
        counts = {name: sum(v > threshold for v in values) for name, values in groups.items()}
        print(f"above {threshold}: {counts}")


if __name__ == "__main__":
    main(sys.argv[1:])
