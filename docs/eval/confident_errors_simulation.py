"""How often each count finds a noisy site: all errors against the confident ones.

A small FedAvg federation (an MLP of one hidden layer of 64 units, two local epochs of SGD per
round) on scikit-learn's digits or breast-cancer set; every round, before local training, each
site counts the global model's errors per given label and, for each threshold t, the errors
where the model gives the label a probability of at most t. The error-count test of
``service.audit.error_evidence`` (phi's floor 0.1, its other defaults) turns each kind of count
into p-values, and so does the share test of ``service.audit.confident_errors`` (the confident
share of the site's errors: "share t"), alone and combined by Bonferroni; Benjamini-Hochberg at
5 % flags on them.
Printed per scenario and rule: the share of (noisy site, round) pairs flagged over rounds 4-15
and 5 seeds, and the rounds in which a clean site was flagged.

This measures the counts alone (no loss evidence, no site-level test); the stress matrix
(``docs/eval/matrix.py``) measures the whole detector. Usage (about 6 minutes on 2 cores)::

    .venv/bin/python docs/eval/confident_errors_simulation.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_breast_cancer, load_digits
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from service.audit.confident_errors import share_evidence  # noqa: E402
from service.audit.error_evidence import error_evidence  # noqa: E402

THRESHOLDS = (0.2, 0.1, 0.05)
RULES = {
    "all errors": ["all"],
    "confident 0.2": [0.2],
    "confident 0.1": [0.1],
    "all + confident 0.1": ["all", 0.1],
    "share 0.1": ["share 0.1"],
    "share 0.2": ["share 0.2"],
    "share 0.05": ["share 0.05"],
    "all + share 0.1": ["all", "share 0.1"],
}
SCENARIOS = {
    "digits, 20 sites, Dir(0.5), 6 at 10-30 % symmetric": {
        "beta": 0.5,
        "n_noisy": 6,
        "lo": 0.1,
        "hi": 0.3,
    },
    "digits, 20 sites, Dir(0.1), 5 at 30-50 % pair flip": {
        "beta": 0.1,
        "n_noisy": 5,
        "lo": 0.3,
        "hi": 0.5,
        "flip": "pair",
    },
    "digits, 20 clean sites, Dir(0.5)": {"beta": 0.5, "n_noisy": 0},
    "digits, 20 clean sites, Dir(0.1)": {"beta": 0.1, "n_noisy": 0},
    "breast cancer, 10 sites, IID, 3 at 20-40 %": {
        "k": 10,
        "beta": 100.0,
        "n_noisy": 3,
        "lo": 0.2,
        "hi": 0.4,
        "data": "bc",
    },
    "breast cancer, 10 clean sites, Dir(1)": {"k": 10, "beta": 1.0, "n_noisy": 0, "data": "bc"},
}


def benjamini_hochberg(p: np.ndarray, q: float = 0.05) -> np.ndarray:
    order = np.argsort(p)
    ok = p[order] <= q * np.arange(1, p.size + 1) / p.size
    flags = np.zeros(p.size, dtype=bool)
    flags[order[: (np.flatnonzero(ok).max() + 1) if ok.any() else 0]] = True
    return flags


def _federation(seed: int, k: int, beta: float, data: str) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    if data == "digits":
        x, y = load_digits(return_X_y=True)
        x = x / 16.0
    else:
        x, y = load_breast_cancer(return_X_y=True)
        x = (x - x.mean(axis=0)) / x.std(axis=0)
    parts: list[list[int]] = [[] for _ in range(k)]
    for c in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == c))
        cuts = (np.cumsum(rng.dirichlet([beta] * k)) * members.size).astype(int)[:-1]
        for site, chunk in enumerate(np.split(members, cuts)):
            parts[site] += chunk.tolist()
    return x.astype(np.float32), y, np.array([np.array(p) for p in parts], dtype=object), rng


def run(seed: int, k=20, beta=0.5, n_noisy=6, lo=0.1, hi=0.3, flip="sym", data="digits"):
    """The p-values of each rule per round after the warm-up, and the noisy sites."""
    x, y, parts, rng = _federation(seed, k, beta, data)
    torch.manual_seed(seed)
    classes = int(y.max()) + 1
    noisy = np.zeros(k, dtype=bool)
    noisy[rng.choice(k, n_noisy, replace=False)] = True
    labels = []
    for site in range(k):
        given = y[parts[site]].copy()
        if noisy[site]:
            hit = rng.random(given.size) < rng.uniform(lo, hi)
            shift = rng.integers(1, classes, hit.sum()) if flip == "sym" else 1
            given[hit] = (given[hit] + shift) % classes
        labels.append(given)
    model = nn.Sequential(nn.Linear(x.shape[1], 64), nn.ReLU(), nn.Linear(64, classes))
    rounds = []
    for rnd in range(16):
        start = {name: v.clone() for name, v in model.state_dict().items()}
        counts = np.zeros((k, classes), dtype=np.int64)
        kinds = {key: np.zeros((k, classes), dtype=np.int64) for key in ("all", *THRESHOLDS)}
        states, sizes = [], []
        for site in range(k):
            xs, ys = torch.tensor(x[parts[site].astype(int)]), torch.tensor(labels[site])
            model.load_state_dict(start)
            with torch.no_grad():
                probs = torch.softmax(model(xs), dim=1)
            wrong = probs.argmax(dim=1) != ys
            p_label = probs[torch.arange(ys.numel()), ys]
            for c in range(classes):
                mine = ys == c
                counts[site, c] = int(mine.sum())
                kinds["all"][site, c] = int((wrong & mine).sum())
                for t in THRESHOLDS:
                    kinds[t][site, c] = int((wrong & mine & (p_label <= t)).sum())
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
            for _ in range(2):
                order = torch.randperm(ys.numel())
                for b in range(0, ys.numel(), 16):
                    batch = order[b : b + 16]
                    opt.zero_grad()
                    nn.functional.cross_entropy(model(xs[batch]), ys[batch]).backward()
                    opt.step()
            states.append({name: v.clone() for name, v in model.state_dict().items()})
            sizes.append(ys.numel())
        w = np.asarray(sizes) / sum(sizes)
        model.load_state_dict(
            {n: sum(wi * s[n] for wi, s in zip(w, states, strict=True)) for n in start}
        )
        if rnd >= 4:
            p: dict[object, np.ndarray] = {
                key: error_evidence(v, counts, min_dispersion=0.1).p_value
                for key, v in kinds.items()
            }
            for t in THRESHOLDS:
                p[f"share {t}"] = share_evidence(
                    kinds["all"], kinds[t], counts, reporting=np.ones(k, dtype=bool)
                ).p_value
            rounds.append(
                {
                    rule: np.minimum(1.0, len(keys) * np.min([p[key] for key in keys], axis=0))
                    for rule, keys in RULES.items()
                }
            )
    return rounds, noisy


def main() -> None:
    for name, options in SCENARIOS.items():
        found = dict.fromkeys(RULES, 0)
        false_rounds = dict.fromkeys(RULES, 0)
        pairs = 0
        for seed in range(5):
            rounds, noisy = run(seed, **options)
            for p in rounds:
                pairs += int(noisy.sum())
                for rule in RULES:
                    flags = benjamini_hochberg(p[rule])
                    found[rule] += int(flags[noisy].sum())
                    false_rounds[rule] += int(flags[~noisy].any())
        print(name)
        for rule in RULES:
            share = f"{found[rule] / pairs:.2f}" if pairs else "n/a"
            print(f"  {rule:28s} noisy found {share}, false-flag rounds {false_rounds[rule]}")


if __name__ == "__main__":
    main()
