"""One simulated federation on the coordinator, driven over HTTP through the SDK.

:func:`create_federation` creates it (one federation per method configuration, ``min_clients``
= the number of clients and a generous deadline, so a round closes when everyone submitted),
adds and joins the clients; :func:`train_round` has every client train one round
(``get_current_round`` long-poll and ``Participant.train_round``); :func:`collect_round` reads a
closed round back (``AdminClient.get_round``, ``list_clients``), evaluates its global model and
records it; :func:`stop_failed` stops a federation whose client's training failed;
:func:`run_result` is the finished federation's :class:`~fedaudit_sim.records.RunResult`.
``fedaudit_sim.runner`` drives several of these in lock-step.

This module talks to the coordinator over HTTP only: it imports ``client_sdk``, never
``service.api``, ``service.coordinator`` or ``service.store``.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
from torch import nn

from client_sdk import (
    AdminClient,
    APIStatusError,
    FederationClient,
    SignalPolicyError,
    SiteRoundError,
)
from client_sdk.participant import Participant
from client_sdk.recipes import RecipeError
from fedaudit_sim.lying import LossLyingParticipant
from fedaudit_sim.preparation import PreparedData, evaluate_state, per_class_losses
from fedaudit_sim.records import ClientRecord, RoundRecord, RunResult
from fedaudit_sim.round_records import ClientRound, round_record
from fedaudit_sim.scenario import MethodSpec, ScenarioError
from fedaudit_sim.summaries import summarise_run

__all__ = [
    "LONG_POLL_S",
    "ClientTrainingError",
    "Federation",
    "RoundEvent",
    "RunFailure",
    "SimulationError",
    "collect_round",
    "create_federation",
    "next_instruction",
    "run_result",
    "stop_failed",
    "train_round",
]

#: Long-poll per request (the coordinator's maximum is 30 s).
LONG_POLL_S: Final = 30.0


class SimulationError(RuntimeError):
    """A simulated federation could not complete (the coordinator failed a round, ...)."""


class ClientTrainingError(SimulationError):
    """A client's local training failed; only its federation is lost.

    Attributes
    ----------
    label : str
        The method configuration's name.
    round_index : int
    client : str
        The client's name (``client-03``).
    error : str
        ``"<exception type>: <message>"`` of the SDK's error.
    """

    def __init__(self, message: str, *, label: str, round_index: int, client: str, error: str):
        super().__init__(message)
        self.label = label
        self.round_index = round_index
        self.client = client
        self.error = error


@dataclass(frozen=True)
class RunFailure:
    """A method configuration of one seed that stopped before its last round.

    ``rounds_completed`` rounds were closed and evaluated before the failure; they are not
    scored (a run's metrics need every round of the plan).
    """

    scenario: str
    label: str
    seed: int
    federation_id: str
    round_index: int
    client: str
    error: str
    rounds_completed: int

    def describe(self) -> str:
        """One line: which run, where, and why."""
        return (
            f"{self.label} seed {self.seed}: {self.client} failed in round {self.round_index} "
            f"({self.error}); federation {self.federation_id}, {self.rounds_completed} "
            "round(s) completed"
        )

    def to_json(self) -> dict[str, Any]:
        """The failure as plain JSON values (``results.json``, under ``failures``)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RoundEvent:
    """Passed to the progress callback after each closed round."""

    label: str
    seed: int
    round_index: int
    rounds: int
    accuracy: float
    flagged: int
    true_noisy: int
    in_warmup: bool


@dataclass
class Federation:
    """One method configuration's federation while it runs: its clients and what it recorded.

    ``pending`` holds each trained round's wall seconds and client results until the round is
    read back (:func:`collect_round`); ``model_in`` is the global model the current round
    started from.
    """

    spec: MethodSpec
    federation_id: str
    config: dict[str, Any]
    names: list[str]
    ids: dict[str, str]
    participants: list[Participant]
    eval_model: nn.Module
    started: float
    model_in: bytes = b""
    pending: dict[int, tuple[float, list[ClientRound]]] = field(default_factory=dict)
    records: list[RoundRecord] = field(default_factory=list)


def create_federation(
    admin: AdminClient,
    http: httpx.Client,
    data: PreparedData,
    spec: MethodSpec,
    names: list[str],
) -> Federation:
    """Create the federation of ``spec`` on ``data``, upload the initial model, add the clients
    ``names`` (the noisy ones that lie as ``scenario.lying`` says) and join them.

    Raises
    ------
    ScenarioError
        The coordinator refused the method configuration (the message holds its problem).
    """
    scenario = data.scenario
    train = data.split.train
    body = {
        "name": f"{scenario.name}-{spec.name}-seed{data.seed}",
        "task": {
            "num_classes": train.num_classes,
            "input_shape": list(train.input_shape),
            "class_names": list(train.class_names),
        },
        "plan": {
            "rounds": scenario.training.rounds,
            "min_clients": scenario.clients,
            "round_deadline_s": scenario.round_deadline_s,
        },
        "config": spec.config_input(scenario.training),
        "seed": data.federation_seed,
    }
    try:
        federation = admin.create_federation(body)
    except APIStatusError as exc:
        detail = exc.problem.detail if exc.problem is not None else str(exc)
        errors = exc.extensions.get("errors")
        raise ScenarioError(
            f"method {spec.name!r}: the coordinator refused the configuration: {detail}"
            + (f" {errors}" if errors else "")
        ) from exc
    fid = str(federation.id)
    admin.upload_initial_model(fid, data.initial_state)
    ids: dict[str, str] = {}
    participants: list[Participant] = []
    template = data.build_model()
    liars = set(data.lying_sites())
    for k, name in enumerate(names):
        created = admin.add_client(fid, name)
        ids[name] = str(created.id)
        if k < scenario.anchors:
            admin.set_anchor(fid, created.id, "simulated trust anchor: curated labels")
        site_class = LossLyingParticipant if k in liars else Participant
        participants.append(
            site_class(
                FederationClient(api_token=created.token, http_client=http, max_retries=3),
                fid,
                copy.deepcopy(template),
                data.local_data(k),
                device="cpu",
                poll_wait_s=LONG_POLL_S,
                progress=False,  # the simulator draws its own progress bar
            )
        )
    for k, participant in enumerate(participants):
        try:
            participant.join()
        except SignalPolicyError as exc:
            raise SimulationError(
                f"method {spec.name!r}: {names[k]} cannot join under the federation's privacy "
                f"policy ({exc}); lower min_class_count or give the sites more samples"
            ) from exc
    return Federation(
        spec=spec,
        federation_id=fid,
        config=dict(federation.config),
        names=names,
        ids=ids,
        participants=participants,
        eval_model=template,
        started=time.perf_counter(),
        model_in=data.initial_state,
    )


def next_instruction(fed: Federation, k: int, expected_round: int, timeout_s: float) -> Any:
    """Long-poll until client ``k`` may train round ``expected_round`` or the federation is
    finished; anything else (another round, no answer in time) is an error."""
    participant = fed.participants[k]
    deadline = time.monotonic() + timeout_s
    while True:
        current = participant.client.get_current_round(fed.federation_id, wait_s=LONG_POLL_S)
        if current.status == "finished":
            return current
        if current.status == "train":
            assert current.round is not None
            if current.round.index != expected_round:
                raise SimulationError(
                    f"{fed.spec.name}: {fed.names[k]} was sent round {current.round.index}, "
                    f"expected round {expected_round}"
                )
            return current
        if time.monotonic() > deadline:
            raise SimulationError(
                f"{fed.spec.name}: round {expected_round} did not open within {timeout_s:.0f} s "
                f"(coordinator says: {current.reason})"
            )


def train_round(
    fed: Federation,
    round_index: int,
    timeout_s: float,
    collect_previous: Callable[[], None],
) -> None:
    """Every client trains ``round_index``; the previous round is read back as soon as the
    first client's instructions arrive (the round then is closed and the next one cannot close
    before this one's clients all uploaded, so the statuses read belong to that round)."""
    started = time.perf_counter()
    done: list[ClientRound] = []
    for k, participant in enumerate(fed.participants):
        current = next_instruction(fed, k, round_index, timeout_s)
        if current.status != "train":
            raise SimulationError(
                f"{fed.spec.name}: the federation finished before round {round_index}"
            )
        if k == 0:
            collect_previous()
        try:
            summary = participant.train_round(current)
        except SiteRoundError as exc:
            # A client's local training failed (e.g. diverged): name the run, round and client
            # instead of a bare traceback; the coordinator data stays for inspection (and has
            # the site's site.error event).
            cause = exc.__cause__
            if not isinstance(cause, RecipeError):
                raise
            error = f"{type(cause).__name__}: {cause}"
            raise ClientTrainingError(
                f"{fed.spec.name} (federation {fed.federation_id}): client {fed.names[k]} failed "
                f"in round {round_index}: {error}",
                label=fed.spec.name,
                round_index=round_index,
                client=fed.names[k],
                error=error,
            ) from exc
        if not summary.accepted:
            raise SimulationError(
                f"{fed.spec.name}: round {round_index} closed before {fed.names[k]} uploaded"
            )
        role = current.instructions.role if current.instructions is not None else None
        done.append(ClientRound(role=role, summary=summary))
    fed.pending[round_index] = (time.perf_counter() - started, done)


def collect_round(
    admin: AdminClient,
    fed: Federation,
    data: PreparedData,
    round_index: int,
    on_round: Callable[[RoundEvent], None] | None,
) -> None:
    """Read a closed round back, evaluate its global model and record it."""
    info = admin.get_round(fed.federation_id, round_index)
    if info.state != "closed" or info.model_out_id is None:
        raise SimulationError(
            f"{fed.spec.name}: round {round_index} is {info.state!r}"
            + (f" ({info.state_reason})" if info.state_reason else "")
        )
    statuses = {c.name: c.pinned_status or c.status for c in admin.list_clients(fed.federation_id)}
    state = admin.download_model(info.model_out_id)
    acc = evaluate_state(fed.eval_model, state, data.split)
    record = round_record(fed, round_index, info, statuses, acc, fed.pending.pop(round_index))
    if all(c.normalised_loss is None for c in record.clients):
        # No FedNoRo evidence (the detector is not configured or undetermined): the heat map
        # falls back to the raw per-class losses of the round's global model, as each client
        # would report them.
        losses = per_class_losses(fed.eval_model, fed.model_in, data)
        for client, row in zip(record.clients, losses, strict=True):
            client.per_class_loss = row
    fed.model_in = state
    fed.records.append(record)
    if on_round is not None:
        flagged = sum(1 for c in record.clients if c.primary_flag)
        on_round(
            RoundEvent(
                label=fed.spec.name,
                seed=data.seed,
                round_index=round_index,
                rounds=data.scenario.training.rounds,
                accuracy=acc[0],
                flagged=flagged,
                true_noisy=int(data.noise.noisy_clients.sum()),
                in_warmup=record.in_warmup,
            )
        )


def stop_failed(
    admin: AdminClient, fed: Federation, data: PreparedData, exc: ClientTrainingError
) -> RunFailure:
    """Stop a federation whose client's training failed (so the coordinator's database says
    why it ended) and describe the failure."""
    admin.stop_federation(
        fed.federation_id,
        f"simulation: {exc.client} failed in round {exc.round_index} ({exc.error})",
    )
    return RunFailure(
        scenario=data.scenario.name,
        label=exc.label,
        seed=data.seed,
        federation_id=fed.federation_id,
        round_index=exc.round_index,
        client=exc.client,
        error=exc.error,
        rounds_completed=len(fed.records),
    )


def run_result(fed: Federation, data: PreparedData, report: dict[str, Any]) -> RunResult:
    """The finished federation's run: the clients' ground truth, its rounds, the coordinator's
    noisy-client ``report`` and the noise notes, summarised (``summarise_run``)."""
    noise = data.noise
    liars = set(data.lying_sites())
    clients = [
        ClientRecord(
            index=k,
            name=name,
            client_id=fed.ids[name],
            num_samples=int(data.client_indices[k].size),
            class_counts=data.class_counts(k),
            target_rate=float(noise.target_rates[k]),
            realised_rate=float(noise.realised_rates[k]),
            true_noisy=bool(noise.noisy_clients[k]),
            lies_about_losses=k in liars,
        )
        for k, name in enumerate(fed.names)
    ]
    notes = list(noise.notes)
    if liars:
        notes.append(
            "sites reporting their true labels' losses: "
            + ", ".join(fed.names[k] for k in sorted(liars))
        )
    asked = data.scenario.lying.sites if data.scenario.lying is not None else None
    if isinstance(asked, int) and len(liars) < asked:
        notes.append(f"lying.sites asked for {asked} liars; only {len(liars)} sites are noisy")
    run = RunResult(
        scenario=data.scenario.name,
        label=fed.spec.name,
        seed=data.seed,
        federation_id=fed.federation_id,
        config=fed.config,
        clients=clients,
        rounds=fed.records,
        noise_protocol=noise.protocol,
        noise_threshold=noise.threshold,
        num_classes=data.split.train.num_classes,
        wall_seconds=time.perf_counter() - fed.started,
        report=report,
        notes=notes,
    )
    summarise_run(run)
    return run
