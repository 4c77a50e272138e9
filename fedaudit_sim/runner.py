"""The simulator: whole federations on one machine through the real HTTP API.

docs/operator-guide.md, "Simulating a federation". One real coordinator process
(``CoordinatorProcess``: migrated SQLite in a data directory, uvicorn on a loopback port) and real
SDK participants (``client_sdk.Participant``) driven from this process:

1. :func:`prepare_data` loads the data set, partitions it and injects label noise
   (the papers' protocols), and builds the initial model, all from the run's seed:
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
   :class:`RunFailure` (method, seed, round, client, error) and the other methods of the
   comparison run to the end. A failing coordinator still stops everything.

HTTP per client per round: ``rounds/current``, the model download, the upload (the minimum the
protocol allows); per federation and round: ``get_round``, ``list_clients`` and one model
download for the evaluation. All participants share one ``httpx.Client`` (keep-alive).

The simulator calls ``torch.set_num_threads(1)``: the models are tiny, and on a shared 2-core
machine intra-op threads only add contention (measured 5-10x slower with the default).

This module talks to the coordinator over HTTP only: it imports ``client_sdk``, never
``service.api``, ``service.coordinator`` or ``service.store``.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx
import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from client_sdk import (
    AdminClient,
    APIStatusError,
    CoordinatorSDKError,
    FederationClient,
    SiteRoundError,
)
from client_sdk.participant import Participant, load_state_bytes, state_to_bytes
from client_sdk.recipes import LocalData, RecipeError
from fedaudit_sim.datasets import (
    DatasetError,
    DataSplit,
    load_callable,
    load_dataset,
    load_npz,
)
from fedaudit_sim.lying import LossLyingParticipant
from fedaudit_sim.metrics import accuracy, balanced_accuracy
from fedaudit_sim.models import ModelConfigError, TorchvisionNotInstalledError, build_model
from fedaudit_sim.noise import NoiseError, NoiseReport, inject_noise, noise_levels
from fedaudit_sim.partition import PartitionError, partition
from fedaudit_sim.records import ClientRecord, ClientRoundRecord, RoundRecord, RunResult
from fedaudit_sim.scenario import MethodSpec, Scenario, ScenarioError
from fedaudit_sim.summaries import summarise_run

__all__ = [
    "LONG_POLL_S",
    "ClientTrainingError",
    "PreparedData",
    "RoundEvent",
    "RunFailure",
    "SeedRuns",
    "SimulationError",
    "SimulationOutcome",
    "client_names",
    "evaluate_state",
    "per_class_losses",
    "prepare_data",
    "run_methods",
    "simulate",
]

#: Long-poll per request (the coordinator's maximum is 30 s).
LONG_POLL_S: Final = 30.0
_EVAL_BATCH: Final = 2048

IntArray = npt.NDArray[np.int64]


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
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------------------
# data


# eq=False: the fields hold numpy arrays, whose == is elementwise.
@dataclass(frozen=True, eq=False)
class PreparedData:
    """Everything that must be identical across the method configurations of one seed.

    Attributes
    ----------
    scenario : Scenario
    seed : int
    split : DataSplit
        Training split (true labels) and the clean test split.
    client_indices : list of numpy.ndarray
        Each client's training-sample indices.
    noise : NoiseReport
        Noisy labels and per-client ground truth.
    model_name : str
        The resolved model name (``cnn`` for images, ``mlp`` otherwise, unless set).
    initial_state : bytes
        safetensors bytes of the initial global model.
    federation_seed : int
        The coordinator-side seed (batch order, probes), derived from ``seed``.
    """

    scenario: Scenario
    seed: int
    split: DataSplit
    client_indices: list[IntArray]
    noise: NoiseReport
    model_name: str
    initial_state: bytes
    federation_seed: int

    def build_model(self) -> nn.Module:
        """A fresh model of the scenario's architecture holding the initial weights."""
        model = build_model(
            self.model_name,
            self.split.train.input_shape,
            self.split.train.num_classes,
            **self.scenario.model.params,
        )
        load_state_bytes(model, self.initial_state)
        return model

    def local_data(self, k: int) -> LocalData:
        """Client ``k``'s training set: its inputs, noisy labels and (for metrics) true labels."""
        idx = self.client_indices[k]
        return LocalData(
            inputs=torch.from_numpy(np.ascontiguousarray(self.split.train.x[idx])),
            labels=torch.from_numpy(np.ascontiguousarray(self.noise.noisy_labels[idx])),
            true_labels=torch.from_numpy(np.ascontiguousarray(self.split.train.y[idx])),
        )

    def lying_sites(self) -> list[int]:
        """Indices of the clients that report their true labels' losses (``scenario.lying``)."""
        spec = self.scenario.lying
        if spec is None:
            return []
        noisy = [k for k, is_noisy in enumerate(self.noise.noisy_clients) if is_noisy]
        return noisy if spec.sites == "noisy" else noisy[: int(spec.sites)]

    def class_counts(self, k: int) -> list[int]:
        """Histogram of client ``k``'s (noisy) labels."""
        labels = self.noise.noisy_labels[self.client_indices[k]]
        return [int(c) for c in np.bincount(labels, minlength=self.split.train.num_classes)]


def client_names(num_clients: int) -> list[str]:
    """``client-00``, ``client-01``, ... (zero-padded so they sort in index order)."""
    width = max(2, len(str(num_clients - 1)))
    return [f"client-{k:0{width}d}" for k in range(num_clients)]


def _derive_int(sequence: np.random.SeedSequence) -> int:
    return int(sequence.generate_state(1, dtype=np.uint32)[0] & 0x7FFFFFFF)


def _load_data(scenario: Scenario, seed: int) -> DataSplit:
    """The scenario's data set: a built-in one, or the custom arrays (``custom_data``)."""
    custom = scenario.custom_data
    if custom is None:
        return load_dataset(
            scenario.dataset,
            data_dir=scenario.data_dir,
            test_fraction=scenario.test_fraction,
            seed=seed,
        )
    options: dict[str, Any] = {
        "test_fraction": scenario.test_fraction,
        "seed": seed,
        "num_classes": custom.num_classes,
        "class_names": custom.class_names,
        "standardize": custom.standardize,
    }
    if custom.npz is not None:
        return load_npz(custom.npz, name=custom.name, **options)
    assert custom.function is not None  # CustomDataSpec: exactly one source
    return load_callable(custom.function, custom.params, name=custom.name, **options)


def prepare_data(scenario: Scenario, seed: int) -> PreparedData:
    """Load, partition and noise the data and build the initial model, all from ``seed``.

    Raises
    ------
    ScenarioError
        The data set cannot be loaded, or the partition, noise or model settings do not fit
        it (the message names the scenario field).
    """
    try:
        split = _load_data(scenario, seed)
    except DatasetError as exc:
        raise ScenarioError(f"dataset {scenario.dataset!r}: {exc}") from exc
    train = split.train
    part_seq, noise_seq, model_seq, federation_seq = np.random.SeedSequence(seed).spawn(4)
    try:
        indices = partition(
            train.y,
            scenario.clients,
            scenario.partition.method,
            np.random.default_rng(part_seq),
            **scenario.partition.params,
        )
    except PartitionError as exc:
        raise ScenarioError(f"partition: {exc}") from exc
    noise_rng = np.random.default_rng(noise_seq)
    spec = scenario.noise
    try:
        levels = noise_levels(scenario.clients, spec.protocol, noise_rng, **spec.params)
        report = inject_noise(
            train.y,
            indices,
            levels,
            train.num_classes,
            spec.flip,
            noise_rng,
            protocol=spec.protocol,
            threshold=spec.threshold,
            class_map=spec.class_map,
            x=train.x if spec.flip == "instance" else None,
        )
    except NoiseError as exc:
        raise ScenarioError(f"noise: {exc}") from exc
    model_name = scenario.model.name or ("cnn" if train.kind == "image" else "mlp")
    try:
        model = build_model(
            model_name,
            train.input_shape,
            train.num_classes,
            seed=_derive_int(model_seq),
            **scenario.model.params,
        )
    except (ModelConfigError, TorchvisionNotInstalledError) as exc:
        raise ScenarioError(f"model: {exc}") from exc
    return PreparedData(
        scenario=scenario,
        seed=seed,
        split=split,
        client_indices=indices,
        noise=report,
        model_name=model_name,
        initial_state=state_to_bytes(model),
        federation_seed=_derive_int(federation_seq),
    )


def evaluate_state(model: nn.Module, state: bytes, split: DataSplit) -> tuple[float, float]:
    """Accuracy and balanced accuracy of ``state`` (loaded into ``model``) on the test split."""
    load_state_bytes(model, state)
    model.eval()
    x = torch.from_numpy(split.test.x)
    predictions = []
    with torch.inference_mode():
        for start in range(0, x.shape[0], _EVAL_BATCH):
            predictions.append(model(x[start : start + _EVAL_BATCH]).argmax(dim=1))
    predicted = torch.cat(predictions).numpy().astype(np.int64)
    y = split.test.y
    return accuracy(y, predicted), balanced_accuracy(y, predicted, split.test.num_classes)


def per_class_losses(
    model: nn.Module, state: bytes, data: PreparedData
) -> list[list[float | None]]:
    """Each client's mean cross-entropy per (noisy) label class under ``state``, eval mode;
    ``None`` for a class the client does not hold (``per_class_loss``, FedNoRo eq. 3's input)."""
    load_state_bytes(model, state)
    model.eval()
    num_classes = data.split.train.num_classes
    result: list[list[float | None]] = []
    with torch.inference_mode():
        for k in range(len(data.client_indices)):
            local = data.local_data(k)
            losses = torch.nn.functional.cross_entropy(
                model(local.inputs), local.labels, reduction="none"
            ).double()
            sums = torch.zeros(num_classes, dtype=torch.float64).index_add_(0, local.labels, losses)
            counts = torch.bincount(local.labels, minlength=num_classes)
            result.append(
                [
                    float(sums[c] / counts[c]) if int(counts[c]) > 0 else None
                    for c in range(num_classes)
                ]
            )
    return result


# --------------------------------------------------------------------------------------------
# driving federations


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
class _ClientRound:
    role: str | None
    summary: Any  # client_sdk RoundSummary


@dataclass
class _Federation:
    spec: MethodSpec
    federation_id: str
    config: dict[str, Any]
    names: list[str]
    ids: dict[str, str]
    participants: list[Participant]
    eval_model: nn.Module
    started: float
    model_in: bytes = b""
    pending: dict[int, tuple[float, list[_ClientRound]]] = field(default_factory=dict)
    records: list[RoundRecord] = field(default_factory=list)


def _create_federation(
    admin: AdminClient,
    http: httpx.Client,
    data: PreparedData,
    spec: MethodSpec,
    names: list[str],
) -> _Federation:
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
    for participant in participants:
        participant.join()
    return _Federation(
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


def _next_instruction(fed: _Federation, k: int, expected_round: int, timeout_s: float) -> Any:
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


def _train_round(
    fed: _Federation,
    round_index: int,
    timeout_s: float,
    collect_previous: Callable[[], None],
) -> None:
    """Every client trains ``round_index``; the previous round is read back as soon as the
    first client's instructions arrive (the round then is closed and the next one cannot close
    before this one's clients all uploaded, so the statuses read belong to that round)."""
    started = time.perf_counter()
    done: list[_ClientRound] = []
    for k, participant in enumerate(fed.participants):
        current = _next_instruction(fed, k, round_index, timeout_s)
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
        done.append(_ClientRound(role=role, summary=summary))
    fed.pending[round_index] = (time.perf_counter() - started, done)


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _round_record(
    fed: _Federation,
    round_index: int,
    info: Any,
    statuses: dict[str, str],
    acc: tuple[float, float],
    trained: tuple[float, list[_ClientRound]],
) -> RoundRecord:
    audit: dict[str, Any] = info.audit or {}
    ids: list[str] = list(audit.get("client_ids") or [])
    position = {cid: i for i, cid in enumerate(ids)}
    name_of = {cid: name for name, cid in fed.ids.items()}
    detections: dict[str, Any] = audit.get("detections") or {}
    weights: list[Any] = (audit.get("aggregation") or {}).get("weights") or []
    expertise = audit.get("expertise")
    neighbors: dict[str, Any] = audit.get("neighbors") or {}
    self_weights: dict[str, Any] = audit.get("self_weights") or {}
    primary_flags: list[Any] = audit.get("primary_flags") or []
    clients: list[ClientRoundRecord] = []
    wall, trained_clients = trained
    for k, name in enumerate(fed.names):
        cid = fed.ids[name]
        pos = position.get(cid)
        entries: dict[str, dict[str, Any]] = {}
        normalised = None
        for det_name, detection in detections.items():
            verdicts = detection.get("verdicts") or []
            verdict = verdicts[pos] if pos is not None and pos < len(verdicts) else None
            if detection.get("status") != "ok":
                verdict = None
            score = None if verdict is None else _float_or_none(verdict.get("score"))
            entries[det_name] = {
                "status": detection.get("status"),
                "score": score,
                "flag": None if verdict is None else verdict.get("flag"),
                "noisiness": score,
            }
            if det_name == "fednoro" and verdict is not None:
                evidence = verdict.get("evidence") or {}
                # the graded statistic behind FedNoRo's flags: the client's mean loss on its
                # own labels under the global model (the separation guard's input)
                entries[det_name]["mean_loss"] = _float_or_none(evidence.get("mean_loss"))
                # the same loss standardised class by class (the guard's default input)
                entries[det_name]["class_z"] = _float_or_none(evidence.get("class_z"))
                # the mixture's posterior before the guard (two-group membership)
                entries[det_name]["posterior"] = _float_or_none(
                    evidence.get("gmm_noisy_probability")
                )
                normalised = evidence.get("normalised_loss")
        summary = trained_clients[k].summary
        metrics: dict[str, Any] = dict(summary.metrics)
        clients.append(
            ClientRoundRecord(
                name=name,
                role=trained_clients[k].role,
                detectors=entries,
                primary_flag=(
                    primary_flags[pos] if pos is not None and pos < len(primary_flags) else None
                ),
                status=statuses.get(name),
                expertise=(
                    _float_or_none(expertise[pos])
                    if expertise is not None and pos is not None
                    else None
                ),
                neighbors=(
                    [name_of.get(n["client_id"], n["client_id"]) for n in neighbors[cid]]
                    if cid in neighbors
                    else None
                ),
                self_weight=_float_or_none(self_weights.get(cid)),
                weight=(
                    _float_or_none(weights[pos]) if pos is not None and pos < len(weights) else None
                ),
                train_loss=_float_or_none(summary.train_loss),
                train_seconds=float(summary.train_seconds),
                signal_seconds=float(summary.signal_seconds),
                upload_bytes=int(summary.upload_bytes),
                download_bytes=int(summary.download_bytes),
                label_precision=_float_or_none(metrics.get("label_precision")),
                label_recall=_float_or_none(metrics.get("label_recall")),
                normalised_loss=normalised,
            )
        )
    primary = audit.get("primary")
    primary_summary = (detections.get(primary or "") or {}).get("summary") or {}
    ashman = primary_summary.get("ashman_d")
    aggregation = audit.get("aggregation") or {}
    return RoundRecord(
        index=round_index,
        in_warmup=bool(audit.get("in_warmup", round_index < int(fed.config["warmup_rounds"]))),
        accuracy=acc[0],
        balanced_accuracy=acc[1],
        coordinator_seconds=_float_or_none(info.coordinator_seconds),
        wall_seconds=wall,
        aggregation_rule=info.aggregation_rule or aggregation.get("rule"),
        fallback_reason=aggregation.get("fallback_reason"),
        primary=primary,
        detector_status={n: d.get("status") for n, d in detections.items()},
        detector_reason={n: d.get("reason") for n, d in detections.items()},
        ashman_d=_float_or_none(ashman),
        clients=clients,
    )


def _collect(
    admin: AdminClient,
    fed: _Federation,
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
    record = _round_record(fed, round_index, info, statuses, acc, fed.pending.pop(round_index))
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


def _stop_failed(
    admin: AdminClient, fed: _Federation, data: PreparedData, exc: ClientTrainingError
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
    coordinator (status "failed", with the client, round and error as the reason) and
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
            feds = [_create_federation(admin, http, data, spec, names) for spec in methods]
            for r in range(rounds):
                for fed in list(feds):

                    def previous(fed: _Federation = fed, r: int = r) -> None:
                        if r > 0:
                            _collect(admin, fed, data, r - 1, on_round)

                    try:
                        _train_round(fed, r, timeout_s, previous)
                    except ClientTrainingError as exc:
                        feds.remove(fed)
                        failures.append(_stop_failed(admin, fed, data, exc))
                        if on_failure is not None:
                            on_failure(failures[-1])
            for fed in feds:
                current = _next_instruction(fed, 0, rounds, timeout_s)
                if current.status != "finished":
                    raise SimulationError(f"{fed.spec.name}: still running after {rounds} rounds")
                _collect(admin, fed, data, rounds - 1, on_round)
            results = []
            for fed in feds:
                report = admin.get_json(f"/federations/{fed.federation_id}/report")
                results.append(_result(fed, data, report))
            return SeedRuns(runs=results, failures=failures)
        except SiteRoundError:
            raise  # a site's own failure (not a recipe's): its traceback, not the coordinator's
        except CoordinatorSDKError as exc:
            raise SimulationError(f"the coordinator answered with an error: {exc}") from exc


def _result(fed: _Federation, data: PreparedData, report: dict[str, Any]) -> RunResult:
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
