"""The update's metadata, checked: the JSON part of an update upload (sample count, signals,
metrics, the state's sha256) against the federation it is sent to.

:func:`parse_metadata` reads the JSON (size, depth, an object); :func:`validate_signals` checks
every number against the federation (its classes, its probe size, the signals it requires) and
collects every problem, each with its location, before the update is refused
(:class:`~service.errors.UpdateRejectedError`, answered as RFC 9457 problem details).
"""

from __future__ import annotations

import json
import math
from typing import Any

from service.errors import UpdateRejectedError
from service.inputs import INT32_MAX, MAX_JSON_DEPTH, json_depth_exceeds, name_problem
from service.store.models import Federation

__all__ = [
    "MAX_METRICS",
    "PROBABILITY_TOLERANCE",
    "parse_metadata",
    "problem",
    "validate_signals",
]

PROBABILITY_TOLERANCE = 1e-3
MAX_METRICS = 64


def problem(loc: list[Any], msg: str) -> dict[str, Any]:
    """One problem of a refused update: where (``loc``) and what (``msg``)."""
    return {"loc": loc, "msg": msg}


def _check_per_class(
    errors: list[dict[str, Any]],
    name: str,
    values: Any,
    counts: list[int] | None,
    num_classes: int,
    *,
    counted: bool = False,
) -> None:
    """A per-class signal: one value per held class, null elsewhere. A finite non-negative
    number; with ``counted``, an integer from 0 to the class's count (``per_class_errors``)."""
    loc: list[str | int] = ["metadata", "signals", name]
    if not isinstance(values, list) or len(values) != num_classes:
        errors.append(problem(loc, f"must have {num_classes} entries"))
        return
    for c, value in enumerate(values):
        present = counts is not None and counts[c] > 0
        if value is None:
            if present:
                errors.append(problem([*loc, c], "null for a class the client holds"))
        elif counted and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            errors.append(problem([*loc, c], "must be a non-negative integer"))
        elif not counted and not (_finite(value) and value >= 0):
            errors.append(problem([*loc, c], "must be a finite non-negative number"))
        elif counts is not None and not present:
            errors.append(problem([*loc, c], "must be null for a class with no sample"))
        elif counted and counts is not None and value > counts[c]:
            errors.append(problem([*loc, c], f"exceeds the class's count {counts[c]}"))


def parse_metadata(raw: str | bytes) -> dict[str, Any]:
    too_deep = f"nested deeper than {MAX_JSON_DEPTH} levels"
    try:
        data = json.loads(raw)
    except RecursionError:
        raise UpdateRejectedError(
            f"metadata is {too_deep}", errors=[problem(["metadata"], too_deep)]
        ) from None
    except ValueError as exc:  # not JSON, not UTF-8, or an integer of more than 4300 digits
        raise UpdateRejectedError(
            f"metadata is not valid JSON: {exc}", errors=[problem(["metadata"], str(exc))]
        ) from None
    if json_depth_exceeds(data):
        raise UpdateRejectedError(
            f"metadata is {too_deep}", errors=[problem(["metadata"], too_deep)]
        )
    if not isinstance(data, dict):
        raise UpdateRejectedError(
            "metadata must be a JSON object", errors=[problem(["metadata"], "not an object")]
        )
    return data


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


_KNOWN_SIGNALS = frozenset(
    {
        "class_counts",
        "per_class_loss",
        "per_class_loss_sd",
        "per_class_errors",
        "train_loss",
        "train_accuracy",
        "probe_softmax",
        "centroids",
    }
)


def validate_signals(
    metadata: dict[str, Any], federation: Federation
) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """Check the metadata's numbers against the federation; return (n, signals, metrics).

    Every problem is collected (each with its location) before the update is refused, so that a
    site learns all of them at once.
    """
    errors: list[dict[str, Any]] = []
    n = metadata.get("num_samples")
    if not (isinstance(n, int) and not isinstance(n, bool) and 0 < n <= INT32_MAX):
        errors.append(
            problem(["metadata", "num_samples"], f"must be an integer from 1 to {INT32_MAX}")
        )
        n = None
    signals = metadata.get("signals")
    if not isinstance(signals, dict):
        errors.append(problem(["metadata", "signals"], "must be an object"))
        raise UpdateRejectedError("signals are missing", errors=errors)
    for key in sorted(set(signals) - _KNOWN_SIGNALS):
        errors.append(problem(["metadata", "signals", key], "unknown signal"))
    for key in federation.config["signals"]:
        if signals.get(key) is None:
            errors.append(problem(["metadata", "signals", key], "required by this federation"))
    counts = _check_class_counts(errors, signals, n, federation.num_classes)
    _check_per_class_signals(errors, signals, counts, federation.num_classes)
    _check_scalar_signals(errors, signals)
    _check_probe(errors, signals.get("probe_softmax"), federation)
    _check_centroids(errors, signals.get("centroids"), federation.num_classes)
    metrics = _checked_metrics(errors, metadata.get("metrics", {}))
    for key in sorted(set(metadata) - {"num_samples", "sha256", "signals", "metrics"}):
        errors.append(problem(["metadata", key], "unknown field"))
    if errors:
        raise UpdateRejectedError(
            f"the update's metadata is invalid ({len(errors)} problems; first: "
            f"{'.'.join(map(str, errors[0]['loc']))}: {errors[0]['msg']})",
            errors=errors,
        )
    assert n is not None
    clean = {k: v for k, v in signals.items() if v is not None}
    return n, clean, metrics


def _check_class_counts(
    errors: list[dict[str, Any]], signals: dict[str, Any], n: int | None, num_classes: int
) -> list[int] | None:
    """The class counts when they are valid (one integer per class, summing to ``n`` when that
    is valid); None otherwise, with the problem added to ``errors``."""
    counts: Any = signals.get("class_counts")
    counts_ok = (
        isinstance(counts, list)
        and len(counts) == num_classes
        and all(
            isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= INT32_MAX for c in counts
        )
    )
    if not counts_ok:
        errors.append(
            problem(
                ["metadata", "signals", "class_counts"],
                f"must be {num_classes} integers from 0 to {INT32_MAX}",
            )
        )
        return None
    if n is not None and sum(counts) != n:
        errors.append(
            problem(
                ["metadata", "signals", "class_counts"],
                f"sums to {sum(counts)} but num_samples is {n}",
            )
        )
    return list(counts)


def _check_per_class_signals(
    errors: list[dict[str, Any]],
    signals: dict[str, Any],
    counts: list[int] | None,
    num_classes: int,
) -> None:
    """per_class_loss, and its spread and error counts, which are sent with it only (the error
    counts integers up to the class's count)."""
    losses = signals.get("per_class_loss")
    if losses is not None:
        _check_per_class(errors, "per_class_loss", losses, counts, num_classes)
    for name, counted in (("per_class_loss_sd", False), ("per_class_errors", True)):
        values = signals.get(name)
        if values is None:
            continue
        if losses is None:
            errors.append(problem(["metadata", "signals", name], "sent without per_class_loss"))
        else:
            _check_per_class(errors, name, values, counts, num_classes, counted=counted)


def _check_scalar_signals(errors: list[dict[str, Any]], signals: dict[str, Any]) -> None:
    """train_loss (finite, >= 0) and train_accuracy (in [0, 1]), where sent."""
    train_loss = signals.get("train_loss")
    if train_loss is not None and not (_finite(train_loss) and train_loss >= 0):
        errors.append(
            problem(["metadata", "signals", "train_loss"], "must be a finite non-negative number")
        )
    accuracy = signals.get("train_accuracy")
    if accuracy is not None and not (_finite(accuracy) and 0.0 <= accuracy <= 1.0):
        errors.append(problem(["metadata", "signals", "train_accuracy"], "must be in [0, 1]"))


def _check_probe(errors: list[dict[str, Any]], probe: Any, federation: Federation) -> None:
    """probe_softmax, where sent: ``probe_size`` rows of one probability per class, each row
    summing to 1 (within ``PROBABILITY_TOLERANCE``)."""
    if probe is None:
        return
    num_classes = federation.num_classes
    loc = ["metadata", "signals", "probe_softmax"]
    size = int(federation.config["probe_size"])
    rows_ok = (
        isinstance(probe, list)
        and len(probe) == size
        and all(isinstance(r, list) and len(r) == num_classes for r in probe)
    )
    if not rows_ok:
        errors.append(problem(loc, f"must be {size} rows of {num_classes} probabilities"))
        return
    for i, row in enumerate(probe):
        if not all(_finite(p) and -1e-6 <= p <= 1 + 1e-6 for p in row):
            errors.append(problem([*loc, i], "probabilities must be in [0, 1]"))
        elif abs(sum(row) - 1.0) > PROBABILITY_TOLERANCE:
            errors.append(problem([*loc, i], f"sums to {sum(row):.6f}, not 1"))


def _check_centroids(errors: list[dict[str, Any]], centroids: Any, num_classes: int) -> None:
    """centroids (RoFL), where sent: one non-empty row of finite numbers per class, all rows of
    the same length."""
    if centroids is None:
        return
    ok = (
        isinstance(centroids, list)
        and len(centroids) == num_classes
        and all(isinstance(r, list) and r for r in centroids)
        and len({len(r) for r in centroids}) == 1
        and all(_finite(v) for r in centroids for v in r)
    )
    if not ok:
        errors.append(
            problem(
                ["metadata", "signals", "centroids"],
                f"must be {num_classes} equal-length rows of finite numbers",
            )
        )


def _checked_metrics(errors: list[dict[str, Any]], metrics: Any) -> dict[str, Any]:
    """The site's free-form metrics (at most ``MAX_METRICS`` names of 1-64 printable characters,
    each a finite number or null); an empty dict when they are not an object."""
    if not isinstance(metrics, dict) or len(metrics) > MAX_METRICS:
        errors.append(problem(["metadata", "metrics"], f"must be an object of <= {MAX_METRICS}"))
        return {}
    for key, value in metrics.items():
        if not (1 <= len(key) <= 64) or name_problem(key) is not None:
            errors.append(
                problem(["metadata", "metrics"], "names must be 1-64 printable characters")
            )
        elif not (value is None or _finite(value)):
            errors.append(problem(["metadata", "metrics", key], "finite number"))
    return dict(metrics)
