"""Do the probe softmax or Fed-NCL's q, judged among the update geometry's peers, separate?

The report shows each site's softmax on the round's shared random probe inputs (FedRN, section
4.1) and Fed-NCL's reliability score (Tam et al., eq. 7-9), but the verdict reads neither: judged
against every site with an empirical null they false-alarmed (``side_evidence_whatif.py``). The
update geometry enters the verdict only among **peers** (same declared class mix up to sampling,
same size within a power of two, not in the noisy role:
:func:`service.audit.geometry_evidence.peer_groups`). This script judges the other statistics
among the same peers, per stored round after the warm-up, as robust z (the group's median and
``1.4826 MAD``, high = unlike the peers in the noisy direction):

* ``geometry``: the product's leave-one-out cosine z (:func:`geometry_evidence`), for reference;
* ``probe_js``: the mean over probe inputs of the Jensen-Shannon divergence (natural log) of the
  site's probe softmax to its peers' coordinate-wise median softmax, renormalised;
* ``probe_tv``: the same with the total-variation distance;
* ``probe_entropy``: the mean entropy of the site's probe softmax (a model fitted to symmetric
  label noise is less sure of itself; one-sided, high = flatter than the peers');
* ``fedncl_q``: Fed-NCL's ``q_k = e_k h_k / n_k`` with ``e_k = ||theta_G - theta_k||^2`` (eq. 7,
  the float tensors) and ``h_k = train_loss_k n_k`` (eq. 8, ``loss_mode="sum"``): the reported
  training loss times the divergence;
* ``divergence``: ``e_k`` alone (what the coordinator computes; a site cannot report it).

Per scenario and method: the largest z of a clean site, the noisy sites' (in federations with
liars: the liars') min / median z, the mean per-round AUROC of the judged sites, the rounds where
a clean site reaches ``--floor``, and per noisy site the first round after the warm-up whose z
exceeds the largest clean z of every run (the margin a floor would need). Reads the coordinator
data that ``fedaudit simulate --keep-coordinator-data`` keeps, as ``geometry_whatif.py``.

Usage (from the repository root; one directory per ``fedaudit simulate --out``)::

    .venv/bin/python docs/eval/probe_whatif.py [--floor 10] [--out RECORDS.jsonl] RUN_DIR ...
    .venv/bin/python docs/eval/probe_whatif.py --records RECORDS.jsonl [--floor 10]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from geometry_whatif import (  # noqa: E402
    StoredRound,
    coordinator_db,
    loo_cosines,
    noisy_role,
    stored_rounds,
    stored_run,
)

from service.audit.geometry_evidence import geometry_evidence, peer_groups  # noqa: E402
from service.audit.geometry_null import mad_z  # noqa: E402

STATISTICS = ("geometry", "probe_js", "probe_tv", "probe_entropy", "fedncl_q", "divergence")


def _kl(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray((a * np.log(np.maximum(a, 1e-12) / np.maximum(b, 1e-12))).sum(-1))


def probe_distances(probes: np.ndarray, members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(JS, TV) of every site's probe softmax (K, n, C) to the members' median, mean over n."""
    median = np.median(probes[members], axis=0)
    median = median / median.sum(axis=-1, keepdims=True)
    mix = 0.5 * (probes + median[None])
    js = 0.5 * _kl(probes, mix) + 0.5 * _kl(median[None], mix)
    tv = 0.5 * np.abs(probes - median[None]).sum(axis=-1)
    return js.mean(axis=-1), tv.mean(axis=-1)


def robust_z(values: np.ndarray, members: np.ndarray) -> np.ndarray:
    """``(x - median) / (1.4826 MAD)`` over the members, NaN elsewhere (and where MAD is 0)."""
    z = np.full(values.size, np.nan)
    low_z, scale = mad_z(values[members])  # (median - x) / scale: this statistic's sign is upward
    if float(scale) > 0.0:
        z[members] = -low_z
    return z


def round_z(stored: StoredRound, role: np.ndarray) -> dict[str, np.ndarray]:
    """Each statistic's z for every site of one round (NaN where the site was not judged)."""
    k = stored.sizes.size
    out = {name: np.full(k, np.nan) for name in STATISTICS}
    geometry = geometry_evidence(
        loo_cosines(stored), stored.counts, stored.sizes, q=0.01, exclude=role
    )
    out["geometry"] = geometry.z
    groups = peer_groups(stored.counts, stored.sizes, exclude=role)
    if not (groups >= 0).any():
        return out
    probes = np.stack([np.asarray(s["probe_softmax"], dtype=np.float64) for s in stored.signals])
    divergence = (stored.updates**2).sum(axis=1)
    loss = np.asarray([float(s["train_loss"]) for s in stored.signals])
    entropy = -(probes * np.log(np.maximum(probes, 1e-12))).sum(axis=-1).mean(axis=-1)
    for value in np.unique(groups[groups >= 0]):
        members = groups == value
        js, tv = probe_distances(probes, members)
        for name, stat in (
            ("probe_js", js),
            ("probe_tv", tv),
            ("probe_entropy", entropy),
            ("fedncl_q", divergence * loss),
            ("divergence", divergence),
        ):
            z = robust_z(stat, members)
            out[name][members] = z[members]
    return out


def scenario_name(run_dir: Path) -> str:
    """``mx/m01-.../seed0`` -> ``mx/m01-...``; ``s/liar3`` -> ``s/liar3``."""
    if run_dir.name.startswith("seed"):
        return f"{run_dir.parents[1].name}/{run_dir.parent.name}"
    return f"{run_dir.parent.name}/{run_dir.name}"


def records(run_dir: Path) -> list[dict[str, Any]]:
    """One record per run, round and site: truth, liar, and each statistic's z."""
    lying = json.loads((run_dir / "scenario.json").read_text(encoding="utf-8")).get("lying")
    con = coordinator_db(run_dir)
    out: list[dict[str, Any]] = []
    for path in sorted((run_dir / "runs").glob("*_seed*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        run = stored_run(data)
        for stored in stored_rounds(con, run_dir / "coordinator" / "blobs", data):
            z = round_z(stored, noisy_role(run, stored.round_index))
            for i, name in enumerate(run.names):
                out.append(
                    {
                        "scenario": scenario_name(run_dir),
                        "run": f"{run_dir}/{path.stem}",
                        "method": path.stem.split("_seed")[0],
                        "round": stored.round_index,
                        "site": name,
                        "noisy": bool(run.truth[i]),
                        "liar": bool(run.truth[i] and lying),
                        "status": run.status.get(stored.round_index),
                        **{s: _finite(z[s][i]) for s in STATISTICS},
                    }
                )
    con.close()
    return out


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def auroc(positive: list[float], negative: list[float]) -> float:
    """P(a noisy site's z > a clean one's), ties counted half."""
    pos, neg = np.asarray(positive)[:, None], np.asarray(negative)[None, :]
    return float((pos > neg).mean() + 0.5 * (pos == neg).mean())


def summarise(rows: list[dict[str, Any]], floor: float) -> None:
    """Print one markdown table per statistic (module docstring)."""
    cases: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        cases[(row["scenario"], row["method"])].append(row)
    for stat in STATISTICS:
        margin = max((r[stat] for r in rows if r[stat] is not None and not r["noisy"]), default=0)
        print(f"\n### {stat} (largest clean z of all runs: {margin:.1f}; floor {floor:g})\n")
        print(
            "| scenario | method | judged site-rounds | clean max z | noisy min / median z | "
            "AUROC | rounds a clean site >= floor | noisy sites > all-runs clean max: first "
            "round after warm-up |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for (scenario, method), chosen in sorted(cases.items()):
            print(f"| {scenario} | {method} | " + _cells(chosen, stat, floor, margin) + " |")


def _cells(rows: list[dict[str, Any]], stat: str, floor: float, margin: float) -> str:
    judged = [r for r in rows if r[stat] is not None]
    clean = [r[stat] for r in judged if not r["noisy"]]
    noisy = [r[stat] for r in judged if r["noisy"]]
    per_round: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in judged:
        per_round[(r["run"], r["round"])].append(r)
    scores = [
        auroc([r[stat] for r in g if r["noisy"]], [r[stat] for r in g if not r["noisy"]])
        for g in per_round.values()
        if any(r["noisy"] for r in g) and not all(r["noisy"] for r in g)
    ]
    alarms = sorted(
        {key for key, g in per_round.items() if any(not r["noisy"] and r[stat] >= floor for r in g)}
    )
    first: dict[tuple[str, str], int | None] = {}
    start = {run: min(r["round"] for r in rows if r["run"] == run) for run, _ in per_round}
    for r in sorted((r for r in rows if r["noisy"]), key=lambda r: r["round"]):
        key = (r["run"], r["site"])
        first.setdefault(key, None)
        if first[key] is None and r[stat] is not None and r[stat] > margin:
            first[key] = r["round"] - start[r["run"]]
    firsts = ", ".join("-" if v is None else str(v) for v in first.values()) or "no noisy site"
    return " | ".join(
        [
            f"{len(judged)}",
            f"{max(clean):.1f}" if clean else "-",
            f"{min(noisy):.1f} / {np.median(noisy):.1f}" if noisy else "-",
            f"{np.mean(scores):.2f}" if scores else "-",
            f"{len(alarms)}" + (f" ({_alarm_rounds(alarms)})" if alarms else ""),
            firsts,
        ]
    )


def _alarm_rounds(alarms: list[tuple[str, int]]) -> str:
    shown = [f"{Path(run).name}:{index}" for run, index in alarms[:4]]
    return ", ".join(shown) + (", ..." if len(alarms) > 4 else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dirs", nargs="*", type=Path)
    parser.add_argument("--floor", type=float, default=10.0)
    parser.add_argument("--out", type=Path, help="write the per-site records (JSON lines)")
    parser.add_argument("--records", type=Path, nargs="*", default=[], help="read records")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for path in args.records:
        rows += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    for run_dir in args.run_dirs:
        rows += records(run_dir)
    if args.out is not None:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    if not rows:
        raise SystemExit(__doc__)
    summarise(rows, args.floor)


if __name__ == "__main__":
    main()
