"""Simulation scenarios: what ``fedaudit simulate`` runs.

docs/operator-guide.md, "Simulating a federation", describes them for users.

A :class:`Scenario` fixes the data set, the number of clients, the partition and the client noise
protocol (the papers' protocols), the model, the training schedule and one or more *method
configurations* (a coordinator method preset plus overrides, run on identical data and noise).
It is a pydantic model with ``extra="forbid"`` at every level, so a typo in a scenario file is an
error that names the offending key instead of a silently ignored setting.

Scenarios come from a YAML or JSON file (:func:`load_scenario`), from a preset
(``fedaudit_sim.presets``) or from command-line flags (:func:`apply_overrides`); all three
end in :func:`validate_scenario`, which raises :class:`ScenarioError` with one line per problem.

What is checked here and what is left to the coordinator: partition and noise parameter *names*
and the noise parameter *values* are checked here (the noise levels are drawn once for a dummy
seed, which costs nothing); partition values that depend on the data (more clients than samples,
shards that do not divide) fail when the run is prepared, with a :class:`ScenarioError` that names
the field. The method configuration's recipe, aggregation and detector names and the audit
overrides are validated by the coordinator itself when the federation is created (this package
talks to it over HTTP only and does not import its configuration code); its problem details are
reported as a :class:`ScenarioError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fedaudit_sim.datasets import DATASET_NAMES
from fedaudit_sim.label_flips import FLIP_TYPES
from fedaudit_sim.noise_protocols import NOISE_PROTOCOLS, NoiseError, noise_levels
from fedaudit_sim.partition import PARTITION_METHODS, PARTITION_PARAMS

__all__ = [
    "CUSTOM_DATASET",
    "METHOD_PRESETS",
    "CustomDataSpec",
    "LyingSpec",
    "MethodSpec",
    "ModelSpec",
    "NoiseSpec",
    "PartitionSpec",
    "Scenario",
    "ScenarioError",
    "TrainingSpec",
    "apply_overrides",
    "load_scenario",
    "parse_key_values",
    "validate_scenario",
]

#: The coordinator's method presets (``service/coordinator/federation_config.py``). Duplicated on
#: purpose: the simulator talks to the coordinator over HTTP only; the coordinator validates again.
METHOD_PRESETS: Final[tuple[str, ...]] = (
    "fedavg",
    "fedprox",
    "fednoro",
    "fedrn",
    "fedncl",
    "rofl",
    "flr",
)
Scalar = bool | int | float | str
#: ``dataset`` value of a scenario whose data come from ``custom_data`` (arrays).
CUSTOM_DATASET: Final = "custom"


class ScenarioError(ValueError):
    """A scenario (file, preset or flags) is invalid; the message lists every problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CustomDataSpec(_Strict):
    """A custom data set from arrays (``dataset: custom``; ``fedaudit_sim.datasets``).

    Exactly one source: ``npz`` (a file with arrays ``x``, ``y`` and optionally ``x_test``,
    ``y_test``; a relative path is taken from the working directory, as ``data_dir``) or
    ``function`` (``module:function`` or ``path/to/file.py:function``, called with ``params`` as
    keyword arguments, returning ``(x, y)`` or ``((x_train, y_train), (x_test, y_test))``).
    Without a given test split, a seeded stratified split holds out the scenario's
    ``test_fraction``.
    """

    npz: str | None = Field(default=None, description="path of an .npz file with x and y")
    function: str | None = Field(default=None, description="'module:function' returning arrays")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments")
    name: str | None = Field(default=None, description="name in the results")
    num_classes: int | None = Field(default=None, ge=1, description="default: largest label + 1")
    class_names: list[str] | None = None
    standardize: bool = Field(default=True, description="scale like the built-in data sets")

    @model_validator(mode="after")
    def _one_source(self) -> CustomDataSpec:
        if (self.npz is None) == (self.function is None):
            raise ValueError("give exactly one of npz (a file) and function ('module:function')")
        if self.function is not None:
            module, sep, attribute = self.function.rpartition(":")
            if not sep or not module or not attribute:
                raise ValueError(
                    f"function {self.function!r} must be 'module:function' or "
                    "'path/to/file.py:function'"
                )
        elif self.params:
            raise ValueError("params are passed to a function; an npz source takes none")
        return self


class PartitionSpec(_Strict):
    """How samples are split among clients (``fedaudit_sim.partition``)."""

    method: Literal[PARTITION_METHODS] = "iid"  # type: ignore[valid-type]
    params: dict[str, Scalar] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_params(self) -> PartitionSpec:
        allowed = PARTITION_PARAMS[self.method]
        unknown = sorted(set(self.params) - allowed)
        if unknown:
            raise ValueError(
                f"partition {self.method!r} has no parameter(s) {unknown}; "
                f"it accepts {sorted(allowed) or 'none'}"
            )
        return self


class NoiseSpec(_Strict):
    """Client noise levels and the label flip (``fedaudit_sim.noise``)."""

    protocol: Literal[NOISE_PROTOCOLS] = "none"  # type: ignore[valid-type]
    params: dict[str, Scalar] = Field(default_factory=dict)
    flip: Literal[FLIP_TYPES] = "symmetric"  # type: ignore[valid-type]
    class_map: dict[int, int] | None = Field(
        default=None, description="asymmetric flips: {source class: target class}"
    )
    threshold: float = Field(
        default=0.1,
        ge=0.0,
        le=1.0,
        description="continuous protocols: realised rate at which a client counts as noisy",
    )

    @model_validator(mode="after")
    def _check(self) -> NoiseSpec:
        count = self.params.get("noisy_clients")
        # An exact count is checked against the scenario's clients there (Scenario).
        dummy_k = max(4, count) if isinstance(count, int) and not isinstance(count, bool) else 4
        try:
            # Cheap: draws a few rates; validates names and values of the parameters.
            noise_levels(dummy_k, self.protocol, 0, **self.params)
        except NoiseError as exc:
            raise ValueError(str(exc)) from None
        if self.flip == "asymmetric" and not self.class_map:
            raise ValueError("flip 'asymmetric' needs class_map {source: target}")
        if self.flip != "asymmetric" and self.class_map:
            raise ValueError(f"class_map is only used by flip 'asymmetric', not {self.flip!r}")
        return self


class LyingSpec(_Strict):
    """Noisy sites that report the losses of their true labels (``fedaudit_sim.lying``)."""

    sites: Literal["noisy"] | int = Field(
        default="noisy",
        description="'noisy': every noisy site lies; n: the first n noisy sites (by index)",
    )

    @field_validator("sites")
    @classmethod
    def _positive(cls, value: str | int) -> str | int:
        if isinstance(value, int) and (isinstance(value, bool) or value < 1):
            raise ValueError("sites: 'noisy' or a count >= 1")
        return value


class ModelSpec(_Strict):
    """The model every client trains (``fedaudit_sim.models.build_model``)."""

    name: str | None = Field(
        default=None, description="'mlp', 'cnn' or 'tv:<name>'; default cnn for images, else mlp"
    )
    params: dict[str, Any] = Field(default_factory=dict)


class TrainingSpec(_Strict):
    """Schedule and local optimiser (sent as the federation's common hyper-parameters).

    The defaults are the reference scenarios' shared schedule (``fedaudit_sim.presets``
    argues it): 100 rounds of 5 local epochs, SGD with lr 0.05, momentum 0.5, batch 32. A scenario
    that leaves ``training`` out is therefore run the way V1-V6 were measured. (Before, the
    defaults were the coordinator's generic ones, 20 rounds of 1 epoch at lr 0.01, with which the
    small simulator models barely learn: FedAvg on digits, 20 clients, clean, 10 rounds, reached
    0.19 accuracy IID and 0.16 under Dirichlet(0.5).)
    """

    rounds: int = Field(default=100, ge=1, le=100_000)
    local_epochs: int = Field(default=5, ge=1)
    lr: float = Field(default=0.05, gt=0.0)
    batch_size: int = Field(default=32, ge=1)
    momentum: float = Field(default=0.5, ge=0.0, lt=1.0)


class PrivacySpec(_Strict):
    """The federation's signal privacy policy (the coordinator's ``config.privacy``): every
    simulated site applies it through the SDK, so a run measures what it costs the audit."""

    min_class_count: int = Field(default=0, ge=0)
    count_bucket: int = Field(default=1, ge=1)
    # The Gaussian mechanism (sigma > 0 needs the clip and delta; the coordinator checks them).
    dp_noise_multiplier: float | None = Field(default=None, ge=0.0)
    dp_clip_loss: float | None = Field(default=None, gt=0.0)
    dp_clip_probe: float | None = Field(default=None, gt=0.0)
    dp_delta: float | None = Field(default=None, gt=0.0, lt=1.0)


class MethodSpec(_Strict):
    """One method configuration: a coordinator preset plus overrides.

    The fields after ``method`` are the coordinator's ``FederationConfigInput`` fields; unset
    ones are not sent (the preset decides).
    """

    name: str = Field(default="", description="label in tables and plots; default: the method")
    method: Literal[METHOD_PRESETS] = "fednoro"  # type: ignore[valid-type]
    recipe: str | None = None
    aggregation: str | None = None
    primary_detector: str | None = None
    detectors: list[str] | None = None
    warmup_rounds: int | None = Field(default=None, ge=0)
    hyperparameters: dict[str, Any] = Field(default_factory=dict)
    audit: dict[str, Any] = Field(default_factory=dict)
    probe_size: int | None = Field(default=None, ge=1, le=1024)
    privacy: PrivacySpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and not data.get("name"):
            return {**data, "name": data.get("method", "fednoro")}
        return data

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        # The label becomes part of file names.
        if value and not all(ch.isalnum() or ch in "-_." for ch in value):
            raise ValueError(f"name {value!r} may hold only letters, digits, '-', '_' and '.'")
        return value

    def config_input(self, training: TrainingSpec) -> dict[str, Any]:
        """The ``config`` object of the federation-create request."""
        hyperparameters: dict[str, Any] = {
            "lr": training.lr,
            "local_epochs": training.local_epochs,
            "batch_size": training.batch_size,
            "momentum": training.momentum,
            **self.hyperparameters,
        }
        config: dict[str, Any] = {"method": self.method, "hyperparameters": hyperparameters}
        for key in ("recipe", "aggregation", "primary_detector", "detectors", "warmup_rounds"):
            value = getattr(self, key)
            if value is not None:
                config[key] = value
        if self.audit:
            config["audit"] = dict(self.audit)
        if self.probe_size is not None:
            config["probe_size"] = self.probe_size
        if self.privacy is not None:
            config["privacy"] = self.privacy.model_dump(exclude_none=True)
        return config


class Scenario(_Strict):
    """A whole simulated federation (see the module docstring)."""

    name: str = "custom"
    description: str = ""
    dataset: Literal[(*DATASET_NAMES, CUSTOM_DATASET)] = "digits"  # type: ignore[valid-type]
    data_dir: str | None = Field(
        default=None, description="directory of the file-based data sets (default: shared/data)"
    )
    custom_data: CustomDataSpec | None = Field(
        default=None, description="dataset 'custom': where the arrays come from"
    )
    test_fraction: float = Field(default=0.2, gt=0.0, lt=1.0)
    clients: int = Field(default=10, ge=1, le=10_000)
    partition: PartitionSpec = Field(default_factory=PartitionSpec)
    noise: NoiseSpec = Field(default_factory=NoiseSpec)
    lying: LyingSpec | None = Field(
        default=None,
        description="noisy sites that report the losses of their true labels (an attack)",
    )
    anchors: int = Field(
        default=0,
        ge=0,
        description=(
            "trust anchors: the first n sites hold curated labels (their noise is undone after "
            "it is drawn, so the other sites' noise is the same as without anchors) and are "
            "marked as anchors in every method's federation"
        ),
    )
    model: ModelSpec = Field(default_factory=ModelSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    methods: list[MethodSpec] = Field(
        default_factory=lambda: [MethodSpec(method="fednoro")], min_length=1
    )
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    round_deadline_s: float = Field(default=3600.0, gt=0.0)

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, value: list[int]) -> list[int]:
        if any(s < 0 or s >= 2**31 for s in value):
            raise ValueError("seeds must lie in [0, 2**31)")
        if len(set(value)) != len(value):
            raise ValueError(f"seeds {value} repeat a value")
        return value

    @model_validator(mode="after")
    def _custom_data_with_custom_dataset(self) -> Scenario:
        if self.dataset == CUSTOM_DATASET and self.custom_data is None:
            raise ValueError(
                "dataset 'custom' needs custom_data: {npz: FILE} or {function: 'module:function'}"
            )
        if self.dataset != CUSTOM_DATASET and self.custom_data is not None:
            raise ValueError(
                f"custom_data is only used with dataset 'custom', not {self.dataset!r}"
            )
        return self

    @model_validator(mode="after")
    def _lying_needs_noise(self) -> Scenario:
        if self.lying is not None and self.noise.protocol == "none":
            raise ValueError("lying: the liars are noisy sites; set a noise protocol")
        return self

    @model_validator(mode="after")
    def _anchors_fit(self) -> Scenario:
        if self.anchors >= self.clients:
            raise ValueError(
                f"anchors={self.anchors}: at least one of the {self.clients} sites must not be "
                "an anchor"
            )
        return self

    @model_validator(mode="after")
    def _noisy_count_fits(self) -> Scenario:
        count = self.noise.params.get("noisy_clients")
        if isinstance(count, int) and count > self.clients:
            raise ValueError(
                f"noise.params.noisy_clients={count} exceeds the {self.clients} clients"
            )
        return self

    @model_validator(mode="after")
    def _unique_labels(self) -> Scenario:
        labels = [m.name for m in self.methods]
        repeated = sorted({x for x in labels if labels.count(x) > 1})
        if repeated:
            raise ValueError(f"method names must be unique; repeated: {repeated}")
        return self

    def method(self, label: str) -> MethodSpec:
        """The method configuration called ``label``."""
        for spec in self.methods:
            if spec.name == label:
                return spec
        raise ScenarioError(
            f"scenario {self.name!r} has no method {label!r}; it has "
            f"{[m.name for m in self.methods]}"
        )


def _format_errors(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        message = error["msg"].removeprefix("Value error, ")
        lines.append(f"  {where}: {message}")
    return "\n".join(lines)


def validate_scenario(data: Mapping[str, Any], *, source: str = "scenario") -> Scenario:
    """Build a :class:`Scenario` from plain data.

    Raises
    ------
    ScenarioError
        With one line per problem, each naming the field path (``partition.params``, ...).
    """
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{source}: expected a mapping of settings, got {type(data).__name__}")
    try:
        return Scenario.model_validate(dict(data))
    except ValidationError as exc:
        raise ScenarioError(f"{source} is invalid:\n{_format_errors(exc)}") from None


def load_scenario(path: Path | str) -> Scenario:
    """Read a scenario from a ``.yaml``/``.yml`` or ``.json`` file.

    Raises
    ------
    ScenarioError
        Missing file, unknown extension, a syntax error, or an invalid scenario.
    """
    file = Path(path)
    if not file.is_file():
        raise ScenarioError(f"scenario file {str(file)!r} does not exist")
    suffix = file.suffix.lower()
    text = file.read_text(encoding="utf-8")
    if suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ScenarioError(f"scenario file {str(file)!r} is not valid YAML: {exc}") from None
    elif suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ScenarioError(f"scenario file {str(file)!r} is not valid JSON: {exc}") from None
    else:
        raise ScenarioError(
            f"scenario file {str(file)!r}: unknown extension {suffix!r}; use .yaml, .yml or .json"
        )
    if data is None:
        raise ScenarioError(f"scenario file {str(file)!r} is empty")
    return validate_scenario(data, source=f"scenario file {str(file)!r}")


def _parse_scalar(text: str) -> Any:
    """A flag value: JSON when it parses (numbers, true/false, lists), else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_key_values(items: list[str] | None, *, option: str) -> dict[str, Any]:
    """Parse repeated ``KEY=VALUE`` flags; values are JSON when they parse, else strings.

    Raises
    ------
    ScenarioError
        An item without ``=`` or with an empty key.
    """
    result: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ScenarioError(f"{option} {item!r}: expected KEY=VALUE")
        result[key.strip()] = _parse_scalar(value.strip())
    return result


_RESET_ON_CHANGE: Final[dict[str, str]] = {
    "partition.method": "params",
    "noise.protocol": "params",
    "model.name": "params",
}


def apply_overrides(scenario: Scenario, overrides: Mapping[str, Any]) -> Scenario:
    """Return ``scenario`` with dotted-path overrides applied and validated again.

    ``overrides`` maps paths such as ``"clients"``, ``"training.rounds"``,
    ``"partition.params"`` (a dict, merged) or ``"methods"`` (a list, replaced) to values; a
    ``None`` value means "not given" and is skipped. Selecting methods is done by the caller.
    ``"noise.noisy_clients"`` sets ``noise.params.noisy_clients`` and drops ``rho`` and ``p``
    (the rate-based selection it replaces); ``"custom_data"`` replaces the whole spec, and a
    built-in ``"dataset"`` drops it.

    Raises
    ------
    ScenarioError
        The result is invalid.
    """
    data = scenario.model_dump()
    # A method/protocol change first, so parameters given with it land on the new one.
    ordered = sorted(overrides.items(), key=lambda item: item[0] not in _RESET_ON_CHANGE)
    for path, value in ordered:
        if value is None:
            continue
        if path == "dataset" and value != CUSTOM_DATASET:
            # A built-in data set replaces the custom arrays.
            data["custom_data"] = None
        if path == "custom_data":
            # Another source replaces the whole spec (an npz and a function do not merge).
            data["custom_data"] = value
            continue
        if path == "noise.noisy_clients":
            # An exact count replaces the protocol's rate-based selection (rho, or p).
            params = {k: v for k, v in data["noise"]["params"].items() if k not in ("rho", "p")}
            data["noise"]["params"] = {**params, "noisy_clients": value}
            continue
        *parents, leaf = path.split(".")
        reset = _RESET_ON_CHANGE.get(path)
        if reset is not None and value != data[parents[0]][leaf]:
            # Another partition method or noise protocol has other parameters.
            data[parents[0]][reset] = {}
        target = data
        for part in parents:
            target = target[part]
        if isinstance(value, Mapping) and isinstance(target.get(leaf), dict):
            target[leaf] = {**target[leaf], **value}
        else:
            target[leaf] = value
    return validate_scenario(data, source="scenario with command-line overrides")
