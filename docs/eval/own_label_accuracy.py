"""How far the global model beats chance on the sites' own labels, round by round.

Issue 17 asks the audit to abstain when "the global model is at or below chance on the sites'
own data". The sites send ``per_class_errors`` (per given label, how many of their samples the
received global model assigns to another class), so the coordinator knows the global model's
pooled accuracy ``A`` on the labels as the sites hold them. Chance is ``C``, the share of the most
common label (the accuracy of always predicting it), and ``z = (A - C) / sqrt(C (1 - C) / N)``
over the ``N`` samples. This script prints ``A/C/z`` every third round after the warm-up and at
the last round, from the coordinator database ``fedaudit simulate`` keeps.

Usage (from the repository root)::

    .venv/bin/fedaudit simulate --scenario docs/eval/matrix/m10-bc-10-gauss-corrupt.yaml \
        --rounds 40 --seeds 0,1,2 --method fedavg --out runs/m10-fedavg
    .venv/bin/python docs/eval/own_label_accuracy.py runs/m10-fedavg
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from evidence_whatif import load  # noqa: E402


def main(argv: list[str]) -> int:
    for directory in argv:
        for run in load(Path(directory)):
            cells = []
            for index, _loss, counts, _sd, errors in run["rounds"]:
                if index < run["warmup"] or errors is None:
                    continue
                total = float(counts.sum())
                chance = float(counts.sum(axis=0).max()) / total
                accuracy = 1.0 - float(errors.sum()) / total
                z = (accuracy - chance) / math.sqrt(chance * (1.0 - chance) / total)
                cells.append(f"{index}:{accuracy:.2f}/{chance:.2f}/{z:.1f}")
            print(run["name"], " ".join(cells[::3] + cells[-1:]) or "no error counts sent")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
