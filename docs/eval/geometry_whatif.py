"""The update-geometry evidence replayed on the updates sites actually uploaded.

Reads the coordinator data that ``fedaudit simulate --keep-coordinator-data`` keeps
(``<out>/coordinator``: the database and the model files), takes every round after the warm-up
whose updates all arrived, computes each site's leave-one-out cosine from the stored models
(:func:`service.audit.geometry_evidence.leave_one_out_cosines`) and judges the round with
:func:`service.audit.geometry_evidence.geometry_evidence` at the default settings.

Per run: in how many rounds the test applied (some site had enough peers of its class mix and
size), the rounds
where it would flag a clean site (and of those, how many the loss evidence judged ``ok``, the only
rounds where the product adds geometry flags), the mean share of noisy sites it flags, the first
round each noisy site was flagged, and the largest z of a clean site.

Usage (from the repository root; one directory per ``fedaudit simulate --out``)::

    .venv/bin/python docs/eval/geometry_whatif.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from safetensors.numpy import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from service.audit.geometry_evidence import (  # noqa: E402
    geometry_evidence,
    leave_one_out_cosines,
)

ROUNDS = (
    'SELECT r.id, r."index", m.blob_key FROM round r JOIN model_version m '
    'ON r.model_in_id = m.id WHERE r.federation_id = ? ORDER BY r."index"'
)
UPDATES = "SELECT client_id, blob_key, num_samples, signals FROM model_update WHERE round_id = ?"


def _hex(value: object) -> str:
    return str(value).replace("-", "")


def _flat(path: Path, names: list[str]) -> np.ndarray:
    tensors = load_file(str(path))
    return np.concatenate([tensors[n].astype(np.float64).ravel() for n in names])


class StoredRound(NamedTuple):
    """One complete round after the warm-up, as the coordinator stored it."""

    round_index: int
    updates: np.ndarray  # K x P: each site's state minus the round's global model
    sizes: np.ndarray  # K: num_samples
    counts: np.ndarray  # K x C: declared class counts
    signals: list[dict[str, Any]]  # K: the signals each site sent with its update


class StoredRun(NamedTuple):
    """What a run JSON says about its sites (in client-index order)."""

    names: list[str]
    truth: np.ndarray  # K bools: true_noisy
    status: dict[int, str | None]  # round index -> the evidence detector's status
    noisy_after: dict[int, np.ndarray]  # round index -> K bools: noisy at its end


def stored_run(data: dict[str, Any]) -> StoredRun:
    """The sites' ground truth, the evidence detector's status and the noisy role per round."""
    data["clients"] = sorted(data["clients"], key=lambda c: c["index"])
    names = [c["name"] for c in data["clients"]]
    noisy_after = {
        r["index"]: np.array(
            [{c["name"]: c["status"] for c in r["clients"]}.get(n) == "noisy" for n in names]
        )
        for r in data["rounds"]
    }
    return StoredRun(
        names,
        np.array([bool(c["true_noisy"]) for c in data["clients"]]),
        {r["index"]: r["detector_status"].get("evidence") for r in data["rounds"]},
        noisy_after,
    )


def noisy_role(run: StoredRun, index: int) -> np.ndarray:
    """The sites in the noisy role in round ``index``: noisy at the end of the round before."""
    return run.noisy_after.get(index - 1, np.zeros(len(run.names), dtype=bool))


def stored_rounds(
    con: sqlite3.Connection, blobs: Path, data: dict[str, Any]
) -> Iterator[StoredRound]:
    """Each complete round after the warm-up, from the database and the stored models."""
    order = {_hex(c["client_id"]): c["index"] for c in data["clients"]}
    warmup = sum(1 for r in data["rounds"] if r["in_warmup"])
    for round_id, index, global_key in con.execute(ROUNDS, (_hex(data["federation_id"]),)):
        rows = con.execute(UPDATES, (round_id,)).fetchall()
        if index < warmup or len(rows) != len(order):
            continue
        reference = load_file(str(blobs / global_key[:2] / global_key))
        names = sorted(n for n, v in reference.items() if v.dtype.kind == "f")
        flat_global = np.concatenate([reference[n].astype(np.float64).ravel() for n in names])
        updates = np.zeros((len(order), flat_global.size))
        sizes = np.zeros(len(order))
        signals: list[dict[str, Any]] = [{} for _ in order]
        for client_id, key, num_samples, raw in rows:
            k = order[_hex(client_id)]
            updates[k] = _flat(blobs / key[:2] / key, names) - flat_global
            sizes[k] = num_samples
            signals[k] = json.loads(raw)
        counts = np.asarray([s["class_counts"] for s in signals], dtype=np.float64)
        yield StoredRound(int(index), updates, sizes, counts, signals)


def coordinator_db(run_dir: Path) -> sqlite3.Connection:
    """The run directory's coordinator database, read-only."""
    coordinator = run_dir / "coordinator"
    if not (coordinator / "fedaudit.db").is_file():
        raise SystemExit(f"{coordinator} has no fedaudit.db: keep the coordinator data")
    return sqlite3.connect(f"file:{coordinator / 'fedaudit.db'}?mode=ro", uri=True)


def loo_cosines(stored: StoredRound) -> np.ndarray:
    """Each site's leave-one-out cosine (the product's formula on the stored updates)."""
    updates, sizes = stored.updates, stored.sizes
    total = (sizes[:, None] * updates).sum(axis=0)
    return leave_one_out_cosines(
        (updates**2).sum(axis=1), updates @ total, float(total @ total), sizes
    )


def replay(run_dir: Path) -> None:
    """Print one line per run of one ``fedaudit simulate --out`` directory."""
    con = coordinator_db(run_dir)
    for path in sorted((run_dir / "runs").glob("*_seed*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        run = stored_run(data)
        truth = run.truth
        applied = false_rounds = false_ok = rounds = 0
        recall: list[float] = []
        first: dict[int, int] = {}
        clean_max = -np.inf
        for stored in stored_rounds(con, run_dir / "coordinator" / "blobs", data):
            rounds += 1
            index = stored.round_index
            result = geometry_evidence(
                loo_cosines(stored),
                stored.counts,
                stored.sizes,
                q=0.01,
                exclude=noisy_role(run, index),
            )
            applied += result.applies
            if (result.judged & ~truth).any():
                clean_max = max(clean_max, float(np.nanmax(result.z[result.judged & ~truth])))
            if (result.flags & ~truth).any():
                false_rounds += 1
                false_ok += run.status.get(index) == "ok"
            for k in np.flatnonzero(result.flags & truth):
                first.setdefault(int(k), index)
            if truth.any():
                recall.append(float(result.flags[truth].mean()))
        print(
            f"{run_dir.name}/{path.stem}: applied {applied}/{rounds} rounds; clean site flagged "
            f"in {false_rounds} (evidence ok in {false_ok}); largest clean z {clean_max:.1f}; "
            f"noisy sites flagged {np.mean(recall) if recall else float('nan'):.2f} of rounds; "
            f"first flags {sorted(first.values())}"
        )
    con.close()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    for argument in sys.argv[1:]:
        replay(Path(argument))
