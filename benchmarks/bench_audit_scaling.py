"""How do detection and neighbor selection scale with the number of clients K?

Times, for K = 100, 1,000 and 10,000 clients on synthetic inputs (C = 10 classes, a probe of
P = 8 inputs):

* ``FedNoRoDetector.fit`` (per-class losses, 9 two-component GMM fits; 20% of the clients have a
  higher loss), the cache of its separation guard's null threshold cleared before each fit,
* ``FedNCLDetector.fit`` (divergence, train loss, sample counts),
* ``EvidenceDetector.fit``, the primary detector (per-class losses, their spreads and the error
  counts, with FedNoRo's fit of the same round as its mixture cross-check, as the pipeline passes
  it), followed by the update-geometry test on given cosines
  (:func:`service.audit.geometry_evidence.geometry_evidence`; the cosines themselves come from
  the round's pass over the updates, timed by ``bench_aggregation.py``),
* ``k_reliable_neighbors`` (FedRN, k = 2) exact (``chunk_size=None``: every K x K block at once),
  chunked (``--chunk-size`` targets at a time), and "auto": the chunk size the coordinator's
  audit pipeline picks when none is configured (exact up to
  ``service.audit.pipeline.EXACT_NEIGHBOR_LIMIT`` candidates, then chunks of
  ``AUTO_NEIGHBOR_CHUNK_ENTRIES // K`` rows; at or below the limit it is the exact call, whose
  figures it repeats).

Per size, ``detection_and_neighbors`` adds up the medians of FedNoRo's fit, Fed-NCL's fit, the
evidence fit and the automatic neighbor search: what a round close spends on them (issue 18's
budget at K = 10,000: 2 s).

Every time is reported as a multiple of a reference op measured just before and just after it in
the same run (a ``--ref-n`` x ``--ref-n`` float64 numpy matmul on one BLAS thread, 5 calls per
slot; the subject is divided by the mean of its two neighbouring slots), and as scaling exponents
(the slope of log time against log K, fitted on the reference multiples so a change of load
between sizes cancels). Peak memory of one call of each (``tracemalloc``: numpy allocations
included) is measured in a separate, untimed pass. The exact search is run at a size only when
the bytes per K^2 measured at the previous size predict a peak under ``--exact-limit-gib``
(default 2 GiB: the exact search at K = 10,000 needs about 4 GiB, too much to take by default on
a shared machine); otherwise the result says it was skipped and gives the prediction.
``--exact-limit-gib 8`` measures it (about a minute more on a 2-core machine).

    .venv/bin/python benchmarks/bench_audit_scaling.py --out runs/bench_audit_scaling.json
    .venv/bin/python benchmarks/bench_audit_scaling.py --quick --out runs/scaling.json
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import (
    benchmark_parser,
    bracketed,
    machine_info,
    median,
    paired_ratio,
    scaling_exponent,
    traced_peak,
    write_result,
)
from numpy.typing import NDArray
from threadpoolctl import threadpool_limits

from service.audit import EvidenceDetector, FedNCLDetector, FedNoRoDetector, k_reliable_neighbors
from service.audit.detectors import separation
from service.audit.geometry_evidence import geometry_evidence
from service.audit.pipeline import AUTO_NEIGHBOR_CHUNK_ENTRIES, EXACT_NEIGHBOR_LIMIT

NUM_CLASSES = 10
PROBE_SIZE = 8
REF_CALLS = 5
SUBJECTS = (
    "fednoro_fit",
    "fedncl_fit",
    "evidence_fit",
    "neighbors_exact",
    "neighbors_chunked",
    "neighbors_auto",
)


def auto_chunk_size(k: int) -> int | None:
    """The chunk size the audit pipeline uses for K candidates when none is configured."""
    if k <= EXACT_NEIGHBOR_LIMIT:
        return None
    return max(1, AUTO_NEIGHBOR_CHUNK_ENTRIES // k)


def synthetic_inputs(k: int, seed: int) -> dict[str, NDArray[Any]]:
    """Per-client signals of a round with K clients, 20% of them noisy."""
    rng = np.random.default_rng(seed)
    noisy = np.zeros(k, dtype=bool)
    noisy[: k // 5] = True
    counts = rng.integers(5, 200, size=(k, NUM_CLASSES))
    loss = rng.uniform(0.2, 0.6, size=(k, NUM_CLASSES))
    loss[noisy] += rng.uniform(0.5, 1.5, size=(int(noisy.sum()), NUM_CLASSES))
    error_rate = np.clip(loss / 4.0, 0.0, 1.0)
    logits = rng.standard_normal((k, PROBE_SIZE, NUM_CLASSES)) * 2.0
    probes = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probes /= probes.sum(axis=-1, keepdims=True)
    errors = rng.binomial(counts, error_rate)
    return {
        "per_class_loss": loss,
        "class_counts": counts,
        "num_samples": counts.sum(axis=1),
        "train_loss": (loss * counts).sum(axis=1) / counts.sum(axis=1),
        "divergence": rng.uniform(0.5, 1.5, size=k) * np.where(noisy, 2.0, 1.0),
        "train_accuracy": np.where(noisy, 0.6, 0.9) + rng.uniform(-0.05, 0.05, size=k),
        "probes": probes,
        "per_class_loss_sd": rng.uniform(0.3, 0.8, size=(k, NUM_CLASSES)),
        "per_class_errors": errors,
        # a clean site's errors a quarter confident, a noisy site's labels' errors mostly
        "per_class_confident_errors": rng.binomial(errors, np.where(noisy, 0.8, 0.25)[:, None]),
        "cosines": rng.normal(0.5, 0.05, size=k) - np.where(noisy, 0.3, 0.0),
    }


def subjects_for(
    data: dict[str, NDArray[Any]], *, exact: bool, chunk_size: int, auto_chunk: int | None
) -> dict[str, Callable[[], object]]:
    """The timed calls on one size's inputs, in ``SUBJECTS`` order (exact and auto optional)."""

    def fednoro() -> object:
        # The separation guard's null threshold is cached per (K, flagged count); a
        # coordinator meets a new pair whenever the flagged count changes, so each timed
        # fit pays for it, as the first fit of such a round does.
        clear = getattr(separation.null_separation_threshold, "cache_clear", None)
        if clear is not None:
            clear()
        return FedNoRoDetector().fit(data["per_class_loss"], data["class_counts"])

    def fedncl() -> object:
        return FedNCLDetector().fit(data["divergence"], data["train_loss"], data["num_samples"])

    mixture = FedNoRoDetector().fit(data["per_class_loss"], data["class_counts"]).result_

    def evidence() -> object:
        result = EvidenceDetector().fit(
            data["per_class_loss"],
            data["class_counts"],
            data["per_class_loss_sd"],
            mixture=mixture,
            per_class_errors=data["per_class_errors"],
            per_class_confident_errors=data["per_class_confident_errors"],
        )
        counts, sizes = data["class_counts"], data["num_samples"]
        return result, geometry_evidence(data["cosines"], counts, sizes, q=0.01)

    def neighbors(chunk: int | None) -> Callable[[], object]:
        return lambda: k_reliable_neighbors(
            data["probes"], data["train_accuracy"], chunk_size=chunk
        )

    subjects: dict[str, Callable[[], object]] = {
        "fednoro_fit": fednoro,
        "fedncl_fit": fedncl,
        "evidence_fit": evidence,
    }
    if exact:
        subjects["neighbors_exact"] = neighbors(None)
    subjects["neighbors_chunked"] = neighbors(chunk_size)
    if auto_chunk is not None:
        subjects["neighbors_auto"] = neighbors(auto_chunk)
    return subjects


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; return (and write) the result."""
    parser = benchmark_parser(__doc__)
    parser.add_argument("--sizes", default="100,1000,10000", help="comma-separated K values")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats for K < 10,000")
    parser.add_argument(
        "--large-repeats", type=int, default=1, help="timed repeats for K >= 10,000"
    )
    parser.add_argument("--chunk-size", type=int, default=256)
    parser.add_argument("--ref-n", type=int, default=768, help="size of the reference matmul")
    parser.add_argument(
        "--exact-limit-gib",
        type=float,
        default=2.0,
        help="skip the exact neighbor search where its predicted peak exceeds this (GiB)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: K = 20, 60; 1 repeat")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.repeats, args.large_repeats, args.ref_n = "20,60", 1, 1, 128
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]

    ref_rng = np.random.default_rng(99)
    a = ref_rng.standard_normal((args.ref_n, args.ref_n))
    b = ref_rng.standard_normal((args.ref_n, args.ref_n))

    def reference() -> None:
        # One BLAS thread, like the subjects (elementwise numpy; FedNoRo pins its GMM fits to
        # one thread): a two-thread reference would suffer more from a neighbour on the other
        # core than the subjects do. Several calls per slot smooth out a scheduler hiccup.
        with threadpool_limits(limits=1):
            for _ in range(REF_CALLS):
                np.matmul(a, b)

    per_size: dict[str, dict[str, Any]] = {}
    bytes_per_k2: float | None = None
    for k in sizes:
        data = synthetic_inputs(k, seed=k)
        predicted = None if bytes_per_k2 is None else bytes_per_k2 * k * k
        exact_skipped: str | None = None
        if predicted is not None and predicted > args.exact_limit_gib * 2**30:
            exact_skipped = (
                f"predicted peak {predicted / 2**30:.1f} GiB (from {bytes_per_k2:.1f} bytes per "
                f"K^2 at the previous size) exceeds --exact-limit-gib {args.exact_limit_gib}"
            )
        auto = auto_chunk_size(k)
        subjects = subjects_for(
            data, exact=exact_skipped is None, chunk_size=args.chunk_size, auto_chunk=auto
        )

        # Memory first (untimed, one call each); for the small sizes it is also a warm-up.
        gc.collect()
        peaks: dict[str, int] = {}
        for name, fn in subjects.items():
            peaks[name] = traced_peak(fn)
            gc.collect()
        if "neighbors_exact" in peaks:
            bytes_per_k2 = peaks["neighbors_exact"] / (k * k)
        large = k >= 10_000
        times, brackets, references = bracketed(
            subjects, reference, args.large_repeats if large else args.repeats
        )
        references = [t / REF_CALLS for t in references]

        entry: dict[str, Any] = {
            "reference_seconds": references,
            "subjects": {},
        }
        for name in SUBJECTS:
            if name not in times:
                continue
            entry["subjects"][name] = {
                "seconds": times[name],
                "predicted_peak_bytes": predicted if name == "neighbors_exact" else None,
                "median_seconds": median(times[name]),
                "reference_multiples": paired_ratio(
                    times[name], [t / REF_CALLS for t in brackets[name]]
                ),
                "peak_traced_bytes": peaks[name],
            }
        if exact_skipped is not None:
            entry["subjects"]["neighbors_exact"] = {
                "skipped": exact_skipped,
                "predicted_peak_bytes": predicted,
            }
        if auto is None and "neighbors_exact" in times:
            entry["subjects"]["neighbors_auto"] = {
                **entry["subjects"]["neighbors_exact"],
                "same_call_as": "neighbors_exact",
            }
        entry["auto_chunk_size"] = auto
        # What a round close spends on detection and neighbors: every detector the pipeline
        # runs for the primary (FedNoRo's fit is the evidence's mixture cross-check) and the
        # neighbor search it picks by itself.
        parts = ("fednoro_fit", "fedncl_fit", "evidence_fit", "neighbors_auto")
        entry["detection_and_neighbors"] = {
            "parts": list(parts),
            "median_seconds": sum(entry["subjects"][p]["median_seconds"] for p in parts),
            "reference_multiples": sum(entry["subjects"][p]["reference_multiples"] for p in parts),
        }
        per_size[str(k)] = entry
        print(
            f"K={k}: reference op {median(references) * 1e3:.1f} ms "
            f"(min {min(references) * 1e3:.1f}, max {max(references) * 1e3:.1f})"
        )
        total = entry["detection_and_neighbors"]
        print(
            f"  {'detection+neighbors':<18} {total['median_seconds']:9.4f} s = "
            f"{total['reference_multiples']:9.2f} x ref (sum of the four parts' medians)"
        )
        for name, values in entry["subjects"].items():
            if "skipped" in values:
                print(f"  {name:<18} skipped: {values['skipped']}")
                continue
            print(
                f"  {name:<18} {values['median_seconds']:9.4f} s = "
                f"{values['reference_multiples']:9.2f} x ref, peak "
                f"{values['peak_traced_bytes'] / 2**20:8.1f} MiB"
            )
        del data, subjects

    exponents: dict[str, Any] = {}
    for name in SUBJECTS:
        points = [
            (k, per_size[str(k)]["subjects"][name]["reference_multiples"])
            for k in sizes
            if "reference_multiples" in per_size[str(k)]["subjects"].get(name, {})
        ]
        pairwise = [
            {
                "from": k0,
                "to": k1,
                "exponent": scaling_exponent([k0, k1], [r0, r1]),
            }
            for (k0, r0), (k1, r1) in zip(points, points[1:], strict=False)
        ]
        exponents[name] = {
            "fit": scaling_exponent([p[0] for p in points], [p[1] for p in points]),
            "pairwise": pairwise,
            "sizes": [p[0] for p in points],
        }
    result: dict[str, Any] = {
        "benchmark": "audit_scaling",
        "machine": machine_info(),
        "parameters": {
            "sizes": sizes,
            "num_classes": NUM_CLASSES,
            "probe_size": PROBE_SIZE,
            "k_neighbors": 2,
            "chunk_size": args.chunk_size,
            "exact_neighbor_limit": EXACT_NEIGHBOR_LIMIT,
            "auto_neighbor_chunk_entries": AUTO_NEIGHBOR_CHUNK_ENTRIES,
            "repeats": args.repeats,
            "large_repeats": args.large_repeats,
            "reference": (
                f"np.matmul of two {args.ref_n}x{args.ref_n} float64 matrices, one BLAS thread, "
                f"mean of {REF_CALLS} calls per slot"
            ),
            "exact_limit_gib": args.exact_limit_gib,
            "quick": args.quick,
        },
        "sizes": per_size,
        "scaling_exponents": exponents,
        "notes": [
            "reference_multiples = median over repeats of subject seconds / the mean of the "
            "reference runs just before and after it",
            "exponent: slope of log(reference multiples) on log(K)",
            "FedNoRoDetector limits BLAS/OpenMP to one thread for its GMM fits",
        ],
    }
    print("scaling exponents (time ~ K^e):")
    for name, values in exponents.items():
        steps = ", ".join(
            f"{p['from']}->{p['to']}: {p['exponent']:.2f}"
            for p in values["pairwise"]
            if p["exponent"] is not None
        )
        fit = values["fit"]
        print(f"  {name:<18} fit {'n/a' if fit is None else f'{fit:.2f}'} ({steps})")
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
