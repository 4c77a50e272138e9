"""``fedaudit simulate`` and ``fedaudit demo`` (docs/operator-guide.md, "Simulating a federation").

Both are plain typer command functions, entry points of the group ``fedaudit.commands``
(``pyproject.toml``), which ``service/cli.py`` adds to the ``fedaudit`` command. This module
imports only typer, rich and the SDK's report table at import time (every ``fedaudit`` command,
the coordinator process's too, loads it); the simulator is imported when a command runs.

``simulate`` builds a scenario from a file (``--scenario``), a preset (``--preset``) or the
defaults, applies the flags on top, selects the method configurations (``--method`` or
``--compare``), runs it (:func:`fedaudit_sim.runner.simulate`) with a progress bar, prints
the comparison table and says where the results are.

``demo`` runs the ``demo`` preset (V1's federation: digits, 20 clients, 8 of them noisy;
FedNoRo against FedAvg on identical data), then prints the coordinator's noisy-client report next
to the ground truth and both methods' accuracy.
"""

from __future__ import annotations

import datetime as _dt
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from client_sdk.report_table import output_console, render_report

if TYPE_CHECKING:
    from rich.console import Console

    from fedaudit_sim.federation import RoundEvent, RunFailure
    from fedaudit_sim.records import RunResult
    from fedaudit_sim.runner import SimulationOutcome
    from fedaudit_sim.scenario import MethodSpec, Scenario

__all__ = [
    "build_scenario",
    "demo",
    "run_demo",
    "select_methods",
    "simulate",
]


# --------------------------------------------------------------------------------------------
# building the scenario from the flags


def _csv_list(text: str | None) -> list[str] | None:
    if text is None:
        return None
    items = [part.strip() for part in text.split(",") if part.strip()]
    return items or None


def _parse_seeds(seed: int | None, seeds: str | None) -> list[int] | None:
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


# --------------------------------------------------------------------------------------------
# running with a progress bar


class _ProgressDisplay:
    """A rich progress bar with one task per method and seed, advanced per closed round."""

    def __init__(self, console: Console, scenario: Scenario, enabled: bool) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.console = console
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not enabled,
        )
        self.tasks: dict[tuple[str, int], Any] = {}
        width = max(len(m.name) for m in scenario.methods)
        for seed in scenario.seeds:
            for spec in scenario.methods:
                self.tasks[(spec.name, seed)] = self.progress.add_task(
                    f"{spec.name:<{width}} seed {seed}",
                    total=scenario.training.rounds,
                    status="waiting",
                )

    def on_round(self, event: RoundEvent) -> None:
        status = f"acc {event.accuracy:.3f}  flagged {event.flagged}/{event.true_noisy} noisy" + (
            "  (warm-up)" if event.in_warmup else ""
        )
        self.progress.update(self.tasks[(event.label, event.seed)], advance=1, status=status)

    def on_server(self, url: str, data_dir: Path) -> None:
        # The bars appear once the data is prepared and the coordinator is up, so a scenario
        # that fails before that shows its error alone, not a row of "waiting" bars.
        self.console.print(f"coordinator at {url}, data directory [bold]{escape(str(data_dir))}[/]")
        self.progress.start()

    def on_failure(self, failure: RunFailure) -> None:
        status = f"[red]failed in round {failure.round_index} ({failure.client})[/]"
        task = self.tasks[(failure.label, failure.seed)]
        self.progress.update(task, status=status)
        self.progress.stop_task(task)


def _run(
    scenario: Scenario, out_dir: Path, *, console: Console, progress: bool, plots: bool
) -> SimulationOutcome:
    from fedaudit_sim.runner import simulate as run_simulation

    display = _ProgressDisplay(console, scenario, progress)
    try:
        return run_simulation(
            scenario,
            out_dir,
            plots=plots,
            on_round=display.on_round,
            on_server=display.on_server,
            on_failure=display.on_failure,
        )
    finally:
        display.progress.stop()


def _default_out(prefix: str) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path.cwd() / f"{prefix}-{stamp}"


def _check_out(out: Path) -> None:
    from fedaudit_sim.scenario import ScenarioError

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ScenarioError(
            f"--out {str(out)!r} exists and is not an empty directory; choose a new one "
            "(results and the coordinator's database are written there)"
        )


def _fail(console: Console, message: str, code: int) -> typer.Exit:
    """Print ``message`` on standard error and return the exit to raise."""
    from rich.console import Console

    err = Console(stderr=True, width=max(console.width, 100))
    # The message is text, not markup: "fedaudit[vision]" prints as written.
    err.print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False)
    return typer.Exit(code)


# --------------------------------------------------------------------------------------------
# commands


def simulate(
    scenario_file: Annotated[
        Path | None,
        typer.Option("--scenario", help="Scenario file (YAML or JSON)", show_default=False),
    ] = None,
    preset: Annotated[
        str | None, typer.Option(help="Reference scenario: V1..V6 or demo", show_default=False)
    ] = None,
    dataset: Annotated[
        str | None,
        typer.Option(
            help="digits, breast_cancer, wine, pneumoniamnist, breastmnist, mnist (custom: "
            "see --data-npz, --data-function)",
            show_default=False,
        ),
    ] = None,
    data_npz: Annotated[
        Path | None,
        typer.Option(
            help="Custom data set: an .npz file with arrays x, y (optionally x_test, y_test)",
            show_default=False,
        ),
    ] = None,
    data_function: Annotated[
        str | None,
        typer.Option(
            help="Custom data set: MODULE:FUNCTION (or FILE.py:FUNCTION) returning (x, y) or "
            "((x_train, y_train), (x_test, y_test))",
            show_default=False,
        ),
    ] = None,
    clients: Annotated[
        int | None, typer.Option(help="Number of clients", show_default=False)
    ] = None,
    partition: Annotated[
        str | None,
        typer.Option(
            help="iid, shards, k_classes, dirichlet, bernoulli_dirichlet, lognormal_quantity",
            show_default=False,
        ),
    ] = None,
    partition_param: Annotated[
        list[str] | None,
        typer.Option(help="Partition parameter KEY=VALUE (repeatable), e.g. beta=0.5"),
    ] = None,
    noise: Annotated[
        str | None,
        typer.Option(
            help="Client noise protocol: none, linear, rho_tau, rho_range, bernoulli, "
            "truncated_gaussian, clipped_gaussian, uniform_all",
            show_default=False,
        ),
    ] = None,
    noise_param: Annotated[
        list[str] | None,
        typer.Option(help="Noise parameter KEY=VALUE (repeatable), e.g. rho=0.4"),
    ] = None,
    noisy_clients: Annotated[
        int | None,
        typer.Option(
            help="Exactly this many noisy clients, drawn by the seed (rho_tau, rho_range, "
            "bernoulli; replaces rho / p)",
            show_default=False,
        ),
    ] = None,
    flip: Annotated[
        str | None,
        typer.Option(
            help="Label flip: symmetric, symmetric_any, pairflip, asymmetric, instance",
            show_default=False,
        ),
    ] = None,
    class_map: Annotated[
        str | None,
        typer.Option(help="Asymmetric flips: SOURCE:TARGET,... e.g. 3:5,9:4", show_default=False),
    ] = None,
    noise_threshold: Annotated[
        float | None,
        typer.Option(
            help="Continuous protocols: realised rate counted as noisy", show_default=False
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="mlp, cnn or tv:<torchvision name>", show_default=False),
    ] = None,
    model_param: Annotated[
        list[str] | None, typer.Option(help="Model option KEY=VALUE (repeatable)")
    ] = None,
    rounds: Annotated[
        int | None, typer.Option(help="Rounds (scenario default 100)", show_default=False)
    ] = None,
    local_epochs: Annotated[
        int | None,
        typer.Option(help="Local epochs per round (scenario default 5)", show_default=False),
    ] = None,
    lr: Annotated[
        float | None, typer.Option(help="Learning rate (scenario default 0.05)", show_default=False)
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(help="Local batch size (scenario default 32)", show_default=False)
    ] = None,
    momentum: Annotated[
        float | None, typer.Option(help="SGD momentum (scenario default 0.5)", show_default=False)
    ] = None,
    method: Annotated[
        str | None,
        typer.Option(help="Run one method (a scenario method or a preset)", show_default=False),
    ] = None,
    compare: Annotated[
        str | None,
        typer.Option(
            help="Run several methods on identical data, e.g. fedavg,fednoro", show_default=False
        ),
    ] = None,
    aggregation: Annotated[
        str | None, typer.Option(help="Aggregation override for every method", show_default=False)
    ] = None,
    primary_detector: Annotated[
        str | None, typer.Option(help="Primary detector override", show_default=False)
    ] = None,
    warmup_rounds: Annotated[
        int | None, typer.Option(help="Warm-up rounds override", show_default=False)
    ] = None,
    hp: Annotated[
        list[str] | None,
        typer.Option("--hp", help="Recipe hyper-parameter KEY=VALUE (repeatable)"),
    ] = None,
    audit: Annotated[
        list[str] | None,
        typer.Option(help="Audit configuration KEY=VALUE (repeatable), e.g. fednoro_seeds=[0]"),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="One seed", show_default=False)] = None,
    seeds: Annotated[
        str | None, typer.Option(help="Several seeds, e.g. 0,1,2", show_default=False)
    ] = None,
    datasets_dir: Annotated[
        Path | None,
        typer.Option(help="Directory of the file-based data sets", show_default=False),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Output directory (default: a new one here)", show_default=False),
    ] = None,
    plots: Annotated[bool, typer.Option(help="Write PNG plots")] = True,
    progress: Annotated[bool, typer.Option(help="Show the progress bar")] = True,
    keep_coordinator_data: Annotated[
        bool,
        typer.Option(
            help="Keep the coordinator's data directory (database, every model and update: "
            "large for many clients and rounds)"
        ),
    ] = True,
) -> None:
    """Simulate whole federations through the real HTTP API and score the audit."""
    from fedaudit_sim.comparison import comparison_table, detection_lines
    from fedaudit_sim.federation import SimulationError
    from fedaudit_sim.scenario import ScenarioError, parse_key_values

    console = output_console()
    try:
        overrides: dict[str, Any] = {
            **_custom_data_overrides(dataset, data_npz, data_function),
            "data_dir": None if datasets_dir is None else str(datasets_dir),
            "clients": clients,
            "partition.method": partition,
            "partition.params": parse_key_values(partition_param, option="--partition-param")
            or None,
            "noise.protocol": noise,
            "noise.params": parse_key_values(noise_param, option="--noise-param") or None,
            "noise.noisy_clients": noisy_clients,
            "noise.flip": flip,
            "noise.class_map": _parse_class_map(class_map),
            "noise.threshold": noise_threshold,
            "model.name": model,
            "model.params": parse_key_values(model_param, option="--model-param") or None,
            "training.rounds": rounds,
            "training.local_epochs": local_epochs,
            "training.lr": lr,
            "training.batch_size": batch_size,
            "training.momentum": momentum,
            "seeds": _parse_seeds(seed, seeds),
        }
        if method is not None and compare is not None:
            raise ScenarioError("give --method or --compare, not both")
        labels = [method] if method is not None else _csv_list(compare)
        method_overrides: dict[str, Any] = {
            "aggregation": aggregation,
            "primary_detector": primary_detector,
            "warmup_rounds": warmup_rounds,
            "hyperparameters": parse_key_values(hp, option="--hp") or None,
            "audit": parse_key_values(audit, option="--audit") or None,
        }
        scenario = build_scenario(
            scenario_file=scenario_file,
            preset=preset,
            overrides=overrides,
            methods=labels,
            method_overrides=method_overrides,
        )
        out_dir = out if out is not None else _default_out(f"simulation-{scenario.name}")
        _check_out(out_dir)
        console.print(
            f"scenario [bold]{escape(scenario.name)}[/]: {escape(_dataset_text(scenario))}, "
            f"{scenario.clients} clients, "
            f"{scenario.partition.method} partition, {scenario.noise.protocol} noise "
            f"({scenario.noise.flip}), {scenario.training.rounds} rounds; methods "
            f"{', '.join(m.name for m in scenario.methods)}; seeds "
            f"{', '.join(map(str, scenario.seeds))}"
        )
        outcome = _run(scenario, out_dir, console=console, progress=progress, plots=plots)
    except ScenarioError as exc:
        raise _fail(console, str(exc), 2) from None
    except SimulationError as exc:
        raise _fail(console, str(exc), 1) from None
    if outcome.runs:
        console.print(comparison_table(outcome.runs, title=f"scenario {scenario.name}"))
        for run in outcome.runs:
            for line in detection_lines(run):
                console.print(escape(line), highlight=False)
    if not keep_coordinator_data:
        import shutil

        shutil.rmtree(outcome.data_dir)
    _print_where(console, outcome)
    if outcome.failures:
        lines = "\n".join(f"  {failure.describe()}" for failure in outcome.failures)
        raise _fail(
            console,
            f"{len(outcome.failures)} of {len(outcome.failures) + len(outcome.runs)} run(s) "
            f"failed (not scored; listed under 'failures' in results.json):\n{lines}",
            1,
        )


def _dataset_text(scenario: Scenario) -> str:
    custom = scenario.custom_data
    if custom is None:
        return str(scenario.dataset)
    return f"custom data ({custom.npz if custom.npz is not None else custom.function})"


def _print_where(console: Console, outcome: SimulationOutcome) -> None:
    console.print(
        f"results: [bold]{escape(str(outcome.out_dir))}[/] (runs/: JSON and CSV per run; "
        "rounds.csv, clients.csv, summary.csv, results.json"
        + (", *.png" if any(p.suffix == ".png" for p in outcome.files) else "")
        + ")"
    )
    if outcome.data_dir.is_dir():
        size = sum(p.stat().st_size for p in outcome.data_dir.rglob("*") if p.is_file())
        console.print(
            f"coordinator data directory (SQLite, models, updates, log; {size / 1e6:.0f} MB): "
            f"{escape(str(outcome.data_dir))}"
        )
        console.print(
            "browse the reports in the admin dashboard: "
            f"FEDAUDIT_DATA_DIR={escape(shlex.quote(str(outcome.data_dir)))} "
            "FEDAUDIT_ADMIN_TOKEN=<choose one> fedaudit serve, then open "
            "http://127.0.0.1:8000/admin and log in with that token",
            soft_wrap=True,
        )
    else:
        console.print("coordinator data directory removed (--no-keep-coordinator-data)")
    console.print(f"wall time {outcome.wall_seconds:.1f} s")


def _truth_line(run: RunResult) -> str:
    noisy = [c for c in run.clients if c.true_noisy]
    if not noisy:
        return "ground truth: no noisy client"
    rates = ", ".join(f"{c.name} ({c.realised_rate:.2f})" for c in noisy)
    return f"ground truth: {len(noisy)} of {len(run.clients)} clients are noisy: {rates}"


def demo(
    out: Annotated[
        Path | None,
        typer.Option(help="Output directory (default: a new one here)", show_default=False),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of data, partition, noise and model")] = 0,
    rounds: Annotated[
        int | None, typer.Option(help="Rounds (default 20)", show_default=False)
    ] = None,
    progress: Annotated[bool, typer.Option(help="Show the progress bar")] = True,
) -> None:
    """Watch the audit catch noisy clients: 20 simulated hospitals, 8 with noisy labels."""
    run_demo(out=out, seed=seed, rounds=rounds, progress=progress)


def run_demo(
    *,
    out: Path | None = None,
    seed: int = 0,
    rounds: int | None = None,
    progress: bool = True,
) -> None:
    """Run the ``demo`` preset and print the report, the ground truth and both accuracies.

    Raises
    ------
    typer.Exit
        Code 2 for a bad setting, 1 when a federation failed.
    """
    from fedaudit_sim.comparison import comparison_table, detection_lines
    from fedaudit_sim.federation import SimulationError
    from fedaudit_sim.presets import get_preset
    from fedaudit_sim.scenario import ScenarioError, TrainingSpec, apply_overrides

    console = output_console()
    try:
        scenario = apply_overrides(get_preset("demo"), {"seeds": [seed], "training.rounds": rounds})
        out_dir = out if out is not None else _default_out("fedaudit-demo")
        _check_out(out_dir)
        noise_params = ", ".join(f"{k}={v}" for k, v in scenario.noise.params.items())
        console.print(
            f"[bold]fedaudit demo[/]: {scenario.clients} clients on {scenario.dataset}, "
            f"{scenario.partition.method} partition, "
            f"{scenario.noise.protocol}({noise_params}) "
            f"{scenario.noise.flip} label noise; {scenario.training.rounds} rounds of "
            f"{' and '.join(m.name for m in scenario.methods)} on identical data"
        )
        console.print(f"writing to [bold]{escape(str(out_dir))}[/]")
        outcome = _run(scenario, out_dir, console=console, progress=progress, plots=True)
    except ScenarioError as exc:
        raise _fail(console, str(exc), 2) from None
    except SimulationError as exc:
        raise _fail(console, str(exc), 1) from None
    if outcome.failures:
        raise _fail(console, "; ".join(f.describe() for f in outcome.failures), 1)
    audited = outcome.runs[0]
    truth = {c.name: c.realised_rate for c in audited.clients}
    if audited.report is not None:
        console.print(render_report(audited.report, truth))
    console.print(_truth_line(audited))
    for line in detection_lines(audited):
        console.print(escape(line), highlight=False)
    console.print(comparison_table(outcome.runs, title="accuracy and detection, both methods"))
    reference_rounds = TrainingSpec().rounds
    if scenario.training.rounds < reference_rounds:
        console.print(
            f"accuracy: after {scenario.training.rounds} rounds both models are still learning, "
            "so the two accuracies are close. The noise costs FedAvg later: on V1's "
            f"{reference_rounds} rounds FedAvg's accuracy falls from about round 60 on while "
            f"FedNoRo's keeps rising (docs/evaluation.md). `fedaudit demo --rounds "
            f"{reference_rounds}` shows it (a few minutes)."
        )
    _print_where(console, outcome)
