"""Replay a kept simulation's rounds with site 0 as a trust anchor, in the product's evidence
detector as it is and with its anchored mode forced on in every round (what an anchor could do
with the global model the federation trained).

Usage (from the repository root; one directory per ``fedaudit simulate --out``, run with the
coordinator data kept)::

    .venv/bin/python docs/eval/anchor_whatif.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from evidence_whatif import f1, load  # noqa: E402

from service.audit.evidence import EvidenceDetector  # noqa: E402


def main(paths: list[str]) -> None:
    for path in paths:
        for run in load(Path(path)):
            truth = run["truth"]
            anchors = np.zeros(truth.size, dtype=bool)
            anchors[0] = True
            for forced in (False, True):
                det = EvidenceDetector()
                if forced:
                    original = det._anchored

                    def always(loss, counts, sd, anchor, consensus, reason, original=original):  # type: ignore[no-untyped-def]
                        return original(loss, counts, sd, anchor, consensus, reason or "forced")

                    det._anchored = always  # type: ignore[method-assign]
                scores, modes = [], set()
                for index, loss, counts, sd, errors in run["rounds"]:
                    if index < run["warmup"]:
                        continue
                    result = det.fit(loss, counts, sd, anchors=anchors, per_class_errors=errors)
                    flags = np.array([bool(v is not None and v.flag) for v in result.verdicts])
                    scores.append(f1(flags, truth))
                    modes.add(result.summary.get("mode"))
                shown = sorted(m for m in modes if m)
                print(
                    f"{run['name']} anchored mode {'forced' if forced else 'as is'}: F1 mean "
                    f"{np.mean(scores):.2f}, last {scores[-1]:.2f}; modes {shown}"
                )


if __name__ == "__main__":
    main(sys.argv[1:])
