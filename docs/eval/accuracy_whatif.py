"""The accuracy evidence replayed on the signals sites actually sent.

Reads the coordinator database that ``fedaudit simulate`` keeps (``<out>/coordinator``) and, for
every round after the warm-up whose updates all arrived, runs
:func:`service.audit.accuracy_evidence.accuracy_evidence` on the sites' ``train_accuracy`` alone
(not combined with the loss evidence, no status history). Per run: rounds in which it flags a
clean site, the largest z of a clean site, the noisy sites it flags and the first round of each.
With ``--verbose``, every flag with its z and excess error.

Usage (from the repository root; one directory per ``fedaudit simulate --out``)::

    .venv/bin/python docs/eval/accuracy_whatif.py [--min-gap 0.25] [--q 0.01] RUN_DIR [...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from evidence_whatif import stored_runs  # noqa: E402

from service.audit.accuracy_evidence import accuracy_evidence  # noqa: E402


def replay(run_dir: Path, min_gap: float, q: float, verbose: bool) -> None:
    for data, complete in stored_runs(run_dir):
        clients = data["clients"]
        truth = np.array([c["true_noisy"] for c in clients], dtype=bool)
        warmup = int(data["config"]["warmup_rounds"])
        rounds = false_rounds = 0
        worst_clean = -np.inf
        first: dict[int, int] = {}
        for sig in complete:
            index = sig[0]["_round"]
            if index < warmup or any("train_accuracy" not in s for s in sig):
                continue
            acc = [s["train_accuracy"] for s in sig]
            n = [sum(s["class_counts"]) for s in sig]
            ev = accuracy_evidence(acc, n, q=q, min_gap=min_gap)
            rounds += 1
            false_rounds += bool((ev.flags & ~truth).any())
            if (~truth).any():
                worst_clean = max(worst_clean, float(ev.z[~truth].max()))
            for k in np.flatnonzero(ev.flags):
                first.setdefault(int(k), index)
                if verbose:
                    kind = "noisy" if truth[k] else "CLEAN"
                    name = clients[k]["name"]
                    print(f"  round {index} {name} {kind} z {ev.z[k]:.1f} gap {ev.gap[k]:.3f}")
        found = sum(1 for k in first if truth[k])
        print(
            f"{run_dir.name}/{data['label']} seed {data['seed']}: {rounds} rounds, "
            f"{false_rounds} with a clean site flagged, largest clean z {worst_clean:.1f}, "
            f"noisy sites flagged {found}/{int(truth.sum())}, first rounds "
            f"{sorted(first[k] for k in first if truth[k])}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--min-gap", type=float, default=0.25)
    parser.add_argument("--q", type=float, default=0.01)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    for run_dir in args.run_dirs:
        replay(run_dir, args.min_gap, args.q, args.verbose)


if __name__ == "__main__":
    main()
