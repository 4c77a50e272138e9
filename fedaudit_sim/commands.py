"""``fedaudit simulate`` and ``fedaudit demo`` (docs/operator-guide.md, "Simulating a federation").

Both are plain typer command functions, entry points of the group ``fedaudit.commands``
(``pyproject.toml``), which ``service/cli/`` adds to the ``fedaudit`` command. This module
imports only typer, rich and the SDK's report table at import time (every ``fedaudit`` command,
the coordinator process's too, loads it); the simulator is imported when a command runs.

``simulate`` builds a scenario from a file (``--scenario``), a preset (``--preset``) or the
defaults, applies the flags on top, selects the method configurations (``--method`` or
``--compare``; the flags and these steps are ``fedaudit_sim.simulate_flags``), runs it
(:func:`fedaudit_sim.runner.simulate`) with a progress bar, prints the comparison table and says
where the results are.

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
from fedaudit_sim import simulate_flags as flag

if TYPE_CHECKING:
    from rich.console import Console

    from fedaudit_sim.federation import RoundEvent, RunFailure
    from fedaudit_sim.records import RunResult
    from fedaudit_sim.runner import SimulationOutcome
    from fedaudit_sim.scenario import Scenario

__all__ = [
    "demo",
    "run_demo",
    "simulate",
]


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


def simulate(
    scenario_file: flag.ScenarioFile = None,
    preset: flag.Preset = None,
    dataset: flag.Dataset = None,
    data_npz: flag.DataNpz = None,
    data_function: flag.DataFunction = None,
    clients: flag.Clients = None,
    partition: flag.Partition = None,
    partition_param: flag.PartitionParam = None,
    noise: flag.Noise = None,
    noise_param: flag.NoiseParam = None,
    noisy_clients: flag.NoisyClients = None,
    anchors: flag.Anchors = None,
    flip: flag.Flip = None,
    class_map: flag.ClassMap = None,
    noise_threshold: flag.NoiseThreshold = None,
    model: flag.Model = None,
    model_param: flag.ModelParam = None,
    rounds: flag.Rounds = None,
    local_epochs: flag.LocalEpochs = None,
    lr: flag.Lr = None,
    batch_size: flag.BatchSize = None,
    momentum: flag.Momentum = None,
    method: flag.Method = None,
    compare: flag.Compare = None,
    aggregation: flag.Aggregation = None,
    primary_detector: flag.PrimaryDetector = None,
    warmup_rounds: flag.WarmupRounds = None,
    hp: flag.Hp = None,
    audit: flag.Audit = None,
    seed: flag.Seed = None,
    seeds: flag.Seeds = None,
    datasets_dir: flag.DatasetsDir = None,
    out: flag.Out = None,
    plots: flag.Plots = True,
    progress: flag.Progress = True,
    keep_coordinator_data: flag.KeepCoordinatorData = True,
) -> None:
    """Simulate whole federations through the real HTTP API and score the audit."""
    # locals() holds exactly the parameters here: every flag, by name.
    _simulate(flag.SimulateFlags(**locals()))


def _simulate(flags: flag.SimulateFlags) -> None:
    """Build the scenario the flags describe, run it and print the outcome (:func:`simulate`).

    Raises
    ------
    typer.Exit
        Code 2 for a bad setting, 1 when a federation or a run failed.
    """
    from fedaudit_sim.federation import SimulationError
    from fedaudit_sim.scenario import ScenarioError

    console = output_console()
    try:
        scenario = flags.scenario()
        out_dir = (
            flags.out if flags.out is not None else _default_out(f"simulation-{scenario.name}")
        )
        _check_out(out_dir)
        console.print(
            f"scenario [bold]{escape(scenario.name)}[/]: {escape(_dataset_text(scenario))}, "
            f"{scenario.clients} clients, "
            f"{scenario.partition.method} partition, {scenario.noise.protocol} noise "
            f"({scenario.noise.flip}), {scenario.training.rounds} rounds; methods "
            f"{', '.join(m.name for m in scenario.methods)}; seeds "
            f"{', '.join(map(str, scenario.seeds))}"
        )
        outcome = _run(
            scenario, out_dir, console=console, progress=flags.progress, plots=flags.plots
        )
    except ScenarioError as exc:
        raise _fail(console, str(exc), 2) from None
    except SimulationError as exc:
        raise _fail(console, str(exc), 1) from None
    _print_outcome(console, scenario, outcome, keep_coordinator_data=flags.keep_coordinator_data)


def _print_outcome(
    console: Console,
    scenario: Scenario,
    outcome: SimulationOutcome,
    *,
    keep_coordinator_data: bool,
) -> None:
    """Print the comparison and the detection lines, remove the coordinator's data unless it is
    kept, say where everything is, and fail (code 1) when a run failed."""
    from fedaudit_sim.comparison import comparison_table, detection_lines

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
    """The scenario's data set in words (a custom one names its file or function)."""
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
    """The ground truth of a run in one line: which clients are noisy, at what rate."""
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
