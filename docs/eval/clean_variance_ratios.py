"""How far a clean site's reported loss variance strays from the other holders' pooled variance.

The evidence detector judges every holder of a class against the pooled per-sample loss
variance of the class's holders, each holder's variance clipped at
``service.audit.pooling.POOL_CAP`` (4) times the others' pooled variance
(``service.audit.class_null``). A lying site can raise the pool by reporting a large spread, but
only as far as a clean site with many hard samples does on its own: this script measures, on
the signals sites actually sent, the ratio of each clean holder's variance (ddof 1) to the
others' pooled variance (degrees-of-freedom weighted, no cap), for holders of at least 10
samples of the class whose others hold at least as many degrees of freedom.

Usage (from the repository root; one directory per ``fedaudit simulate --out`` with the
coordinator data kept, e.g. the stress matrix's ``OUT/<scenario>/seed<S>`` with
``docs/eval/matrix.py --keep-coordinator-data``; a few seconds)::

    .venv/bin/python docs/eval/clean_variance_ratios.py RUN_DIR [RUN_DIR ...]

Prints per scenario (the run directory's parent): the number of clean holder-rounds, the
median, 90th, 99th percentile and the largest ratio, and the share of ratios above 2 and 4.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from evidence_whatif import stored_runs  # noqa: E402

MIN_SAMPLES = 10


def _matrix(rows: list[list[float | None]]) -> np.ndarray:
    return np.asarray([[np.nan if v is None else v for v in r] for r in rows], dtype=np.float64)


def ratios(run_dir: Path) -> list[float]:
    """Each clean holder's variance over the other holders' pooled variance, every stored round
    with spreads."""
    out: list[float] = []
    for data, rounds in stored_runs(run_dir):
        truth = np.asarray([c["true_noisy"] for c in data["clients"]], dtype=bool)
        for sig in rounds:
            if not all(s.get("per_class_loss_sd") is not None for s in sig):
                continue
            sd = _matrix([s["per_class_loss_sd"] for s in sig])
            n = np.asarray([[c or 0 for c in s["class_counts"]] for s in sig], dtype=np.float64)
            for c in range(n.shape[1]):
                rows = n[:, c] > 0
                if rows.sum() < 3:
                    continue
                nk, clean = n[rows, c], ~truth[rows]
                dof = nk - 1.0
                var = np.square(sd[rows, c]) * nk / np.maximum(dof, 1.0)
                for i in np.flatnonzero(clean & (nk >= MIN_SAMPLES)):
                    others_dof = dof.sum() - dof[i]
                    others = (dof * var).sum() - dof[i] * var[i]
                    if others_dof >= dof[i] and others > 0:
                        out.append(float(var[i] / (others / others_dof)))
    return out


def main(paths: list[str]) -> None:
    by_scenario: dict[str, list[float]] = {}
    for run_dir in paths:
        by_scenario.setdefault(Path(run_dir).parent.name, []).extend(ratios(Path(run_dir)))
    print("| scenario | clean holder-rounds | median | 90 % | 99 % | largest | > 2 | > 4 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, values in sorted(by_scenario.items()):
        if not values:
            continue
        v = np.asarray(values)
        q50, q90, q99 = np.quantile(v, [0.5, 0.9, 0.99])
        print(
            f"| {name} | {v.size} | {q50:.2f} | {q90:.2f} | {q99:.2f} | {v.max():.1f} | "
            f"{(v > 2).mean():.1%} | {(v > 4).mean():.1%} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
