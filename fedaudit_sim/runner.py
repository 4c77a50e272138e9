"""The simulator: whole federations on one machine through the real HTTP API.

docs/operator-guide.md, "Simulating a federation". One real coordinator process
(``CoordinatorProcess``: migrated SQLite in a data directory, uvicorn on a loopback port) and real
SDK participants (``client_sdk.Participant``) driven from this process:

1. :func:`~fedaudit_sim.preparation.prepare_data` loads the data set, partitions it and
   injects label noise (the papers' protocols), and builds the initial model, all from the
   run's seed:
   ``numpy.random.SeedSequence(seed)`` is split into independent streams for the partition, the
   noise and the model initialisation, and the federation's seed (batch order, probes) is
   derived from it too. Every method configuration of a seed gets the *same* prepared data:
   identical partition, noisy labels and initial model.
   The per-client training seed the coordinator sends each round derives from the federation
   seed, the client's name and the round (``service/coordinator/rounds.py``), so two runs of a
   scenario, and the methods of one comparison, see the same mini-batch orders.
2. :func:`run_methods` creates one federation per method configuration (``min_clients`` = the
   number of clients and a generous deadline, so a round closes when everyone submitted), adds
   and joins the clients, and drives all federations in lock-step, round by round, clients one
   after another in this thread: for each client one long-poll ``get_current_round`` and
   ``Participant.train_round`` (model download, training, signals, upload). While the
   coordinator closes one federation's round in the background, the next federation's clients
   train. A round is read back (``AdminClient.get_round``: its stored ``audit`` and
   ``coordinator_seconds``; ``list_clients``: the statuses) once the next round has opened (the
   first client's long-poll returns) or the federation finished, and its global model is
   evaluated on the clean test split.

   When a client's local training fails (a :class:`~client_sdk.recipes.RecipeError`, e.g. the
   loss became non-finite), only that method's federation stops: the failure is recorded as a
   :class:`~fedaudit_sim.federation.RunFailure` (method, seed, round, client, error) and the
   other methods of the comparison run to the end. A failing coordinator still stops everything.

HTTP per client per round: ``rounds/current``, the model download, the upload (the minimum the
protocol allows); per federation and round: ``get_round``, ``list_clients`` and one model
download for the evaluation. All participants share one ``httpx.Client`` (keep-alive).

The simulator calls ``torch.set_num_threads(1)``: the models are tiny, and on a shared 2-core
machine intra-op threads only add contention (measured 5-10x slower with the default).

This module talks to the coordinator over HTTP only: it imports ``client_sdk``, never
``service.api``, ``service.coordinator`` or ``service.store``.

Where the pieces live: the data of a seed and the evaluation in ``fedaudit_sim.preparation``;
one federation's creation, rounds, read-back and failure in ``fedaudit_sim.federation``; a
round's record from the stored audit in ``fedaudit_sim.round_records``; this module runs the
federations of a seed in lock-step (:func:`run_methods`) and whole scenarios (:func:`simulate`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import torch

from client_sdk import AdminClient, CoordinatorSDKError, SiteRoundError
from fedaudit_sim.federation import (
    ClientTrainingError,
    Federation,
    RoundEvent,
    RunFailure,
    SimulationError,
    collect_round,
    create_federation,
    next_instruction,
    run_result,
    stop_failed,
    train_round,
)
from fedaudit_sim.preparation import PreparedData, client_names, prepare_data
from fedaudit_sim.records import RunResult
from fedaudit_sim.scenario import MethodSpec, Scenario

__all__ = [
    "SeedRuns",
    "SimulationOutcome",
    "run_methods",
    "simulate",
]


@dataclass
class SeedRuns:
    """What :func:`run_methods` returns for one seed: the finished runs and the failed ones."""

    runs: list[RunResult]
    failures: list[RunFailure]


def run_methods(
    url: str,
    admin_token: str,
    data: PreparedData,
    methods: Sequence[MethodSpec],
    *,
    on_round: Callable[[RoundEvent], None] | None = None,
    on_failure: Callable[[RunFailure], None] | None = None,
) -> SeedRuns:
    """Run every method configuration on ``data`` against the coordinator at ``url``.

    The federations run in lock-step (module docstring). Each gets the same clients (names,
    local data, noisy labels), the same initial model and the same federation seed. A
    federation whose client's training fails is dropped from the lock-step, stopped on the
    coordinator (status "stopped", with the client, round and error as the reason) and
    recorded; the others go on.

    Returns
    -------
    SeedRuns
        ``runs``: one per method that finished, in order, summarised (:func:`summarise_run`) and
        with the coordinator's noisy-client report attached; ``failures``: one per method that
        did not, in the order they failed.

    Raises
    ------
    ScenarioError
        The coordinator refused a method configuration.
    SimulationError
        A round failed on the coordinator or did not open in time.
    """
    torch.set_num_threads(1)
    scenario = data.scenario
    rounds = scenario.training.rounds
    names = client_names(scenario.clients)
    timeout_s = scenario.round_deadline_s + 60.0
    failures: list[RunFailure] = []
    with (
        httpx.Client(base_url=url, timeout=httpx.Timeout(120.0, connect=10.0)) as http,
        AdminClient(url, admin_token, max_retries=3) as admin,
    ):
        try:
            feds = [create_federation(admin, http, data, spec, names) for spec in methods]
            for r in range(rounds):
                for fed in list(feds):

                    def previous(fed: Federation = fed, r: int = r) -> None:
                        if r > 0:
                            collect_round(admin, fed, data, r - 1, on_round)

                    try:
                        train_round(fed, r, timeout_s, previous)
                    except ClientTrainingError as exc:
                        feds.remove(fed)
                        failures.append(stop_failed(admin, fed, data, exc))
                        if on_failure is not None:
                            on_failure(failures[-1])
            for fed in feds:
                current = next_instruction(fed, 0, rounds, timeout_s)
                if current.status != "finished":
                    raise SimulationError(f"{fed.spec.name}: still running after {rounds} rounds")
                collect_round(admin, fed, data, rounds - 1, on_round)
            results = []
            for fed in feds:
                report = admin.get_json(f"/federations/{fed.federation_id}/report")
                results.append(run_result(fed, data, report))
            return SeedRuns(runs=results, failures=failures)
        except SiteRoundError:
            raise  # a site's own failure (not a recipe's): its traceback, not the coordinator's
        except CoordinatorSDKError as exc:
            raise SimulationError(f"the coordinator answered with an error: {exc}") from exc


# --------------------------------------------------------------------------------------------
# whole scenarios


@dataclass
class SimulationOutcome:
    """What :func:`simulate` did and where it left it."""

    scenario: Scenario
    runs: list[RunResult]
    out_dir: Path
    data_dir: Path
    files: list[Path]
    wall_seconds: float
    failures: list[RunFailure] = field(default_factory=list)


def simulate(
    scenario: Scenario,
    out_dir: Path,
    *,
    data_dir: Path | None = None,
    plots: bool = True,
    on_round: Callable[[RoundEvent], None] | None = None,
    on_server: Callable[[str, Path], None] | None = None,
    on_failure: Callable[[RunFailure], None] | None = None,
) -> SimulationOutcome:
    """Run every seed and method configuration of ``scenario`` and write the results.

    One coordinator process serves every federation (SQLite in ``data_dir``, default
    ``out_dir / "coordinator"``; it is left there with its log). Seeds run one after another;
    the method configurations of a seed run in lock-step on identical data
    (:func:`run_methods`).

    Parameters
    ----------
    scenario : Scenario
    out_dir : pathlib.Path
        Where ``scenario.json`` and the results (``fedaudit_sim.results.write_outputs``)
        are written; created if missing.
    data_dir : pathlib.Path, optional
        The coordinator's data directory.
    plots : bool
        Write the PNG plots.
    on_round : callable, optional
        Called after every closed round (progress display).
    on_server : callable, optional
        Called with the coordinator's URL and data directory once it is up.
    on_failure : callable, optional
        Called when a method's run fails (a client's training failed); the other runs go on,
        and the outcome lists the failure (``SimulationOutcome.failures``, ``results.json``).

    Raises
    ------
    ScenarioError
        The scenario does not fit its data, or the coordinator refused a configuration.
    SimulationError
        The coordinator failed a round or did not answer; the message ends with its log. (A
        client whose training fails stops only its own run: see ``on_failure``.)
    """
    from fedaudit_sim.coordinator_process import CoordinatorProcess, CoordinatorStartError
    from fedaudit_sim.results import write_outputs

    started = time.perf_counter()
    torch.set_num_threads(1)
    # The first seed is prepared before anything is written or started: a scenario that does
    # not fit its data fails fast and leaves no output folder behind (so the same --out can be
    # used again once the scenario is fixed).
    first = prepare_data(scenario, scenario.seeds[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "scenario.json").write_text(
        scenario.model_dump_json(indent=1) + "\n", encoding="utf-8"
    )
    server_dir = data_dir if data_dir is not None else out_dir / "coordinator"
    runs: list[RunResult] = []
    failures: list[RunFailure] = []
    server = CoordinatorProcess(server_dir)
    try:
        server.start()
    except CoordinatorStartError as exc:
        raise SimulationError(str(exc)) from exc
    try:
        if on_server is not None:
            on_server(server.url, server_dir)
        for i, seed in enumerate(scenario.seeds):
            data = first if i == 0 else prepare_data(scenario, seed)
            try:
                seed_runs = run_methods(
                    server.url,
                    server.admin_token,
                    data,
                    scenario.methods,
                    on_round=on_round,
                    on_failure=on_failure,
                )
            except SimulationError as exc:
                raise SimulationError(f"{exc}\ncoordinator log:\n{server.log_tail()}") from exc
            runs.extend(seed_runs.runs)
            failures.extend(seed_runs.failures)
    finally:
        server.stop()
    files = write_outputs(
        runs, out_dir, plots=plots, failures=[failure.to_json() for failure in failures]
    )
    return SimulationOutcome(
        scenario=scenario,
        runs=runs,
        out_dir=out_dir,
        data_dir=server_dir,
        files=files,
        wall_seconds=time.perf_counter() - started,
        failures=failures,
    )
