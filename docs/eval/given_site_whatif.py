"""The evidence detector's second pass with and without the flagged sites' own losses.

``service.audit.evidence.FLAGGED_OWN_LOSSES`` (on by default since 29 November 2026): the second
pass judges the sites the first pass flagged on their own losses, not "given their difficulty"
(docs/algorithms.md, "classes given the site"). This replays every complete round after the
warm-up of the runs given, on the signals the sites sent (the coordinator database that
``fedaudit simulate --keep-coordinator-data`` keeps), with the switch off ("before") and on
("after"), as ``docs/eval/confident_errors_whatif.py`` judges a round (the error counts and the
confident errors included; no status history, no update geometry: the detector's own flags).

Per run and variant: rounds after the warm-up with a false flag, F1 mean and at the last round,
noisy sites flagged at least once, the slowest first flag, and rounds the detector abstained in.
Then the totals over every run, and the runs whose figures changed.

Usage (from the repository root; one directory per ``fedaudit simulate --out`` run, e.g.
``OUT/<scenario>/seed<S>`` of ``docs/eval/holdout.py`` or ``docs/eval/matrix.py`` with
``--keep-coordinator-data``)::

    .venv/bin/python docs/eval/given_site_whatif.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from confident_errors_whatif import judge  # noqa: E402
from evidence_whatif import stored_runs  # noqa: E402

import service.audit.evidence as evidence  # noqa: E402

KEYS = ("false_rounds", "rounds", "found", "noisy", "inconclusive")


def _line(name: str, variant: str, r: dict[str, Any]) -> str:
    return (
        f"{name:60s} {variant:6s} false {r['false_rounds']}/{r['rounds']} "
        f"F1 mean {r['f1_mean']:.2f} last {r['f1_last']:.2f} found {r['found']}/{r['noisy']} "
        f"slowest {r['slowest']} inconclusive {r['inconclusive']}"
    )


def main(paths: list[str]) -> None:
    totals = {variant: dict.fromkeys(KEYS, 0) for variant in ("before", "after")}
    changed = []
    for run_dir in paths:
        for data, rounds in stored_runs(Path(run_dir)):
            name = f"{Path(run_dir).parent.name}/{Path(run_dir).name}/{data['label']}"
            results = {}
            for variant, on in (("before", False), ("after", True)):
                evidence.FLAGGED_OWN_LOSSES = on
                results[variant] = judge(data, rounds, True)
                for key in KEYS:
                    totals[variant][key] += int(results[variant][key])
                print(_line(name, variant, results[variant]), flush=True)
            if str(results["before"]) != str(results["after"]):
                changed.append(name)
    evidence.FLAGGED_OWN_LOSSES = True
    for variant, total in totals.items():
        print(
            f"total {variant}: false-flag rounds {total['false_rounds']} of {total['rounds']}, "
            f"noisy sites found {total['found']} of {total['noisy']}, "
            f"inconclusive rounds {total['inconclusive']}"
        )
    print(f"{len(changed)} runs changed: {', '.join(changed) or '-'}")


if __name__ == "__main__":
    main(sys.argv[1:])
