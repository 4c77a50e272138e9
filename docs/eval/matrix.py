"""The stress matrix of issue 17: every scenario of ``docs/eval/matrix/`` x seed, one table.

Each scenario file runs the configured method (``fednoro``) against ``fedavg`` on identical data
(its ``methods``). For every scenario and seed this script runs ``fedaudit simulate`` as a
subprocess (``--no-plots --no-progress --no-keep-coordinator-data``; ``--keep-coordinator-data``
keeps the databases, for ``docs/eval/evidence_whatif.py``) into
``OUT/<scenario>/seed<S>/``, skips the runs already finished (a ``results.json`` there), and then
writes ``OUT/matrix.md`` (the tables and what each number means) and ``OUT/matrix.json`` (the
same numbers, per seed too). Every figure is read from the simulator's own outputs: the run
summaries of ``results.json`` (``fedaudit_sim.summaries.summarise_run``) and, for the
primary detector's status per round (``inconclusive``), the per-run JSON beside it. Nothing about
detection is recomputed here; the script only averages over seeds and compares with the targets.

With ``--clean-reference`` it also runs FedAvg on each noisy scenario's partition with every
label clean (``--noise none --method fedavg``, same seed: the partition and the initial model
come from independent streams of the seed, so they are identical) into ``seed<S>-clean/``; the
table then says from that run whether FedAvg suffers from the noise.

Usage (from the repository root; outputs under ``--out``)::

    .venv/bin/python docs/eval/matrix.py --rounds 40 --seeds 0 1 2 --out runs/matrix-r40 --jobs 1
    .venv/bin/python docs/eval/matrix.py --seeds 0 --out runs/matrix-r40 --only m07-wine-5-sym
    .venv/bin/python docs/eval/matrix.py --seeds 0 1 2 --out runs/matrix-r40 --table-only

The file-based data sets (PneumoniaMNIST, BreastMNIST, MNIST) are read from ``../shared/data``
beside the repository, or from ``FEDAUDIT_DATASETS_DIR`` (inherited by the subprocesses), or from
``--datasets-dir``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCENARIO_DIR = Path(__file__).resolve().parent / "matrix"

CONFIGURED = "fednoro"
BASELINE = "fedavg"
#: Class-imbalanced binary image sets: their accuracy column is the balanced accuracy, as on the
#: rest of docs/evaluation.md.
BALANCED_DATASETS = frozenset({"pneumoniamnist", "breastmnist"})

F1_TARGET = 0.95
FIRST_DETECTION_ROUNDS = 5
HARM_POINTS = 1.0
GAIN_POINTS = 5.0
#: FedAvg "suffers from the noise" when the noise costs it at least this many points.
SUFFERS_POINTS = 3.0


# ------------------------------------------------------------------------------------------------
# running


@dataclass(frozen=True)
class Job:
    """One ``fedaudit simulate`` call: a scenario, a seed, noisy (the scenario) or clean."""

    name: str
    scenario: Path
    seed: int
    clean: bool

    def directory(self, out: Path) -> Path:
        return out / self.name / (f"seed{self.seed}-clean" if self.clean else f"seed{self.seed}")


def scenario_files(directory: Path, only: Sequence[str] | None) -> list[Path]:
    """The scenario files of ``directory`` (sorted), restricted to ``only`` (file stems)."""
    files = sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml", ".json"))
    if only:
        known = {p.stem for p in files}
        unknown = sorted(set(only) - known)
        if unknown:
            raise SystemExit(f"unknown scenario(s) {unknown}; known: {sorted(known)}")
        files = [p for p in files if p.stem in only]
    return files


def _is_clean(path: Path) -> bool:
    """Does the scenario file inject no noise?"""
    import yaml

    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return bool((data.get("noise") or {}).get("protocol", "none") == "none")


def is_finished(directory: Path) -> bool:
    """A run is finished once the simulator wrote its ``results.json`` (its last output)."""
    return (directory / "results.json").is_file()


def simulate_command(
    fedaudit: str,
    job: Job,
    rounds: int,
    out: Path,
    datasets_dir: str | None,
    keep_data: bool = False,
) -> list[str]:
    """The ``fedaudit simulate`` arguments of ``job``."""
    command = [
        fedaudit, "simulate",
        "--scenario", str(job.scenario),
        "--rounds", str(rounds),
        "--seeds", str(job.seed),
        "--out", str(job.directory(out)),
        "--no-plots", "--no-progress",
    ]  # fmt: skip
    if not keep_data:
        command.append("--no-keep-coordinator-data")
    if job.clean:
        command += ["--noise", "none", "--method", BASELINE]
    if datasets_dir:
        command += ["--datasets-dir", datasets_dir]
    return command


def run_job(command: list[str], directory: Path) -> tuple[int, float]:
    """Run one simulation (a partial directory from an interrupted run is removed first)."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    log = directory.parent / f"{directory.name}.log"
    start = time.monotonic()
    with log.open("w", encoding="utf-8") as handle:
        rc = subprocess.call(command, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT)
    wall = time.monotonic() - start
    meta = {
        "command": shlex.join(command),
        "rc": rc,
        "wall_seconds": round(wall, 1),
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    (directory.parent / f"{directory.name}.meta.json").write_text(
        json.dumps(meta, indent=1) + "\n", encoding="utf-8"
    )
    return rc, wall


# ------------------------------------------------------------------------------------------------
# reading one seed


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def _load_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _summary(results: dict[str, Any], label: str) -> dict[str, Any] | None:
    for run in results.get("runs", []):
        if run.get("label") == label:
            return dict(run)
    return None


def _primary_statuses(directory: Path, label: str, seed: int) -> list[tuple[int, str | None]]:
    """(round, the primary detector's status) per round, from the per-run JSON."""
    path = directory / "runs" / f"{label}_seed{seed}.json"
    if not path.is_file():
        return []
    run = _load_json(path)
    statuses = []
    for record in run.get("rounds", []):
        primary = record.get("primary") or ""
        statuses.append((int(record["index"]), (record.get("detector_status") or {}).get(primary)))
    return statuses


def _accuracy(summary: dict[str, Any], balanced: bool) -> dict[str, float]:
    curve = summary["balanced_accuracy" if balanced else "accuracy"]
    return {"last10": float(curve["last10"]), "best": float(curve["best"])}


def read_seed(
    directory: Path, seed: int, balanced: bool, clean_directory: Path | None = None
) -> dict[str, Any]:
    """What the table needs from one finished seed of a scenario (see ``build_table``)."""
    results = _load_json(directory / "results.json")
    seed_row: dict[str, Any] = {"seed": seed, "failures": results.get("failures") or []}
    method = _summary(results, CONFIGURED)
    baseline = _summary(results, BASELINE)
    if method is None or baseline is None:
        missing = [x for x, s in ((CONFIGURED, method), (BASELINE, baseline)) if s is None]
        seed_row["missing"] = missing
        return seed_row
    warmup = int(method["warmup_rounds"])
    after = [r for r in method["detection_per_round"] if r["round"] >= warmup]
    statuses = [s for r, s in _primary_statuses(directory, CONFIGURED, seed) if r >= warmup]
    first = method["first_detection"]
    worst = method["false_alarms"]["worst_round"]
    acc_method = _accuracy(method, balanced)
    acc_base = _accuracy(baseline, balanced)
    seed_row.update(
        {
            "sites": int(method["clients"]),
            "noisy": int(method["true_noisy"]),
            "warmup_rounds": warmup,
            "rounds": int(method["rounds"]),
            "rounds_after_warmup": int(method["after_warmup"]["rounds"]),
            "primary_detector": method["primary_detector"],
            "f1_last": method["final"]["f1"],
            "f1_mean": method["after_warmup"]["f1"],
            "f1_rounds": method["after_warmup"]["f1_rounds"],
            "false_flag_rounds": int(method["false_alarms"]["rounds_with_false_flags"]),
            "first_false_flag_round": method["false_alarms"]["first_false_flag_round"],
            "worst_false_flag_round": worst,
            "flagged_rounds": sum(1 for r in after if r["flagged"]),
            "inconclusive_rounds": sum(1 for s in statuses if s == "inconclusive"),
            "last_inconclusive": bool(statuses) and statuses[-1] == "inconclusive",
            "undetermined_rounds": int(method["after_warmup"]["rounds_primary_undetermined"]),
            "detected": int(first["detected"]),
            "first_detection_delay": (None if first["max"] is None else int(first["max"]) - warmup),
            "accuracy": acc_method["last10"],
            "fedavg_accuracy": acc_base["last10"],
            "fedavg_best": acc_base["best"],
            "difference_points": 100.0 * (acc_method["last10"] - acc_base["last10"]),
            "wall_seconds": sum(
                float(s.get("wall_seconds") or 0.0) for s in results.get("runs", [])
            ),
        }
    )
    if clean_directory is not None and is_finished(clean_directory):
        clean = _summary(_load_json(clean_directory / "results.json"), BASELINE)
        if clean is not None:
            seed_row["fedavg_clean_accuracy"] = _accuracy(clean, balanced)["last10"]
    return seed_row


# ------------------------------------------------------------------------------------------------
# the table


def _kind(seeds: list[dict[str, Any]]) -> str:
    """clean (no noisy site in any seed), minority (noisy < half the sites in every seed), else
    majority (the consensus is corrupted)."""
    if all(s["noisy"] == 0 for s in seeds):
        return "clean"
    if all(2 * s["noisy"] < s["sites"] for s in seeds):
        return "minority"
    return "majority"


def _suffers(seeds: list[dict[str, Any]]) -> tuple[bool | None, str]:
    """Does the noise cost FedAvg at least SUFFERS_POINTS points? (answer, basis).

    Measured on the seeds that have a clean FedAvg run, else estimated from FedAvg's fall from
    its best round (see LEGEND).
    """
    measured = [s for s in seeds if "fedavg_clean_accuracy" in s]
    if measured:
        cost = _mean(
            [100.0 * (s["fedavg_clean_accuracy"] - s["fedavg_accuracy"]) for s in measured]
        )
        assert cost is not None
        which = ",".join(str(s["seed"]) for s in measured)
        return cost >= SUFFERS_POINTS, f"clean FedAvg − FedAvg: {cost:.1f} pts, seeds {which}"
    drop = _mean([100.0 * (s["fedavg_best"] - s["fedavg_accuracy"]) for s in seeds])
    assert drop is not None
    return drop >= SUFFERS_POINTS, f"estimate, best − last 10 %: {drop:.1f} pts"


def scenario_row(name: str, dataset: str, seeds: list[dict[str, Any]]) -> dict[str, Any]:
    """Average one scenario's finished seeds and judge the targets (``None``: not applicable)."""
    failed = [s for s in seeds if s.get("failures") or s.get("missing")]
    done = [s for s in seeds if "sites" in s]
    row: dict[str, Any] = {
        "scenario": name,
        "dataset": dataset,
        "seeds": [s["seed"] for s in done],
        "failed_seeds": [
            {"seed": s["seed"], "failures": s.get("failures"), "missing": s.get("missing")}
            for s in failed
        ],
        "per_seed": seeds,
    }
    if not done:
        return row
    kind = _kind(done)
    f1_last = [s["f1_last"] for s in done]
    f1_mean = [s["f1_mean"] for s in done]
    delays = [s["first_detection_delay"] for s in done]
    noisy_total = sum(s["noisy"] for s in done)
    detected_total = sum(s["detected"] for s in done)
    differences = [s["difference_points"] for s in done]
    worst = [(s["seed"], s["worst_false_flag_round"]) for s in done if s["worst_false_flag_round"]]
    suffers, suffers_basis = _suffers(done) if kind != "clean" else (False, "clean federation")
    difference = _mean(differences)
    assert difference is not None
    row.update(
        {
            "kind": kind,
            "sites": done[0]["sites"],
            "noisy": sorted({s["noisy"] for s in done}),
            "warmup_rounds": done[0]["warmup_rounds"],
            "rounds": done[0]["rounds"],
            "f1_last": _mean(f1_last),
            "f1_last_min": min((v for v in f1_last if v is not None), default=None),
            "f1_mean": _mean(f1_mean),
            "f1_mean_min": min((v for v in f1_mean if v is not None), default=None),
            "f1_undefined_seeds": sum(1 for v in f1_last if v is None),
            "false_flag_rounds": sum(s["false_flag_rounds"] for s in done),
            "flagged_rounds": sum(s["flagged_rounds"] for s in done),
            "rounds_after_warmup": sum(s["rounds_after_warmup"] for s in done),
            "inconclusive_rounds": sum(s["inconclusive_rounds"] for s in done),
            "undetermined_rounds": sum(s["undetermined_rounds"] for s in done),
            "worst_false_flag": [
                {"seed": seed, "round": w["round"], "sites": w["sites"]} for seed, w in worst
            ],
            "detected": detected_total,
            "noisy_total": noisy_total,
            "first_detection_max": max((d for d in delays if d is not None), default=None),
            "accuracy": _mean([s["accuracy"] for s in done]),
            "fedavg_accuracy": _mean([s["fedavg_accuracy"] for s in done]),
            "difference_points": difference,
            "seeds_ahead": sum(1 for d in differences if d > 0),
            "fedavg_suffers": suffers,
            "fedavg_suffers_basis": suffers_basis,
            "wall_seconds": _mean([s["wall_seconds"] for s in done]),
        }
    )
    minority = kind == "minority"
    row["targets"] = {
        "f1": (
            (row["f1_last_min"] or 0.0) >= F1_TARGET and (row["f1_mean_min"] or 0.0) >= F1_TARGET
            if minority
            else None
        ),
        "first_detection": (
            detected_total == noisy_total
            and row["first_detection_max"] is not None
            and row["first_detection_max"] <= FIRST_DETECTION_ROUNDS
            if minority
            else None
        ),
        "clean_no_flag": row["flagged_rounds"] == 0 if kind == "clean" else None,
        "corrupted_abstains": (
            row["flagged_rounds"] == 0 and all(s["last_inconclusive"] for s in done)
            if kind == "majority"
            else None
        ),
        "no_harm": difference >= -HARM_POINTS,
        "gain": difference >= GAIN_POINTS if suffers else None,
    }
    return row


def _f(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _yes(value: bool | None) -> str:
    return "—" if value is None else ("yes" if value else "**no**")


def _abstains(row: dict[str, Any]) -> str:
    """The corrupted-consensus target with its two parts."""
    verdict = _yes(row["targets"]["corrupted_abstains"])
    if row["targets"]["corrupted_abstains"] is None:
        return verdict
    last = sum(1 for s in row["per_seed"] if s.get("last_inconclusive"))
    return (
        f"{verdict} (rounds with a flag: {row['flagged_rounds']}; last round inconclusive in "
        f"{last} of {len(row['seeds'])} seeds)"
    )


def markdown(rows: list[dict[str, Any]], rounds: int, seeds: Sequence[int]) -> str:
    """The two tables (measurements, targets) and the legend, as Markdown."""
    lines = [
        f"Configured method `{CONFIGURED}` against `{BASELINE}`, {rounds} rounds, "
        f"seeds asked: {', '.join(str(s) for s in seeds)}.",
        "",
        "| scenario | sites / noisy | seeds | F1 last | F1 mean | false-flag rounds "
        "| inconclusive rounds | first detection | FedNoRo acc | FedAvg acc | Δ points |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        if not row["seeds"]:
            state = "failed" if row["failed_seeds"] else "not run"
            lines.append(f"| {row['scenario']} | | {state} | | | | | | | | |")
            continue
        noisy = "-".join(str(n) for n in (row["noisy"][0], row["noisy"][-1]))
        if len(row["noisy"]) == 1:
            noisy = str(row["noisy"][0])
        seeds_cell = ",".join(str(s) for s in row["seeds"])
        if row["failed_seeds"]:
            seeds_cell += " (failed: " + ",".join(str(f["seed"]) for f in row["failed_seeds"]) + ")"
        if row["kind"] == "clean":
            f1_last = f1_mean = "n/a (clean)"
            first = "n/a"
        else:
            f1_last, f1_mean = _f(row["f1_last"]), _f(row["f1_mean"])
            first = f"{row['detected']}/{row['noisy_total']}"
            if row["first_detection_max"] is not None:
                first += f", ≤ {row['first_detection_max']}"
        after = row["rounds_after_warmup"]
        lines.append(
            f"| {row['scenario']} | {row['sites']} / {noisy} | {seeds_cell} | {f1_last} "
            f"| {f1_mean} | {row['false_flag_rounds']} / {after} "
            f"| {row['inconclusive_rounds']} / {after} | {first} | {_f(row['accuracy'], 3)} "
            f"| {_f(row['fedavg_accuracy'], 3)} | {row['difference_points']:+.2f} "
            f"({row['seeds_ahead']}/{len(row['seeds'])}) |"
        )
    lines += [
        "",
        "| scenario | kind | F1 ≥ 0.95 | first ≤ 5 rounds | clean: no flag "
        "| corrupted: inconclusive, no flag | ≥ FedAvg − 1 | FedAvg suffers? | ≥ FedAvg + 5 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        if not row["seeds"]:
            continue
        t = row["targets"]
        lines.append(
            f"| {row['scenario']} | {row['kind']} | {_yes(t['f1'])} | {_yes(t['first_detection'])} "
            f"| {_yes(t['clean_no_flag'])} | {_abstains(row)} "
            f"| {_yes(t['no_harm'])} | {'yes' if row['fedavg_suffers'] else 'no'} "
            f"({row['fedavg_suffers_basis']}) | {_yes(t['gain'])} |"
        )
    lines += ["", LEGEND]
    return "\n".join(lines) + "\n"


LEGEND = f"""\
What the numbers mean (every figure is read from the simulator's `results.json` run summaries
and, for the status, its per-run JSON; "after warm-up" means rounds with index ≥ the
federation's resolved warm-up, rounds counted from 0):

- **sites / noisy**: sites in the federation / sites that are noisy in the ground truth (some
  label realised as flipped; a continuous protocol also needs a realised rate ≥ 0.1); a range
  when the seeds differ.
- **F1 last**: F1 of the primary detector's flags of the `{CONFIGURED}` federation against the
  ground truth in the last round, mean over the seeds. **F1 mean**: the simulator's mean of the
  per-round F1 over the rounds after warm-up, then the mean over the seeds. A round without any
  flag has F1 0 (recall 0), a round the audit abstained in (`inconclusive`) too. F1 is undefined
  where no site is noisy: "n/a (clean)"; there the false-flag column tells the story.
- **false-flag rounds**: rounds after warm-up in which the primary detector flagged at least one
  clean site / rounds after warm-up, summed over the seeds.
- **inconclusive rounds**: rounds after warm-up whose primary detector status was
  `inconclusive` (the audit abstained, nobody flagged) / rounds after warm-up, summed over seeds.
- **first detection**: noisy sites flagged at least once after warm-up / noisy sites, summed over
  the seeds; "≤ n": the slowest of the detected sites was first flagged n rounds after the end of
  the warm-up (0 = the first round after it), the worst seed.
- **FedNoRo acc, FedAvg acc**: accuracy of the global model on the clean test split, mean of the
  last 10 % of rounds (balanced accuracy for PneumoniaMNIST and BreastMNIST), mean over seeds.
  **Δ points**: 100 × (FedNoRo − FedAvg), mean over seeds (seeds in which FedNoRo is ahead).
- **kind**: clean (no noisy site), minority (noisy sites fewer than half the sites in every
  seed), majority (otherwise: the consensus is corrupted).
- **Targets** (issue 17), "—" where a target does not apply to the row. F1 ≥ {F1_TARGET} at the
  last round and as the mean after warm-up, in every seed (minority rows); first detection:
  every noisy site flagged within {FIRST_DETECTION_ROUNDS} rounds after warm-up in every seed
  (minority rows); clean: no site flagged in any round after warm-up in any seed; corrupted:
  no site flagged in any round after warm-up and the last round `inconclusive`, in every seed;
  ≥ FedAvg − {HARM_POINTS:g}: Δ ≥ −{HARM_POINTS:g} point; ≥ FedAvg + {GAIN_POINTS:g}: Δ ≥
  {GAIN_POINTS:g} points where FedAvg suffers from the noise.
- **FedAvg suffers?**: the noise costs FedAvg ≥ {SUFFERS_POINTS:g} points (mean over seeds).
  Measured against FedAvg on the same partition and initial model with clean labels, on the
  seeds where that run exists (`--clean-reference`: "clean FedAvg − FedAvg"); otherwise only
  estimated by FedAvg's fall from its best round to its last 10 % of rounds ("estimate"), the
  memorisation of wrong labels, which misses a noise cost that lowers the whole curve and, in
  40 rounds, mostly has not set in yet.
"""


def build_table(
    out: Path, files: Sequence[Path], seeds: Sequence[int], rounds: int
) -> tuple[str, dict[str, Any]]:
    """Read every finished run under ``out`` and return (Markdown, JSON data)."""
    import yaml

    rows = []
    for path in files:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        dataset = str(data.get("dataset", "digits"))
        balanced = dataset in BALANCED_DATASETS
        per_seed = []
        for seed in seeds:
            directory = out / path.stem / f"seed{seed}"
            if is_finished(directory):
                clean = out / path.stem / f"seed{seed}-clean"
                per_seed.append(read_seed(directory, seed, balanced, clean))
        rows.append(scenario_row(path.stem, dataset, per_seed))
    data = {
        "rounds": rounds,
        "seeds": list(seeds),
        "configured": CONFIGURED,
        "baseline": BASELINE,
        "rows": rows,
    }
    return markdown(rows, rounds, seeds), data


# ------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("runs/matrix-r40"))
    parser.add_argument("--jobs", type=int, default=1, help="simulations at a time")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="scenario file stems")
    parser.add_argument("--table-only", action="store_true", help="rebuild the table, run nothing")
    parser.add_argument("--clean-reference", action="store_true", help="also run clean FedAvg")
    parser.add_argument("--scenarios", type=Path, default=SCENARIO_DIR)
    parser.add_argument("--datasets-dir", help="passed on to fedaudit simulate")
    parser.add_argument(
        "--keep-coordinator-data",
        action="store_true",
        help="keep each run's coordinator database (the sites' signals, for the what-if replays "
        "of docs/eval/evidence_whatif.py; about 10-100 MB a run)",
    )
    parser.add_argument(
        "--fedaudit", default=str(Path(sys.executable).parent / "fedaudit"), help="the CLI"
    )
    args = parser.parse_args(argv)
    out = args.out.resolve()
    files = [p.resolve() for p in scenario_files(args.scenarios, args.only)]
    if not args.table_only:
        jobs = [
            Job(p.stem, p, seed, clean)
            for seed in args.seeds
            for p in files
            for clean in ((False, True) if args.clean_reference else (False,))
            if not (clean and _is_clean(p))  # a clean scenario is its own reference
        ]
        todo = [j for j in jobs if not is_finished(j.directory(out))]
        print(f"{len(jobs) - len(todo)} of {len(jobs)} runs already finished", flush=True)

        def work(job: Job) -> None:
            command = simulate_command(
                args.fedaudit, job, args.rounds, out, args.datasets_dir, args.keep_coordinator_data
            )
            rc, wall = run_job(command, job.directory(out))
            tag = "clean " if job.clean else ""
            print(f"{job.name} {tag}seed {job.seed}: rc {rc}, {wall:.0f} s", flush=True)

        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            list(pool.map(work, todo))
    text, data = build_table(out, files, args.seeds, args.rounds)
    out.mkdir(parents=True, exist_ok=True)
    (out / "matrix.md").write_text(text, encoding="utf-8")
    (out / "matrix.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
