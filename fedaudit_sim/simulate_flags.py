"""The flags of ``fedaudit simulate`` and the scenario they describe.

One typer option type per flag (``fedaudit_sim.commands.simulate`` declares its parameters with
them), :class:`SimulateFlags` (the parsed flags together) and the steps from flags to a
scenario: :func:`build_scenario` (file or preset, or the defaults, then the overrides) and
:func:`select_methods` (``--method`` or ``--compare``, with the method overrides).

Like ``fedaudit_sim.commands``, this module imports only typer at import time (every
``fedaudit`` command loads the simulator's commands); the scenario module is imported when a
scenario is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeAlias

import typer

if TYPE_CHECKING:
    from fedaudit_sim.scenario import MethodSpec, Scenario

__all__ = [
    "SimulateFlags",
    "build_scenario",
    "select_methods",
]


# --------------------------------------------------------------------------------------------
# the options of ``fedaudit simulate``, in the order of its --help

ScenarioFile: TypeAlias = Annotated[
    Path | None,
    typer.Option("--scenario", help="Scenario file (YAML or JSON)", show_default=False),
]
Preset: TypeAlias = Annotated[
    str | None, typer.Option(help="Reference scenario: V1..V6 or demo", show_default=False)
]
Dataset: TypeAlias = Annotated[
    str | None,
    typer.Option(
        help="digits, breast_cancer, wine, pneumoniamnist, breastmnist, mnist (custom: "
        "see --data-npz, --data-function)",
        show_default=False,
    ),
]
DataNpz: TypeAlias = Annotated[
    Path | None,
    typer.Option(
        help="Custom data set: an .npz file with arrays x, y (optionally x_test, y_test)",
        show_default=False,
    ),
]
DataFunction: TypeAlias = Annotated[
    str | None,
    typer.Option(
        help="Custom data set: MODULE:FUNCTION (or FILE.py:FUNCTION) returning (x, y) or "
        "((x_train, y_train), (x_test, y_test))",
        show_default=False,
    ),
]
Clients: TypeAlias = Annotated[
    int | None, typer.Option(help="Number of clients", show_default=False)
]
Partition: TypeAlias = Annotated[
    str | None,
    typer.Option(
        help="iid, shards, k_classes, dirichlet, bernoulli_dirichlet, lognormal_quantity",
        show_default=False,
    ),
]
PartitionParam: TypeAlias = Annotated[
    list[str] | None,
    typer.Option(help="Partition parameter KEY=VALUE (repeatable), e.g. beta=0.5"),
]
Noise: TypeAlias = Annotated[
    str | None,
    typer.Option(
        help="Client noise protocol: none, linear, rho_tau, rho_range, bernoulli, "
        "truncated_gaussian, clipped_gaussian, uniform_all",
        show_default=False,
    ),
]
NoiseParam: TypeAlias = Annotated[
    list[str] | None,
    typer.Option(help="Noise parameter KEY=VALUE (repeatable), e.g. rho=0.4"),
]
Anchors: TypeAlias = Annotated[
    int | None,
    typer.Option(
        help="The first N sites hold curated labels and are marked as trust anchors",
        show_default=False,
    ),
]
NoisyClients: TypeAlias = Annotated[
    int | None,
    typer.Option(
        help="Exactly this many noisy clients, drawn by the seed (rho_tau, rho_range, "
        "bernoulli; replaces rho / p)",
        show_default=False,
    ),
]
Flip: TypeAlias = Annotated[
    str | None,
    typer.Option(
        help="Label flip: symmetric, symmetric_any, pairflip, asymmetric, instance",
        show_default=False,
    ),
]
ClassMap: TypeAlias = Annotated[
    str | None,
    typer.Option(help="Asymmetric flips: SOURCE:TARGET,... e.g. 3:5,9:4", show_default=False),
]
NoiseThreshold: TypeAlias = Annotated[
    float | None,
    typer.Option(help="Continuous protocols: realised rate counted as noisy", show_default=False),
]
Model: TypeAlias = Annotated[
    str | None,
    typer.Option(help="mlp, cnn or tv:<torchvision name>", show_default=False),
]
ModelParam: TypeAlias = Annotated[
    list[str] | None, typer.Option(help="Model option KEY=VALUE (repeatable)")
]
Rounds: TypeAlias = Annotated[
    int | None, typer.Option(help="Rounds (scenario default 100)", show_default=False)
]
LocalEpochs: TypeAlias = Annotated[
    int | None,
    typer.Option(help="Local epochs per round (scenario default 5)", show_default=False),
]
Lr: TypeAlias = Annotated[
    float | None, typer.Option(help="Learning rate (scenario default 0.05)", show_default=False)
]
BatchSize: TypeAlias = Annotated[
    int | None, typer.Option(help="Local batch size (scenario default 32)", show_default=False)
]
Momentum: TypeAlias = Annotated[
    float | None, typer.Option(help="SGD momentum (scenario default 0.5)", show_default=False)
]
Method: TypeAlias = Annotated[
    str | None,
    typer.Option(help="Run one method (a scenario method or a preset)", show_default=False),
]
Compare: TypeAlias = Annotated[
    str | None,
    typer.Option(
        help="Run several methods on identical data, e.g. fedavg,fednoro", show_default=False
    ),
]
Aggregation: TypeAlias = Annotated[
    str | None, typer.Option(help="Aggregation override for every method", show_default=False)
]
PrimaryDetector: TypeAlias = Annotated[
    str | None, typer.Option(help="Primary detector override", show_default=False)
]
WarmupRounds: TypeAlias = Annotated[
    int | None, typer.Option(help="Warm-up rounds override", show_default=False)
]
Hp: TypeAlias = Annotated[
    list[str] | None,
    typer.Option("--hp", help="Recipe hyper-parameter KEY=VALUE (repeatable)"),
]
Audit: TypeAlias = Annotated[
    list[str] | None,
    typer.Option(help="Audit configuration KEY=VALUE (repeatable), e.g. fednoro_seeds=[0]"),
]
Seed: TypeAlias = Annotated[int | None, typer.Option(help="One seed", show_default=False)]
Seeds: TypeAlias = Annotated[
    str | None, typer.Option(help="Several seeds, e.g. 0,1,2", show_default=False)
]
DatasetsDir: TypeAlias = Annotated[
    Path | None,
    typer.Option(help="Directory of the file-based data sets", show_default=False),
]
Out: TypeAlias = Annotated[
    Path | None,
    typer.Option(help="Output directory (default: a new one here)", show_default=False),
]
Plots: TypeAlias = Annotated[bool, typer.Option(help="Write PNG plots")]
Progress: TypeAlias = Annotated[bool, typer.Option(help="Show the progress bar")]
KeepCoordinatorData: TypeAlias = Annotated[
    bool,
    typer.Option(
        help="Keep the coordinator's data directory (database, every model and update: "
        "large for many clients and rounds)"
    ),
]


@dataclass(frozen=True)
class SimulateFlags:
    """Every flag of ``fedaudit simulate``, as typer parsed it (None: not given)."""

    scenario_file: Path | None = None
    preset: str | None = None
    dataset: str | None = None
    data_npz: Path | None = None
    data_function: str | None = None
    clients: int | None = None
    partition: str | None = None
    partition_param: list[str] | None = None
    noise: str | None = None
    noise_param: list[str] | None = None
    noisy_clients: int | None = None
    anchors: int | None = None
    flip: str | None = None
    class_map: str | None = None
    noise_threshold: float | None = None
    model: str | None = None
    model_param: list[str] | None = None
    rounds: int | None = None
    local_epochs: int | None = None
    lr: float | None = None
    batch_size: int | None = None
    momentum: float | None = None
    method: str | None = None
    compare: str | None = None
    aggregation: str | None = None
    primary_detector: str | None = None
    warmup_rounds: int | None = None
    hp: list[str] | None = None
    audit: list[str] | None = None
    seed: int | None = None
    seeds: str | None = None
    datasets_dir: Path | None = None
    out: Path | None = None
    plots: bool = True
    progress: bool = True
    keep_coordinator_data: bool = True

    def scenario_overrides(self) -> dict[str, Any]:
        """The scenario overrides the data, partition, noise, model, training and seed flags
        give (None: not given).

        Raises
        ------
        ScenarioError
            A malformed KEY=VALUE, class map or seed list, or conflicting data flags.
        """
        from fedaudit_sim.scenario import parse_key_values

        return {
            **_custom_data_overrides(self.dataset, self.data_npz, self.data_function),
            "data_dir": None if self.datasets_dir is None else str(self.datasets_dir),
            "clients": self.clients,
            "partition.method": self.partition,
            "partition.params": parse_key_values(self.partition_param, option="--partition-param")
            or None,
            "noise.protocol": self.noise,
            "noise.params": parse_key_values(self.noise_param, option="--noise-param") or None,
            "noise.noisy_clients": self.noisy_clients,
            "anchors": self.anchors,
            "noise.flip": self.flip,
            "noise.class_map": _parse_class_map(self.class_map),
            "noise.threshold": self.noise_threshold,
            "model.name": self.model,
            "model.params": parse_key_values(self.model_param, option="--model-param") or None,
            "training.rounds": self.rounds,
            "training.local_epochs": self.local_epochs,
            "training.lr": self.lr,
            "training.batch_size": self.batch_size,
            "training.momentum": self.momentum,
            "seeds": _parse_seeds(self.seed, self.seeds),
        }

    def method_labels(self) -> list[str] | None:
        """The methods ``--method`` or ``--compare`` name (None: the scenario's own).

        Raises
        ------
        ScenarioError
            Both flags given.
        """
        from fedaudit_sim.scenario import ScenarioError

        if self.method is not None and self.compare is not None:
            raise ScenarioError("give --method or --compare, not both")
        return [self.method] if self.method is not None else _csv_list(self.compare)

    def method_overrides(self) -> dict[str, Any]:
        """The overrides of every selected method configuration (None: not given)."""
        from fedaudit_sim.scenario import parse_key_values

        return {
            "aggregation": self.aggregation,
            "primary_detector": self.primary_detector,
            "warmup_rounds": self.warmup_rounds,
            "hyperparameters": parse_key_values(self.hp, option="--hp") or None,
            "audit": parse_key_values(self.audit, option="--audit") or None,
        }

    def scenario(self) -> Scenario:
        """The scenario these flags describe (:func:`build_scenario`).

        Raises
        ------
        ScenarioError
            Any invalid or conflicting flag (the message names it).
        """
        overrides = self.scenario_overrides()
        labels = self.method_labels()
        return build_scenario(
            scenario_file=self.scenario_file,
            preset=self.preset,
            overrides=overrides,
            methods=labels,
            method_overrides=self.method_overrides(),
        )


# --------------------------------------------------------------------------------------------
# from the flags to a scenario


def _csv_list(text: str | None) -> list[str] | None:
    """The non-empty items of a comma-separated flag (None: not given or empty)."""
    if text is None:
        return None
    items = [part.strip() for part in text.split(",") if part.strip()]
    return items or None


def _parse_seeds(seed: int | None, seeds: str | None) -> list[int] | None:
    """The seeds of ``--seed`` or ``--seeds`` (None: neither given)."""
    from fedaudit_sim.scenario import ScenarioError

    if seed is not None and seeds is not None:
        raise ScenarioError("give --seed or --seeds, not both")
    if seed is not None:
        return [seed]
    items = _csv_list(seeds)
    if items is None:
        return None
    try:
        return [int(item) for item in items]
    except ValueError:
        raise ScenarioError(f"--seeds {seeds!r}: expected comma-separated integers") from None


def _parse_class_map(text: str | None) -> dict[int, int] | None:
    """The ``--class-map`` SOURCE:TARGET pairs as a dict (None: not given)."""
    from fedaudit_sim.scenario import ScenarioError

    if text is None:
        return None
    mapping: dict[int, int] = {}
    for item in _csv_list(text) or []:
        source, sep, target = item.partition(":")
        try:
            if not sep:
                raise ValueError(item)
            mapping[int(source)] = int(target)
        except ValueError:
            raise ScenarioError(
                f"--class-map {text!r}: expected SOURCE:TARGET pairs such as 3:5,9:4"
            ) from None
    return mapping


def _custom_data_overrides(
    dataset: str | None, npz: Path | None, function: str | None
) -> dict[str, Any]:
    """The ``dataset`` (and ``custom_data``) overrides of --dataset, --data-npz and
    --data-function."""
    from fedaudit_sim.scenario import CUSTOM_DATASET, ScenarioError

    if npz is not None and function is not None:
        raise ScenarioError("give --data-npz or --data-function, not both")
    if npz is None and function is None:
        return {"dataset": dataset}
    if dataset is not None and dataset != CUSTOM_DATASET:
        raise ScenarioError(
            f"--dataset {dataset!r} and a custom data set (--data-npz/--data-function) conflict"
        )
    source = {"npz": str(npz)} if npz is not None else {"function": function}
    return {"dataset": CUSTOM_DATASET, "custom_data": source}


def select_methods(
    scenario: Scenario,
    labels: list[str] | None,
    overrides: dict[str, Any],
) -> list[MethodSpec]:
    """The method configurations to run.

    Each label names a method configuration of the scenario or, failing that, a coordinator
    method preset (``fedavg``, ``fednoro``, ...). ``overrides`` (``aggregation``,
    ``primary_detector``, ``warmup_rounds``, ``hyperparameters``, ``audit``; None = not given)
    apply to every selected configuration; dict values are merged.

    Raises
    ------
    ScenarioError
        A label is neither a configuration of the scenario nor a preset.
    """
    from fedaudit_sim.scenario import METHOD_PRESETS, MethodSpec, ScenarioError

    if labels is None:
        chosen = list(scenario.methods)
    else:
        chosen = []
        known = {m.name: m for m in scenario.methods}
        for label in labels:
            if label in known:
                chosen.append(known[label])
            elif label in METHOD_PRESETS:
                chosen.append(MethodSpec(method=label))
            else:
                raise ScenarioError(
                    f"method {label!r} is neither a method of scenario {scenario.name!r} "
                    f"({', '.join(known)}) nor a coordinator preset ({', '.join(METHOD_PRESETS)})"
                )
    result = []
    for spec in chosen:
        data = spec.model_dump()
        for key, value in overrides.items():
            if value is None:
                continue
            if isinstance(value, dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        result.append(data)
    return [MethodSpec.model_validate(d) for d in result]


def build_scenario(
    *,
    scenario_file: Path | None = None,
    preset: str | None = None,
    overrides: dict[str, Any] | None = None,
    methods: list[str] | None = None,
    method_overrides: dict[str, Any] | None = None,
) -> Scenario:
    """The scenario the flags describe: file or preset (or defaults), then overrides.

    Raises
    ------
    ScenarioError
        Both a file and a preset, or any invalid setting (the message names it).
    """
    from fedaudit_sim.presets import get_preset
    from fedaudit_sim.scenario import (
        Scenario,
        ScenarioError,
        apply_overrides,
        load_scenario,
    )

    if scenario_file is not None and preset is not None:
        raise ScenarioError("give --scenario or --preset, not both")
    if scenario_file is not None:
        scenario = load_scenario(scenario_file)
    elif preset is not None:
        scenario = get_preset(preset)
    else:
        scenario = Scenario()
    scenario = apply_overrides(scenario, overrides or {})
    selected = select_methods(scenario, methods, method_overrides or {})
    return apply_overrides(scenario, {"methods": [m.model_dump() for m in selected]})
