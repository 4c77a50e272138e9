"""The update's metadata, typed and checked: the JSON part of an update upload (sample count,
signals, metrics, the state's sha256) against the federation it is sent to.

:func:`parse_metadata` reads the JSON (a bounded depth, an object). :class:`UpdateMetadata` and
:class:`UpdateSignals` are its schema: types, ranges and unknown fields are refused there, and the
committed OpenAPI shows them as the upload's ``metadata`` part. :func:`validate_signals` then
checks what depends on the federation (its number of classes, its probe size, the signals it
requires, each class's count) and collects every problem, each with its location, before the
update is refused (:class:`~service.errors.UpdateRejectedError`, answered as RFC 9457 problem
details).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, NoReturn

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.audit import MAX_LOSS
from service.coordinator.signal_policy import count_problems, dp_problems, policy_of
from service.errors import PrivacyPolicyError, Problem, UpdateRejectedError, problem
from service.inputs import INT32_MAX, MAX_JSON_DEPTH, json_depth_exceeds, name_problem
from service.store.tables import Federation

__all__ = [
    "MAX_METRICS",
    "PROBABILITY_TOLERANCE",
    "UpdateMetadata",
    "UpdateSignals",
    "parse_metadata",
    "problem",
    "validate_signals",
]

PROBABILITY_TOLERANCE = 1e-3
"""How far a probe row's probabilities may sum from 1 (float32 softmax, rounded in JSON)."""
MAX_METRICS = 64

# Strict: a JSON number for a number (no string, no boolean), an integer for a count.
Count = Annotated[int, Field(ge=0, le=INT32_MAX, strict=True)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)]
Loss = Annotated[float, Field(ge=0, le=MAX_LOSS, allow_inf_nan=False, strict=True)]
"""A per-class mean loss or spread, in nats: at most the audit's ``MAX_LOSS`` (1e6)."""
Finite = Annotated[float, Field(allow_inf_nan=False, strict=True)]
Probability = Annotated[float, Field(ge=-1e-6, le=1 + 1e-6, allow_inf_nan=False, strict=True)]
MetricName = Annotated[str, Field(min_length=1, max_length=64)]
MAX_ENTRIES = 100_000
"""The longest list a signal may hold (as many classes as a task may have; probe rows)."""


class UpdateSignals(BaseModel):
    """The signals an update carries; the federation says which it requires. Per-class lists
    have one entry per class, null for a class the site does not hold."""

    model_config = ConfigDict(extra="forbid")

    class_counts: list[Count | None] = Field(
        max_length=MAX_ENTRIES,
        description=(
            "Samples per class, as declared at join (every update sends them); sums to "
            "num_samples. Under the federation's privacy policy (config.privacy): null for a "
            "suppressed class (the site holds 1 to min_class_count - 1 samples of it), and "
            "every count rounded up to a multiple of count_bucket"
        ),
    )
    per_class_loss: list[Loss | None] | None = Field(
        None,
        max_length=MAX_ENTRIES,
        description=(
            "The global model's mean cross-entropy per given label (FedNoRo); null for a class "
            "the site holds no sample of, or whose count the privacy policy suppresses"
        ),
    )
    per_class_loss_sd: list[Loss | None] | None = Field(
        None,
        max_length=MAX_ENTRIES,
        description="The standard deviation of the same per-sample losses",
    )
    per_class_errors: list[Count | None] | None = Field(
        None,
        max_length=MAX_ENTRIES,
        description="The global model's errors per given label, at most the class's count",
    )
    per_class_confident_errors: list[Count | None] | None = Field(
        None,
        max_length=MAX_ENTRIES,
        description=(
            "Of those errors, the ones where the global model gives the given label a "
            "probability of at most 0.1; at most the class's errors"
        ),
    )
    train_loss: NonNegative | None = Field(None, description="Mean local training loss (Fed-NCL)")
    train_accuracy: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False, strict=True)] | None = (
        Field(None, description="The local model's accuracy on the site's own labels (FedRN)")
    )
    probe_softmax: list[Annotated[list[Probability], Field(max_length=MAX_ENTRIES)]] | None = Field(
        None,
        max_length=MAX_ENTRIES,
        description="probe_size rows of class probabilities on the seeded random inputs",
    )
    centroids: list[Annotated[list[Finite], Field(min_length=1, max_length=MAX_ENTRIES)]] | None = (
        Field(
            None,
            max_length=MAX_ENTRIES,
            description="One feature centroid per class, rows of equal length (RoFL)",
        )
    )


class UpdateMetadata(BaseModel):
    """The ``metadata`` part of an update upload (a JSON object)."""

    model_config = ConfigDict(extra="forbid")

    num_samples: Annotated[int, Field(ge=1, le=INT32_MAX, strict=True)]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] = Field(
        description="The state part's sha256 (hex)"
    )
    signals: UpdateSignals
    metrics: Annotated[dict[MetricName, Finite | None], Field(max_length=MAX_METRICS)] = Field(
        default_factory=dict, description="Free-form numbers the site reports"
    )


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


def validate_signals(
    metadata: dict[str, Any], federation: Federation
) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """Check the metadata against its schema, then against the federation; return
    (num_samples, the signals sent, metrics).

    Raises
    ------
    UpdateRejectedError
        With every problem found, each with its location: the schema's first (types, ranges,
        unknown fields), else the federation's (lengths, required signals, counts).
    """
    try:
        typed = UpdateMetadata.model_validate(metadata)
    except ValidationError as exc:
        _refuse([problem(["metadata", *e["loc"]], e["msg"]) for e in exc.errors(include_url=False)])
    signals = typed.signals
    errors: list[Problem] = []
    for key in federation.config["signals"]:
        if getattr(signals, key, None) is None:
            errors.append(problem(["metadata", "signals", key], "required by this federation"))
    forbidden: list[Problem] = []
    counts = _check_class_counts(errors, forbidden, typed.num_samples, signals, federation)
    _check_per_class_signals(errors, forbidden, signals, counts, federation.num_classes)
    forbidden.extend(dp_problems(signals.model_dump(), policy_of(federation.config)))
    _check_probe(errors, signals.probe_softmax, federation)
    _check_centroids(errors, signals.centroids, federation.num_classes)
    for key in typed.metrics:
        if name_problem(key) is not None:
            errors.append(problem(["metadata", "metrics"], "names must be printable characters"))
    if forbidden:
        _refuse([*forbidden, *errors], PrivacyPolicyError)
    if errors:
        _refuse(errors)
    return typed.num_samples, signals.model_dump(exclude_none=True), dict(typed.metrics)


MAX_PROBLEMS_SHOWN = 50
"""Problems a refusal lists: a list of a million bad numbers gets the first 50 and the count,
not a response larger than the upload."""


def _refuse(
    errors: list[Problem], error: type[UpdateRejectedError] = UpdateRejectedError
) -> NoReturn:
    shown = "" if len(errors) <= MAX_PROBLEMS_SHOWN else f", the first {MAX_PROBLEMS_SHOWN} listed"
    raise error(
        f"the update's metadata is invalid ({len(errors)} problems{shown}; first: "
        f"{'.'.join(map(str, errors[0]['loc']))}: {errors[0]['msg']})",
        errors=errors[:MAX_PROBLEMS_SHOWN],
    )


def _check_class_counts(
    errors: list[Problem],
    forbidden: list[Problem],
    n: int,
    signals: UpdateSignals,
    federation: Federation,
) -> list[int | None] | None:
    """The class counts when there is one per class (what the federation's privacy policy
    forbids added to ``forbidden``, counts that do not add up to ``n`` to ``errors``); None
    otherwise, with the problem added to ``errors``."""
    counts = signals.class_counts
    if len(counts) != federation.num_classes:
        errors.append(
            problem(
                ["metadata", "signals", "class_counts"],
                f"must have {federation.num_classes} entries",
            )
        )
        return None
    refused, wrong = count_problems(
        n,
        counts,
        policy_of(federation.config),
        samples_loc=["metadata", "num_samples"],
        counts_loc=["metadata", "signals", "class_counts"],
    )
    forbidden.extend(refused)
    errors.extend(wrong)
    return counts


_PER_CLASS = (
    "per_class_loss",
    "per_class_loss_sd",
    "per_class_errors",
    "per_class_confident_errors",
)
"""The signals with one entry per class; all but the first are sent with per_class_loss only."""

_COUNTS = frozenset({"per_class_errors", "per_class_confident_errors"})
"""The per-class signals that count samples (at most the class's count)."""


def _check_per_class_signals(
    errors: list[Problem],
    forbidden: list[Problem],
    signals: UpdateSignals,
    counts: list[int | None] | None,
    num_classes: int,
) -> None:
    """per_class_loss, and its spread and error counts, which are sent with it only: one entry
    per class, null exactly where the site holds no sample or its count is suppressed (a value
    there is what the privacy policy forbids), errors at most the class's count."""
    if counts is not None:
        for name in _PER_CLASS:
            values = getattr(signals, name)
            for c, count in enumerate(counts):
                if (
                    count is None
                    and values is not None
                    and c < len(values)
                    and values[c] is not None
                ):
                    forbidden.append(
                        problem(
                            ["metadata", "signals", name, c],
                            "must be null for a class the privacy policy suppresses",
                        )
                    )
    if signals.per_class_loss is not None:
        _check_per_class(errors, "per_class_loss", signals.per_class_loss, counts, num_classes)
    for name in _PER_CLASS[1:]:
        values = getattr(signals, name)
        if values is None:
            continue
        if signals.per_class_loss is None:
            errors.append(problem(["metadata", "signals", name], "sent without per_class_loss"))
        else:
            _check_per_class(errors, name, values, counts, num_classes)
    _check_confident(errors, signals.per_class_errors, signals.per_class_confident_errors)


def _check_confident(
    errors: list[Problem], wrong: list[int | None] | None, confident: list[int | None] | None
) -> None:
    """per_class_confident_errors: sent with per_class_errors, at most the class's errors."""
    if confident is None:
        return
    loc: list[str | int] = ["metadata", "signals", "per_class_confident_errors"]
    if wrong is None:
        errors.append(problem(loc, "sent without per_class_errors"))
        return
    for c, (e, k) in enumerate(zip(wrong, confident, strict=False)):
        if e is not None and k is not None and k > e:
            errors.append(problem([*loc, c], f"exceeds the class's errors {e}"))


def _check_per_class(
    errors: list[Problem],
    name: str,
    values: list[float | None] | list[int | None],
    counts: list[int | None] | None,
    num_classes: int,
) -> None:
    loc: list[str | int] = ["metadata", "signals", name]
    if len(values) != num_classes:
        errors.append(problem(loc, f"must have {num_classes} entries"))
        return
    if counts is None:
        return
    for c, value in enumerate(values):
        count = counts[c]
        if count is None:
            continue  # suppressed: a value there is refused by _check_per_class_signals
        if value is None and count > 0:
            errors.append(problem([*loc, c], "null for a class the client holds"))
        elif value is not None and count == 0:
            errors.append(problem([*loc, c], "must be null for a class with no sample"))
        elif name in _COUNTS and value is not None and value > count:
            errors.append(problem([*loc, c], f"exceeds the class's count {count}"))


def _check_probe(
    errors: list[Problem], probe: list[list[float]] | None, federation: Federation
) -> None:
    """probe_softmax, where sent: ``probe_size`` rows of one probability per class, each row
    summing to 1 (within ``PROBABILITY_TOLERANCE``)."""
    if probe is None:
        return
    num_classes = federation.num_classes
    loc: list[str | int] = ["metadata", "signals", "probe_softmax"]
    size = int(federation.config["probe_size"])
    if len(probe) != size or any(len(row) != num_classes for row in probe):
        errors.append(problem(loc, f"must be {size} rows of {num_classes} probabilities"))
        return
    for i, row in enumerate(probe):
        if abs(sum(row) - 1.0) > PROBABILITY_TOLERANCE:
            errors.append(problem([*loc, i], f"sums to {sum(row):.6f}, not 1"))


def _check_centroids(
    errors: list[Problem], centroids: list[list[float]] | None, num_classes: int
) -> None:
    """centroids (RoFL), where sent: one row per class, all rows of the same length."""
    if centroids is None:
        return
    if len(centroids) != num_classes or len({len(r) for r in centroids}) != 1:
        errors.append(
            problem(
                ["metadata", "signals", "centroids"],
                f"must be {num_classes} equal-length rows of finite numbers",
            )
        )
