"""A federation's training and audit configuration, resolved once at creation.

A *method* preset (``fedavg``, ``fedprox``, ``fednoro``, ``fedrn``, ``fedncl``, ``rofl``, ``flr``)
chooses the client recipe, the aggregation rule and the primary detector; every field can be
overridden. Round schedules quoted in the papers for the papers' run lengths are scaled to the
planned number of rounds (docs/algorithms.md, "Status and warm-up") unless set explicitly, and
the resolved values are what gets stored, so a report always says which values were used.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.audit import (
    AGGREGATION_RULES,
    DETECTORS,
    AuditConfig,
    required_signals,
    scale_rounds,
)
from service.coordinator.hyperparameters import hyperparameter_errors
from service.coordinator.signal_policy import SignalPolicy
from service.errors import Problem
from service.inputs import INT32_MAX, BoundedJson

Method = Literal["fedavg", "fedprox", "fednoro", "fedrn", "fedncl", "rofl", "flr"]
RECIPES = ("fedavg", "fedprox", "fednoro", "fedrn", "fedncl_correction", "rofl", "flr")
AGGREGATIONS = AGGREGATION_RULES  # the audit's registry of rules (service.audit.aggregation)
SIGNALS = ("per_class_loss", "train_loss", "train_accuracy", "probe_softmax", "centroids")

# method -> (recipe, aggregation, primary detector)
PRESETS: dict[str, tuple[str, str, str]] = {
    "fedavg": ("fedavg", "fedavg", "evidence"),
    "fedprox": ("fedprox", "fedavg", "evidence"),
    "fednoro": ("fednoro", "daagg", "evidence"),
    "fedrn": ("fedrn", "fedavg", "evidence"),
    "fedncl": ("fedncl_correction", "fedncl_layerwise", "fedncl"),
    "rofl": ("rofl", "fedavg", "evidence"),
    "flr": ("flr", "fedavg", "evidence"),
}

# Schedules in rounds as the papers give them: key -> (value, the paper's run length).
PAPER_SCHEDULES: dict[str, dict[str, tuple[int, int]]] = {
    "fednoro": {"warmup_rounds": (10, 100), "ramp_rounds": (39, 100)},
    "fedrn": {"warmup_rounds": (100, 500)},
    "fedncl_correction": {"t_corr": (60, 150)},
    "rofl": {"forget_rounds": (10, 1000), "t_pl": (100, 1000)},
    "flr": {"r_w": (50, 300), "warmup_rounds": (50, 300)},
}

# The federation-level warm-up (rounds before detector flags drive roles and aggregation).
# Fed-NCL's paper has none; we use FedNoRo's 10 % because Fed-NCL's score q = e * h / n is inverted
# while the global model is still untrained (the clean clients' local models move further from it
# than the noisy ones'): on scenario V5 its AUROC was 0.00-0.43 in rounds 0-2 of every federation
# and seed and 0.96-1.00 from round 3 on, and without a warm-up the first flags fell on clean
# clients in every seed (docs/algorithms.md, "Status and warm-up"). How long q stays inverted
# depends on how fast the global model learns (up to round 7 of V5 with the simulator's current
# schedule, inside its 10-round warm-up; docs/evaluation.md, "Detection beyond the targets"). The
# warm-up is a fraction of the run, not a test of the model, and was not lengthened to fit one
# scenario. `warmup_rounds: 0` restores the paper's schedule.
METHOD_WARMUP: dict[str, tuple[int, int] | None] = {
    "fedavg": (10, 100),
    "fedprox": (10, 100),
    "fednoro": (10, 100),
    "fedrn": (100, 500),
    "fedncl": (10, 100),
    "rofl": (10, 100),
    "flr": (10, 100),
}

# Audit settings a method's paper decides differently from AuditConfig's defaults.
# Fed-NCL penalises the clients its score flags in the round ("at each global training round, the
# clients are divided into noisy clients and clean clients", section V-C; the penalty, section V-B),
# so its federations aggregate on the round's flags. FedNoRo identifies its noisy clients once,
# after the warm-up, and trains the second stage on that set, which the status (noisy after 2 flags
# in 3 rounds, trusted after 3 clean rounds) follows more closely; it is AuditConfig's default.
# Measured (docs/algorithms.md, "Which sites the aggregation treats as noisy"): with the status,
# Fed-NCL's mean + 1 sigma rule, which flags about two clients of a clean federation in every round,
# kept one clean client of V4 (seed 2) penalised for 24 of the 27 rounds after the warm-up, against
# the 9 rounds it was flagged in with the round's flags.
# FedAvg is the plain baseline (the simulator's and the stress matrix's reference): its aggregate
# is every site's, anchors or not, so it is never anchor-led (service/audit/anchor_mode.py).
METHOD_AUDIT: dict[str, dict[str, Any]] = {
    "fedavg": {"anchor_lead": False},
    "fedncl": {"aggregation_flags": "round"},
}

# How far an update's num_samples and class_counts may drift from what the site declared at join,
# as a fraction of the joined num_samples: |n - n_join| <= drift * n_join and
# sum_c |count_c - count_c,join| <= drift * n_join (an L1 bound on the histogram, so relabelling
# m samples costs 2m). A site running the SDK sends exactly its join counts; 10 % leaves room for
# a site whose data set changed a little without rejoining, and keeps an overstated size from
# buying weight (issue 20: a site that joined with 100 samples claimed 10^12). 0: exact.
DEFAULT_MAX_SAMPLE_DRIFT = 0.1

COMMON_HYPERPARAMETERS: dict[str, Any] = {
    "optimizer": "sgd",
    "lr": 0.01,
    "momentum": 0.9,
    "weight_decay": 0.0,
    "local_epochs": 1,
    "batch_size": 32,
    # Gradient-norm clipping in local training (the SDK's TrainingConfig); None: none, as in
    # the papers. A site whose loss becomes non-finite is told to lower lr or set this.
    "max_grad_norm": None,
}


# Rounds in a row a selected site may miss before it is absent (service.coordinator.attendance).
DEFAULT_ABSENT_AFTER_MISSED = 2


class InvalidHyperparametersError(ValueError):
    """The hyper-parameters do not fit the recipe; `errors` locate each problem inside them."""

    def __init__(self, recipe: str, errors: list[Problem]) -> None:
        first = errors[0]
        where = ".".join(str(part) for part in first["loc"])
        super().__init__(f"hyperparameters.{where}: {first['msg']} (recipe {recipe})")
        self.recipe = recipe
        self.errors = errors


class FederationConfigInput(BaseModel):
    """What an operator may set; everything else comes from the method preset."""

    model_config = ConfigDict(extra="forbid")

    method: Method = "fedavg"
    recipe: Literal[RECIPES] | None = None  # type: ignore[valid-type]
    aggregation: Literal[AGGREGATIONS] | None = None  # type: ignore[valid-type]
    primary_detector: Literal[DETECTORS] | None = None  # type: ignore[valid-type]
    detectors: list[Literal[DETECTORS]] | None = None  # type: ignore[valid-type]
    warmup_rounds: int | None = Field(default=None, ge=0, le=INT32_MAX)
    hyperparameters: BoundedJson = Field(
        default_factory=dict,
        description=(
            "The recipe's hyper-parameters (over its defaults): every recipe reads optimizer "
            "(sgd, adam), lr (> 0), momentum ([0, 1]), weight_decay (>= 0), local_epochs "
            "(1-10000), batch_size, max_grad_norm (> 0 or null), and its own keys (see "
            "service/coordinator/hyperparameters.py); another key, a wrong type or a value out "
            "of range is refused (422, the field named)"
        ),
    )
    audit: BoundedJson = Field(default_factory=dict)
    probe_size: int = Field(default=8, ge=1, le=1024)
    max_sample_drift: float = Field(
        default=DEFAULT_MAX_SAMPLE_DRIFT,
        ge=0.0,
        le=1.0,
        description=(
            "How far an update's num_samples and class_counts may drift from the site's join, "
            "as a fraction d of the joined num_samples n: |num_samples - n| <= d n and the sum "
            "over classes of |class count - joined class count| <= d n. 0: exactly the join. "
            "An update outside is refused (422, /problems/update-inconsistent)."
        ),
    )
    absent_after_missed: int = Field(
        default=DEFAULT_ABSENT_AFTER_MISSED,
        ge=0,
        le=1000,
        description=(
            "Rounds in a row a selected site may end without its update before it counts as "
            "absent: not selected again until it polls the coordinator, so a site that stopped "
            "does not make every round wait for its deadline. 0: never absent."
        ),
    )
    privacy: SignalPolicy = Field(
        default_factory=SignalPolicy,
        description=(
            "The signal privacy policy every site applies before sending its counts and "
            "per-class signals (docs/what-leaves-the-site.md); a join or update that does not "
            "obey it is refused (422, /problems/privacy-policy). Off by default."
        ),
    )


def resolve_config(data: FederationConfigInput, *, rounds: int) -> dict[str, Any]:
    """The stored, fully resolved configuration of a federation planned for `rounds` rounds."""
    recipe, aggregation, primary = PRESETS[data.method]
    recipe = data.recipe or recipe
    aggregation = data.aggregation or aggregation
    primary = data.primary_detector or primary
    detectors = list(data.detectors) if data.detectors is not None else list(DETECTORS)
    if primary not in detectors:
        raise ValueError(f"the primary detector {primary!r} is not among detectors {detectors}")

    hyperparameters = dict(COMMON_HYPERPARAMETERS)
    for key, (value, paper_rounds) in PAPER_SCHEDULES.get(recipe, {}).items():
        hyperparameters[key] = scale_rounds(value, paper_rounds, rounds)
    hyperparameters.update(data.hyperparameters)
    errors = hyperparameter_errors(recipe, hyperparameters)
    if errors:
        raise InvalidHyperparametersError(recipe, errors)

    if data.warmup_rounds is not None:
        warmup = data.warmup_rounds
    else:
        quoted = METHOD_WARMUP[data.method]
        warmup = 0 if quoted is None else scale_rounds(quoted[0], quoted[1], rounds)
    warmup = min(warmup, max(rounds - 1, 0))

    audit_defaults = AuditConfig().to_json()
    audit = {
        **audit_defaults,
        "detectors": detectors,
        "primary_detector": primary,
        "aggregation": aggregation,
        "fedncl_t_corr": scale_rounds(60, 150, rounds),
        **METHOD_AUDIT.get(data.method, {}),
    }
    audit.update(data.audit)
    audit_config = AuditConfig.from_json(audit)  # validates names and values

    # Every site sends its training loss; the detectors' signals come from their registry.
    signals = {"train_loss", *required_signals(detectors, audit_config)}
    if recipe == "fedrn":
        signals.update({"train_accuracy", "probe_softmax"})
    if recipe == "rofl":
        signals.add("centroids")
    return {
        "method": data.method,
        "recipe": recipe,
        "aggregation": aggregation,
        "primary_detector": primary,
        "detectors": detectors,
        "warmup_rounds": warmup,
        "hyperparameters": hyperparameters,
        "audit": audit_config.to_json(),
        "probe_size": data.probe_size,
        "max_sample_drift": data.max_sample_drift,
        "absent_after_missed": data.absent_after_missed,
        "privacy": data.privacy.model_dump(),
        "signals": sorted(signals),
    }
