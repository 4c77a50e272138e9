"""FedRN's Spearman(expertise, noise rate) at the last round, per scenario and method.

Reads the ``results.json`` that ``fedaudit simulate`` writes (the stress matrix's
``OUT/<scenario>/seed<S>``, ``docs/eval/matrix.py``): each run's ``spearman_final.expertise``,
the rank correlation between the sites' FedRN expertise (higher = more reliable) and their true
noise rates at the last round. Issue 17 asks for -0.9 or below on symmetric and pair-flip noise.
A clean federation has no rates to rank (empty).

Usage (from the repository root; instant)::

    .venv/bin/python docs/eval/expertise_spearman.py RUN_DIR [RUN_DIR ...]

Prints, per scenario (the run directory's parent) and method: the value of each seed, their mean.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(paths: list[str]) -> None:
    table: dict[tuple[str, str], list[tuple[str, float]]] = {}
    for run_dir in paths:
        results = Path(run_dir) / "results.json"
        if not results.is_file():
            raise SystemExit(f"{results} not found: not a fedaudit simulate output directory")
        data = json.loads(results.read_text(encoding="utf-8"))
        for run in data["runs"]:
            value = (run.get("spearman_final") or {}).get("expertise")
            if value is not None:
                key = (Path(run_dir).parent.name, str(run.get("label")))
                table.setdefault(key, []).append((Path(run_dir).name, float(value)))
    print("| scenario | method | per seed | mean |")
    print("| --- | --- | --- | --- |")
    for (scenario, method), values in sorted(table.items()):
        seeds = ", ".join(f"{name} {v:.2f}" for name, v in values)
        mean = sum(v for _, v in values) / len(values)
        print(f"| {scenario} | {method} | {seeds} | {mean:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
