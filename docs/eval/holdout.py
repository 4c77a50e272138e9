"""Held-out scenarios: federations drawn at random, never used to tune the audit.

The stress matrix (``docs/eval/matrix/``) is the audit's own reference, and every change since
was judged on it; an independent evaluator will try federations it has never seen. This script
draws ``--count`` scenarios from a wider space with a fixed ``--draw`` seed, writes them as
scenario files under ``OUT/scenarios/``, and runs them through ``docs/eval/matrix.py`` (the same
runs, the same table, the same targets) into ``OUT``. A draw seed that has been looked at is
spent: judge a change on a new one.

What is drawn (each uniformly unless said):

- data set and number of sites within what the data set holds (about 30 samples a site or
  more): wine 5-6, breast_cancer 5-15, BreastMNIST 5-10, digits 5-60, PneumoniaMNIST 5-30, the
  MNIST test set 8-30 (small CNN);
- partition: IID, Dirichlet(0.1 / 0.3 / 1.0), 2 classes per site (multi-class sets only),
  log-normal quantity skew (sigma 1.0), Bernoulli-Dirichlet;
- noise: a clean control with probability 0.3; otherwise a minority of noisy sites (exactly one,
  about a fifth, or just under half), rates drawn from U(0.1, 0.3), U(0.3, 0.5) or U(0.5, 0.8),
  and a flip: symmetric, pair flip, or an asymmetric map of a few random classes (multi-class
  sets only; binary sets flip symmetrically);
- the method ``fednoro`` against ``fedavg`` on identical data, as in the matrix.

Usage (from the repository root)::

    .venv/bin/python docs/eval/holdout.py --draw 1 --count 16 --rounds 40 --seeds 0 1 \\
        --out runs/holdout-d1 --jobs 1
    .venv/bin/python docs/eval/holdout.py --draw 1 --count 16 --out runs/holdout-d1 --list

Everything after the draw is ``matrix.py``'s: ``OUT/matrix.md`` holds the table.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import matrix  # noqa: E402

#: data set -> (classes, smallest and largest number of sites, model block or None)
DATASETS: dict[str, tuple[int, int, int, dict[str, Any] | None]] = {
    "wine": (3, 5, 6, None),
    "breast_cancer": (2, 5, 15, None),
    "breastmnist": (2, 5, 10, None),
    "digits": (10, 5, 60, None),
    "pneumoniamnist": (2, 5, 30, {"name": "cnn", "params": {"channels": [8, 16]}}),
    "mnist": (10, 8, 30, {"name": "cnn", "params": {"channels": [8, 16]}}),
}
RATES = [(0.1, 0.3), (0.3, 0.5), (0.5, 0.8)]
CLEAN_SHARE = 0.3


def _partition(rng: random.Random, classes: int) -> tuple[str, dict[str, Any]]:
    options: list[tuple[str, dict[str, Any]]] = [
        ("iid", {"method": "iid"}),
        ("dir01", {"method": "dirichlet", "params": {"beta": 0.1}}),
        ("dir03", {"method": "dirichlet", "params": {"beta": 0.3}}),
        ("dir1", {"method": "dirichlet", "params": {"beta": 1.0}}),
        ("qskew", {"method": "lognormal_quantity", "params": {"sigma": 1.0}}),
        ("bdir", {"method": "bernoulli_dirichlet", "params": {"p": 0.5, "alpha": 1.0}}),
    ]
    if classes > 2:
        options.append(("k2", {"method": "k_classes", "params": {"k": 2}}))
    return rng.choice(options)


def _noise(rng: random.Random, classes: int, sites: int) -> tuple[str, dict[str, Any]]:
    if rng.random() < CLEAN_SHARE:
        return "clean", {"protocol": "none"}
    most = (sites - 1) // 2
    noisy = rng.choice([1, max(1, round(sites / 5)), most])
    lo, hi = rng.choice(RATES)
    flips = ["symmetric", "pairflip", "asymmetric"] if classes > 2 else ["symmetric"]
    flip = rng.choice(flips)
    block: dict[str, Any] = {
        "protocol": "rho_range",
        "params": {"noisy_clients": noisy, "lo": lo, "hi": hi},
        "flip": flip,
    }
    if flip == "asymmetric":
        sources = rng.sample(range(classes), rng.randint(2, max(2, classes // 2)))
        block["class_map"] = {
            s: rng.choice([c for c in range(classes) if c != s]) for s in sorted(sources)
        }
    return f"{noisy}n-{flip[:4]}-{int(lo * 100)}-{int(hi * 100)}", block


def draw(seed: int, count: int) -> list[dict[str, Any]]:
    """``count`` scenario dicts (``fedaudit_sim.scenario`` format), the same for the same seed."""
    rng = random.Random(seed)
    scenarios = []
    for index in range(count):
        dataset = rng.choice(sorted(DATASETS))
        classes, fewest, most, model = DATASETS[dataset]
        sites = rng.randint(fewest, most)
        part_name, partition = _partition(rng, classes)
        noise_name, noise = _noise(rng, classes, sites)
        clean = "clean-" if noise["protocol"] == "none" else ""
        name = f"h{seed}-{index:02d}-{clean}{dataset}-{sites}-{part_name}"
        if not clean:
            name += f"-{noise_name}"
        scenario: dict[str, Any] = {
            "name": name,
            "dataset": dataset,
            "clients": sites,
            "partition": partition,
            "noise": noise,
            "methods": [{"method": matrix.CONFIGURED}, {"method": matrix.BASELINE}],
            "seeds": [0],
        }
        if model is not None:
            scenario["model"] = model
        scenarios.append(scenario)
    return scenarios


def write(scenarios: list[dict[str, Any]], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for scenario in scenarios:
        text = yaml.safe_dump(scenario, sort_keys=False, default_flow_style=None)
        (directory / f"{scenario['name']}.yaml").write_text(
            "# drawn by docs/eval/holdout.py\n" + text, encoding="utf-8"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draw", type=int, required=True, help="seed of the draw")
    parser.add_argument("--count", type=int, default=16)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--list", action="store_true", help="write and list, run nothing")
    args, rest = parser.parse_known_args(argv)
    if args.count < 1:
        parser.error("--count must be at least 1")
    scenarios = draw(args.draw, args.count)
    directory = args.out / "scenarios"
    write(scenarios, directory)
    for scenario in scenarios:
        print(scenario["name"])
    if args.list:
        return 0
    return matrix.main(["--scenarios", str(directory), "--out", str(args.out), *rest])


if __name__ == "__main__":
    raise SystemExit(main())
