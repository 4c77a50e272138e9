"""The site's training loop: join, then train whatever the coordinator asks until it is done.

    participant = Participant(client, federation_id, model, dataset, state_dir="fedaudit-state")
    participant.run()

Each round: ask for instructions (long-poll), download the global model once per version (and
the neighbor models it was assigned), train with the named recipe, compute the signals the
federation needs, upload theta_k with an idempotency key, persist local state. A round that
closes while this client trains is skipped with a log line; a round this site cannot do (the
global model does not load into its module, training fails) is reported to the coordinator and
raised as `SiteRoundError`; every other error propagates.

This module holds the round loop; what one round trains with and uploads is built in
``client_sdk._round_update``, and the model-file helpers (``state_to_bytes``,
``load_state_bytes``, ``save_initial_model``, ``safetensors_manifest``) live in
``client_sdk.model_files`` and are importable from here as well.
"""

from __future__ import annotations

import copy
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from client_sdk._client import FederationClient, join_body, join_path
from client_sdk._exceptions import (
    APIConnectionError,
    ConflictError,
    CoordinatorSDKError,
    FederationFailedError,
    InternalServerError,
    ProtocolMismatchError,
    SiteRoundError,
)
from client_sdk._progress import RoundSummary, print_progress, round_line
from client_sdk._responses import CurrentRound, Diagnostics, Instructions, SiteTask
from client_sdk._round_update import (
    PreparedUpdate,
    frozen_global_copy,
    neighbor_model,
    reported_signals,
    round_context,
)
from client_sdk.local_state import LocalStateStore
from client_sdk.model_files import (
    load_state_bytes,
    safetensors_manifest,
    save_initial_model,
    state_to_bytes,
)
from client_sdk.privacy import private_counts, private_signals
from client_sdk.privacy_budget import preview_privacy
from client_sdk.recipes import LocalData, NeighborModel, TrainReport, get_recipe
from client_sdk.signals import Signals, compute_signals

log = logging.getLogger("client_sdk.participant")
_DOING = {
    "load": "loading the global model",
    "train": "training",
    "signals": "computing the signals",
    "upload": "preparing the upload",
    "other": "taking part",
}
_T = TypeVar("_T")


def default_device() -> torch.device:
    """``cuda`` when a GPU is available, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Participant:
    """A site taking part in a federation.

    Parameters
    ----------
    client : FederationClient
        Authenticated with this site's client token.
    federation_id : uuid.UUID or str
    model : torch.nn.Module
        The architecture the federation trains (its last ``nn.Linear`` is the head).
    data : LocalData or torch.utils.data.Dataset
        The local training set; a Dataset of ``(x, y)`` pairs is materialised once as tensors.
    device : torch.device or str, optional
        Defaults to ``cuda`` when available, else ``cpu``.
    amp : bool
        Mixed precision on CUDA.
    state_dir : path, optional
        Where per-client state survives restarts (FLR averages, FedRN's previous model, ...).
    poll_wait_s : float
        Long-poll time when asking for instructions.
    on_round : callable, optional
        Called with a `RoundSummary` after each accepted round.
    outage_s : float or None
        How long :meth:`run` keeps trying while the coordinator cannot be reached (connection
        refused or timed out, 5xx after the client's own retries): None (default) forever, so
        that a coordinator restart does not end a site's training; a number of seconds, after
        which the last error is raised. A connection that cannot work however long one waits
        (an ``https://`` URL to a coordinator serving plain http or the reverse, a certificate
        the SDK does not trust, a server that does not speak HTTP) is not an outage:
        `ProtocolMismatchError` is raised at once, naming the cause and what to check.
    outage_backoff_max_s : float
        The longest wait between two tries during an outage (the waits double from 1 s).
    sleep : callable
        How to wait (tests pass their own).
    progress : bool or callable
        True (default): one line on standard error per step a person waiting at the site wants
        to see (joined, each round trained and uploaded with its loss, waiting and why, the
        coordinator unreachable and why, finished with the site's own verdict); False: nothing
        printed, the warnings (coordinator unreachable, round closed before the upload) go
        through logging only (logger ``client_sdk.participant``); a callable: called with each
        line instead (e.g. a logger's ``info``). A warning is said once: with the default
        printer and no logging configured, it is not logged as well.
    """

    def __init__(
        self,
        client: FederationClient,
        federation_id: uuid.UUID | str,
        model: nn.Module,
        data: LocalData | torch.utils.data.Dataset[Any],
        *,
        device: torch.device | str | None = None,
        amp: bool = False,
        state_dir: Path | str | None = None,
        poll_wait_s: float = 10.0,
        on_round: Callable[[RoundSummary], None] | None = None,
        outage_s: float | None = None,
        outage_backoff_max_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        progress: bool | Callable[[str], None] = True,
    ) -> None:
        if outage_s is not None and outage_s < 0:
            raise ValueError("outage_s must be >= 0 (or None: keep trying)")
        if outage_backoff_max_s <= 0:
            raise ValueError("outage_backoff_max_s must be > 0")
        self.outage_s = outage_s
        self.outage_backoff_max_s = outage_backoff_max_s
        self._sleep = sleep
        self.client = client
        self.federation_id = str(federation_id)
        self.device = torch.device(device) if device is not None else default_device()
        self.model = model.to(self.device)
        local = data if isinstance(data, LocalData) else LocalData.from_dataset(data)
        self.data = local.to(self.device)
        self.amp = amp
        self.state = LocalStateStore(Path(state_dir) if state_dir is not None else None)
        self.poll_wait_s = poll_wait_s
        self.on_round = on_round
        self._models: dict[str, tuple[str, bytes]] = {}  # model id -> (sha256, bytes)
        self.rounds_done: list[RoundSummary] = []
        # An update whose upload got no answer (the coordinator went away mid-request): sent
        # again, byte for byte with its idempotency key, before anything else. Training the round
        # again instead would lose it when the first upload did arrive (the coordinator then says
        # "wait") and would be refused as a reused key when it did not.
        self._unsent: PreparedUpdate | None = None
        self._say: Callable[[str], None] | None = (
            print_progress if progress is True else (progress or None)
        )
        self._last_wait: str | None = None

    def _join_counts(self, task: SiteTask | None = None) -> tuple[int, list[int | None]]:
        """(num_samples, class_counts) as the join declares them (checked against the task,
        fetched unless given), as coarse as the federation's privacy policy asks
        (``client_sdk.privacy``)."""
        task = task if task is not None else self.client.get_task(self.federation_id)
        shape = tuple(self.data.inputs.shape[1:])
        if shape != tuple(task.input_shape):
            raise ValueError(
                f"the local inputs are shaped {list(shape)} but the federation's task expects "
                f"{list(task.input_shape)}: the site would fail every round"
            )
        labels = self.data.labels.cpu()
        if int(labels.max().item()) >= task.num_classes:
            raise ValueError(
                f"the local labels go up to {int(labels.max().item())} but the federation has "
                f"{task.num_classes} classes"
            )
        counts = [int(c) for c in torch.bincount(labels, minlength=task.num_classes)]
        return private_counts(self.data.num_samples, counts, task.privacy)

    def join(self) -> None:
        """Join (again) with this site's sample count and class counts."""
        num_samples, counts = self._join_counts()
        joined = self.client.join(self.federation_id, num_samples=num_samples, class_counts=counts)
        log.info("joined federation %s as %s", self.federation_id, joined.name)
        held = sum(1 for c in counts if c is None or c > 0)
        self._progress(
            f"joined federation {self.federation_id} as {joined.name!r}: {num_samples} samples "
            f"in {held} of {len(counts)} classes, training on {self.device}"
        )

    def run(self, *, max_rounds: int | None = None) -> list[RoundSummary]:
        """Train until the federation finishes (or `max_rounds` rounds were done here).

        An outage of the coordinator (see ``outage_s``) is waited out: the step that failed
        (join, asking for instructions, a round) is tried again. An upload that got no answer is
        sent again unchanged (same bytes, same idempotency key) once the coordinator is back: if
        the first one did arrive the coordinator recognises it, if it did not the update counts
        now, and if the round closed meanwhile the round is recorded as not accepted.
        """
        self._through_outage(self.join)
        while max_rounds is None or len(self.rounds_done) < max_rounds:
            if not self._through_outage(self._step):
                break
        return self.rounds_done

    def _step(self) -> bool:
        """One poll and, when told to train, one round; False once the federation finished."""
        if self._unsent is not None:
            self._record(self._upload(self._unsent))
            return True
        current = self.client.get_current_round(self.federation_id, wait_s=self.poll_wait_s)
        if current.status == "finished":
            self._load_final(current)
            log.info("federation %s finished", self.federation_id)
            self._progress_finished()
            return False
        if current.status == "wait":
            reason = current.reason or "waiting for the coordinator"
            if reason != self._last_wait:
                self._progress(f"waiting: {reason}")
                self._last_wait = reason
            if self.poll_wait_s == 0:  # no long-poll: honour the server's hint
                self._sleep(min(current.retry_after_s or 1.0, 5.0))
            return True
        self._last_wait = None
        assert current.instructions is not None
        index = current.instructions.round_index
        self._progress(
            f"round {index} ({index + 1} of {current.instructions.total_rounds}): training "
            f"({current.instructions.recipe})"
        )
        self._record(self.train_round(current))
        return True

    def _record(self, summary: RoundSummary) -> None:
        index = summary.round_index
        if not summary.accepted:
            self._warn(f"round {index}: closed before this site's upload; not counted")
            return
        self._progress(round_line(summary))
        self.rounds_done.append(summary)
        if self.on_round is not None:
            self.on_round(summary)

    def _progress(self, line: str) -> None:
        if self._say is not None:
            self._say(line)

    def _progress_finished(self) -> None:
        if self._say is None:
            return
        self._say(
            f"federation finished: {len(self.rounds_done)} round(s) trained here; the final "
            "model is loaded"
        )
        try:
            verdict = self.diagnostics()
        except CoordinatorSDKError as exc:  # the verdict is a courtesy; the run succeeded
            self._say(f"(this site's verdict could not be read: {exc})")
            return
        classes = f" (classes {', '.join(verdict.noisy_classes)})" if verdict.noisy_classes else ""
        self._say(f"this site's status: {verdict.status}{classes}. {verdict.advice}")

    def diagnostics(self) -> Diagnostics:
        """This site's own verdict from the coordinator: status, the rounds after the warm-up in
        which it was flagged, the classes that look noisy, and advice (``GET .../diagnostics``)."""
        return self.client.get_diagnostics(self.federation_id)

    def _through_outage(self, step: Callable[[], _T]) -> _T:
        """``step()``, tried again while the coordinator is unreachable (``outage_s``), timed
        from the start of the first failed try (the client's own retries included); a
        `ProtocolMismatchError` is raised at once: waiting does not mend it."""
        started: float | None = None
        wait = 1.0
        while True:
            tried = time.monotonic()
            try:
                return step()
            except ProtocolMismatchError:
                raise
            except (APIConnectionError, InternalServerError) as exc:
                now = time.monotonic()
                started = tried if started is None else started
                if self.outage_s is not None and now - started >= self.outage_s:
                    raise
                self._warn(
                    f"coordinator unreachable for {now - started:.0f} s ({exc.cause}); trying "
                    f"again in {wait:.0f} s",
                    detail=str(exc),
                )
                self._sleep(wait)
                wait = min(2.0 * wait, self.outage_backoff_max_s)

    def _warn(self, line: str, *, detail: str | None = None) -> None:
        """A warning said once: as a progress line and a log record, except that with the
        default progress printer and no logging configured the record is left out (Python's
        last-resort handler would print it to the same standard error a second time). With
        ``progress=False`` the warning goes through logging only."""
        self._progress(line)
        if self._say is print_progress and not log.hasHandlers():
            return
        log.warning("%s%s", line, f" [{detail}]" if detail and detail not in line else "")

    def _fetch(self, model_id: str, sha256: str) -> tuple[bytes, int]:
        """Model bytes by id, downloaded at most once per content (ETag); (bytes, downloaded)."""
        cached = self._models.get(model_id)
        if cached is not None and cached[0] == sha256:
            return cached[1], 0
        data = self.client.download_model(model_id, expected_sha256=sha256)
        assert data is not None
        self._models[model_id] = (sha256, data)
        return data, len(data)

    def _forget_models_except(self, keep: set[str]) -> None:
        for model_id in list(self._models):
            if model_id not in keep:
                del self._models[model_id]

    def _site_error(self, round_index: int, stage: str, exc: Exception) -> SiteRoundError:
        """Report a failed round to the coordinator (best effort) and return the typed error,
        which says it once (the log record is DEBUG: at ERROR an uncaught one printed twice)."""
        error_type = type(exc).__name__
        message = str(exc) or error_type
        reported = False
        try:
            reported = self.client.report_error(
                self.federation_id,
                round_index,
                stage=stage,
                error_type=error_type,
                message=message,
            )
        except Exception as report_exc:  # the original error matters more
            self._warn(f"could not report the error to the coordinator: {report_exc}")
        log.debug(
            "round %d failed while %s: %s: %s", round_index, _DOING[stage], error_type, message
        )
        return SiteRoundError(
            f"round {round_index} failed while {_DOING[stage]}: {error_type}: {message}"
            + ("" if reported else " (not reported to the coordinator)"),
            round_index=round_index,
            stage=stage,
            error_type=error_type,
            reported=reported,
        )

    def _prepare_update(
        self,
        current: CurrentRound,
        model: nn.Module,
        state: LocalStateStore,
        stage: list[str] | None = None,
    ) -> PreparedUpdate:
        """Train one round from its instructions in ``model`` with ``state`` and build the
        update: everything :meth:`train_round` uploads and :meth:`preview` shows. ``stage[0]``
        follows the work ("load", "train", "signals", "upload") for the error report."""
        stage = stage if stage is not None else ["load"]
        assert current.instructions is not None
        assert current.round is not None
        instructions: Instructions = current.instructions
        neighbors, downloaded = self._load_round_models(instructions, model)
        global_model = frozen_global_copy(model)
        model.train()
        ctx = round_context(instructions, neighbors, state, device=self.device, amp=self.amp)
        stage[0] = "train"
        recipe = get_recipe(instructions.recipe)
        started = time.perf_counter()
        report: TrainReport = recipe.train(model, global_model, self.data, ctx)
        trained = time.perf_counter()
        stage[0] = "signals"
        signals = self._compute_signals(global_model, model, report, instructions)
        signal_seconds = time.perf_counter() - trained
        stage[0] = "upload"
        num_samples, reported = private_signals(
            self.data.num_samples,
            reported_signals(signals),
            instructions.privacy,
            global_centroids=instructions.centroids,
        )
        return PreparedUpdate(
            round_index=instructions.round_index,
            recipe=instructions.recipe,
            idempotency_key=f"{current.round.id}",
            state=state_to_bytes(model),
            num_samples=num_samples,
            signals=reported,
            metrics=dict(report.metrics),
            report=report,
            train_seconds=trained - started,
            signal_seconds=signal_seconds,
            download_bytes=downloaded,
            train_accuracy=signals.train_accuracy,
        )

    def _load_round_models(
        self, instructions: Instructions, model: nn.Module
    ) -> tuple[list[NeighborModel], int]:
        """Load the round's global model into ``model`` and read the neighbor models FedRN was
        assigned, each downloaded at most once per content; (neighbors, bytes downloaded). The
        cache then holds only this round's models."""
        downloaded = 0
        global_id = str(instructions.global_model_id)
        data, n = self._fetch(global_id, instructions.global_model_sha256)
        downloaded += n
        load_state_bytes(model, data)
        neighbors = []
        for neighbor in instructions.neighbors:
            if instructions.recipe != "fedrn":
                break
            blob, n = self._fetch(str(neighbor.model_id), neighbor.model_sha256)
            downloaded += n
            neighbors.append(neighbor_model(neighbor, blob, self.device))
        self._forget_models_except({global_id, *(str(n.model_id) for n in instructions.neighbors)})
        return neighbors, downloaded

    def _compute_signals(
        self,
        global_model: nn.Module,
        model: nn.Module,
        report: TrainReport,
        instructions: Instructions,
    ) -> Signals:
        """The round's signals (:func:`client_sdk.signals.compute_signals` on this site's data).

        The one place a simulated dishonest site (``fedaudit_sim``) changes what it
        reports; a real site has no reason to override it.
        """
        return compute_signals(
            global_model=global_model,
            local_model=model,
            data=self.data,
            num_classes=instructions.num_classes,
            required=instructions.signals,
            train_report=report,
            probe_seed=instructions.probe.seed if instructions.probe is not None else None,
            probe_size=instructions.probe.size if instructions.probe is not None else 0,
            input_shape=instructions.input_shape,
            device=self.device,
            loss_clip=instructions.privacy.dp_clip_loss if instructions.privacy.dp_active else None,
        )

    def train_round(self, current: CurrentRound) -> RoundSummary:
        """Run one round from its instructions and upload the result.

        Raises
        ------
        SiteRoundError
            Loading the global model into this site's module, training or computing the
            signals failed (the original exception is the cause); the coordinator was told
            first (a ``site.error`` event with the message), on a best-effort basis.
        """
        assert current.instructions is not None
        stage = ["load"]
        try:
            prepared = self._prepare_update(current, self.model, self.state, stage)
        except CoordinatorSDKError:
            raise  # the coordinator's own answer, or it cannot be reached: nothing to report
        except Exception as exc:
            raise self._site_error(current.instructions.round_index, stage[0], exc) from exc
        return self._upload(prepared)

    def _upload(self, prepared: PreparedUpdate) -> RoundSummary:
        """Send a trained update; kept as unsent (and the error raised) when nothing answered."""
        self._unsent = None
        accepted = True
        try:
            self.client.submit_update(
                self.federation_id,
                prepared.round_index,
                state=prepared.state,
                num_samples=prepared.num_samples,
                signals=prepared.signals,
                metrics=prepared.metrics,
                idempotency_key=prepared.idempotency_key,
            )
        except (APIConnectionError, InternalServerError):
            self._unsent = prepared
            raise
        except ConflictError as exc:
            if (exc.problem is None) or exc.problem.type != "/problems/round-closed":
                raise
            accepted = False
            log.info("round %d closed before the upload: %s", prepared.round_index, exc)
        self.state.flush()
        report = prepared.report
        return RoundSummary(
            round_index=prepared.round_index,
            recipe=prepared.recipe,
            train_loss=report.train_loss,
            train_seconds=prepared.train_seconds,
            signal_seconds=prepared.signal_seconds,
            upload_bytes=len(prepared.state),
            download_bytes=prepared.download_bytes,
            metrics=dict(report.metrics),
            notes=list(report.notes),
            accepted=accepted,
            train_accuracy=prepared.train_accuracy,
        )

    def preview(self, *, wait_s: float = 0.0) -> dict[str, Any]:
        """What this site would send next, computed the way :meth:`run` computes it, sent nowhere.

        Returns a plain, JSON-serialisable dict (``print(json.dumps(p.preview(), indent=2))``):

        - ``join``: the join request (method, path, JSON body: ``num_samples`` and
          ``class_counts``), what :meth:`run` sends first;
        - ``round``: the coordinator's answer to "what now" (``status`` ``train``, ``wait`` or
          ``finished``, and its ``reason``);
        - ``update``: when the status is ``train``, the round's upload: method, path, the
          ``Idempotency-Key`` header, ``metadata`` (the JSON part exactly as it would be sent:
          ``num_samples``, ``sha256``, ``signals``, ``metrics``) and ``state`` (the model part:
          format, byte size, sha256 and each tensor's name, dtype and shape, not its values);
          None otherwise (join first, or wait for the round to open: ``wait_s`` long-polls);
        - ``privacy``: the federation's privacy policy and, under its Gaussian mechanism, what
          sending costs (:func:`client_sdk.privacy_budget.preview_privacy`): the (epsilon,
          delta) of this round's update and the epsilon after an update in every round of the
          plan, computed by the coordinator's accountant; before a round is open, or without
          the ``dp-accounting`` package (``fedaudit[dp]``), the epsilons are None and
          ``epsilon_unavailable`` says why.

        The round is trained here, with the coordinator's instructions, on a copy of the model
        and an in-memory copy of the local state: the model, the state directory and the
        coordinator are left as they were (only GET requests are made: the task, the round, the
        models to start from). The upload of the round computes the payload again with the same
        code; on the CPU the same seed gives the same bytes (``client_sdk.recipes.training``),
        on a GPU the numbers may differ in their last digits, the fields and shapes do not.
        """
        task = self.client.get_task(self.federation_id)
        num_samples, counts = self._join_counts(task)
        preview: dict[str, Any] = {
            "federation_id": self.federation_id,
            "join": {
                "method": "POST",
                "path": join_path(self.federation_id),
                "body": join_body(num_samples, counts),
            },
        }
        current = self.client.get_current_round(self.federation_id, wait_s=wait_s)
        preview["round"] = {"status": current.status, "reason": current.reason}
        if current.status != "train":  # no round: which signals get noise is not known yet
            preview["privacy"] = preview_privacy(task.privacy)
            preview["update"] = None
            return preview
        instructions = current.instructions
        assert instructions is not None
        preview["privacy"] = preview_privacy(
            instructions.privacy, instructions.signals, instructions.total_rounds
        )
        prepared = self._prepare_update(
            current, copy.deepcopy(self.model), self.state.scratch_copy()
        )
        preview["round"]["index"] = prepared.round_index
        preview["update"] = prepared.request_preview(self.federation_id)
        return preview

    def _load_final(self, current: CurrentRound) -> None:
        if current.final_model_id is None:
            return
        data = self.client.download_model(current.final_model_id)
        if data is not None:
            load_state_bytes(self.model, data)


__all__ = [
    "FederationFailedError",
    "Participant",
    "RoundSummary",
    "SiteRoundError",
    "default_device",
    "load_state_bytes",
    "safetensors_manifest",
    "save_initial_model",
    "state_to_bytes",
]
