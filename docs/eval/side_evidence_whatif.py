"""Could the update geometry or the probe softmax flag a site on their own?

A site can lie about its per-class losses (issue 20, point 1: report the federation's mean while
training on flipped labels). The two signals it cannot fake as easily are its model update and
its model's softmax on the round's random probe inputs. This script asks whether either, turned
into a p-value with an *empirical* null (each site's statistic against the median and the
scaled median absolute deviation of all sites: Efron, "Large-scale simultaneous hypothesis
testing", JASA 2004, section 3, with the normal's MAD consistency factor 1.4826), ranks the noisy
sites first (AUROC) and flags without false alarms (Benjamini-Hochberg at q = 0.01, as the
evidence detector). Statistics per site and round:

* ``1-cos``: one minus the cosine between the site's update (its state minus the round's global
  model) and the sum of the other sites' updates;
* ``norm``: the update's Euclidean norm;
* ``dist``: the distance of the update to the coordinate-wise median update;
* ``probe``: the mean Jensen-Shannon divergence of the site's probe softmax to the renormalised
  coordinate-wise median of all sites' probe softmaxes.

Reads the coordinator data that ``fedaudit simulate`` keeps (``<out>/coordinator``: the database
and every stored update; only ``fedavg`` runs are a fair counterfactual), e.g. the federations of
``docs/eval/evidence_signals.sh``::

    .venv/bin/python docs/eval/side_evidence_whatif.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file
from scipy.special import ndtr

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from service.audit.class_null import benjamini_hochberg  # noqa: E402


def _hex(value: object) -> str:
    return str(value).replace("-", "")


def _flat(path: Path) -> np.ndarray:
    tensors = load_file(str(path))
    return np.concatenate([tensors[k].ravel().astype(np.float64) for k in sorted(tensors)])


def _js(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    m = 0.5 * (p + q)

    def kl(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.asarray((a * np.log(np.maximum(a, 1e-12) / np.maximum(b, 1e-12))).sum(-1))

    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def statistics(deltas: np.ndarray, probes: np.ndarray) -> dict[str, np.ndarray]:
    """Per-site statistics of one round (module docstring): deltas (K, P), probes (K, n, C)."""
    norms = np.linalg.norm(deltas, axis=1)
    others = deltas.sum(axis=0)[None, :] - deltas
    cos = (deltas * others).sum(axis=1) / (norms * np.linalg.norm(others, axis=1) + 1e-30)
    median = np.median(probes, axis=0)
    median = median / median.sum(axis=-1, keepdims=True)
    return {
        "1-cos": 1.0 - cos,
        "norm": norms,
        "dist": np.linalg.norm(deltas - np.median(deltas, axis=0), axis=1),
        "probe": _js(probes, median[None]).mean(axis=-1),
    }


def empirical_p(stat: np.ndarray) -> np.ndarray:
    centre = np.median(stat)
    scale = max(1.4826 * float(np.median(np.abs(stat - centre))), 1e-30)
    return np.asarray(ndtr(-(stat - centre) / scale))


def auroc(score: np.ndarray, truth: np.ndarray) -> float:
    if truth.all() or not truth.any():
        return float("nan")
    pos, neg = score[truth], score[~truth]
    return float((pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean())


def judge(run_dir: Path) -> None:
    coordinator = run_dir / "coordinator"
    con = sqlite3.connect(f"file:{coordinator / 'fedaudit.db'}?mode=ro", uri=True)
    blob = lambda key: coordinator / "blobs" / key[:2] / key  # noqa: E731
    for path in sorted((run_dir / "runs").glob("*_seed*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        clients = sorted(data["clients"], key=lambda c: c["index"])
        order = {_hex(c["client_id"]): i for i, c in enumerate(clients)}
        truth = np.asarray([c["true_noisy"] for c in clients], dtype=bool)
        fid = _hex(data["federation_id"])
        warmup = int(data["config"]["warmup_rounds"])
        found: dict[str, list[tuple[float, bool, float]]] = {}
        query = 'SELECT "index", model_in_id FROM round WHERE federation_id = ?'
        for index, model_in in con.execute(query, (fid,)).fetchall():
            if index < warmup:
                continue
            rows = con.execute(
                "SELECT client_id, blob_key, signals FROM model_update "
                "WHERE federation_id = ? AND round_index = ?",
                (fid, index),
            ).fetchall()
            if len(rows) != len(clients):
                continue
            (global_key,) = con.execute(
                "SELECT blob_key FROM model_version WHERE id = ?", (model_in,)
            ).fetchone()
            base = _flat(blob(global_key))
            deltas = np.zeros((len(clients), base.size))
            probes: list[np.ndarray] = [np.zeros(0)] * len(clients)
            for cid, key, signals in rows:
                k = order[_hex(cid)]
                deltas[k] = _flat(blob(key)) - base
                probes[k] = np.asarray(json.loads(signals)["probe_softmax"], dtype=np.float64)
            for name, stat in statistics(deltas, np.stack(probes)).items():
                flags = benjamini_hochberg(empirical_p(stat), 0.01)[0]
                recall = float((flags & truth).sum() / truth.sum()) if truth.any() else float("nan")
                found.setdefault(name, []).append(
                    (auroc(stat, truth), bool((flags & ~truth).any()), recall)
                )
        cells = []
        for name, rows_of in found.items():
            au = np.asarray([r[0] for r in rows_of])
            rec = np.asarray([r[2] for r in rows_of])
            cells.append(
                f"{name}: AUROC {np.nanmean(au) if np.isfinite(au).any() else float('nan'):.2f}, "
                f"false-flag rounds {sum(r[1] for r in rows_of)}/{len(rows_of)}, "
                f"recall {np.nanmean(rec) if np.isfinite(rec).any() else float('nan'):.2f}"
            )
        print(f"{run_dir.name}/{path.stem} | " + " | ".join(cells))
    con.close()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    for arg in sys.argv[1:]:
        judge(Path(arg))
